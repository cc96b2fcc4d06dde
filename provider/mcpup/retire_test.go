package mcpup

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"credbroker/internal/egress"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestListChangeRetiresSession: a list change heard on a Listen session
// replaces the pool's 2026-07-28 session for the same target (the go-sdk
// keeps that session's lists for the upstream's ttlMs and would list the
// old tools), without ending a call in flight on it; Close closes the
// retired session too.
func TestListChangeRetiresSession(t *testing.T) {
	u := newUpstream(t, false)
	u.sse = true
	u.restart()
	hc, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	p := New(Options{HTTPClient: hc})
	closed := false
	t.Cleanup(func() {
		if !closed {
			p.Close()
		}
	})
	u.mu.Lock()
	server := u.server
	u.mu.Unlock()
	started, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before Close: a failed test must not hold the call
	server.AddTool(&mcp.Tool{Name: "hold", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			close(started)
			<-release
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "held"}}}, nil
		})
	target := Target{Provider: "up", URL: u.url()}
	ctx := context.Background()
	old, err := p.Session(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if Era(old) != "2026-07-28" {
		t.Fatalf("era %q", Era(old))
	}
	// The call goes through the go-sdk's session (not the pool's own
	// exchange), as a call asking for progress does.
	done := make(chan string, 1)
	go func() {
		res, err := old.CallTool(ctx, &mcp.CallToolParams{Name: "hold", Arguments: map[string]any{}})
		switch {
		case err != nil:
			done <- "error: " + err.Error()
		case len(res.Content) == 0:
			done <- "no content"
		default:
			done <- res.Content[0].(*mcp.TextContent).Text
		}
	}()
	<-started
	heard := make(chan string, 4)
	lctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := p.Listen(lctx, target, func(m string) { heard <- m }); err != nil {
		t.Fatal(err)
	}
	server.AddTool(&mcp.Tool{Name: "late", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	select {
	case m := <-heard:
		if m != ToolsListChanged {
			t.Fatalf("heard %s", m)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no change heard")
	}
	fresh, err := p.Session(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if fresh == old {
		t.Fatal("the session that listed before the change is still handed out")
	}
	if p.Len() != 1 {
		t.Fatalf("%d sessions in the pool, want 1", p.Len())
	}
	free()
	select {
	case got := <-done:
		if got != "held" {
			t.Fatalf("the call in flight on the retired session ended %q", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the call in flight on the retired session did not end")
	}
	stop()
	p.Close()
	closed = true
	if _, err := old.ListTools(ctx, nil); err == nil {
		t.Fatal("the retired session still lists after Close")
	}
}
