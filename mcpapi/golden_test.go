package mcpapi

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden transcripts in testdata/")

// transcript records HTTP exchanges with unstable values normalised.
type transcript struct {
	h         *harness
	t         *testing.T
	Exchanges []exchange   `json:"exchanges"`
	raw       bytes.Buffer // every response body and header, for secret checks
	lastState string
	lastGrant string
}

type exchange struct {
	Name     string           `json:"name"`
	Request  exchangeRequest  `json:"request"`
	Response exchangeResponse `json:"response"`
}

type exchangeRequest struct {
	Method  string            `json:"method"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
	RawBody string            `json:"rawBody,omitempty"`
}

type exchangeResponse struct {
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
}

var (
	reGrantURL   = regexp.MustCompile(`/connect/[A-Za-z0-9_-]{22}`)
	reElicitID   = regexp.MustCompile(`"elicitationId":"[A-Za-z0-9_-]{22}"`)
	reState      = regexp.MustCompile(`"requestState":"[A-Za-z0-9_-]+"`)
	reStateParam = regexp.MustCompile(`"requestState":"<requestState>"`)
	reConnID     = regexp.MustCompile(`conn_[A-Za-z0-9_-]{22}`)
)

func (tr *transcript) normalise(s string) string {
	s = strings.ReplaceAll(s, tr.h.iss.srv.URL, "http://issuer.test")
	s = reGrantURL.ReplaceAllString(s, "/connect/<grant>")
	s = reConnID.ReplaceAllString(s, "<connection>")
	s = reElicitID.ReplaceAllString(s, `"elicitationId":"<grant>"`)
	s = reState.ReplaceAllString(s, `"requestState":"<requestState>"`)
	return s
}

// shown headers in transcripts.
var requestHeaders = []string{"Content-Type", "Accept", "Mcp-Protocol-Version", "Mcp-Method", "Mcp-Name", "Origin", "Mcp-Session-Id"}
var responseHeaders = []string{"Content-Type", "Www-Authenticate", "Allow", "Mcp-Session-Id"}

func (tr *transcript) do(name string, c rawCall) rawResult {
	tr.t.Helper()
	r := tr.h.do(c)
	tr.raw.Write(r.body)
	for k, v := range r.header {
		tr.raw.WriteString(k + ": " + strings.Join(v, ",") + "\n")
	}
	ex := exchange{Name: name, Request: exchangeRequest{Method: c.method, Headers: map[string]string{}}}
	if ex.Request.Method == "" {
		ex.Request.Method = "POST"
	}
	for _, k := range requestHeaders {
		if v := c.headers[k]; v != "" {
			if k == "Mcp-Session-Id" {
				v = "<session>"
			}
			ex.Request.Headers[k] = v
		}
	}
	if a := c.headers["Authorization"]; a != "" {
		ex.Request.Headers["Authorization"] = "Bearer <token>"
	}
	switch {
	case len(c.body) > 4096:
		ex.Request.RawBody = fmt.Sprintf("<%d bytes>", len(c.body))
	case json.Valid([]byte(c.body)):
		ex.Request.Body = json.RawMessage(tr.normalise(c.body))
	default:
		ex.Request.RawBody = c.body
	}
	ex.Response.Status = r.status
	ex.Response.Headers = map[string]string{}
	for _, k := range responseHeaders {
		if v := r.header.Get(k); v != "" {
			if k == "Mcp-Session-Id" {
				v = "<session>"
			}
			ex.Response.Headers[k] = tr.normalise(v)
		}
	}
	if len(bytes.TrimSpace(r.body)) > 0 {
		if !json.Valid(r.body) {
			tr.t.Errorf("%s: response body is not JSON: %q", name, r.body)
		} else {
			ex.Response.Body = json.RawMessage(tr.normalise(string(r.body)))
		}
	}
	// Remember the latest MRTR state and grant for the next step.
	if m := regexp.MustCompile(`"requestState":"([A-Za-z0-9_-]+)"`).FindSubmatch(r.body); m != nil {
		tr.lastState = string(m[1])
	}
	if m := regexp.MustCompile(`/connect/([A-Za-z0-9_-]{22})`).FindSubmatch(r.body); m != nil {
		tr.lastGrant = string(m[1])
	}
	tr.Exchanges = append(tr.Exchanges, ex)
	return r
}

func (tr *transcript) check(file string) {
	tr.t.Helper()
	got, err := json.MarshalIndent(tr, "", "  ")
	if err != nil {
		tr.t.Fatal(err)
	}
	got = append(got, '\n')
	path := filepath.Join("testdata", file)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			tr.t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tr.t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		tr.t.Errorf("%s differs from the golden transcript; run go test ./mcpapi -run %s -update and review the diff.\n got:\n%s", path, tr.t.Name(), got)
	}
	// Invariant 1: no third-party token, and no bearer token, in any
	// response or log line.
	all := tr.raw.String() + tr.h.logs.String()
	for _, secret := range []string{providerSecret, refreshSecret, tr.h.bearer("alice")[:40]} {
		if strings.Contains(all, secret) {
			tr.t.Errorf("a secret (%.8s…) appears in a response or log line", secret)
		}
	}
}

func jsonBody(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestGoldenModern(t *testing.T) {
	h := newHarness(t)
	tr := &transcript{h: h, t: t}
	hd := h.modernHeaders
	nextID := 10
	call := func(name, tool string, caps string, args map[string]any, extra map[string]any) rawResult {
		nextID++
		params := map[string]any{"name": tool, "arguments": args}
		for k, v := range extra {
			params[k] = v
		}
		return tr.do(name, rawCall{headers: hd("alice", "tools/call", tool), body: modernBody(nextID, "tools/call", caps, params)})
	}
	gh := map[string]any{"provider": "github"}

	tr.do("server/discover", rawCall{headers: hd("alice", "server/discover", ""), body: modernBody(1, "server/discover", "{}", nil)})
	tr.do("tools/list", rawCall{headers: hd("alice", "tools/list", ""), body: modernBody(1, "tools/list", "{}", nil)})
	call("list_connections (none)", "list_connections", "{}", map[string]any{}, nil)
	call("connect_account: unknown provider", "connect_account", urlCaps, map[string]any{"provider": "gitlab"}, nil)
	call("connect_account: scope not allowed", "connect_account", urlCaps, map[string]any{"provider": "github", "scopes": []string{"admin:org"}}, nil)
	call("connect_account: -32021 without elicitation.url", "connect_account", "{}", gh, nil)

	call("connect_account: input_required", "connect_account", urlCaps, gh, nil)
	call("retry without responses: fresh input_required", "connect_account", urlCaps, gh, map[string]any{"requestState": tr.lastState})
	call("retry accept, browser not finished: fresh input_required", "connect_account", urlCaps, gh, map[string]any{"requestState": tr.lastState,
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}})
	call("retry cancel: nothing connected, grant stays usable", "connect_account", urlCaps, gh, map[string]any{"requestState": tr.lastState,
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "cancel"}}})
	call("retry with tampered requestState: -32602", "connect_account", urlCaps, gh, map[string]any{"requestState": tamperMiddle(tr.lastState),
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}})
	call("retry decline: declined, grant closed", "connect_account", urlCaps, gh, map[string]any{"requestState": tr.lastState,
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "decline"}}})

	call("connect_account again: input_required", "connect_account", urlCaps, gh, nil)
	h.completeGrant(tr.lastGrant, h.principal("alice"), "octocat")
	call("retry accept after the browser finished: complete", "connect_account", urlCaps, gh, map[string]any{"requestState": tr.lastState,
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}})
	call("connect_account when connected: complete at once", "connect_account", "{}", gh, nil)
	call("list_connections", "list_connections", "{}", map[string]any{}, nil)
	call("disconnect_account", "disconnect_account", "{}", gh, nil)
	call("disconnect_account: nothing connected", "disconnect_account", "{}", gh, nil)

	// Protocol errors.
	bad := func(name string, mod func(map[string]string), body string) {
		m := hd("alice", "tools/list", "")
		mod(m)
		tr.do(name, rawCall{headers: m, body: body})
	}
	list := modernBody(3, "tools/list", "{}", nil)
	bad("-32602 missing _meta protocolVersion", func(map[string]string) {}, `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}}`)
	bad("-32602 missing clientCapabilities", func(map[string]string) {}, `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`)
	bad("-32020 MCP-Protocol-Version header differs", func(m map[string]string) { m["MCP-Protocol-Version"] = "2025-11-25" }, list)
	bad("-32020 _meta says 2025-11-25, header says 2026-07-28", func(map[string]string) {}, strings.ReplaceAll(list, `"io.modelcontextprotocol/protocolVersion":"2026-07-28"`, `"io.modelcontextprotocol/protocolVersion":"2025-11-25"`))
	bad("-32020 Mcp-Method header differs", func(m map[string]string) { m["Mcp-Method"] = "tools/call" }, list)
	bad("-32020 Mcp-Method header missing", func(m map[string]string) { m["Mcp-Method"] = "" }, list)
	tr.do("-32020 Mcp-Name header differs", rawCall{headers: hd("alice", "tools/call", "disconnect_account"),
		body: modernBody(4, "tools/call", "{}", map[string]any{"name": "list_connections", "arguments": map[string]any{}})})
	tr.do("Mcp-Name in base64 form", rawCall{headers: hd("alice", "tools/call", "=?base64?bGlzdF9jb25uZWN0aW9ucw==?="),
		body: modernBody(4, "tools/call", "{}", map[string]any{"name": "list_connections", "arguments": map[string]any{}})})
	bad("-32022 unsupported version", func(m map[string]string) { m["MCP-Protocol-Version"] = "2099-01-01" },
		strings.ReplaceAll(list, versionModern, "2099-01-01"))
	bad("-32601 unknown method (404)", func(m map[string]string) { m["Mcp-Method"] = "resources/list" },
		modernBody(5, "resources/list", "{}", nil))
	// 2026-07-28 removed initialize and ping: a request claiming the modern
	// version gets them as unknown methods.
	bad("-32601 ping is not in 2026-07-28 (404)", func(m map[string]string) { m["Mcp-Method"] = "ping" },
		modernBody(5, "ping", "{}", nil))
	bad("-32601 initialize with a 2026-07-28 _meta (404)", func(m map[string]string) { m["Mcp-Method"] = "initialize" },
		modernBody(5, "initialize", "{}", nil))
	tr.do("-32602 unknown tool", rawCall{headers: hd("alice", "tools/call", "nope"),
		body: modernBody(6, "tools/call", "{}", map[string]any{"name": "nope"})})
	bad("Accept without text/event-stream", func(m map[string]string) { m["Accept"] = "application/json" }, list)
	bad("-32700 parse error", func(map[string]string) {}, `{"jsonrpc":"2.0",`)
	bad("-32600 batch", func(map[string]string) {}, "["+list+"]")
	bad("-32600 not JSON-RPC 2.0", func(map[string]string) {}, `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`)
	bad("415 form body", func(m map[string]string) { m["Content-Type"] = "application/x-www-form-urlencoded" }, "a=b")
	bad("413 body too large", func(map[string]string) {}, `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"`+strings.Repeat("a", 1<<20)+`"}}`)
	bad("403 foreign Origin", func(m map[string]string) { m["Origin"] = "https://evil.example.com" }, list)
	bad("401 no bearer token", func(m map[string]string) { m["Authorization"] = "" }, list)
	bad("401 token for another audience", func(m map[string]string) {
		m["Authorization"] = "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: "https://other.example.com/mcp", exp: h.clock.Now().Add(3600e9)})
	}, list)
	notif := hd("alice", "notifications/cancelled", "")
	tr.do("notification: 202", rawCall{headers: notif, body: `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`})
	tr.do("GET: 405", rawCall{method: "GET", headers: hd("alice", "", "")})
	tr.do("DELETE: 405", rawCall{method: "DELETE", headers: hd("alice", "", "")})
	tr.check("modern.golden.json")
}

func TestGoldenLegacy(t *testing.T) {
	h := newHarness(t)
	tr := &transcript{h: h, t: t}
	var session string
	hd := func(extra ...string) map[string]string {
		m := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + h.bearer("alice"), "Mcp-Session-Id": session}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	rpc := func(id int, method string, params any) string {
		return jsonBody(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	}
	r := tr.do("initialize (declares elicitation.url)", rawCall{headers: hd(), body: rpc(1, "initialize", map[string]any{
		"protocolVersion": versionLegacy, "capabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
		"clientInfo": map[string]any{"name": "legacy-agent", "version": "1"}})})
	session = r.header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatal("initialize returned no Mcp-Session-Id")
	}
	v := "MCP-Protocol-Version"
	tr.do("notifications/initialized: 202", rawCall{headers: hd(v, versionLegacy), body: `{"jsonrpc":"2.0","method":"notifications/initialized"}`})
	tr.do("tools/list", rawCall{headers: hd(v, versionLegacy), body: rpc(2, "tools/list", map[string]any{})})
	gh := map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "github"}}
	tr.do("connect_account: -32042 URLElicitationRequiredError", rawCall{headers: hd(v, versionLegacy), body: rpc(3, "tools/call", gh)})
	h.completeGrant(tr.lastGrant, h.principal("alice"), "octocat")
	tr.do("retry after the browser finished: complete", rawCall{headers: hd(v, versionLegacy), body: rpc(4, "tools/call", gh)})
	tr.do("list_connections", rawCall{headers: hd(v, versionLegacy), body: rpc(5, "tools/call", map[string]any{"name": "list_connections", "arguments": map[string]any{}})})
	tr.do("disconnect_account", rawCall{headers: hd(v, versionLegacy), body: rpc(6, "tools/call", map[string]any{"name": "disconnect_account", "arguments": map[string]any{"provider": "github"}})})
	tr.do("connect_account: unknown provider", rawCall{headers: hd(v, versionLegacy), body: rpc(7, "tools/call", map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "gitlab"}})})
	saved := session
	session = ""
	tr.do("connect_account without a session declaring elicitation.url: tool error", rawCall{headers: hd(v, versionLegacy), body: rpc(8, "tools/call", gh)})
	session = saved
	tr.do("unsupported MCP-Protocol-Version header: -32022", rawCall{headers: hd(v, "2024-01-01"), body: rpc(9, "tools/list", map[string]any{})})
	tr.do("unknown method: -32601", rawCall{headers: hd(v, versionLegacy), body: rpc(10, "foo/bar", map[string]any{})})
	tr.do("Accept without text/event-stream: JSON-RPC 400 (SDK's plain text rewritten)", rawCall{headers: hd(v, versionLegacy, "Accept", "application/json"), body: rpc(11, "tools/list", map[string]any{})})
	tr.check("legacy.golden.json")
}

// tamperMiddle changes one character in the middle of a sealed state to a
// different one. (Changing the last characters was flaky: unpadded base64
// ignores a final character's spare bits, so "AA" at the end sometimes
// decoded to the same bytes.)
func tamperMiddle(s string) string {
	i := len(s) / 2
	c := byte('A')
	if s[i] == 'A' {
		c = 'B'
	}
	return s[:i] + string(c) + s[i+1:]
}
