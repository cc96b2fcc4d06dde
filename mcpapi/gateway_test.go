package mcpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// gatewayHarness is the harness with an mcp provider "up" (testUpstream)
// and the gateway mounted.
type gatewayHarness struct {
	*harness
	up *testUpstream
}

func newGatewayHarness(t *testing.T, mods ...harnessOpt) *gatewayHarness {
	t.Helper()
	return newGatewayHarnessWith(t, nil, mods...)
}

// newGatewayHarnessWith is newGatewayHarness with more settings of the
// entry's mcp block ("max_result_bytes: 1500").
func newGatewayHarnessWith(t *testing.T, mcpSettings []string, mods ...harnessOpt) *gatewayHarness {
	t.Helper()
	return newGatewayHarnessEntry(t, nil, mcpSettings, mods...)
}

// newGatewayHarnessEntry is newGatewayHarnessWith with more keys of the
// entry itself ("default_scopes: [tools, admin]").
func newGatewayHarnessEntry(t *testing.T, entry, mcpSettings []string, mods ...harnessOpt) *gatewayHarness {
	t.Helper()
	up := newTestUpstream(t)
	settings := append([]string{"url: " + up.url(), "tools: {deny: [hidden]}"}, mcpSettings...)
	if !slices.ContainsFunc(mcpSettings, func(s string) bool { return strings.HasPrefix(s, "call_timeout:") }) {
		settings = append(settings, "call_timeout: 5s")
	}
	var hh *harness
	h := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		var more string
		for _, line := range entry {
			more += "    " + line + "\n"
		}
		return `  up:
    display_name: Upstream
    type: mcp
    mcp: {` + strings.Join(settings, ", ") + `}
` + more
	}, append([]harnessOpt{func(o *Options) {
		o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens(),
			Logger: slog.New(slog.NewJSONHandler(hh.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	}}, mods...)...)
	return &gatewayHarness{harness: h, up: up}
}

// gwCall does a modern request to the gateway endpoint of "up".
func (g *gatewayHarness) gwCall(sub, caps, method, name string, params map[string]any) decoded {
	g.t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	if name != "" {
		if method == "resources/read" {
			params["uri"] = name
		} else {
			params["name"] = name
		}
	}
	hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer(sub), "MCP-Protocol-Version": versionModern, "Mcp-Method": method}
	if name != "" {
		hd["Mcp-Name"] = name
	}
	r := g.do(rawCall{path: "/mcp/u/up", headers: hd, body: modernBody(9, method, caps, params)})
	return decode(g.t, r.body)
}

func (g *gatewayHarness) gwBearer(sub string) string {
	return g.iss.token(g.t, tokenSpec{sub: sub, aud: publicURL + "/mcp/u/up", exp: g.clock.Now().Add(time.Hour)})
}

// connectUp completes connect request id for alice as the callback would,
// with tokens the upstream issued for scopes.
func (g *gatewayHarness) connectUp(id string, scopes ...string) vault.Connection {
	g.t.Helper()
	return g.connectUpAs("alice", id, scopes...)
}

// connectUpAs is connectUp for the person sub.
func (g *gatewayHarness) connectUpAs(sub, id string, scopes ...string) vault.Connection {
	g.t.Helper()
	ctx := context.Background()
	pr := g.principal(sub)
	gr, err := g.grants.Authorize(ctx, id, pr)
	if err != nil {
		g.t.Fatal(err)
	}
	at, rt := g.up.grant(scopes...)
	p, _ := g.conns.Providers().Lookup("up")
	c, err := g.conns.Save(ctx, pr, gr, p, provider.Exchanged{Account: provider.Account{ID: "up-" + sub, Login: sub + "@up"},
		Scopes: scopes, Token: vault.TokenSet{AccessToken: vault.Secret(at), RefreshToken: vault.Secret(rt), TokenType: "Bearer", Expiry: g.clock.Now().Add(time.Hour)}})
	if err != nil {
		g.t.Fatal(err)
	}
	return c
}

func toolNames(t testing.TB, d decoded) []string {
	t.Helper()
	tools, _ := d.Result["tools"].([]any)
	var out []string
	for _, x := range tools {
		out = append(out, x.(map[string]any)["name"].(string))
	}
	return out
}

func textOf(d decoded) string {
	c, _ := d.Result["content"].([]any)
	if len(c) == 0 {
		return ""
	}
	s, _ := c[0].(map[string]any)["text"].(string)
	return s
}

