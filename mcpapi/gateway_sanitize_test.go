package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"credbroker/provider/mcpup"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Upstream text with everything sanitizeText strips, and what is left of
// it: C0 and C1 controls (newline and tab kept), bidirectional controls,
// zero-width characters, tag characters spelling "Ign" (and the
// unassigned U+E0000), and other format characters.
const (
	dirtyText = "Line one\nTab\there.\x00\x07\x1b[31m\x7f\r\u0085\u009b" +
		"\u202eevil\u202c\u202a\u2066\u2069\u200e\u200f\u061c" +
		"zero\u200b\u200c\u200d\u2060\ufeffwidth" +
		"\U000E0001\U000E0049\U000E0067\U000E006E\U000E007F\U000E0000" +
		"\u00ad\u180e\u2061\u2064\ufff9 café 日本 end"
	cleanText = "Line one\nTab\there.[31mevilzerowidth café 日本 end"
)

// TestSanitizeText: what sanitizeText strips and keeps, and its cap (in
// bytes, on a rune boundary, after stripping).
func TestSanitizeText(t *testing.T) {
	long := "x" + strings.Repeat("é", 3000)
	for _, c := range []struct {
		in    string
		limit int
		want  string
	}{
		{"", 10, ""},
		{"plain, visible text: café 日本 😀", 100, "plain, visible text: café 日本 😀"},
		{"kept:\nnewline\ttab", 100, "kept:\nnewline\ttab"},
		{"c0:\x00\x01\x08\x0b\x0c\r\x1b\x1f\x7f|c1:\u0080\u0085\u009b\u009f|", 100, "c0:|c1:|"},
		{"bidi:\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c|", 100, "bidi:|"},
		{"zero-width:\u200b\u200c\u200d\u2060\ufeff|", 100, "zero-width:|"},
		{"tags:\U000E0001\U000E0020\U000E0041\U000E0069\U000E007E\U000E007F\U000E0000\U000E0002\U000E001F|", 100, "tags:|"},
		{"format:\u00ad\u180e\u2061\u2062\u2063\u2064\u206a\u206f\ufff9\ufffa\ufffb\u0600\u06dd\U000110BD\U0001D173\U0001BCA0|", 100, "format:|"},
		// Bytes hidden as variation selectors after a visible letter (VS1–16
		// and VS17–256), and emoji presentation selectors with them.
		{"vs:a\ufe00\ufe0f\U000E0100\U000E0131\U000E01EF|\u2764\ufe0f|\u180b\u180f|", 100, "vs:a|\u2764||"},
		{"ignorable:\u034f\u115f\u1160\u17b4\u17b5\u3164\uffa0\ufff0\U000E0080\U000E01F0\U000E0FFF|", 100, "ignorable:|"},
		{dirtyText, 1000, cleanText},
		{"a\xffb", 10, "a\uFFFDb"},
		{"abcdef", 3, "abc"},
		{long, maxDescription, "x" + strings.Repeat("é", (maxDescription-1)/2)},
		{strings.Repeat("\u200b", 100) + "abc", 3, "abc"},
	} {
		got := sanitizeText(c.in, c.limit)
		if got != c.want || len(got) > c.limit || !utf8.ValidString(got) {
			t.Errorf("sanitizeText(%.80q, %d) = %d bytes, %.80q; want %d bytes, %.80q", c.in, c.limit, len(got), got, len(c.want), c.want)
		}
	}
}

// TestHidden: hidden removes exactly what its definition names, for every
// code point: C0 and C1 controls but newline and tab, Unicode's format
// characters (Cf), variation selectors, the other default-ignorable code
// points, and the tag block U+E0000–E007F.
func TestHidden(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		want := r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r) ||
			unicode.Is(unicode.Variation_Selector, r) || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r) ||
			r >= 0xE0000 && r <= 0xE007F)
		if hidden(r) != want {
			t.Errorf("hidden(%U) = %v, want %v", r, hidden(r), want)
		}
	}
}

