package mcpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/vault"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// legacyCall is a 2025-11-25 host's tools/call of name at the endpoint.
func (g *gatewayHarness) legacyCall(sub, name string) decoded {
	g.t.Helper()
	r := g.do(rawCall{path: "/mcp/u/up", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer(sub), "MCP-Protocol-Version": versionLegacy},
		body: `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":` + quoteJSON(name) + `,"arguments":{}}}`})
	return decode(g.t, r.body)
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// upstreamCalls is how many tools/call requests the upstream was sent.
func (u *testUpstream) upstreamCalls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.methods["tools/call"]
}

// TestGatewayUnknownTool: a tools/call of a tool the person's list does
// not have is refused with -32602 in both eras and never reaches the
// upstream: a name the upstream never listed, a tool the entry denies
// (though the upstream has it) and one dropped as the list was sanitised
// (a schema over 64 KiB), each looked for in a list fetched again. A
// tool the upstream added after the list was cached is callable at once.
func TestGatewayUnknownTool(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ran"}}}, nil
	}
	g.up.server.AddTool(&mcp.Tool{Name: "hidden", InputSchema: json.RawMessage(`{"type":"object"}`)}, noop)
	huge := `{"type":"object","description":"` + strings.Repeat("x", 65<<10) + `"}`
	g.up.server.AddTool(&mcp.Tool{Name: "huge", InputSchema: json.RawMessage(huge)}, noop)
	before := g.up.upstreamCalls()
	for _, name := range []string{"nosuch", "hidden", "huge"} {
		want := "Invalid params: unknown tool " + quote(name)
		d := g.gwCall("alice", urlCaps, "tools/call", name, map[string]any{"arguments": map[string]any{}})
		if d.Error == nil || d.Error.Code != codeInvalidParams || d.Error.Message != want {
			t.Fatalf("modern call of %s: %+v %+v, want -32602 %q", name, d.Result, d.Error, want)
		}
		if d := g.legacyCall("alice", name); d.Error == nil || d.Error.Code != codeInvalidParams || d.Error.Message != want {
			t.Fatalf("legacy call of %s: %+v %+v, want -32602 %q", name, d.Result, d.Error, want)
		}
	}
	if n := g.up.upstreamCalls(); n != before {
		t.Fatalf("the upstream was sent %d tools/call for refused tools", n-before)
	}
	// A listed tool is still relayed, in both eras.
	if d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); textOf(d) != "echo {}" {
		t.Fatalf("echo: %+v %+v", d.Result, d.Error)
	}
	if d := g.legacyCall("alice", "echo"); textOf(d) != "echo {}" {
		t.Fatalf("legacy echo: %+v %+v", d.Result, d.Error)
	}
	// A tool added upstream after the list was cached (the host may have
	// seen it listed by another replica): the name missing from the
	// cached list, the list is fetched again once, and the call goes on.
	g.up.server.AddTool(&mcp.Tool{Name: "fresh", InputSchema: json.RawMessage(`{"type":"object"}`)}, noop)
	lists := func() int {
		g.up.mu.Lock()
		defer g.up.mu.Unlock()
		return g.up.methods["tools/list"]
	}
	n := lists()
	if d := g.gwCall("alice", urlCaps, "tools/call", "fresh", map[string]any{"arguments": map[string]any{}}); textOf(d) != "ran" || lists() != n+1 {
		t.Fatalf("fresh, added after the list was cached: %+v %+v, %d upstream lists (want %d)", d.Result, d.Error, lists(), n+1)
	}
	// The new list is cached: a listed tool's call lists nothing.
	if d := g.gwCall("alice", urlCaps, "tools/call", "fresh", map[string]any{"arguments": map[string]any{}}); textOf(d) != "ran" || lists() != n+1 {
		t.Fatalf("fresh again: %+v, %d upstream lists (want %d)", d.Result, lists(), n+1)
	}
}

