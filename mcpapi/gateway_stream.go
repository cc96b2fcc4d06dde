package mcpapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// Streams of the gateway. A relayed call whose host asked for progress
// (_meta.progressToken) is answered as an SSE stream: the upstream gets a
// progress token the broker minted (hosts' tokens never cross, and one
// person's cannot name another's call), its progress notifications reach
// the host under the host's own token, a comment keeps idle proxies from
// closing the stream every keepAliveEvery, and the result is the stream's
// last event. A modern host may also listen (subscriptions/listen) for the
// endpoint's tools/list_changed, which the gateway sends when the person's
// connection is made (the placeholder gives way to the upstream's tools)
// and when the upstream says its tools changed, and for the upstream's
// prompts and resources list_changed.

// keepAliveEvery spaces SSE comments on an otherwise quiet stream.
const keepAliveEvery = 15 * time.Second

// maxListen bounds one subscriptions/listen stream; the host opens another.
const maxListen = 10 * time.Minute

// sseStream is an http.ResponseWriter that turns each JSON-RPC message
// written to it into one SSE event on the wrapped writer (the response was
// committed as a 200 event stream when the stream began).
type sseStream struct {
	w      http.ResponseWriter
	rc     *http.ResponseController
	header http.Header // absorbs what the JSON writers set

	mu     sync.Mutex // guards the fields below and writes to w
	closed bool
	buf    bytes.Buffer
}

// startSSE commits w as an event stream and returns the stream.
func startSSE(w http.ResponseWriter) *sseStream {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	st := &sseStream{w: w, rc: http.NewResponseController(w), header: http.Header{}}
	_ = st.rc.Flush()
	return st
}

func (s *sseStream) Header() http.Header         { return s.header }
func (s *sseStream) WriteHeader(int)             {}
func (s *sseStream) Unwrap() http.ResponseWriter { return s.w }

// Write sends one complete JSON-RPC message as an event.
func (s *sseStream) Write(b []byte) (int, error) {
	if !s.event(bytes.TrimRight(b, "\n")) {
		return 0, http.ErrHandlerTimeout
	}
	return len(b), nil
}

// event writes one message event; false once the stream is closed or the
// host went away.
func (s *sseStream) event(msg []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.buf.Reset()
	s.buf.WriteString("event: message\ndata: ")
	s.buf.Write(msg)
	s.buf.WriteString("\n\n")
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		s.closed = true
		return false
	}
	return s.rc.Flush() == nil
}

// keepAlive writes a comment and pushes the write deadline on.
func (s *sseStream) keepAlive(extend time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(extend))
	if _, err := s.w.Write([]byte(": keep-alive\n\n")); err != nil {
		s.closed = true
		return false
	}
	return s.rc.Flush() == nil
}

// close ends the stream: later events are dropped.
func (s *sseStream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// keepAliveLoop comments on s every keepAliveEvery until stop is closed.
func (s *sseStream) keepAliveLoop(stop <-chan struct{}, extend time.Duration) {
	t := time.NewTicker(keepAliveEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if !s.keepAlive(extend) {
				return
			}
		}
	}
}

