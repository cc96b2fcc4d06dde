package mcpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkModernHandler is BenchmarkModernToolCall without the network:
// the handler's own CPU per tools/call (list_connections, no connections),
// called in-process with a reused recorder.
func BenchmarkModernHandler(b *testing.B) {
	h := newHarness(b)
	headers, body := benchRequest(h)
	req := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rd := bytes.NewReader(body)
	w := &benchWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(body)
		r := req.Clone(req.Context())
		r.Body = readCloser{rd}
		clear(w.h)
		w.code = 0
		h.srv.ServeHTTP(w, r)
		if w.code != http.StatusOK {
			b.Fatalf("status %d", w.code)
		}
	}
}

type readCloser struct{ *bytes.Reader }

func (readCloser) Close() error { return nil }

// benchWriter is a reusable ResponseWriter that discards the body.
type benchWriter struct {
	h    http.Header
	code int
}

func (w *benchWriter) Header() http.Header { return w.h }
func (w *benchWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *benchWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(p), nil
}
