package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/testskip"
)

// TestGatewayReplicasRound2: an MRTR exchange of the gateway whose round 1
// replica a answers and whose round 2 (the retry carrying the
// requestState and the inputResponses) goes to replica b, on one
// PostgreSQL database. Two exchanges:
//
//   - the broker's own: alice's tools/call of echo at /mcp/u/demo-mcp
//     before she is connected gets the url elicitation of a connect link
//     from replica a; she connects in a browser on replica a; her retry
//     on replica b is relayed to the demo MCP server as alice-demo;
//   - the upstream's: a server that takes no token (auth: none) answers
//     a call with input_required (a form elicitation and its own
//     requestState); replica a relays it, its state sealed inside the
//     gateway's; the retry on replica b reaches the server with the
//     server's own state and alice's answer, and b relays the result.
//
// Before each genuine retry, replica b is sent the same retry with the
// requestState tampered (one character changed), and as bob with alice's
// requestState: each gets the one refusal, -32602 "Invalid or expired
// requestState", and reaches no upstream. Every request is pinned to its
// replica, and the balancer's count per replica says which one served it.
func TestGatewayReplicasRound2(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	asker := startAskingUpstream(t)
	s := newReplicaStackOpts(t, []string{"alice", "bob"}, replicaOptions{
		args: []string{"--upstream-allow-private", "--upstream-allow-unauthenticated"},
		providers: func(yaml string) string {
			return yaml + fmt.Sprintf("  asker:\n    display_name: Asker\n    type: mcp\n    mcp:\n      url: %s\n      auth: none\n", asker.url)
		},
	})
	ctx := testContext(t, 3*time.Minute)
	public := s.lb.srv.URL
	lbURL, _ := url.Parse(public)
	// host is user's host of provider p's endpoint; its requests reach
	// replica only.
	host := func(t *testing.T, user, p, replica string) *evHost {
		t.Helper()
		endpoint := public + "/mcp/u/" + p
		tok, _, err := s.idp.MintAccessToken(user, endpoint, nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return &evHost{endpoint: endpoint, token: tok,
			caps: map[string]any{"elicitation": map[string]any{"url": map[string]any{}, "form": map[string]any{}}},
			hc:   &http.Client{Timeout: time.Minute, Transport: pinTransport{host: lbURL.Host, replica: replica, next: s.lb.srv.Client().Transport}}}
	}
	fail := func(t *testing.T, format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nreplica a:\n%s\nreplica b:\n%s", append(args, grepLines(s.a.logs.String(), "{"), grepLines(s.b.logs.String(), "{"))...)
	}
	// call sends a tools/call through h and checks that replica alone
	// served it.
	call := func(t *testing.T, h *evHost, replica, tool string, args, extra map[string]any) gatewayReply {
		t.Helper()
		a, b := s.lb.hitsOf("a"), s.lb.hitsOf("b")
		params := map[string]any{"name": tool, "arguments": args}
		for k, v := range extra {
			params[k] = v
		}
		ans := h.postErr(ctx, "tools/call", params, nil)
		if ans.err != nil {
			fail(t, "tools/call %s on replica %s: %v", tool, replica, ans.err)
		}
		want := map[string]int64{"a": 0, "b": 0}
		want[replica] = 1
		if da, db := s.lb.hitsOf("a")-a, s.lb.hitsOf("b")-b; da != want["a"] || db != want["b"] {
			t.Errorf("tools/call %s pinned to replica %s: replica a served %d requests, b %d", tool, replica, da, db)
		}
		var r gatewayReply
		if err := json.Unmarshal(ans.final, &r); err != nil {
			fail(t, "tools/call %s on replica %s: HTTP %d, not JSON-RPC: %s", tool, replica, ans.status, ans.final)
		}
		r.raw = string(ans.final)
		return r
	}
	// refusedOnB sends alice's retry to replica b with her requestState
	// tampered, then as bob with her requestState intact: both get the one
	// -32602 "Invalid or expired requestState". reached reports how many
	// requests the upstream has seen.
	refusedOnB := func(t *testing.T, p, tool string, args, responses map[string]any, state string, reached func() int) {
		t.Helper()
		before := reached()
		for _, c := range []struct {
			name, user, state string
		}{
			{"tampered", "alice", tamper(state)},
			{"another person", "bob", state},
		} {
			r := call(t, host(t, c.user, p, "b"), "b", tool, args, map[string]any{"requestState": c.state, "inputResponses": responses})
			if r.Result != nil || r.Error == nil || r.Error.Code != -32602 || r.Error.Message != "Invalid or expired requestState" || len(r.Error.Data) > 0 {
				fail(t, "round 2 on replica b, %s: %s; want the error -32602 \"Invalid or expired requestState\" and nothing else", c.name, r.raw)
			}
		}
		if n := reached() - before; n != 0 {
			t.Errorf("the refused retries reached the upstream %d times", n)
		}
	}

	t.Run("connect link: round 1 on replica a, round 2 on replica b", func(t *testing.T) {
		args := map[string]any{"text": "round 2 on b"}
		echoes := func() int {
			n := 0
			for _, r := range s.mcp.Requests() {
				if r.Tool == "echo" {
					n++
				}
			}
			return n
		}
		first := call(t, host(t, "alice", "demo-mcp", "a"), "a", "echo", args, nil)
		key, req := first.onlyInput(t)
		if key != "connect_demo-mcp" || req.Method != "elicitation/create" || req.Params.Mode != "url" ||
			!strings.HasPrefix(req.Params.URL, public+"/connect/") || first.Result.RequestState == "" {
			fail(t, "round 1 on replica a: %s; want input_required with the url elicitation of a connect link and a requestState", first.raw)
		}
		hitsB := s.lb.hitsOf("b")
		br := &gwBrowser{c: s.browserOn("a")}
		if _, err := br.connect(ctx, req.Params.URL, "alice"); err != nil {
			fail(t, "alice connects in the browser on replica a: %v", err)
		}
		if n := s.lb.hitsOf("b") - hitsB; n != 0 {
			t.Fatalf("replica b served %d requests of the browser's", n)
		}
		accept := map[string]any{key: map[string]any{"action": "accept"}}
		refusedOnB(t, "demo-mcp", "echo", args, accept, first.Result.RequestState, echoes)

		before := echoes()
		done := call(t, host(t, "alice", "demo-mcp", "b"), "b", "echo", args,
			map[string]any{"requestState": first.Result.RequestState, "inputResponses": accept})
		if done.Error != nil || done.Result == nil || done.Result.ResultType == "input_required" || done.Result.IsError ||
			!strings.Contains(done.text(), "round 2 on b") || !strings.Contains(done.text(), "alice-demo") {
			fail(t, "round 2 on replica b: %s; want the demo MCP server's echo as alice-demo", done.raw)
		}
		if n := echoes() - before; n != 1 {
			t.Errorf("round 2 reached the demo MCP server %d times, want once", n)
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("the upstream's form elicitation: round 1 on replica a, round 2 on replica b", func(t *testing.T) {
		args := map[string]any{"about": "the sky"}
		first := call(t, host(t, "alice", "asker", "a"), "a", "ask", args, nil)
		key, req := first.onlyInput(t)
		if key != "colour" || req.Method != "elicitation/create" || req.Params.Mode != "form" || req.Params.Message != "Which colour?" ||
			first.Result.RequestState == "" || strings.Contains(first.Result.RequestState, askerState) {
			fail(t, "round 1 on replica a: %s; want input_required with the server's form elicitation and the gateway's sealed requestState", first.raw)
		}
		if calls := asker.seen(); len(calls) != 1 || calls[0].answered {
			t.Fatalf("round 1: the server saw %+v, want one call without answers", calls)
		}
		answer := map[string]any{key: map[string]any{"action": "accept", "content": map[string]any{"colour": "teal"}}}
		refusedOnB(t, "asker", "ask", args, answer, first.Result.RequestState, func() int { return len(asker.seen()) })

		done := call(t, host(t, "alice", "asker", "b"), "b", "ask", args,
			map[string]any{"requestState": first.Result.RequestState, "inputResponses": answer})
		if done.Error != nil || done.Result == nil || done.Result.ResultType == "input_required" || done.Result.IsError ||
			done.text() != "you said teal" {
			fail(t, "round 2 on replica b: %s; want the server's answer to teal", done.raw)
		}
		if calls := asker.seen(); len(calls) != 2 || calls[1] != (askCall{state: askerState, answered: true, colour: "teal"}) {
			t.Errorf("the server saw %+v; want round 2 with its own requestState and the answer teal", calls)
		}
	})
}

// gatewayReply is a JSON-RPC answer of the gateway to a tools/call.
type gatewayReply struct {
	Result *struct {
		ResultType    string                  `json:"resultType"`
		InputRequests map[string]inputRequest `json:"inputRequests"`
		RequestState  string                  `json:"requestState"`
		IsError       bool                    `json:"isError"`
		Content       []struct{ Type, Text string }
	} `json:"result"`
	Error *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
	raw string
}

// inputRequest is one of an input_required answer's requests.
type inputRequest struct {
	Method string `json:"method"`
	Params struct {
		Mode    string `json:"mode"`
		Message string `json:"message"`
		URL     string `json:"url"`
	} `json:"params"`
}

// onlyInput returns the one input request of an input_required answer.
func (r gatewayReply) onlyInput(t *testing.T) (string, inputRequest) {
	t.Helper()
	if r.Result == nil || r.Result.ResultType != "input_required" || len(r.Result.InputRequests) != 1 {
		t.Fatalf("want input_required with one input request, got %s", r.raw)
	}
	for k, v := range r.Result.InputRequests {
		return k, v
	}
	return "", inputRequest{}
}

// text is the text of the result's content.
func (r gatewayReply) text() string {
	if r.Result == nil {
		return ""
	}
	var parts []string
	for _, c := range r.Result.Content {
		parts = append(parts, c.Text)
	}
	return strings.Join(parts, "\n")
}

// tamper changes one character in the middle of a sealed requestState
// (to another of base64url's alphabet).
func tamper(state string) string {
	b := []byte(state)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}

// askerState is the requestState the asking server puts in its
// input_required answer.
const askerState = "asker-state-1"

// askingUpstream is an MCP server that takes no token (an auth: none
// entry's) whose tool ask answers a call without answers with
// input_required (SEP-2322): a form elicitation, "Which colour?", and
// its own requestState; a retry carrying both gets "you said <colour>".
// It keeps every call it saw.
type askingUpstream struct {
	url string

	mu    sync.Mutex // guards calls
	calls []askCall
}

// askCall is a call of ask as the server saw it.
type askCall struct {
	state    string // the requestState it carried
	answered bool   // it carried inputResponses["colour"]
	colour   string // the colour accepted there
}

func startAskingUpstream(t *testing.T) *askingUpstream {
	t.Helper()
	u := &askingUpstream{}
	server := mcp.NewServer(&mcp.Implementation{Name: "asker", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "ask", Description: "Asks a question first.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			c := askCall{state: req.Params.RequestState}
			if r, ok := req.Params.InputResponses["colour"]; ok {
				c.answered = true
				if er, ok := r.(*mcp.ElicitResult); ok && er.Action == "accept" {
					c.colour, _ = er.Content["colour"].(string)
				}
			}
			u.mu.Lock()
			u.calls = append(u.calls, c)
			u.mu.Unlock()
			switch {
			case !c.answered:
				return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"colour": &mcp.ElicitParams{Mode: "form", Message: "Which colour?",
					RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"colour": map[string]any{"type": "string"}}}}},
					RequestState: askerState}, nil
			case c.state != askerState || c.colour == "":
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "bad retry"}}, IsError: true}, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "you said " + c.colour}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true}))
	t.Cleanup(srv.Close)
	u.url = srv.URL + "/mcp"
	return u
}

// seen returns the calls so far.
func (u *askingUpstream) seen() []askCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]askCall(nil), u.calls...)
}