// TestGatewayToolsListTTL: the host may cache the tool list as long as
// the upstream allows, at most five minutes: ttlMs is min(upstream's,
// 300 000); 0 stays 0. The broker's own cache still answers a list whose
// ttl was 0 (no upstream request) until its five minutes are up.
func TestGatewayToolsListTTL(t *testing.T) {
	for _, c := range []struct{ upstream, host int }{{1000, 1000}, {600_000, maxToolsListTTL}, {0, 0}} {
		t.Run(fmt.Sprint(c.upstream), func(t *testing.T) {
			g, _ := connectedGateway(t, "tools")
			g.up.mu.Lock()
			g.up.listTTL = c.upstream
			g.up.mu.Unlock()
			d := g.gwCall("alice", urlCaps, "tools/list", "", nil)
			if d.Result["ttlMs"] != float64(c.host) || d.Result["cacheScope"] != "private" {
				t.Fatalf("upstream ttlMs %d: the host got ttlMs %v (%v), want %d", c.upstream, d.Result["ttlMs"], d.Result["cacheScope"], c.host)
			}
			if c.upstream != 0 {
				return
			}
			lists := func() int {
				g.up.mu.Lock()
				defer g.up.mu.Unlock()
				return g.up.methods["tools/list"]
			}
			n := lists()
			g.clock.Advance(time.Duration(maxToolsListTTL)*time.Millisecond - time.Second)
			if d := g.gwCall("alice", urlCaps, "tools/list", "", nil); lists() != n || d.Result["ttlMs"] != float64(0) {
				t.Fatalf("within five minutes: %d upstream lists, want %d; ttlMs %v", lists(), n, d.Result["ttlMs"])
			}
			g.clock.Advance(2 * time.Second)
			if g.gwCall("alice", urlCaps, "tools/list", "", nil); lists() != n+1 {
				t.Fatalf("after five minutes: %d upstream lists, want %d", lists(), n+1)
			}
		})
	}
}

// TestGatewayCallLimits: at most 8 calls of one person to one provider
// run at once and 600 start a minute; the next gets a tool error with a
// retry hint (and reaches no upstream), another person is not held back,
// and the same person may call again once a call ends or the minute is
// over.
func TestGatewayCallLimits(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	started, release := make(chan struct{}, maxInFlight+1), make(chan struct{})
	g.up.server.AddTool(&mcp.Tool{Name: "block", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
	// bob, connected too.
	d := g.gwCall("bob", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUpAs("bob", grantIDOf(t, link), "tools")

	var wg sync.WaitGroup
	texts := make(chan string, maxInFlight)
	for range maxInFlight {
		wg.Go(func() {
			r := g.do(rawCall{path: "/mcp/u/up", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "block"},
				body: modernBody(9, "tools/call", urlCaps, map[string]any{"name": "block", "arguments": map[string]any{}})})
			var d decoded
			_ = json.Unmarshal(r.body, &d)
			texts <- textOf(d)
		})
	}
	for range maxInFlight {
		<-started
	}
	calls := g.up.upstreamCalls()
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	if want := "Too many calls to Upstream are running for this person (8 at most); retry when one has finished."; d.Result["isError"] != true || textOf(d) != want {
		t.Fatalf("a ninth call at once: %+v %+v, want the tool error %q", d.Result, d.Error, want)
	}
	if g.up.upstreamCalls() != calls {
		t.Fatalf("the refused call reached the upstream")
	}
	if d := g.gwCall("bob", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); textOf(d) != "echo {}" {
		t.Fatalf("bob's call while alice has 8 running: %+v %+v", d.Result, d.Error)
	}
	close(release)
	wg.Wait()
	close(texts)
	for text := range texts {
		if text != "done" {
			t.Fatalf("a blocked call ended %q", text)
		}
	}
	// A call's answer is flushed before its handler lets go of its place
	// (the rest of the handler's work runs after): the eight have ended
	// once they no longer hold one.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		g.srv.gw.mu.Lock()
		held := 0
		for _, l := range g.srv.gw.limits {
			held += l.inFlight
		}
		g.srv.gw.mu.Unlock()
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls still hold their places 10 s after their answers", held)
		}
	}
	// 600 a minute: alice made 8 (and one refused, not counted); the
	// clock stands still, so the minute is the same.
	for i := maxInFlight; i < maxPerMinute; i++ {
		if d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); textOf(d) != "echo {}" {
			t.Fatalf("call %d of the minute: %+v %+v", i+1, d.Result, d.Error)
		}
	}
	calls = g.up.upstreamCalls()
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	if want := "Too many calls to Upstream this minute (600 at most); retry in 60 s."; d.Result["isError"] != true || textOf(d) != want {
		t.Fatalf("call 601 of the minute: %+v %+v, want the tool error %q", d.Result, d.Error, want)
	}
	g.clock.Advance(45 * time.Second)
	if d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); !strings.HasSuffix(textOf(d), "retry in 15 s.") {
		t.Fatalf("45 s later: %+v", d.Result)
	}
	if g.up.upstreamCalls() != calls {
		t.Fatalf("a refused call reached the upstream")
	}
	if d := g.gwCall("bob", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); textOf(d) != "echo {}" {
		t.Fatalf("bob's call while alice is over the minute's limit: %+v %+v", d.Result, d.Error)
	}
	g.clock.Advance(15 * time.Second)
	if d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); textOf(d) != "echo {}" {
		t.Fatalf("the next minute: %+v %+v", d.Result, d.Error)
	}
}

