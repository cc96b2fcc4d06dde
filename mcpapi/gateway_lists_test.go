package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/telemetry"
	"credbroker/provider/mcpup"
	"credbroker/vault"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// listMethods are the methods that list (and complete): they never ask
// the person anything.
var listMethods = []string{"tools/list", "prompts/list", "resources/list", "resources/templates/list", "completion/complete"}

// completeParams are the params of a completion/complete request.
func completeParams() map[string]any {
	return map[string]any{"ref": map[string]any{"type": "ref/prompt", "name": "p1"}, "argument": map[string]any{"name": "a", "value": "x"}}
}

// refuseLists makes u refuse every request of listMethods with status
// (403 insufficient_scope for "tools admin", or 401) unless its token
// holds the scope admin, counting the refusals in n.
func refuseLists(u *testUpstream, status int, n *atomic.Int64) func(w http.ResponseWriter, r *http.Request, next http.Handler) {
	return refuseMethods(u, listMethods, status, n)
}

// refuseMethods is refuseLists for the requests of methods.
func refuseMethods(u *testUpstream, methods []string, status int, n *atomic.Int64) func(w http.ResponseWriter, r *http.Request, next http.Handler) {
	return func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		m := peekRPC(r)
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		u.mu.Lock()
		admin := slices.Contains(u.tokens[tok], "admin")
		u.mu.Unlock()
		if r.URL.Path != "/mcp" || !slices.Contains(methods, m.Method) || admin {
			next.ServeHTTP(w, r)
			return
		}
		n.Add(1)
		meta := u.srv.URL + "/.well-known/oauth-protected-resource/mcp"
		if status == http.StatusForbidden {
			w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="tools admin", resource_metadata="`+meta+`"`)
			http.Error(w, `{"error":"insufficient_scope"}`, http.StatusForbidden)
			return
		}
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", resource_metadata="`+meta+`"`)
		http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
	}
}

// peekedRPC is what peekRPC read of a request.
type peekedRPC struct {
	ID     json.RawMessage
	Method string
	Params struct{ Name string }
	body   []byte
}

// peekRPC reads r's JSON-RPC message (its id, method and params' name;
// the zero value for anything else) and puts the body back for the next
// handler.
func peekRPC(r *http.Request) peekedRPC {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var m peekedRPC
	_ = json.Unmarshal(body, &m)
	m.body = body
	return m
}

// legacySession initializes a 2025-11-25 host of sub's at "up" (declaring
// url elicitation when url) and returns what sends its requests.
func (g *gatewayHarness) legacySession(sub string, url bool) func(method string, params map[string]any) decoded {
	g.t.Helper()
	caps := `{}`
	if url {
		caps = `{"elicitation":{"url":{}}}`
	}
	headers := func(session string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + g.gwBearer(sub), "MCP-Protocol-Version": versionLegacy, "Mcp-Session-Id": session}
	}
	init := g.do(rawCall{path: "/mcp/u/up", headers: headers(""), body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":` +
		caps + `,"clientInfo":{"name":"legacy-host","version":"1"}}}`})
	session := init.header.Get("Mcp-Session-Id")
	if session == "" {
		g.t.Fatalf("legacy initialize: %d %s", init.status, init.body)
	}
	return func(method string, params map[string]any) decoded {
		g.t.Helper()
		if params == nil {
			params = map[string]any{}
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": method, "params": params})
		return decode(g.t, g.do(rawCall{path: "/mcp/u/up", headers: headers(session), body: string(body)}).body)
	}
}

// checkPlaceholder fails unless d is the unconnected tools/list: the
// placeholder alone, not to be kept (ttlMs 0), private.
func checkPlaceholder(t *testing.T, what string, d decoded) {
	t.Helper()
	if names := toolNames(t, d); d.Error != nil || !slices.Equal(names, []string{placeholderTool}) || d.Result["ttlMs"] != float64(0) || d.Result["cacheScope"] != "private" {
		t.Fatalf("%s: %+v %+v, want the placeholder alone with ttlMs 0 and cacheScope private", what, d.Result, d.Error)
	}
}