// TestGatewayRelay: an unconnected person sees the placeholder and is
// asked to connect by any call; after connecting, the same call is
// relayed with the upstream token (never the host's), the upstream's tools
// are listed (filtered, sanitised), its input_required reaches the host
// wrapped, a 401 is cured by one forced refresh that sends resource, and a
// second one asks to reconnect.
func TestGatewayRelay(t *testing.T) {
	g := newGatewayHarness(t)
	// Unconnected: one placeholder tool, private, not cached.
	d := g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if names := toolNames(t, d); !slices.Equal(names, []string{"connect_account"}) || d.Result["ttlMs"] != float64(0) || d.Result["cacheScope"] != "private" {
		t.Fatalf("unconnected tools/list = %+v", d.Result)
	}
	// The other lists are empty, and private too.
	for _, m := range []string{"prompts/list", "resources/list", "resources/templates/list"} {
		if d := g.gwCall("alice", urlCaps, m, "", nil); d.Error != nil || d.Result["cacheScope"] != "private" {
			t.Fatalf("unconnected %s = %+v %+v", m, d.Result, d.Error)
		}
	}
	// Any call asks to connect.
	args := map[string]any{"arguments": map[string]any{"x": 1}}
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", args)
	key, link, state := elicitation(t, d)
	if key != "connect_up" {
		t.Fatalf("key %q", key)
	}
	// Without url elicitation: -32021.
	if d := g.gwCall("alice", `{}`, "tools/call", "echo", args); d.Error == nil || d.Error.Code != codeMissingCapability {
		t.Fatalf("no url capability: %+v", d)
	}
	conn := g.connectUp(grantIDOf(t, link), "tools")
	// The retry is the original call, relayed.
	retry := map[string]any{"arguments": map[string]any{"x": 1}, "requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}}
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", retry)
	if got := textOf(d); got != `echo {"x":1}` || d.Result["resultType"] != "complete" {
		t.Fatalf("relayed retry = %+v", d)
	}
	// Connected: the upstream's tools, private, with the upstream's ttl
	// (0: ask again each time; TestGatewayToolsListTTL has the others).
	d = g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if names := toolNames(t, d); !slices.Equal(names, []string{"admin", "ask", "echo", "link", "route", "slow"}) || d.Result["ttlMs"] != float64(0) || d.Result["cacheScope"] != "private" {
		t.Fatalf("connected tools/list = %v %+v", names, d.Result)
	}
	// The placeholder says connected.
	if d := g.gwCall("alice", urlCaps, "tools/call", "connect_account", nil); !strings.Contains(textOf(d), "alice@up") {
		t.Fatalf("placeholder after connecting: %+v", d)
	}
	// The upstream's own input_required, wrapped.
	d = g.gwCall("alice", `{"elicitation":{"form":{},"url":{}}}`, "tools/call", "ask", map[string]any{"arguments": map[string]any{}})
	if d.Result["resultType"] != "input_required" {
		t.Fatalf("ask = %+v", d)
	}
	irs := d.Result["inputRequests"].(map[string]any)
	upState := d.Result["requestState"].(string)
	if _, ok := irs["colour"]; !ok || strings.Contains(upState, "upstream-state-1") {
		t.Fatalf("upstream input not relayed as is, or its state not sealed: %+v", d.Result)
	}
	// Verbatim: the request is the upstream's, member for member
	// (TestGatewayInputRequestsVerbatim has members the go-sdk does not
	// know).
	var sent any
	_ = json.Unmarshal([]byte(`{"colour":{"method":"elicitation/create","params":{"mode":"form","message":"Which colour?",
		"requestedSchema":{"type":"object","properties":{"colour":{"type":"string"}}}}}}`), &sent)
	if !reflect.DeepEqual(d.Result["inputRequests"], sent) {
		t.Fatalf("upstream input relayed as %v, want %v", d.Result["inputRequests"], sent)
	}
	d = g.gwCall("alice", `{"elicitation":{"form":{},"url":{}}}`, "tools/call", "ask", map[string]any{"arguments": map[string]any{},
		"requestState": upState, "inputResponses": map[string]any{"colour": map[string]any{"action": "accept", "content": map[string]any{"colour": "blue"}}}})
	if got := textOf(d); got != "you said blue" {
		t.Fatalf("ask retry = %+v", d)
	}
	// A host that cannot answer a form does not get it.
	d = g.gwCall("alice", `{"elicitation":{"url":{}}}`, "tools/call", "ask", map[string]any{"arguments": map[string]any{}})
	if d.Result["isError"] != true || !strings.Contains(textOf(d), "elicitation.form") {
		t.Fatalf("form to a url-only host: %+v", d)
	}
	// A state for another tool, or tampered: -32602.
	for _, bad := range []map[string]any{
		{"arguments": map[string]any{}, "requestState": upState, "name": "echo"},
		{"arguments": map[string]any{}, "requestState": tamperMiddle(upState)},
		{"arguments": map[string]any{"other": true}, "requestState": upState},
	} {
		name := "ask"
		if n, ok := bad["name"].(string); ok {
			name = n
			delete(bad, "name")
		}
		if d := g.gwCall("alice", urlCaps, "tools/call", name, bad); d.Error == nil || d.Error.Code != codeInvalidParams || d.Error.Message != invalidState {
			t.Fatalf("bad state %v: %+v", bad, d)
		}
	}
	// Bob's token never reaches alice's connection: he is asked to connect.
	if d := g.gwCall("bob", urlCaps, "tools/call", "echo", args); d.Result["resultType"] != "input_required" {
		t.Fatalf("bob: %+v", d)
	}
	// 401: one forced refresh (with resource), then the call goes through.
	full, _ := g.store.GetConnection(context.Background(), conn.ID)
	g.up.revoke(full.Token.AccessToken.Reveal())
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", args)
	if got := textOf(d); got != `echo {"x":1}` {
		t.Fatalf("after a revoked access token: %+v %+v\n%s", d, d.Error, g.logs.String())
	}
	g.up.mu.Lock()
	refreshes, resources := g.up.refreshes, slices.Clone(g.up.resources)
	g.up.mu.Unlock()
	if refreshes != 1 || resources[0] != g.up.url() {
		t.Fatalf("refreshes %d, resources %v", refreshes, resources)
	}
	// A second 401 right after the refresh: needs_reconnect, and the same
	// call asks to connect again.
	full, _ = g.store.GetConnection(context.Background(), conn.ID)
	g.up.revoke(full.Token.AccessToken.Reveal())
	g.up.mu.Lock()
	g.up.refuseRefresh = true
	g.up.mu.Unlock()
	d = g.gwCall("alice", urlCaps, "tools/call", "echo", args)
	if _, link, _ := elicitation(t, d); !strings.Contains(messageOf(t, d), "for scopes tools.") {
		t.Fatalf("after the grant died: %+v (%s)", d, link)
	}
	if c, _ := g.store.GetConnection(context.Background(), conn.ID); c.Status != vault.StatusNeedsReconnect {
		t.Fatalf("connection %s, want needs_reconnect", c.Status)
	}
	// No token of the upstream's appears in anything a host saw, and no
	// host token reached the upstream.
	g.up.mu.Lock()
	seen := slices.Clone(g.up.seenAuth)
	g.up.mu.Unlock()
	for _, a := range seen {
		if a != "" && !strings.HasPrefix(a, "Bearer up-access-") {
			t.Fatalf("the upstream saw %q", a)
		}
	}
}

// TestGatewayStepUp: a 403 insufficient_scope asks the person to connect
// again for the union of the held and the challenged scopes; the same
// connection is upgraded.
func TestGatewayStepUp(t *testing.T) {
	g := newGatewayHarness(t)
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	conn := g.connectUp(grantIDOf(t, link), "tools")
	d = g.gwCall("alice", urlCaps, "tools/call", "admin", map[string]any{"arguments": map[string]any{}})
	key, link, state := elicitation(t, d)
	gr, err := g.grants.Authorize(context.Background(), grantIDOf(t, link), g.principal("alice"))
	if err != nil || !slices.Equal(gr.Scopes, []string{"tools", "admin"}) {
		t.Fatalf("step-up grant %+v %v", gr, err)
	}
	up := g.connectUp(gr.ID, "tools", "admin")
	if up.ID != conn.ID {
		t.Fatalf("step-up made connection %s, want %s upgraded", up.ID, conn.ID)
	}
	d = g.gwCall("alice", urlCaps, "tools/call", "admin", map[string]any{"arguments": map[string]any{}, "requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	if textOf(d) != "admin done" {
		t.Fatalf("after the step-up: %+v", d)
	}
}

// TestGatewayRouting: an unknown or non-MCP provider is 404 with a
// JSON-RPC body; a token for /mcp does not open a gateway endpoint; the
// endpoint's metadata names its own resource; provider_request refuses an
// MCP provider naming its endpoint.
func TestGatewayRouting(t *testing.T) {
	g := newGatewayHarness(t)
	for _, path := range []string{"/mcp/u/nope", "/mcp/u/github"} {
		r := g.do(rawCall{path: path, headers: map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + g.gwBearer("alice")},
			body: modernBody(1, "tools/list", urlCaps, nil)})
		if d := decode(t, r.body); r.status != 404 || d.Error == nil {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
	hd := g.modernHeaders("alice", "tools/list", "") // a token for /mcp
	r := g.do(rawCall{path: "/mcp/u/up", headers: hd, body: modernBody(1, "tools/list", urlCaps, nil)})
	if r.status != 401 || !strings.Contains(r.header.Get("WWW-Authenticate"), "/.well-known/oauth-protected-resource/mcp/u/up") {
		t.Fatalf("a /mcp token at the gateway: %d %s %s", r.status, r.header.Get("WWW-Authenticate"), r.body)
	}
	r = g.do(rawCall{path: "/.well-known/oauth-protected-resource/mcp/u/up", method: "GET"})
	var md map[string]any
	if json.Unmarshal(r.body, &md) != nil || md["resource"] != publicURL+"/mcp/u/up" {
		t.Fatalf("metadata %s", r.body)
	}
	_, d := g.callTool("alice", urlCaps, toolRequest, map[string]any{"provider": "up", "method": "GET", "path": "/x"}, nil)
	if d.Result["isError"] != true || !strings.Contains(textOf(d), "up is an MCP provider: use "+publicURL+"/mcp/u/up") {
		t.Fatalf("provider_request to an MCP provider: %+v", d)
	}
}

// messageOf is the message of d's one input request.
func messageOf(t testing.TB, d decoded) string {
	t.Helper()
	for _, v := range d.Result["inputRequests"].(map[string]any) {
		m, _ := v.(map[string]any)["params"].(map[string]any)["message"].(string)
		return m
	}
	return ""
}

// connected returns a gateway harness whose alice is connected to "up"
// with scopes.
func connectedGateway(t *testing.T, scopes ...string) (*gatewayHarness, vault.Connection) {
	g := newGatewayHarness(t)
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	return g, g.connectUp(grantIDOf(t, link), scopes...)
}

// decodedMessage is any JSON-RPC message.
type decodedMessage struct {
	Method string         `json:"method"`
	Params map[string]any `json:"params"`
	Result map[string]any `json:"result"`
	Error  map[string]any `json:"error"`
}

// TestGatewayProgress: a host that asks for progress gets an event stream
// as the call runs: each of the upstream's progress notifications arrives
// (under the host's own token; the upstream saw a token the broker minted;
// messages sanitised) before the upstream goes on, then the result.
func TestGatewayProgress(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	seen := make(chan struct{})
	g.up.mu.Lock()
	g.up.progressSeen = seen
	g.up.mu.Unlock()
	body := modernBody(3, "tools/call", urlCaps, map[string]any{"name": "slow", "arguments": map[string]any{}})
	body = strings.Replace(body, `"_meta":{`, `"_meta":{"progressToken":"host-tok-1",`, 1)
	req, _ := http.NewRequest(http.MethodPost, g.http.URL+"/mcp/u/up", strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "slow"} {
		req.Header.Set(k, v)
	}
	resp, err := g.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var progress []float64
	var last decodedMessage
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var m decodedMessage
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		if m.Method == "notifications/progress" {
			if m.Params["progressToken"] != "host-tok-1" || strings.ContainsRune(m.Params["message"].(string), '\u202e') {
				t.Fatalf("progress relayed as %+v", m.Params)
			}
			progress = append(progress, m.Params["progress"].(float64))
			seen <- struct{}{} // the upstream goes on only now
			continue
		}
		last = m
	}
	if !slices.Equal(progress, []float64{1, 2}) || last.Result == nil || !strings.Contains(fmt.Sprint(last.Result["content"]), "slow done") {
		t.Fatalf("progress %v, last event %+v", progress, last)
	}
	g.up.mu.Lock()
	tokens := slices.Clone(g.up.progressTokens)
	g.up.progressSeen = nil
	g.up.mu.Unlock()
	if len(tokens) != 1 || tokens[0] == "host-tok-1" || !strings.HasPrefix(fmt.Sprint(tokens[0]), "cb-") {
		t.Fatalf("the upstream got progress tokens %v", tokens)
	}
	// Without a progress token: a plain JSON answer.
	d := g.gwCall("alice", urlCaps, "tools/call", "slow", map[string]any{"arguments": map[string]any{}})
	if textOf(d) != "slow done" {
		t.Fatalf("without progress: %+v", d)
	}
}

// TestGatewayToolsListCached: the upstream's list is fetched once per
// ttl for one person and connection; another person, or the same person
// after a step-up, fetches again.
func TestGatewayToolsListCached(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	lists := func() int {
		g.up.mu.Lock()
		defer g.up.mu.Unlock()
		return g.up.methods["tools/list"]
	}
	first := g.gwCall("alice", urlCaps, "tools/list", "", nil)
	n := lists()
	second := g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if lists() != n || !reflect.DeepEqual(first.Result, second.Result) {
		t.Fatalf("second list went upstream (%d → %d) or differs", n, lists())
	}
	g.clock.Advance(time.Duration(maxToolsListTTL)*time.Millisecond + time.Second)
	d := g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if lists() != n+1 || len(toolNames(t, d)) != 6 {
		t.Fatalf("after the ttl: %d lists, want %d: %+v", lists(), n+1, d)
	}
	// A step-up is another grant: another list.
	d = g.gwCall("alice", urlCaps, "tools/call", "admin", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools", "admin")
	g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if lists() != n+2 {
		t.Fatalf("after the step-up: %d lists, want %d", lists(), n+2)
	}
}

// TestGatewayRelayedCapabilities: every request relayed for a 2026-07-28
// host (lists as well as calls) declares to the upstream the host's
// capabilities within what the entry relays (up relays elicitation and
// sampling, not roots), never the broker's own: a host that declared
// nothing is relayed as declaring nothing.
func TestGatewayRelayedCapabilities(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	all := `{"elicitation":{"url":{}},"sampling":{},"roots":{}}`
	relayed := `{"elicitation":{"url":{}},"sampling":{}}`
	for _, c := range []struct{ caps, method, name, want string }{
		{all, "tools/list", "", relayed},
		{all, "tools/call", "echo", relayed},
		{all, "resources/list", "", relayed},
		{`{}`, "resources/templates/list", "", `{}`},
		{`{}`, "tools/call", "echo", `{}`},
	} {
		var params map[string]any
		if c.method == "tools/call" {
			params = map[string]any{"arguments": map[string]any{}}
		}
		g.gwCall("alice", c.caps, c.method, c.name, params)
		g.up.mu.Lock()
		got := g.up.caps[c.method]
		g.up.mu.Unlock()
		var gv, wv any
		_ = json.Unmarshal(got, &gv)
		_ = json.Unmarshal([]byte(c.want), &wv)
		if !reflect.DeepEqual(gv, wv) {
			t.Errorf("%s for a host declaring %s: the upstream saw capabilities %s, want %s", c.method, c.caps, got, c.want)
		}
	}
}

// TestGatewayParamHeaders: a 2026-07-28 host's Mcp-Param headers (SEP-2243)
// must say what the call's arguments say, for the tools the upstream marks
// x-mcp-header: a missing, extra, badly encoded or different header is
// refused with 400 and -32020 and nothing reaches the upstream; the
// upstream's request carries the header written from the arguments, also
// when its session is new and has not listed the tools (the go-sdk's
// client writes it only for tools its session has listed).
func TestGatewayParamHeaders(t *testing.T) {
	g, conn := connectedGateway(t, "tools")
	call := func(args map[string]any, headers map[string]string) (int, decoded) {
		t.Helper()
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "route"}
		maps.Copy(hd, headers)
		r := g.do(rawCall{path: "/mcp/u/up", headers: hd, body: modernBody(9, "tools/call", urlCaps, map[string]any{"name": "route", "arguments": args})})
		return r.status, decode(t, r.body)
	}
	regions := func() []string {
		g.up.mu.Lock()
		defer g.up.mu.Unlock()
		return slices.Clone(g.up.regions)
	}
	for _, c := range []struct {
		name    string
		args    map[string]any
		headers map[string]string
		problem string // "" when the call goes through
	}{
		{"missing", map[string]any{"region": "eu"}, nil, "missing Mcp-Param-Region header"},
		{"different", map[string]any{"region": "eu"}, map[string]string{"Mcp-Param-Region": "us"}, "does not match"},
		{"bad Base64 padding", map[string]any{"region": "Hello"}, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8?="}, "not valid Base64"},
		{"bad Base64 characters", map[string]any{"region": "Hello"}, map[string]string{"Mcp-Param-Region": "=?base64?SGVs!!!bG8=?="}, "not valid Base64"},
		{"for an absent argument", map[string]any{}, map[string]string{"Mcp-Param-Region": "eu"}, "unexpected Mcp-Param-Region header"},
		{"for a null argument", map[string]any{"region": nil}, map[string]string{"Mcp-Param-Region": "eu"}, "unexpected Mcp-Param-Region header"},
		{"plain", map[string]any{"region": "eu", "n": 2}, map[string]string{"Mcp-Param-Region": "eu"}, ""},
		{"Base64", map[string]any{"region": "Hello"}, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8=?="}, ""},
		{"literal without the suffix", map[string]any{"region": "=?base64?SGVsbG8="}, map[string]string{"Mcp-Param-Region": "=?base64?SGVsbG8="}, ""},
		{"absent argument, no header", map[string]any{}, nil, ""},
	} {
		before := len(regions())
		status, d := call(c.args, c.headers)
		if c.problem != "" {
			if status != http.StatusBadRequest || d.Error == nil || d.Error.Code != codeHeaderMismatch || !strings.Contains(d.Error.Message, c.problem) {
				t.Errorf("%s: HTTP %d %+v, want 400 -32020 saying %q", c.name, status, d.Error, c.problem)
			}
			if len(regions()) != before {
				t.Errorf("%s: the refused call reached the upstream", c.name)
			}
			continue
		}
		if status != http.StatusOK || d.Error != nil || !strings.HasPrefix(textOf(d), "routed") {
			t.Errorf("%s: HTTP %d %+v %q, want the upstream's answer", c.name, status, d.Error, textOf(d))
		}
	}
	want := []string{"eu", "Hello", "=?base64?SGVsbG8=", ""}
	if got := regions(); !slices.Equal(got, want) {
		t.Fatalf("the upstream got Mcp-Param-Region %q, want %q", got, want)
	}
	// A new upstream session, which has listed nothing; the gateway's
	// list is cached.
	g.srv.opts.Upstreams.Forget(mcpup.Target{Provider: "up", URL: g.up.url(), Conn: conn.ID})
	if status, d := call(map[string]any{"region": "ap"}, map[string]string{"Mcp-Param-Region": "ap"}); status != http.StatusOK || d.Error != nil {
		t.Fatalf("after a new session: HTTP %d %+v %q", status, d.Error, textOf(d))
	}
	if got := regions(); got[len(got)-1] != "ap" {
		t.Fatalf("after a new session the upstream got Mcp-Param-Region %q, want ap", got[len(got)-1])
	}
}

// TestGatewayUpstreamLinks: a 2025-11-25-style -32042 from the upstream
// reaches a 2026-07-28 host as input_required url entries; the retry calls
// the upstream again.
func TestGatewayUpstreamLinks(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	d := g.gwCall("alice", urlCaps, "tools/call", "link", map[string]any{"arguments": map[string]any{}})
	key, u, state := elicitation(t, d)
	if key != "upstream_link_1" || u != "https://upstream.example/authorise" {
		t.Fatalf("links relayed as %q %q", key, u)
	}
	d = g.gwCall("alice", urlCaps, "tools/call", "link", map[string]any{"arguments": map[string]any{}, "requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	if textOf(d) != "linked" {
		t.Fatalf("retry: %+v", d)
	}
	// A host without url elicitation is told which capability it lacks.
	g.up.mu.Lock()
	g.up.links = 0
	g.up.mu.Unlock()
	if d := g.gwCall("alice", `{"elicitation":{"form":{}}}`, "tools/call", "link", map[string]any{"arguments": map[string]any{}}); d.Result["isError"] != true || !strings.Contains(textOf(d), "elicitation.url") {
		t.Fatalf("no url capability: %+v", d)
	}
	// Only https links of at most 2 KiB without user info are relayed:
	// anything else is a tool error that names no link.
	for _, bad := range []string{"http://127.0.0.1:9/authorise", "https://user@upstream.example/authorise",
		"https://upstream.example/" + strings.Repeat("a", 2048), "javascript:alert(1)"} {
		g.up.mu.Lock()
		g.up.links, g.up.linkURL = 0, bad
		g.up.mu.Unlock()
		d := g.gwCall("alice", urlCaps, "tools/call", "link", map[string]any{"arguments": map[string]any{}})
		if d.Result["isError"] != true || !strings.Contains(textOf(d), "a link the broker does not relay") || strings.Contains(textOf(d), bad) ||
			d.Result["inputRequests"] != nil {
			t.Fatalf("link %.40q relayed: %+v", bad, d)
		}
	}
}

// TestGatewayListChanged: a modern host listening on the endpoint gets
// notifications/tools/list_changed when its person connects (not when
// another person does), only what the endpoint honours is acknowledged,
// and EndStreams ends the stream with its result.
func TestGatewayListChanged(t *testing.T) {
	g := newGatewayHarness(t)
	body := modernBody(5, "subscriptions/listen", urlCaps, map[string]any{"notifications": map[string]any{"toolsListChanged": true, "promptsListChanged": true}})
	req, _ := http.NewRequest(http.MethodPost, g.http.URL+"/mcp/u/up", strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": "subscriptions/listen"} {
		req.Header.Set(k, v)
	}
	resp, err := g.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("listen answered %d %s: %s", resp.StatusCode, ct, b)
	}
	events := make(chan decodedMessage)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m decodedMessage
				if json.Unmarshal([]byte(data), &m) == nil {
					events <- m
				}
			}
		}
	}()
	next := func() decodedMessage {
		t.Helper()
		select {
		case m := <-events:
			return m
		case <-time.After(30 * time.Second):
			t.Fatal("no event within 30 s")
		}
		return decodedMessage{}
	}
	ack := next()
	if ack.Method != "notifications/subscriptions/acknowledged" || fmt.Sprint(ack.Params["notifications"]) != "map[toolsListChanged:true]" ||
		ack.Params["_meta"].(map[string]any)[mcp.MetaKeySubscriptionID] != float64(5) {
		t.Fatalf("ack %+v", ack)
	}
	connect := func(sub string) {
		d := g.gwCall(sub, urlCaps, "tools/call", "connect_account", map[string]any{"arguments": map[string]any{}})
		key, link, state := elicitation(t, d)
		id := grantIDOf(t, link)
		gr, err := g.grants.Authorize(context.Background(), id, g.principal(sub))
		if err != nil {
			t.Fatal(err)
		}
		at, rt := g.up.grant("tools")
		p, _ := g.conns.Providers().Lookup("up")
		if _, err := g.conns.Save(context.Background(), g.principal(sub), gr, p, provider.Exchanged{Account: provider.Account{ID: "up-" + sub, Login: sub + "@up"},
			Scopes: []string{"tools"}, Token: vault.TokenSet{AccessToken: vault.Secret(at), RefreshToken: vault.Secret(rt), TokenType: "Bearer", Expiry: g.clock.Now().Add(time.Hour)}}); err != nil {
			t.Fatal(err)
		}
		d = g.gwCall(sub, urlCaps, "tools/call", "connect_account", map[string]any{"arguments": map[string]any{}, "requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		if !strings.Contains(textOf(d), sub+"@up") {
			t.Fatalf("%s's placeholder after connecting: %+v", sub, d)
		}
	}
	connect("bob")
	connect("alice")
	if m := next(); m.Method != "notifications/tools/list_changed" || m.Params["_meta"].(map[string]any)[mcp.MetaKeySubscriptionID] != float64(5) {
		t.Fatalf("after connecting: %+v", m)
	}
	g.srv.EndStreams()
	if m := next(); m.Result == nil || m.Result["resultType"] != "complete" {
		t.Fatalf("the stream's end: %+v", m)
	}
	if m, ok := <-events; ok {
		t.Fatalf("after the result: %+v", m)
	}
}

// TestGatewayUpstreamListChanged: a host listening at the endpoint hears
// the upstream's own list changes: its tools (the person's cached list is
// dropped, so the next tools/list has the new tool), and its prompts,
// which the endpoint honours because the upstream declares them with
// listChanged; the endpoint's discover says so. A stream that did not ask
// for prompts hears no prompt change.
func TestGatewayUpstreamListChanged(t *testing.T) {
	g := newGatewayHarness(t)
	// The upstream says its lists stay fresh for ten minutes: a change it
	// announces must still show at once (the go-sdk's client keeps a
	// list that long on the session that fetched it).
	g.up.mu.Lock()
	g.up.listTTL = 600_000
	g.up.mu.Unlock()
	noArgs := func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return &mcp.GetPromptResult{}, nil
	}
	g.up.server.AddPrompt(&mcp.Prompt{Name: "first"}, noArgs)
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools")
	caps := g.gwCall("alice", urlCaps, "server/discover", "", nil).Result["capabilities"].(map[string]any)
	if fmt.Sprint(caps["tools"]) != "map[listChanged:true]" || fmt.Sprint(caps["prompts"]) != "map[listChanged:true]" {
		t.Fatalf("discover declares %v", caps)
	}
	before := toolNames(t, g.gwCall("alice", urlCaps, "tools/list", "", nil))
	all := g.listen(t, 5, map[string]any{"toolsListChanged": true, "promptsListChanged": true})
	toolsOnly := g.listen(t, 6, map[string]any{"toolsListChanged": true})
	if n := fmt.Sprint(all.next().Params["notifications"]); n != "map[promptsListChanged:true toolsListChanged:true]" {
		t.Fatalf("ack honours %s", n)
	}
	toolsOnly.next()
	g.up.server.AddTool(&mcp.Tool{Name: "late", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	for _, st := range []*listenStream{all, toolsOnly} {
		if m := st.next(); m.Method != "notifications/tools/list_changed" {
			t.Fatalf("after a tool was added: %+v", m)
		}
	}
	if after := toolNames(t, g.gwCall("alice", urlCaps, "tools/list", "", nil)); len(after) != len(before)+1 || !slices.Contains(after, "late") {
		t.Fatalf("tools/list after the change: %v (before: %v)", after, before)
	}
	promptNames := func() []string {
		d := g.gwCall("alice", urlCaps, "prompts/list", "", nil)
		var names []string
		for _, p := range d.Result["prompts"].([]any) {
			names = append(names, p.(map[string]any)["name"].(string))
		}
		return names
	}
	if names := promptNames(); !slices.Equal(names, []string{"first"}) {
		t.Fatalf("prompts before the change: %v", names)
	}
	g.up.server.AddPrompt(&mcp.Prompt{Name: "second"}, noArgs)
	if m := all.next(); m.Method != "notifications/prompts/list_changed" {
		t.Fatalf("after a prompt was added: %+v", m)
	}
	if names := promptNames(); !slices.Equal(names, []string{"first", "second"}) {
		t.Fatalf("prompts after the change: %v", names)
	}
	g.srv.EndStreams()
	for _, st := range []*listenStream{all, toolsOnly} {
		if m := st.next(); m.Result == nil || m.Result["resultType"] != "complete" {
			t.Fatalf("the stream's end: %+v (a prompt change reached the stream that did not ask for it?)", m)
		}
	}
}

// listenStream is a host's subscriptions/listen stream at the endpoint.
type listenStream struct {
	t      *testing.T
	events chan decodedMessage
}

// listen opens alice's subscriptions/listen stream (id) at "up".
func (g *gatewayHarness) listen(t *testing.T, id int, notifications map[string]any) *listenStream {
	t.Helper()
	body := modernBody(id, "subscriptions/listen", urlCaps, map[string]any{"notifications": notifications})
	req, _ := http.NewRequest(http.MethodPost, g.http.URL+"/mcp/u/up", strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": "subscriptions/listen"} {
		req.Header.Set(k, v)
	}
	resp, err := g.http.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("listen answered %d %s: %s", resp.StatusCode, ct, b)
	}
	st := &listenStream{t: t, events: make(chan decodedMessage, 16)}
	go func() {
		defer close(st.events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m decodedMessage
				if json.Unmarshal([]byte(data), &m) == nil {
					st.events <- m
				}
			}
		}
	}()
	return st
}

func (st *listenStream) next() decodedMessage {
	st.t.Helper()
	select {
	case m := <-st.events:
		return m
	case <-time.After(30 * time.Second):
		st.t.Fatal("no event within 30 s")
	}
	return decodedMessage{}
}

// TestGatewayLimits: an upstream's untrusted answers get the documented
// answers: a list of 1,001 tools is relayed up to 1,000 (the rest logged);
// a tool whose schema is over 64 KiB is dropped and logged by name; a
// result over max_result_bytes (4 MiB by default) is a tool error naming
// the limit and the setting an operator can raise (mcp.max_result_bytes
// of the entry) that relays none of it, to either era, and the endpoint
// answers the next call.
// TestGatewayHeldStream: an upstream that keeps its event stream open
// after the answer does not hold up the host's answer (sized, so nothing
// waits for its end); once the streams end, the calls go on.
func TestGatewayHeldStream(t *testing.T) {
	release := make(chan struct{})
	held := newFixedUpstream(t, func() {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
	})
	var hh *harness
	g := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		return `  held:
    type: mcp
    mcp: {url: ` + held + `, auth: none}
`
	}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
	call := func(id int) {
		t.Helper()
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization":        "Bearer " + g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/held", exp: g.clock.Now().Add(time.Hour)}),
			"MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "test_simple_text"}
		start := time.Now()
		r := g.do(rawCall{path: "/mcp/u/held", headers: hd, body: modernBody(id, "tools/call", urlCaps, map[string]any{"name": "test_simple_text", "arguments": map[string]any{}})})
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("call %d answered after %v, with the upstream's stream", id, d)
		}
		if d := decode(t, r.body); r.status != http.StatusOK || d.Error != nil || textOf(d) != "This is a simple text response for testing." {
			t.Fatalf("call %d: HTTP %d %s", id, r.status, r.body)
		}
		if r.header.Get("Content-Length") != fmt.Sprint(len(r.body)) {
			t.Errorf("call %d: Content-Length %q for %d bytes", id, r.header.Get("Content-Length"), len(r.body))
		}
	}
	call(1)
	call(2) // while the first call's stream is still open
	close(release)
	call(3)
}