// legacyRequest is a 2025-11-25 host's request of method at the endpoint
// (no session: the gateway's lists need none).
func (g *gatewayHarness) legacyRequest(sub, method string, params map[string]any) decoded {
	g.t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 6, "method": method, "params": params})
	r := g.do(rawCall{path: "/mcp/u/up", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + g.gwBearer(sub), "MCP-Protocol-Version": versionLegacy}, body: string(body)})
	return decode(g.t, r.body)
}

// toolsChanged counts the upstream_tools_changed audit events in the log.
func (g *gatewayHarness) toolsChanged() int {
	return strings.Count(g.logs.String(), `"event":"upstream_tools_changed"`)
}

// listed maps the items of d's list key (tools, prompts, …) by name; it
// fails on a name listed twice.
func listed(t *testing.T, d decoded, key string) map[string]map[string]any {
	t.Helper()
	items, ok := d.Result[key].([]any)
	if !ok {
		t.Fatalf("no %s in %+v %+v", key, d.Result, d.Error)
	}
	out := map[string]map[string]any{}
	for _, x := range items {
		m := x.(map[string]any)
		name := m["name"].(string)
		if out[name] != nil {
			t.Fatalf("%s listed twice", name)
		}
		out[name] = m
	}
	return out
}

// TestGatewaySanitizesTools: issue 31's "untrusted upstream content" rule
// for tools. The upstream lists tools whose names are not
// [A-Za-z0-9_.-]{1,128} (a space, 129 characters, a non-ASCII letter),
// a name twice, an invalid x-mcp-header (dropped by the go-sdk's client),
// a description full of controls, bidirectional overrides, zero-width and
// tag characters, and one over 4 KiB: 2026-07-28 and
// 2025-11-25 hosts both get exactly the well-named tools, once each (the
// first of the two), the descriptions and titles cleaned and capped. An
// upstream_tools_changed audit event is emitted at each listing after the
// upstream changed a relayed tool's description, input or output schema,
// or added or removed one, and at no other listing: not for the same
// list again, in either era, nor for a change to a tool the host is not
// shown.
func TestGatewaySanitizesTools(t *testing.T) {
	g := newGatewayHarness(t)
	g.withAudit(g.client)
	noop := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	}
	add := func(tool *mcp.Tool) {
		if tool.InputSchema == nil {
			tool.InputSchema = json.RawMessage(`{"type":"object"}`)
		}
		g.up.server.AddTool(tool, noop)
	}
	longName := strings.Repeat("n", 128)
	for _, name := range []string{"bad name", strings.Repeat("n", 129), "café", longName} {
		add(&mcp.Tool{Name: name, Description: "named " + name})
	}
	add(&mcp.Tool{Name: "dirty", Title: "Dirty\u202e title\u200b", Description: dirtyText,
		Annotations: &mcp.ToolAnnotations{Title: "Annotated\U000E0041 title\u2066"}})
	add(&mcp.Tool{Name: "long", Description: "x" + strings.Repeat("é", 3000)})
	// The go-sdk's server lists no tool twice and no invalid x-mcp-header,
	// so the upstream's answer is rewritten on the wire: dup_b is listed
	// as a second dup_a, and bad_header's header name has a space.
	add(&mcp.Tool{Name: "dup_a", Description: "the first dup_a"})
	add(&mcp.Tool{Name: "dup_b", Description: "the second dup_a"})
	add(&mcp.Tool{Name: "bad_header", InputSchema: json.RawMessage(`{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"Bad-Header"}}}`)})
	g.up.mu.Lock()
	g.up.intercept = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			if k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(rec.Code)
		b := bytes.ReplaceAll(rec.Body.Bytes(), []byte(`"name":"dup_b"`), []byte(`"name":"dup_a"`))
		w.Write(bytes.ReplaceAll(b, []byte(`"Bad-Header"`), []byte(`"Bad Header"`)))
	}
	g.up.mu.Unlock()
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools")

	want := []string{"admin", "ask", "dirty", "dup_a", "echo", "link", "long", longName, "route", "slow"}
	for era, list := range map[string]func() decoded{
		"2026-07-28": func() decoded { return g.gwCall("alice", urlCaps, "tools/list", "", nil) },
		"2025-11-25": func() decoded { return g.legacyRequest("alice", "tools/list", nil) },
	} {
		d := list()
		if names := toolNames(t, d); !slices.Equal(names, want) {
			t.Fatalf("%s host: tools %q, want %q", era, names, want)
		}
		tools := listed(t, d, "tools")
		dirty := tools["dirty"]
		if dirty["description"] != cleanText || dirty["title"] != "Dirty title" ||
			dirty["annotations"].(map[string]any)["title"] != "Annotated title" {
			t.Errorf("%s host: dirty listed as %+q", era, dirty)
		}
		if desc := tools["long"]["description"].(string); desc != "x"+strings.Repeat("é", (maxDescription-1)/2) {
			t.Errorf("%s host: a %d-byte description relayed as %d bytes (%.20q…)", era, len("x")+2*3000, len(desc), desc)
		}
		if desc := tools["dup_a"]["description"]; desc != "the first dup_a" {
			t.Errorf("%s host: dup_a is %q", era, desc)
		}
	}
	if n := g.toolsChanged(); n != 0 {
		t.Fatalf("%d upstream_tools_changed events for the same list listed twice", n)
	}

	// Each listing goes upstream: the cached list has expired.
	relist := func() {
		t.Helper()
		g.clock.Advance(time.Duration(maxToolsListTTL)*time.Millisecond + time.Second)
		if d := g.gwCall("alice", urlCaps, "tools/list", "", nil); d.Error != nil {
			t.Fatalf("tools/list: %+v", d.Error)
		}
	}
	for i, c := range []struct {
		what    string
		change  func()
		changed bool
	}{
		{"nothing", func() {}, false},
		{"a description", func() { add(&mcp.Tool{Name: "echo", Description: "Echo the arguments, and more."}) }, true},
		{"an input schema", func() {
			add(&mcp.Tool{Name: "echo", Description: "Echo the arguments, and more.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{"type":"string"}}}`)})
		}, true},
		{"an output schema", func() {
			add(&mcp.Tool{Name: "echo", Description: "Echo the arguments, and more.",
				InputSchema: json.RawMessage(`{"type":"object","properties":{"x":{"type":"string"}}}`), OutputSchema: json.RawMessage(`{"type":"object"}`)})
		}, true},
		{"a tool added", func() { add(&mcp.Tool{Name: "extra", Description: "New."}) }, true},
		{"a tool removed", func() { g.up.server.RemoveTools("extra") }, true},
		{"a tool the host is not shown", func() { add(&mcp.Tool{Name: "bad name", Description: "changed"}) }, false},
		{"nothing again", func() {}, false},
	} {
		before := g.toolsChanged()
		c.change()
		relist()
		if got := g.toolsChanged() - before; got != map[bool]int{false: 0, true: 1}[c.changed] {
			t.Fatalf("step %d, %s changed: %d upstream_tools_changed events", i, c.what, got)
		}
	}
	// The 2025-11-25 host's listing of the same list reports nothing.
	before := g.toolsChanged()
	if d := g.legacyRequest("alice", "tools/list", nil); !slices.Contains(toolNames(t, d), "echo") || g.toolsChanged() != before {
		t.Fatalf("legacy tools/list: %+v, %d events", d.Result, g.toolsChanged()-before)
	}
}

// TestGatewayToolsChangedPaged: an upstream that lists its tools two by
// two (nextCursor) does not seem to change them at every listing (each
// page is compared with the same page last listed, in both eras), while a
// change on either page is reported once.
func TestGatewayToolsChangedPaged(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "paged", Version: "1"}, &mcp.ServerOptions{PageSize: 2})
	add := func(name, desc string) {
		server.AddTool(&mcp.Tool{Name: name, Description: desc, InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
	}
	for _, name := range []string{"t1", "t2", "t3", "t4"} {
		add(name, "Tool "+name+".")
	}
	up := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true}))
	t.Cleanup(up.Close)
	var hh *harness
	h := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		return `  paged:
    type: mcp
    mcp: {url: ` + up.URL + `/mcp, auth: none}
`
	}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
	g := &gatewayHarness{harness: h}
	g.withAudit(h.client)
	list := func(legacy bool, cursor any) decoded {
		t.Helper()
		bearer := g.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/paged", exp: g.clock.Now().Add(time.Hour)})
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + bearer, "MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/list"}
		params := map[string]any{}
		if cursor != nil {
			params["cursor"] = cursor
		}
		var body string
		if legacy {
			hd["MCP-Protocol-Version"], hd["Mcp-Method"] = versionLegacy, ""
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params})
			body = string(b)
		} else {
			body = modernBody(1, "tools/list", urlCaps, params)
		}
		return decode(t, g.do(rawCall{path: "/mcp/u/paged", headers: hd, body: body}).body)
	}
	// round lists both pages, the first page fetched again (its cached
	// copy expired), and returns how many changes were reported.
	round := func(legacy bool, descs ...string) int {
		t.Helper()
		before := g.toolsChanged()
		g.clock.Advance(time.Duration(maxToolsListTTL)*time.Millisecond + time.Second)
		first := list(legacy, nil)
		cursor, _ := first.Result["nextCursor"].(string)
		second := list(legacy, cursor)
		var got []string
		for _, d := range []decoded{first, second} {
			tools, _ := d.Result["tools"].([]any)
			for _, tool := range tools {
				got = append(got, tool.(map[string]any)["description"].(string))
			}
		}
		if cursor == "" || second.Result["nextCursor"] != nil || !slices.Equal(got, descs) {
			t.Fatalf("pages %+v %+v and %+v %+v (cursor %q): descriptions %q, want %q", first.Result, first.Error, second.Result, second.Error, cursor, got, descs)
		}
		return g.toolsChanged() - before
	}
	descs := []string{"Tool t1.", "Tool t2.", "Tool t3.", "Tool t4."}
	for i, legacy := range []bool{false, false, true, false} {
		if n := round(legacy, descs...); n != 0 {
			t.Fatalf("listing %d of an unchanged list (legacy %v): %d upstream_tools_changed events", i+1, legacy, n)
		}
	}
	add("t4", "Tool t4, changed.")
	descs[3] = "Tool t4, changed."
	if n := round(false, descs...); n != 1 {
		t.Fatalf("after a change on the second page: %d events, want 1", n)
	}
	add("t1", "Tool t1, changed.")
	descs[0] = "Tool t1, changed."
	if n := round(false, descs...); n != 1 {
		t.Fatalf("after a change on the first page: %d events, want 1", n)
	}
	if n := round(true, descs...); n != 0 {
		t.Fatalf("the changed list listed again: %d events", n)
	}
}

