package mcpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestGatewayUndecodableAnswer: an upstream result the go-sdk's decoder
// panics on (a null input request, "inputRequests":{"k":null}) is a tool
// error saying the server did not answer as an MCP server, for a
// 2026-07-28 host (the pool's own exchange, and the session when the host
// asks for progress) and a 2025-11-25 one; the host's request is answered,
// not aborted.
func TestGatewayUndecodableAnswer(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	g.up.mu.Lock()
	g.up.intercept = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		b := bytes.Replace(rec.Body.Bytes(), []byte(`"content":[{"type":"text","text":"echo {}"}]`), []byte(`"inputRequests":{"k":null},"requestState":"s"`), 1)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Del("Content-Length")
		w.WriteHeader(rec.Code)
		w.Write(b)
	}
	g.up.mu.Unlock()
	want := "Upstream could not be reached or did not answer as an MCP server"
	for what, call := range map[string]func() decoded{
		"2026-07-28": func() decoded {
			return g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
		},
		"2026-07-28 with progress": func() decoded {
			return g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}, "_meta": map[string]any{"progressToken": "p1"}})
		},
		"2025-11-25": func() decoded { return g.legacyCall("alice", "echo") },
	} {
		if d := call(); d.Result["isError"] != true || !strings.Contains(textOf(d), want) {
			t.Errorf("%s host: %+v %+v, want a tool error saying %q", what, d.Result, d.Error, want)
		}
	}
}