// checkEmptyList fails unless d is the unconnected answer to list method
// m: an empty list (or completion), complete, private for a 2026-07-28
// host.
func checkEmptyList(t *testing.T, what, m string, d decoded, modern bool) {
	t.Helper()
	key := map[string]string{"prompts/list": "prompts", "resources/list": "resources", "resources/templates/list": "resourceTemplates"}[m]
	var items []any
	var ok bool
	if m == "completion/complete" {
		c, _ := d.Result["completion"].(map[string]any)
		items, ok = c["values"].([]any)
	} else {
		items, ok = d.Result[key].([]any)
	}
	if d.Error != nil || !ok || len(items) != 0 || d.Result["inputRequests"] != nil || modern && (d.Result["resultType"] != "complete" || d.Result["cacheScope"] != "private" && m != "completion/complete") {
		t.Fatalf("%s %s: %+v %+v, want an empty list", what, m, d.Result, d.Error)
	}
}

// connectedText is the placeholder's answer once alice is connected to
// "up".
const connectedText = "Connected to Upstream as alice@up. Upstream's own tools are listed now: list the tools again to see them."

// upstreamTools are the tools the upstream lists (hidden is denied).
var upstreamTools = []string{"admin", "ask", "echo", "link", "route", "slow"}

// TestGatewayListScopeRefused: issue 31's "unconnected (also missing
// scopes)" when only the upstream knows the scopes are missing: a
// connection the broker holds ready, whose lists the upstream refuses
// with 403 insufficient_scope. Listed five times in both eras, tools/list
// is the placeholder (ttlMs 0, private), the other lists and completion
// are empty (no input_required, which a list may not answer), and no
// connect request is started nor step-up spent. The person's call of
// connect_account asks the upstream first and, refused, answers with the
// step-up's url elicitation for the union of the held and the challenged
// scopes, naming the added one (-32042 to a 2025-11-25 host) instead of
// "Connected"; once the same connection is upgraded, the retry answers
// connected and the lists are the upstream's. Only connect_account's
// calls spent step-ups.
func TestGatewayListScopeRefused(t *testing.T) {
	g, conn := connectedGateway(t, "tools")
	g.withAudit(g.client)
	var refusals atomic.Int64
	g.up.mu.Lock()
	g.up.intercept = refuseLists(g.up, http.StatusForbidden, &refusals)
	g.up.mu.Unlock()
	ctx := context.Background()
	grants := func() int {
		gs, err := g.store.ListGrants(ctx, g.principal("alice"), time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return len(gs)
	}
	before := grants()
	legacy := g.legacySession("alice", true)
	for range 5 {
		checkPlaceholder(t, "tools/list refused", g.gwCall("alice", urlCaps, "tools/list", "", nil))
		checkPlaceholder(t, "2025-11-25 tools/list refused", legacy("tools/list", nil))
		for _, m := range listMethods[1:] {
			params := func() map[string]any {
				if m == "completion/complete" {
					return completeParams()
				}
				return nil
			}
			checkEmptyList(t, "refused", m, g.gwCall("alice", urlCaps, m, "", params()), true)
			checkEmptyList(t, "2025-11-25 refused", m, legacy(m, params()), false)
		}
	}
	if refusals.Load() < 50 {
		t.Fatalf("the upstream refused %d lists, want every one of the 50 asked", refusals.Load())
	}
	if n := grants() - before; n != 0 {
		t.Fatalf("the refused lists started %d connect requests", n)
	}
	if n := len(auditEvents(t, g.logs.String(), telemetry.EventStepUp)); n != 0 {
		t.Fatalf("the refused lists spent %d step-ups", n)
	}
	// A 2025-11-25 host's connect_account: the step-up's link, -32042.
	d := legacy("tools/call", map[string]any{"name": placeholderTool, "arguments": map[string]any{}})
	if d.Error == nil || d.Error.Code != -32042 || !strings.Contains(string(d.Error.Data), publicURL+"/connect/") {
		t.Fatalf("2025-11-25 connect_account after a 403: %+v %+v, want -32042 with the step-up's link", d.Result, d.Error)
	}
	// A 2026-07-28 host's: the step-up's url elicitation.
	g.stepUpByConnect(conn)
	if names := toolNames(t, g.gwCall("alice", urlCaps, "tools/list", "", nil)); !slices.Equal(names, upstreamTools) {
		t.Fatalf("tools/list after the step-up: %v, want %v", names, upstreamTools)
	}
	if names := toolNames(t, legacy("tools/list", nil)); !slices.Equal(names, upstreamTools) {
		t.Fatalf("2025-11-25 tools/list after the step-up: %v, want %v", names, upstreamTools)
	}
	if n := len(auditEvents(t, g.logs.String(), telemetry.EventStepUp)); n != 2 {
		t.Fatalf("%d step-ups, want 2 (the two calls of connect_account)", n)
	}
}

// stepUpByConnect calls connect_account as alice's 2026-07-28 host, wants
// the step-up's url elicitation naming the scope admin, grants it
// (conn upgraded to tools and admin), and calls connect_account again
// with the answer: "connected".
func (g *gatewayHarness) stepUpByConnect(conn vault.Connection) {
	t := g.t
	t.Helper()
	d := g.gwCall("alice", urlCaps, "tools/call", placeholderTool, nil)
	if d.Result == nil || d.Result["resultType"] != "input_required" {
		t.Fatalf("connect_account: %+v %+v, want the step-up's url elicitation", d.Result, d.Error)
	}
	key, link, state := elicitation(t, d)
	if msg := messageOf(t, d); !strings.Contains(msg, "lacks the scopes admin") {
		t.Fatalf("the step-up's message %q does not name the added scope", msg)
	}
	gr, err := g.grants.Authorize(context.Background(), grantIDOf(t, link), g.principal("alice"))
	if err != nil || !slices.Equal(gr.Scopes, []string{"tools", "admin"}) {
		t.Fatalf("step-up grant %+v %v, want scopes tools admin", gr, err)
	}
	if up := g.connectUp(gr.ID, "tools", "admin"); up.ID != conn.ID {
		t.Fatalf("the step-up made connection %s, want %s upgraded", up.ID, conn.ID)
	}
	d = g.gwCall("alice", urlCaps, "tools/call", placeholderTool, map[string]any{"requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	if textOf(d) != connectedText || d.Result["isError"] == true {
		t.Fatalf("connect_account after the step-up: %+v %+v, want %q", d.Result, d.Error, connectedText)
	}
}

// TestGatewayOtherListRefused: an upstream that lists its tools but
// refuses its prompts for want of a scope: prompts/list is empty (and
// asks nothing), and connect_account, though the connection is ready and
// its tools listed, asks the person to step up rather than saying
// connected; after the step-up the prompts are listed.
func TestGatewayOtherListRefused(t *testing.T) {
	g, conn := connectedGateway(t, "tools")
	g.up.server.AddPrompt(&mcp.Prompt{Name: "greet"}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{}, nil
	})
	var refusals atomic.Int64
	g.up.mu.Lock()
	g.up.intercept = refuseMethods(g.up, []string{"prompts/list"}, http.StatusForbidden, &refusals)
	g.up.mu.Unlock()

	checkEmptyList(t, "refused", "prompts/list", g.gwCall("alice", urlCaps, "prompts/list", "", nil), true)
	if names := toolNames(t, g.gwCall("alice", urlCaps, "tools/list", "", nil)); !slices.Equal(names, upstreamTools) {
		t.Fatalf("tools/list: %v, want %v", names, upstreamTools)
	}
	g.stepUpByConnect(conn)
	d := g.gwCall("alice", urlCaps, "prompts/list", "", nil)
	prompts, _ := d.Result["prompts"].([]any)
	if len(prompts) != 1 || prompts[0].(map[string]any)["name"] != "greet" {
		t.Fatalf("prompts/list after the step-up: %+v %+v", d.Result, d.Error)
	}
	if refusals.Load() < 2 {
		t.Fatalf("the upstream refused %d prompts/list requests, want the host's and connect_account's", refusals.Load())
	}
}

// TestGatewayOtherListsAsked: connect_account on a ready connection asks
// the upstream only for the lists its capabilities name (none for a
// server with tools alone), and goes past a list that fails for another
// reason than a refusal (prompts/list answering an internal error) to one
// that is refused (resources/list, 403 insufficient_scope): the step-up,
// after which the resources are listed.
func TestGatewayOtherListsAsked(t *testing.T) {
	t.Run("tools alone", func(t *testing.T) {
		g, _ := connectedGateway(t, "tools")
		if d := g.gwCall("alice", urlCaps, "tools/call", placeholderTool, nil); textOf(d) != connectedText {
			t.Fatalf("connect_account: %+v %+v, want %q", d.Result, d.Error, connectedText)
		}
		g.up.mu.Lock()
		defer g.up.mu.Unlock()
		for _, m := range listMethods[1:4] {
			if n := g.up.methods[m]; n != 0 {
				t.Errorf("the upstream, which has no prompts or resources, was asked %s %d times", m, n)
			}
		}
	})
	t.Run("a failing list, then a refused one", func(t *testing.T) {
		g, conn := connectedGateway(t, "tools")
		g.up.server.AddPrompt(&mcp.Prompt{Name: "greet"}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{}, nil
		})
		g.up.server.AddResource(&mcp.Resource{Name: "doc", URI: "test://doc"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{}, nil
		})
		var refusals atomic.Int64
		refuse := refuseMethods(g.up, []string{"resources/list"}, http.StatusForbidden, &refusals)
		g.up.mu.Lock()
		g.up.intercept = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
			if m := peekRPC(r); m.Method == "prompts/list" {
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"error":{"code":-32603,"message":"broken"}}`))
				return
			}
			refuse(w, r, next)
		}
		g.up.mu.Unlock()
		g.stepUpByConnect(conn)
		d := g.gwCall("alice", urlCaps, "resources/list", "", nil)
		if rs, _ := d.Result["resources"].([]any); len(rs) != 1 {
			t.Fatalf("resources/list after the step-up: %+v %+v", d.Result, d.Error)
		}
		if refusals.Load() != 1 {
			t.Fatalf("the upstream refused %d resources/list requests, want connect_account's one", refusals.Load())
		}
	})
}

// TestGatewayListUnauthorized: a list the upstream answers 401 again
// after the forced refresh marks the connection needs_reconnect, asking
// nobody (no connect request), and is the placeholder; the next lists are
// the placeholder without asking the upstream; connect_account asks to
// reconnect with a url elicitation.
func TestGatewayListUnauthorized(t *testing.T) {
	g, conn := connectedGateway(t, "tools")
	var refusals atomic.Int64
	g.up.mu.Lock()
	g.up.intercept = refuseLists(g.up, http.StatusUnauthorized, &refusals)
	g.up.mu.Unlock()
	ctx := context.Background()
	gs, _ := g.store.ListGrants(ctx, g.principal("alice"), time.Time{})
	checkPlaceholder(t, "tools/list answered 401", g.gwCall("alice", urlCaps, "tools/list", "", nil))
	if c, _ := g.store.GetConnection(ctx, conn.ID); c.Status != vault.StatusNeedsReconnect {
		t.Fatalf("connection %s after the second 401, want needs_reconnect", c.Status)
	}
	if after, _ := g.store.ListGrants(ctx, g.principal("alice"), time.Time{}); len(after) != len(gs) {
		t.Fatalf("the refused list started %d connect requests", len(after)-len(gs))
	}
	n := refusals.Load()
	checkPlaceholder(t, "tools/list needing a reconnect", g.gwCall("alice", urlCaps, "tools/list", "", nil))
	checkEmptyList(t, "needing a reconnect", "prompts/list", g.gwCall("alice", urlCaps, "prompts/list", "", nil), true)
	if refusals.Load() != n {
		t.Fatalf("the lists of a connection needing a reconnect asked the upstream")
	}
	d := g.gwCall("alice", urlCaps, "tools/call", placeholderTool, nil)
	if _, link, _ := elicitation(t, d); link == "" || !strings.Contains(messageOf(t, d), "for scopes tools.") {
		t.Fatalf("connect_account needing a reconnect: %+v", d)
	}
}

// TestGatewayPlaceholderStates: the placeholder is listed (ttlMs 0,
// private, both eras) for a connection marked needs_reconnect and for one
// lacking scopes the entry's default_scopes require, without asking the
// upstream; connected, its call answers the account and that the
// upstream's tools are listed.
func TestGatewayPlaceholderStates(t *testing.T) {
	lists := func(u *testUpstream) int {
		u.mu.Lock()
		defer u.mu.Unlock()
		return u.methods["tools/list"]
	}
	t.Run("needs_reconnect", func(t *testing.T) {
		g, conn := connectedGateway(t, "tools")
		if d := g.gwCall("alice", urlCaps, "tools/call", placeholderTool, nil); textOf(d) != connectedText {
			t.Fatalf("connect_account connected: %+v %+v, want %q", d.Result, d.Error, connectedText)
		}
		if _, err := g.store.UpdateConnection(context.Background(), conn.ID, func(c vault.Connection) (vault.Connection, error) {
			c.Status = vault.StatusNeedsReconnect
			return c, nil
		}); err != nil {
			t.Fatal(err)
		}
		n := lists(g.up)
		checkPlaceholder(t, "needs_reconnect", g.gwCall("alice", urlCaps, "tools/list", "", nil))
		checkPlaceholder(t, "2025-11-25 needs_reconnect", g.legacyRequest("alice", "tools/list", nil))
		if lists(g.up) != n {
			t.Fatal("the upstream was asked for the list of a connection needing a reconnect")
		}
	})
	t.Run("missing scopes", func(t *testing.T) {
		g := newGatewayHarnessEntry(t, []string{"default_scopes: [tools, admin]"}, nil)
		d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
		_, link, _ := elicitation(t, d)
		g.connectUp(grantIDOf(t, link), "tools") // the server granted less than asked
		n := lists(g.up)
		checkPlaceholder(t, "missing scopes", g.gwCall("alice", urlCaps, "tools/list", "", nil))
		checkPlaceholder(t, "2025-11-25 missing scopes", g.legacyRequest("alice", "tools/list", nil))
		if lists(g.up) != n {
			t.Fatal("the upstream was asked for the list of a connection lacking scopes")
		}
	})
}

// TestGatewayReservedToolName: an upstream tool named connect_account
// (the name of the endpoint's own tool, which a call of it always
// reaches) is not listed, in either era, and its drop is logged; the
// call of connect_account is the endpoint's and never reaches the
// upstream.
func TestGatewayReservedToolName(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	g.up.server.AddTool(&mcp.Tool{Name: placeholderTool, InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "the upstream's own connect_account"}}}, nil
		})
	if names := toolNames(t, g.gwCall("alice", urlCaps, "tools/list", "", nil)); !slices.Equal(names, upstreamTools) {
		t.Fatalf("tools/list: %v, want %v", names, upstreamTools)
	}
	if names := toolNames(t, g.legacyRequest("alice", "tools/list", nil)); !slices.Equal(names, upstreamTools) {
		t.Fatalf("2025-11-25 tools/list: %v, want %v", names, upstreamTools)
	}
	if !strings.Contains(g.logs.String(), "an upstream tool named connect_account was dropped") {
		t.Errorf("the dropped tool was not logged")
	}
	calls := g.up.upstreamCalls()
	if d := g.gwCall("alice", urlCaps, "tools/call", placeholderTool, nil); textOf(d) != connectedText {
		t.Fatalf("connect_account: %+v %+v, want %q", d.Result, d.Error, connectedText)
	}
	if g.up.upstreamCalls() != calls {
		t.Fatal("connect_account reached the upstream")
	}
}

// TestGatewayRelaysCursorsAndCompletion: issue 31's "cursors verbatim"
// and "completion 1:1": an upstream that pages its tools, prompts,
// resources and templates two at a time gets back the very cursor it
// gave, which the host got as it was, and the host's completion request
// reaches it with the same ref and argument and answers with the same
// completion; for hosts of both eras, to upstreams of both eras.
func TestGatewayRelaysCursorsAndCompletion(t *testing.T) {
	for _, legacyUp := range []bool{false, true} {
		t.Run(fmt.Sprint("legacy upstream ", legacyUp), func(t *testing.T) {
			opts := &mcp.ServerOptions{PageSize: 2, CompletionHandler: func(_ context.Context, req *mcp.CompleteRequest) (*mcp.CompleteResult, error) {
				return &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{
					Values: []string{req.Params.Ref.Name + "/" + req.Params.Argument.Name + "=" + req.Params.Argument.Value, "two"}, Total: 7, HasMore: true}}, nil
			}}
			if legacyUp {
				opts.SupportedProtocolVersions = []string{versionLegacy}
			}
			server := mcp.NewServer(&mcp.Implementation{Name: "paged", Version: "1"}, opts)
			for i := 1; i <= 3; i++ {
				server.AddTool(&mcp.Tool{Name: fmt.Sprintf("t%d", i), InputSchema: json.RawMessage(`{"type":"object"}`)},
					func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
						return &mcp.CallToolResult{}, nil
					})
				server.AddPrompt(&mcp.Prompt{Name: fmt.Sprintf("p%d", i)}, func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
					return &mcp.GetPromptResult{}, nil
				})
				server.AddResource(&mcp.Resource{Name: fmt.Sprintf("r%d", i), URI: fmt.Sprintf("test://r%d", i)},
					func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
						return &mcp.ReadResourceResult{}, nil
					})
				server.AddResourceTemplate(&mcp.ResourceTemplate{Name: fmt.Sprintf("rt%d", i), URITemplate: fmt.Sprintf("test://rt%d/{x}", i)},
					func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
						return &mcp.ReadResourceResult{}, nil
					})
			}
			handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
				&mcp.StreamableHTTPOptions{Stateless: !legacyUp, JSONResponse: true, DisableLocalhostProtection: true})
			// The upstream's record: the cursor of each request and the
			// nextCursor of each answer, and the completion params it got.
			var mu sync.Mutex
			var gotCursor, gaveCursor string
			var gotComplete json.RawMessage
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				var req struct {
					Method string
					Params json.RawMessage
				}
				_ = json.Unmarshal(body, &req)
				rec := httptest.NewRecorder()
				handler.ServeHTTP(rec, r)
				var ans struct {
					Result struct {
						NextCursor string `json:"nextCursor"`
					}
				}
				_ = json.Unmarshal(rec.Body.Bytes(), &ans)
				var p struct{ Cursor string }
				_ = json.Unmarshal(req.Params, &p)
				mu.Lock()
				if strings.HasSuffix(req.Method, "/list") {
					gotCursor, gaveCursor = p.Cursor, ans.Result.NextCursor
				}
				if req.Method == "completion/complete" {
					gotComplete = req.Params
				}
				mu.Unlock()
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(rec.Body.Bytes())
			}))
			t.Cleanup(up.Close)
			var hh *harness
			g := newHarnessExtra(t, func(h *harness, _ string) string {
				hh = h
				return `  paged:
    type: mcp
    mcp: {url: ` + up.URL + `/mcp, auth: none}
`
			}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
			send := func(legacyHost bool, method string, params map[string]any) decoded {
				t.Helper()
				hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
					"Authorization":        "Bearer " + g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/paged", exp: g.clock.Now().Add(time.Hour)}),
					"MCP-Protocol-Version": versionModern, "Mcp-Method": method}
				var body string
				if legacyHost {
					hd["MCP-Protocol-Version"], hd["Mcp-Method"] = versionLegacy, ""
					b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
					body = string(b)
				} else {
					body = modernBody(1, method, urlCaps, params)
				}
				return decode(t, g.do(rawCall{path: "/mcp/u/paged", headers: hd, body: body}).body)
			}
			for _, legacyHost := range []bool{false, true} {
				for _, m := range listMethods[:4] {
					what := fmt.Sprintf("%s (legacy host %v)", m, legacyHost)
					first := send(legacyHost, m, map[string]any{})
					mu.Lock()
					gave := gaveCursor
					mu.Unlock()
					cursor, _ := first.Result["nextCursor"].(string)
					if first.Error != nil || cursor == "" || cursor != gave {
						t.Fatalf("%s: first page %+v %+v: nextCursor %q, the upstream gave %q", what, first.Result, first.Error, cursor, gave)
					}
					second := send(legacyHost, m, map[string]any{"cursor": cursor})
					mu.Lock()
					got := gotCursor
					mu.Unlock()
					if second.Error != nil || got != cursor || second.Result["nextCursor"] != nil {
						t.Fatalf("%s: second page %+v %+v: the upstream got cursor %q, want %q", what, second.Result, second.Error, got, cursor)
					}
				}
				d := send(legacyHost, "completion/complete", completeParams())
				want := map[string]any{"values": []any{"p1/a=x", "two"}, "total": float64(7), "hasMore": true}
				mu.Lock()
				var gotParams map[string]any
				_ = json.Unmarshal(gotComplete, &gotParams)
				mu.Unlock()
				delete(gotParams, "_meta")
				if d.Error != nil || !reflect.DeepEqual(d.Result["completion"], want) || !reflect.DeepEqual(gotParams, completeParams()) {
					t.Fatalf("completion (legacy host %v): the host got %+v %+v, want %v; the upstream got %v, want %v",
						legacyHost, d.Result, d.Error, want, gotParams, completeParams())
				}
			}
		})
	}
}