// TestGatewaySanitizesLists: the titles and descriptions of the
// upstream's prompts (and their arguments), resources and resource
// templates reach 2026-07-28 and 2025-11-25 hosts cleaned and capped as
// tools' are, and so does a prompt's description from prompts/get.
func TestGatewaySanitizesLists(t *testing.T) {
	g := newGatewayHarness(t)
	long := "x" + strings.Repeat("é", 3000)
	g.up.server.AddPrompt(&mcp.Prompt{Name: "greet", Title: "Greet\u202e", Description: dirtyText,
		Arguments: []*mcp.PromptArgument{{Name: "who", Title: "Who\U000E0041", Description: long}}},
		func(context.Context, *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Description: dirtyText, Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: "hello"}}}}, nil
		})
	read := func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{}, nil
	}
	g.up.server.AddResource(&mcp.Resource{Name: "doc", URI: "file:///doc.txt", Title: "Doc\u200b", Description: dirtyText}, read)
	g.up.server.AddResourceTemplate(&mcp.ResourceTemplate{Name: "docs", URITemplate: "file:///docs/{name}", Title: "Docs\u2066", Description: long}, read)
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools")

	capped := "x" + strings.Repeat("é", (maxDescription-1)/2)
	for _, legacy := range []bool{false, true} {
		get := func(method, key, name string) map[string]any {
			t.Helper()
			d := g.gwCall("alice", urlCaps, method, "", nil)
			if legacy {
				d = g.legacyRequest("alice", method, nil)
			}
			item := listed(t, d, key)[name]
			if item == nil {
				t.Fatalf("%s (legacy %v): no %s in %+v", method, legacy, name, d.Result)
			}
			return item
		}
		p := get("prompts/list", "prompts", "greet")
		arg := p["arguments"].([]any)[0].(map[string]any)
		r := get("resources/list", "resources", "doc")
		rt := get("resources/templates/list", "resourceTemplates", "docs")
		for _, c := range []struct {
			what      string
			got, want any
		}{
			{"the prompt's title", p["title"], "Greet"},
			{"the prompt's description", p["description"], cleanText},
			{"the prompt argument's title", arg["title"], "Who"},
			{"the prompt argument's description", arg["description"], capped},
			{"the resource's title", r["title"], "Doc"},
			{"the resource's description", r["description"], cleanText},
			{"the resource's uri", r["uri"], "file:///doc.txt"},
			{"the template's title", rt["title"], "Docs"},
			{"the template's description", rt["description"], capped},
			{"the template's uriTemplate", rt["uriTemplate"], "file:///docs/{name}"},
		} {
			if c.got != c.want {
				got, _ := c.got.(string)
				t.Errorf("legacy %v: %s is %d bytes, %.80q…, want %d bytes, %.80q…", legacy, c.what, len(got), got, len(c.want.(string)), c.want)
			}
		}
	}
	// prompts/get: the prompt's description cleaned too, its messages as
	// they are.
	d = g.gwCall("alice", urlCaps, "prompts/get", "greet", map[string]any{"arguments": map[string]any{"who": "x"}})
	msgs, _ := d.Result["messages"].([]any)
	if d.Error != nil || d.Result["description"] != cleanText || len(msgs) != 1 {
		t.Errorf("prompts/get: %+v %+v, want the description %q and one message", d.Result, d.Error, cleanText)
	}
}