// TestGatewayUpstreamAnswers: what the host gets when the upstream
// answers badly. A JSON-RPC error is relayed with its code, its message
// cut to 1 KiB (valid UTF-8) and its data only when small; a call the
// upstream does not answer within call_timeout is a tool error saying
// so in seconds; an answer that is not MCP is a tool error that says the
// upstream did not answer as an MCP server.
func TestGatewayUpstreamAnswers(t *testing.T) {
	// call_timeout covers the session, the list and each call below, not
	// only stall's: 3 s, so that a busy machine does not turn a slow
	// error relay into the timeout.
	g := newGatewayHarnessWith(t, []string{"call_timeout: 3s"})
	call := func(name string) decoded {
		t.Helper()
		return g.gwCall("alice", urlCaps, "tools/call", name, map[string]any{"arguments": map[string]any{}})
	}
	_, link, _ := elicitation(t, call("echo"))
	g.connectUp(grantIDOf(t, link), "tools")
	long := strings.Repeat("é", 3000) // 6,000 bytes
	g.up.server.AddTool(&mcp.Tool{Name: "fail_long", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: -32001, Message: long, Data: json.RawMessage(`{"big":"` + strings.Repeat("d", 2000) + `"}`)}
		})
	g.up.server.AddTool(&mcp.Tool{Name: "fail_small", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: -32002, Message: "no such record", Data: json.RawMessage(`{"uri":"rec://1"}`)}
		})
	// stall answers when the test ends (the go-sdk's stateless server
	// waits for its handlers as the upstream server closes).
	unstall := make(chan struct{})
	t.Cleanup(func() { close(unstall) })
	g.up.server.AddTool(&mcp.Tool{Name: "stall", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, _ *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			select {
			case <-ctx.Done():
			case <-unstall:
			}
			return &mcp.CallToolResult{}, nil
		})
	d2 := call("fail_long")
	if d2.Error == nil {
		t.Fatalf("a 6,000-byte upstream error: %+v", d2.Result)
	}
	msg := d2.Error.Message
	if d2.Error.Code != -32001 || len(msg) > maxUpstreamError || !strings.HasPrefix(msg, "éééé") ||
		!strings.HasSuffix(msg, "…") || strings.ContainsRune(msg, '\uFFFD') || d2.Error.Data != nil {
		t.Fatalf("a 6,000-byte upstream error: %d bytes, %+v", len(msg), d2.Error)
	}
	if d2 := call("fail_small"); d2.Error == nil || d2.Error.Code != -32002 || d2.Error.Message != "no such record" ||
		string(d2.Error.Data) != `{"uri":"rec://1"}` {
		t.Fatalf("a small upstream error: %+v", d2.Error)
	}
	start := time.Now()
	d2 = call("stall")
	if want := "Upstream did not answer within 3 s. Nothing is known of the call's outcome; check before calling again."; d2.Result["isError"] != true || textOf(d2) != want {
		t.Fatalf("a call the upstream did not answer: %+v %+v, want the tool error %q", d2.Result, d2.Error, want)
	}
	if took := time.Since(start); took < 3*time.Second {
		t.Fatalf("the timeout came after %v", took)
	}
	// Not MCP: an HTML page where the answer should be.
	g.up.mu.Lock()
	g.up.intercept = at("/mcp", func(_ *testUpstream, w http.ResponseWriter, _ *http.Request, _ http.Handler) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html><body>Sign in</body></html>"))
	})(g.up)
	g.up.mu.Unlock()
	d2 = call("echo")
	if want := "Upstream could not be reached or did not answer as an MCP server. Try again later."; d2.Result["isError"] != true || textOf(d2) != want {
		t.Fatalf("an HTML answer: %+v %+v, want the tool error %q", d2.Result, d2.Error, want)
	}
}

