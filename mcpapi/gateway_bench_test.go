package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// BenchmarkGatewayCall is the gateway's own CPU and allocations per
// relayed tools/call, the handler called in-process with a reused writer
// (the upstream, a go-sdk server, over loopback): open is an auth: none
// upstream, oauth the testUpstream with a stored connection (its token
// read and checked on every call). The upstream's own work is in the
// figure too: compare runs, not the absolute value (make bench measures
// the gateway against the same call made directly).
func BenchmarkGatewayCall(b *testing.B) {
	open := newOpenUpstream(b)
	var hh *harness
	var up *testUpstream
	h := newHarnessExtra(b, func(h *harness, _ string) string {
		hh, up = h, newTestUpstream(b)
		return `  up:
    display_name: Upstream
    type: mcp
    mcp: {url: ` + up.url() + `}
  open:
    display_name: Open
    type: mcp
    mcp: {url: ` + open + `, auth: none}
`
	}, func(o *Options) { o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) })
	at, rt := up.grant("tools")
	if _, err := h.store.CreateConnection(context.Background(), vault.Connection{ID: "conn_up_alice", Principal: h.principal("alice"),
		Provider: "up", AccountID: "up-alice", Scopes: []string{"tools"}, Status: vault.StatusActive, Created: h.clock.Now(), Updated: h.clock.Now(),
		Token: vault.TokenSet{AccessToken: vault.Secret(at), RefreshToken: vault.Secret(rt), TokenType: "Bearer", Expiry: h.clock.Now().Add(10000 * time.Hour)}}); err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	h.srv.Register(mux)
	for _, tc := range []struct{ name, provider, tool, want string }{
		{"open", "open", "test_simple_text", "This is a simple text"},
		{"oauth", "up", "echo", `echo {}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(modernBody(1, "tools/call", urlCaps, map[string]any{"name": tc.tool, "arguments": map[string]any{}}))
			req := httptest.NewRequest(http.MethodPost, "/mcp/u/"+tc.provider, nil)
			hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"Authorization":        "Bearer " + h.iss.token(b, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/" + tc.provider, exp: h.clock.Now().Add(10000 * time.Hour)}),
				"MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": tc.tool}
			for k, v := range hd {
				req.Header.Set(k, v)
			}
			rd := bytes.NewReader(body)
			w := &recordingWriter{benchWriter: benchWriter{h: http.Header{}}}
			call := func() {
				rd.Reset(body)
				r := req.Clone(req.Context())
				r.Body = readCloser{rd}
				clear(w.h)
				w.code = 0
				w.body.Reset()
				mux.ServeHTTP(w, r)
			}
			call()
			if w.code != http.StatusOK || !strings.Contains(w.body.String(), tc.want) {
				b.Fatalf("HTTP %d %s", w.code, w.body.Bytes())
			}
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				// The next minute before the person's 600 a minute run out.
				if n++; n%500 == 0 {
					h.clock.Advance(time.Minute)
				}
				call()
				if w.code != http.StatusOK || bytes.Contains(w.body.Bytes(), []byte(`"isError":true`)) {
					b.Fatalf("HTTP %d %s", w.code, w.body.Bytes())
				}
			}
		})
	}
}

// recordingWriter is a benchWriter that keeps the body.
type recordingWriter struct {
	benchWriter
	body bytes.Buffer
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	w.benchWriter.Write(p)
	return w.body.Write(p)
}

// newOpenUpstream serves a stateless go-sdk server with the conformance
// server's test_simple_text, taking no token.
func newOpenUpstream(t testing.TB) string {
	server := mcp.NewServer(&mcp.Implementation{Name: "open", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "test_simple_text", Description: "Tests simple text content response", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "This is a simple text response for testing."}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}