// TestGatewaySanitizesInstructions: the upstream's instructions (with a
// bidi override and a zero-width space) reach a connected person's
// 2026-07-28 host (server/discover) and 2025-11-25 host (initialize)
// cleaned.
func TestGatewaySanitizesInstructions(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	want := "Upstream instructions with a bidi override and  a zero-width space."
	if got := g.gwCall("alice", urlCaps, "server/discover", "", nil).Result["instructions"]; got != want {
		t.Errorf("server/discover: instructions %+q, want %+q", got, want)
	}
	d := g.legacyRequest("alice", "initialize", map[string]any{"protocolVersion": versionLegacy, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "legacy-host", "version": "1"}})
	if got := d.Result["instructions"]; got != want {
		t.Errorf("initialize: instructions %+q, want %+q (%+v)", got, want, d.Error)
	}
}

// TestGatewayDropsInstructions: with mcp.instructions: drop, a connected
// person's hosts get the broker's own short instructions in place of the
// upstream's, in either era (TestGatewaySanitizesInstructions relays the
// upstream's by default).
func TestGatewayDropsInstructions(t *testing.T) {
	g := newGatewayHarnessWith(t, []string{"instructions: drop"})
	d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
	_, link, _ := elicitation(t, d)
	g.connectUp(grantIDOf(t, link), "tools")
	if d := g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}); !strings.HasPrefix(textOf(d), "echo") {
		t.Fatalf("the person is not connected: %+v", d)
	}
	own := "This is Upstream through credbroker: the broker keeps the Upstream account's tokens. Until the account is connected, call connect_account."
	if got := g.gwCall("alice", urlCaps, "server/discover", "", nil).Result["instructions"]; got != own {
		t.Errorf("server/discover: instructions %+q, want the broker's own", got)
	}
	d = g.legacyRequest("alice", "initialize", map[string]any{"protocolVersion": versionLegacy, "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "legacy-host", "version": "1"}})
	if got := d.Result["instructions"]; got != own {
		t.Errorf("initialize: instructions %+q, want the broker's own (%+v)", got, d.Error)
	}
}