// TestGatewayStateLivesTenMinutes: a gateway state carrying an
// upstream's own requestState is valid ten minutes at most, even when
// --state-ttl allows an hour: within them its retry is relayed, after
// them it gets the one -32602.
func TestGatewayStateLivesTenMinutes(t *testing.T) {
	g := newGatewayHarness(t, func(o *Options) { o.StateTTL = time.Hour })
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools")
	const caps = `{"elicitation":{"form":{},"url":{}}}`
	ask := func() string {
		t.Helper()
		d := g.gwCall("alice", caps, "tools/call", "ask", map[string]any{"arguments": map[string]any{}})
		st, _ := d.Result["requestState"].(string)
		if d.Result["resultType"] != "input_required" || st == "" {
			t.Fatalf("ask = %+v", d)
		}
		return st
	}
	retry := func(st string) decoded {
		return g.gwCall("alice", caps, "tools/call", "ask", map[string]any{"arguments": map[string]any{},
			"requestState": st, "inputResponses": map[string]any{"colour": map[string]any{"action": "accept", "content": map[string]any{"colour": "blue"}}}})
	}
	st := ask()
	g.clock.Advance(10*time.Minute - time.Second)
	if d := retry(st); textOf(d) != "you said blue" {
		t.Fatalf("the retry after 9 min 59 s: %+v %+v", d.Result, d.Error)
	}
	st = ask()
	g.clock.Advance(10*time.Minute + time.Second)
	if d := retry(st); d.Error == nil || d.Error.Code != codeInvalidParams || d.Error.Message != invalidState {
		t.Fatalf("the retry after 10 min 1 s: %+v %+v, want -32602 %q", d.Result, d.Error, invalidState)
	}
}

// TestToolsListNotCachedAcrossAChange: a tools list fetched before lists
// were forgotten (an upstream's list change heard meanwhile) is not
// cached after it: it may be the list before the change. One fetched
// after it is.
func TestToolsListNotCachedAcrossAChange(t *testing.T) {
	g := &gateway{}
	pr := vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	k := toolsKey{principal: pr, provider: "up", conn: "c1"}
	epoch := g.toolsEpochNow()
	g.forgetTools(pr, "up")
	g.cacheToolsList(k, cachedTools{body: []byte("old")}, epoch)
	if _, ok := g.tools[k]; ok {
		t.Fatal("a list fetched before the change was cached after it")
	}
	g.cacheToolsList(k, cachedTools{body: []byte("new")}, g.toolsEpochNow())
	if e, ok := g.tools[k]; !ok || string(e.body) != "new" {
		t.Fatal("a list fetched after the change was not cached")
	}
	// Another person's change forgets none of alice's lists, though a
	// fill of hers across it is fetched again next time.
	g.forgetTools(vault.Principal{Issuer: pr.Issuer, Subject: "bob"}, "up")
	if e, ok := g.tools[k]; !ok || string(e.body) != "new" {
		t.Fatal("bob's change dropped alice's list")
	}
}
