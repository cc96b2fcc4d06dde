package mcpup

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// The list-changed notifications an upstream sends.
const (
	ToolsListChanged     = "notifications/tools/list_changed"
	PromptsListChanged   = "notifications/prompts/list_changed"
	ResourcesListChanged = "notifications/resources/list_changed"
)

// Listen opens a session with t of its own, outside the pool, that hears
// the server's list-changed notifications and passes each one's method
// (ToolsListChanged and the others) to changed, until ctx ends or the
// pool is closed: a 2026-07-28 server is asked with subscriptions/listen
// (when it declares listChanged), a 2025-11-25 one is heard on its
// standalone event stream. It returns once the session is open and a
// 2026-07-28 server has acknowledged the subscription, or with the error
// that kept the session from opening: after Options.ListenWait at most (or
// twice that for a server that answers no request in time). changed must
// not block.
func (p *Pool) Listen(ctx context.Context, t Target, changed func(method string)) error {
	ctx, stop := context.WithCancel(ctx)
	key := new(int)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		stop()
		return ErrClosed
	}
	if p.listens == nil {
		p.listens = map[*int]context.CancelFunc{}
	}
	p.listens[key] = stop
	p.mu.Unlock()
	acked := make(chan struct{})
	heard := func(method string) {
		p.listsChanged(t)
		changed(method)
	}
	cs, err := p.connect(ctx, t, heard, acked)
	if err != nil {
		p.endListen(key)
		return err
	}
	p.closing.Go(func() {
		<-ctx.Done()
		cs.Close()
		p.endListen(key)
	})
	if caps := cs.InitializeResult().Capabilities; Era(cs) >= "2026-07-28" && caps != nil &&
		(caps.Tools != nil && caps.Tools.ListChanged || caps.Prompts != nil && caps.Prompts.ListChanged || caps.Resources != nil && caps.Resources.ListChanged) {
		t := time.NewTimer(p.opts.ListenWait)
		defer t.Stop()
		select {
		case <-acked:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return nil
}

// endListen forgets a Listen session that ended.
func (p *Pool) endListen(key *int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stop, ok := p.listens[key]; ok {
		stop()
		delete(p.listens, key)
	}
}

// headerDeadline gives up a request whose answer's headers do not come
// within d.
type headerDeadline struct {
	next http.RoundTripper
	d    time.Duration
}

func (h headerDeadline) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	t := time.AfterFunc(h.d, cancel)
	resp, err := h.next.RoundTrip(req.WithContext(ctx))
	if !t.Stop() || err != nil {
		cancel()
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("mcpup: %s did not answer within %s", req.URL.Redacted(), h.d)
		}
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

// cancelOnClose releases a request's context with its answer's body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