func TestGatewayLimits(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "big", Version: "1"}, &mcp.ServerOptions{PageSize: 2000})
	for i := range 1001 {
		server.AddTool(&mcp.Tool{Name: fmt.Sprintf("t%04d", i), InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
	}
	huge := `{"type":"object","description":"` + strings.Repeat("x", 65<<10) + `"}`
	server.AddTool(&mcp.Tool{Name: "a_huge_schema", InputSchema: json.RawMessage(huge)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	server.AddTool(&mcp.Tool{Name: "a_big_result", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("y", 5<<20)}}}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, DisableLocalhostProtection: true})
	up := httptest.NewServer(h)
	t.Cleanup(up.Close)
	var hh *harness
	g := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		return `  big:
    type: mcp
    mcp: {url: ` + up.URL + `/mcp, auth: none}
`
	}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
	call := func(method, name string, params map[string]any) decoded {
		if params == nil {
			params = map[string]any{}
		}
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization":        "Bearer " + g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/big", exp: g.clock.Now().Add(time.Hour)}),
			"MCP-Protocol-Version": versionModern, "Mcp-Method": method}
		if name != "" {
			hd["Mcp-Name"] = name
			params["name"] = name
		}
		return decode(t, g.do(rawCall{path: "/mcp/u/big", headers: hd, body: modernBody(1, method, urlCaps, params)}).body)
	}
	names := toolNames(t, call("tools/list", "", nil))
	if len(names) != maxTools || slices.Contains(names, "a_huge_schema") || names[0] != "a_big_result" {
		t.Fatalf("%d tools listed (first %v), want %d without the huge schema", len(names), names[:2], maxTools)
	}
	if !strings.Contains(g.logs.String(), "more tools than the broker relays") {
		t.Errorf("the dropped tools were not logged")
	}
	if logs := g.logs.String(); !strings.Contains(logs, "schemas are over 64 KiB were dropped") || !strings.Contains(logs, `"tools":["a_huge_schema"]`) {
		t.Errorf("the dropped schema was not logged by name")
	}
	d := call("tools/call", "a_big_result", map[string]any{"arguments": map[string]any{}})
	if d.Result["isError"] != true || !strings.Contains(textOf(d), "more than 4194304 bytes") || !strings.Contains(textOf(d), `mcp.max_result_bytes of the "big" entry`) ||
		strings.Contains(textOf(d), "yyyy") {
		t.Fatalf("a 5 MiB result: %.300v", d)
	}
	// A 2025-11-25 host gets the same answer.
	r := g.do(rawCall{path: "/mcp/u/big", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization":        "Bearer " + g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/big", exp: g.clock.Now().Add(time.Hour)}),
		"MCP-Protocol-Version": versionLegacy}, body: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a_big_result","arguments":{}}}`})
	if d := decode(t, r.body); d.Result["isError"] != true || !strings.Contains(textOf(d), "more than 4194304 bytes") ||
		!strings.Contains(textOf(d), `mcp.max_result_bytes of the "big" entry`) || len(r.body) > 4096 {
		t.Fatalf("a 5 MiB result to a 2025-11-25 host: %d bytes, %.300s", len(r.body), r.body)
	}
	if d := call("tools/call", "t0000", map[string]any{"arguments": map[string]any{}}); d.Error != nil || d.Result["isError"] == true {
		t.Fatalf("the call after the oversized result: %+v", d)
	}
}
