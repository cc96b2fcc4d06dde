package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/provider/mcpup"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestGatewayLegacyHostModernInput: issue 31's legacy ↔ modern cell: an
// upstream's input_required reaches a 2025-11-25 host as a tool error
// saying it needs a 2026-07-28 client, with nothing of the request.
func TestGatewayLegacyHostModernInput(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	calls := g.up.upstreamCalls()
	d := g.legacyCall("alice", "ask")
	if d.Result["isError"] != true || !strings.Contains(textOf(d), "Upstream asks for more input before it can answer, which needs a 2026-07-28 client") ||
		d.Result["inputRequests"] != nil || strings.Contains(fmt.Sprint(d.Result), "Which colour") {
		t.Fatalf("a 2025-11-25 host's call answered input_required: %+v %+v", d.Result, d.Error)
	}
	if g.up.upstreamCalls() != calls+1 {
		t.Fatalf("the upstream got %d calls, want 1", g.up.upstreamCalls()-calls)
	}
}

// TestGatewayLegacyLinks: issue 31's legacy ↔ legacy cell: a 2025-11-25
// upstream's -32042 reaches a 2025-11-25 host that declared url
// elicitation as the same error, its messages sanitised, only with https
// links of at most 2 KiB without user info. An http link, one with user
// info, one of 2 KiB + 1, a null entry or no entry at all is the tool
// error a 2026-07-28 host gets, naming no link; a host that did not
// declare url elicitation (or has no session) gets a tool error naming
// the capability.
func TestGatewayLegacyLinks(t *testing.T) {
	var mu sync.Mutex
	data := ""
	server := mcp.NewServer(&mcp.Implementation{Name: "legacy", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{versionLegacy}})
	server.AddTool(&mcp.Tool{Name: "link", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			mu.Lock()
			defer mu.Unlock()
			return nil, &jsonrpc.Error{Code: mcp.CodeURLElicitationRequired, Message: "Open\u202e the link\u200b", Data: json.RawMessage(data)}
		})
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{DisableLocalhostProtection: true}))
	t.Cleanup(up.Close)
	var hh *harness
	g := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		return `  lg:
    type: mcp
    display_name: Legacy
    mcp: {url: ` + up.URL + `/mcp, auth: none}
`
	}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
	headers := func(session string) map[string]string {
		return map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization":        "Bearer " + g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/lg", exp: g.clock.Now().Add(time.Hour)}),
			"MCP-Protocol-Version": versionLegacy, "Mcp-Session-Id": session}
	}
	session := func(caps string) string {
		r := g.do(rawCall{path: "/mcp/u/lg", headers: headers(""), body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":` +
			caps + `,"clientInfo":{"name":"legacy-host","version":"1"}}}`})
		if r.header.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize: %d %s", r.status, r.body)
		}
		return r.header.Get("Mcp-Session-Id")
	}
	urlHost, formHost := session(`{"elicitation":{"url":{}}}`), session(`{"elicitation":{"form":{}}}`)
	call := func(session, links string) (decoded, string) {
		t.Helper()
		mu.Lock()
		data = links
		mu.Unlock()
		r := g.do(rawCall{path: "/mcp/u/lg", headers: headers(session), body: `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"link","arguments":{}}}`})
		return decode(t, r.body), string(r.body)
	}
	entry := func(url string) string {
		return `{"mode":"url","message":"Authorise\u202e the app\u200b","url":` + quoteJSON(url) + `,"elicitationId":"e1"}`
	}
	long := "https://upstream.example/" + strings.Repeat("a", 2048-len("https://upstream.example/"))
	for _, ok := range []string{"https://upstream.example/authorise", long} {
		d, _ := call(urlHost, `{"elicitations":[`+entry(ok)+`]}`)
		want := `{"elicitations":[{"mode":"url","message":"Authorise the app","url":` + quoteJSON(ok) + `,"elicitationId":"e1"}]}`
		if d.Error == nil {
			t.Fatalf("a %d-byte https link: %+v, want -32042", len(ok), d.Result)
		}
		var got, wantV any
		_ = json.Unmarshal(d.Error.Data, &got)
		_ = json.Unmarshal([]byte(want), &wantV)
		if d.Error.Code != mcp.CodeURLElicitationRequired || d.Error.Message != "Open the link" || !reflect.DeepEqual(got, wantV) {
			t.Fatalf("a %d-byte https link: %d %q %s, want -32042 %q with %s", len(ok), d.Error.Code, d.Error.Message, d.Error.Data, "Open the link", want)
		}
	}
	refused := "Legacy asked the person to open a link the broker does not relay (only https links of at most 2 KiB without user info). Nothing was done."
	for _, c := range []struct{ name, links, says string }{
		{"http", `{"elicitations":[` + entry("http://127.0.0.1:9/authorise") + `]}`, refused},
		{"user info", `{"elicitations":[` + entry("https://user@upstream.example/authorise") + `]}`, refused},
		{"2 KiB + 1", `{"elicitations":[` + entry(long+"a") + `]}`, refused},
		{"null entry", `{"elicitations":[null]}`, refused},
		{"one good, one null", `{"elicitations":[` + entry("https://upstream.example/authorise") + `,null]}`, refused},
		{"no entry", `{"elicitations":[]}`, "Legacy asked for a browser step without a link the broker can relay. Nothing was done."},
	} {
		d, body := call(urlHost, c.links)
		if d.Result["isError"] != true || textOf(d) != c.says || strings.Contains(body, "upstream.example") || strings.Contains(body, "127.0.0.1") {
			t.Fatalf("%s: %s, want the tool error %q naming no link", c.name, body, c.says)
		}
	}
	for _, s := range []string{formHost, ""} {
		d, body := call(s, `{"elicitations":[`+entry("https://upstream.example/authorise")+`]}`)
		if d.Result["isError"] != true || !strings.Contains(textOf(d), "declared the capability elicitation.url") || strings.Contains(body, "upstream.example") {
			t.Fatalf("a host without url elicitation (session %v): %s, want a tool error naming the capability and no link", s != "", body)
		}
	}
}

