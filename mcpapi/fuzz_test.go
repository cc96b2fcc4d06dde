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

	"credbroker/internal/bearer"
	"credbroker/vault"
)

// FuzzHandler feeds arbitrary bodies and header values to the endpoint.
// Whatever arrives, the answer is a well-formed JSON-RPC message (or an
// empty 202), every 4xx carries a JSON-RPC error, and no token leaks.
func FuzzHandler(f *testing.F) {
	h := newHarness(f, func(o *Options) {
		o.Verifier = func(ctx context.Context, raw string) (bearer.TokenInfo, error) {
			if raw != "good" {
				return bearer.TokenInfo{}, bearer.ErrInvalidToken
			}
			return bearer.TokenInfo{Principal: vault.Principal{Issuer: "https://idp.test", Subject: "alice"}, Expiry: epoch.Add(time.Hour)}, nil
		}
	})
	h.connect(vault.Principal{Issuer: "https://idp.test", Subject: "alice"}, "github", "octocat", []string{"repo"})
	seeds := []string{
		modernBody(1, "server/discover", "{}", nil),
		modernBody(1, "tools/list", "{}", nil),
		modernBody(2, "tools/call", urlCaps, map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "google"}}),
		modernBody(2, "tools/call", urlCaps, map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "github"}, "requestState": "AQVrMTIzNA", "inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}}),
		modernBody(3, "tools/call", "{}", map[string]any{"name": "list_connections"}),
		modernBody(3, "tools/call", "{}", map[string]any{"name": "disconnect_account", "arguments": map[string]any{"provider": "github", "account": "\u0000"}}),
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_connections"}}`,
		`[{"jsonrpc":"2.0"}]`, `{"jsonrpc":"2.0","id":null,"method":"x"}`, `{`, ``, `null`, `{"id":{}}`,
	}
	for _, s := range seeds {
		f.Add([]byte(s), versionModern, "tools/call", "connect_account", "application/json", "application/json, text/event-stream", "good")
		f.Add([]byte(s), versionLegacy, "tools/list", "", "application/json", "*/*", "good")
	}
	f.Fuzz(func(t *testing.T, body []byte, version, method, name, ctype, accept, token string) {
		req := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
		for k, v := range map[string]string{"MCP-Protocol-Version": version, "Mcp-Method": method, "Mcp-Name": name, "Content-Type": ctype, "Accept": accept} {
			if v != "" {
				req.Header[http.CanonicalHeaderKey(k)] = []string{v}
			}
		}
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		h.srv.ServeHTTP(rec, req)
		out := rec.Body.Bytes()
		if bytes.Contains(out, []byte(providerSecret)) || bytes.Contains(out, []byte(refreshSecret)) {
			t.Fatalf("token in response: %s", out)
		}
		if rec.Code == http.StatusAccepted && len(bytes.TrimSpace(out)) == 0 {
			return
		}
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			Result  json.RawMessage `json:"result"`
			Error   *rpcError       `json:"error"`
		}
		if err := json.Unmarshal(out, &msg); err != nil || msg.JSONRPC != "2.0" || (msg.Result == nil) == (msg.Error == nil) {
			t.Fatalf("status %d: not one JSON-RPC response: %q", rec.Code, out)
		}
		if rec.Code >= 400 && msg.Error == nil {
			t.Fatalf("status %d without a JSON-RPC error", rec.Code)
		}
		if !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
			t.Fatalf("content type %q", rec.Header().Get("Content-Type"))
		}
	})
}