// notification is a JSON-RPC notification the gateway sends on a stream.
type notification struct {
	JSONRPC string `json:"jsonrpc"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

func (s *sseStream) notify(method string, params any) bool {
	b, err := json.Marshal(notification{JSONRPC: "2.0", Method: method, Params: params})
	return err == nil && s.event(b)
}

// progressRelay starts streaming c's answer when its host asked for
// progress: it returns the writer the answer goes to, the token the
// upstream gets, and a stop to run when the answer was written. Without a
// progress token (or an SSE-capable host) w is returned as it is.
func (g *gateway) progressRelay(w http.ResponseWriter, c *gwCall) (http.ResponseWriter, string, func()) {
	if len(c.params.Meta.ProgressToken) == 0 || !c.sse {
		return w, "", func() {}
	}
	host := c.params.Meta.ProgressToken
	var raw [18]byte
	_, _ = rand.Read(raw[:])
	minted := "cb-" + base64.RawURLEncoding.EncodeToString(raw[:])
	st := startSSE(w)
	var last float64
	var mu sync.Mutex
	unregister := g.s.opts.Upstreams.OnProgress(minted, func(p *mcp.ProgressNotificationParams) {
		mu.Lock()
		defer mu.Unlock()
		if p.Progress < last {
			return // progress only increases
		}
		last = p.Progress
		st.notify("notifications/progress", map[string]any{"progressToken": host, "progress": p.Progress,
			"total": p.Total, "message": sanitizeText(p.Message, maxUpstreamError)})
	})
	stop := make(chan struct{})
	go st.keepAliveLoop(stop, c.up.CallTimeout+keepAliveEvery)
	return st, minted, func() {
		unregister()
		close(stop)
		st.close()
	}
}

// extendDeadline lets a relayed call outlive the server's WriteTimeout, up
// to the entry's call timeout.
func extendDeadline(w http.ResponseWriter, c *gwCall) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(c.up.CallTimeout + keepAliveEvery))
}

// listenKey names the streams waiting for one person's endpoint.
type listenKey struct {
	principal vault.Principal
	provider  string
}

// listener is one subscriptions/listen stream: the notifications it
// honours and those waiting to be sent on it.
type listener struct {
	want map[string]bool
	wake chan struct{} // one pending wake-up says it all

	mu      sync.Mutex // guards pending
	pending []string
}

// post queues notification method for the stream, if it honours it.
func (l *listener) post(method string) {
	if !l.want[method] {
		return
	}
	l.mu.Lock()
	if !slices.Contains(l.pending, method) {
		l.pending = append(l.pending, method)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *listener) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.pending
	l.pending = nil
	return p
}

// listen answers subscriptions/listen: the endpoint honours
// toolsListChanged (its tool list changes when the person connects, and
// when the upstream says its tools changed), and promptsListChanged and
// resourcesListChanged when the person is connected to an upstream that
// declares them. For as long as the stream lasts, an upstream session of
// its own hears the upstream's list-changed notifications (mcpup.Listen)
// and passes them on; a tools change also drops the person's cached tool
// lists.
func (g *gateway) listen(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	var p struct {
		Notifications *mcp.NotificationSubscriptions `json:"notifications"`
	}
	if err := json.Unmarshal(c.raw, &p); err != nil || p.Notifications == nil {
		writeRPCError(w, http.StatusBadRequest, c.id, codeInvalidParams, "Invalid params: subscriptions/listen needs a notifications object", nil)
		return
	}
	honoured := mcp.NotificationSubscriptions{ToolsListChanged: p.Notifications.ToolsListChanged}
	// With the store down, only the gateway's own changes are heard.
	r, up, _ := g.upstreamCapabilities(ctx, c)
	if up != nil {
		honoured.PromptsListChanged = p.Notifications.PromptsListChanged && up.Prompts != nil && up.Prompts.ListChanged
		honoured.ResourcesListChanged = p.Notifications.ResourcesListChanged && up.Resources != nil && up.Resources.ListChanged
	}
	meta := map[string]any{mcp.MetaKeySubscriptionID: c.id}
	l := &listener{wake: make(chan struct{}, 1), want: map[string]bool{mcpup.ToolsListChanged: honoured.ToolsListChanged,
		mcpup.PromptsListChanged: honoured.PromptsListChanged, mcpup.ResourcesListChanged: honoured.ResourcesListChanged}}
	listening := honoured.ToolsListChanged || honoured.PromptsListChanged || honoured.ResourcesListChanged
	if listening {
		// Heard from here on: the upstream's subscription is acknowledged
		// before the host's is, so no change after the host's
		// acknowledgement is missed.
		key := listenKey{c.principal, c.p.Name}
		g.mu.Lock()
		if g.listeners == nil {
			g.listeners = map[listenKey]map[*listener]bool{}
		}
		if g.listeners[key] == nil {
			g.listeners[key] = map[*listener]bool{}
		}
		g.listeners[key][l] = true
		g.mu.Unlock()
		defer func() {
			g.mu.Lock()
			delete(g.listeners[key], l)
			if len(g.listeners[key]) == 0 {
				delete(g.listeners, key)
			}
			g.mu.Unlock()
		}()
		if up != nil {
			lctx, stop := context.WithCancel(ctx)
			defer stop()
			err := g.s.opts.Upstreams.Listen(lctx, r.Target, func(method string) {
				if method == mcpup.ToolsListChanged {
					g.forgetTools(c.principal, c.p.Name)
				}
				l.post(method)
			})
			if err != nil {
				g.s.log.Info("mcpapi: the upstream's list changes are not heard on this stream", "provider", c.p.Name, "err", err.Error())
			}
		}
	}
	st := startSSE(w)
	defer st.close()
	if !st.notify("notifications/subscriptions/acknowledged", map[string]any{"_meta": meta, "notifications": honoured}) {
		return
	}
	if listening {
		t := time.NewTicker(keepAliveEvery)
		defer t.Stop()
		end := time.NewTimer(maxListen)
		defer end.Stop()
	wait:
		for {
			select {
			case <-ctx.Done():
				return // the host went away: no result
			case <-g.s.done:
				break wait
			case <-end.C:
				break wait
			case <-l.wake:
				for _, m := range l.take() {
					if !st.notify(m, map[string]any{"_meta": meta}) {
						return
					}
				}
			case <-t.C:
				if !st.keepAlive(2 * keepAliveEvery) {
					return
				}
			}
		}
	}
	res, _ := json.Marshal(map[string]any{"resultType": "complete", "_meta": meta})
	writeRPCResult(st, c.id, res)
}

// listChanged tells the person's listening hosts (on this replica) that
// one of the endpoint's lists changed (method is the notification).
func (g *gateway) listChanged(pr vault.Principal, provider, method string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for l := range g.listeners[listenKey{pr, provider}] {
		l.post(method)
	}
}

// toolsChanged: the endpoint's tools changed for the person.
func (g *gateway) toolsChanged(pr vault.Principal, provider string) {
	g.listChanged(pr, provider, mcpup.ToolsListChanged)
}