// TestGatewayInputRequestsVerbatim: issue 31's "upstream input_required
// reaches the host verbatim, wrapped in sealed broker state": the
// relayed inputRequests are what the upstream sent, members the go-sdk
// does not know included (futureField, vendor members), with the state
// sealed; yet what the capability check read is what the host reads: an
// elicitation whose mode the upstream wrote twice in two letter cases
// reaches a form-only host with the one mode the check saw.
func TestGatewayInputRequestsVerbatim(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	const sent = `{"q":{"method":"elicitation/create","params":{"mode":"form","message":"Hi","requestedSchema":{"type":"object","properties":{"a":{"type":"string","x-custom":1}}},"_meta":{"vendor/x":1},"futureField":{"deep":[1,"two"]}},"futureRequestMember":true},` +
		`"s":{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"q"}}],"maxTokens":10,"modelPreferences":{"hints":[{"name":"claude"}]},"metadata":{"k":"v"},"systemPrompt":"sys","futureSampling":"x"}}}`
	const twice = `{"t":{"method":"elicitation/create","params":{"mode":"url","url":"https://upstream.example/x","message":"m","MODE":"form","requestedSchema":{"type":"object"}}}}`
	g.up.mu.Lock()
	g.up.intercept = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		m := peekRPC(r)
		body := m.body
		irs := map[string]string{"ask": sent, "echo": twice}[m.Params.Name]
		if m.Method == "prompts/get" || m.Method == "resources/read" {
			irs = sent
		}
		if r.URL.Path != "/mcp" || m.Method != "tools/call" && m.Method != "prompts/get" && m.Method != "resources/read" || irs == "" {
			next.ServeHTTP(w, r)
			return
		}
		answer := `{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{"resultType":"input_required","inputRequests":` + irs + `,"requestState":"upstream-state"}}`
		if bytes.Contains(body, []byte(`"test://stray"`)) {
			// Another answer asking for input, for a request never made,
			// ahead of the call's own on the stream.
			answer = `{"jsonrpc":"2.0","id":999,"result":{"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create","params":{"mode":"form","message":"stray","requestedSchema":{"type":"object"},"futureStray":1}}},"requestState":"stray-state"}}` +
				"\n\nevent: message\ndata: " + answer
		}
		if m.Method == "resources/read" || bytes.Contains(body, []byte(`"progressToken"`)) {
			// As an event stream (which a progress token asks for).
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte("event: message\ndata: " + answer + "\n\n"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(answer))
	}
	g.up.mu.Unlock()
	d := g.gwCall("alice", `{"elicitation":{"form":{},"url":{}},"sampling":{}}`, "tools/call", "ask", map[string]any{"arguments": map[string]any{}})
	var want any
	_ = json.Unmarshal([]byte(sent), &want)
	state, _ := d.Result["requestState"].(string)
	if d.Result["resultType"] != "input_required" || !reflect.DeepEqual(d.Result["inputRequests"], want) || state == "" || strings.Contains(state, "upstream-state") {
		got, _ := json.Marshal(d.Result["inputRequests"])
		t.Fatalf("relayed:\n%s\nthe upstream sent:\n%s\n(state %q, %+v)", got, sent, state, d.Error)
	}
	// The same through the go-sdk's client: prompts/get (a JSON answer),
	// resources/read (an event stream), and tools/call with a progress
	// token (an event stream to the host too).
	relayedVerbatim := func(what string, d decoded) {
		t.Helper()
		state, _ := d.Result["requestState"].(string)
		if d.Result["resultType"] != "input_required" || !reflect.DeepEqual(d.Result["inputRequests"], want) || state == "" || strings.Contains(state, "upstream-state") {
			got, _ := json.Marshal(d.Result["inputRequests"])
			t.Fatalf("%s relayed:\n%s\nthe upstream sent:\n%s\n(state %q, %+v)", what, got, sent, state, d.Error)
		}
	}
	const allCaps = `{"elicitation":{"form":{},"url":{}},"sampling":{}}`
	relayedVerbatim("prompts/get", g.gwCall("alice", allCaps, "prompts/get", "greet", nil))
	relayedVerbatim("resources/read", g.gwCall("alice", allCaps, "resources/read", "test://doc", nil))
	body := modernBody(3, "tools/call", allCaps, map[string]any{"name": "ask", "arguments": map[string]any{}})
	body = strings.Replace(body, `"_meta":{`, `"_meta":{"progressToken":"p-1",`, 1)
	resp := g.do(rawCall{path: "/mcp/u/up", body: body, headers: map[string]string{"Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "Authorization": "Bearer " + g.gwBearer("alice"),
		"MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "ask"}})
	var last decoded
	for _, line := range strings.Split(string(resp.body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			last = decode(t, []byte(data))
		}
	}
	relayedVerbatim("tools/call with a progress token", last)
	// A stream with another answer asking for input before the call's
	// own: the host gets the call's requests (as the go-sdk decoded them),
	// nothing of the other's.
	d = g.gwCall("alice", allCaps, "resources/read", "test://stray", nil)
	q, _ := d.Result["inputRequests"].(map[string]any)["q"].(map[string]any)
	qp, _ := q["params"].(map[string]any)
	if raw, _ := json.Marshal(d.Result); d.Result["resultType"] != "input_required" || qp["message"] != "Hi" || strings.Contains(string(raw), "futureStray") || strings.Contains(string(raw), "stray-state") {
		t.Fatalf("with a stray answer ahead: %s %+v", raw, d.Error)
	}

	d = g.gwCall("alice", `{"elicitation":{"form":{}}}`, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	irs, _ := d.Result["inputRequests"].(map[string]any)
	req, _ := irs["t"].(map[string]any)
	params, _ := req["params"].(map[string]any)
	if d.Result["resultType"] != "input_required" || params["mode"] != "form" || params["MODE"] != nil || params["message"] != "m" {
		t.Fatalf("an elicitation with its mode twice, to a form-only host: %+v %+v", d.Result, d.Error)
	}
}
