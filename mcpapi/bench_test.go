package mcpapi

import (
	"bytes"
	"credbroker/vault"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// benchLoop sends the same POST from 16 concurrent keep-alive clients.
func benchLoop(b *testing.B, url string, headers map[string]string, body []byte) {
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	b.SetParallelism(8) // × GOMAXPROCS(2) = 16 clients
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			for k, v := range headers {
				req.Header.Set(k, v)
			}
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}

func benchRequest(h *harness) (map[string]string, []byte) {
	return h.modernHeaders("alice", "tools/call", "list_connections"),
		[]byte(modernBody(1, "tools/call", "{}", map[string]any{"name": "list_connections", "arguments": map[string]any{}}))
}

// BenchmarkModernToolCall is one 2026-07-28 tools/call (list_connections,
// no connections) through the whole endpoint: Origin, Content-Type, bearer
// (verified JWT from the cache), decode, header and _meta checks, the tool,
// encoding.
func BenchmarkModernToolCall(b *testing.B) {
	h := newHarness(b)
	headers, body := benchRequest(h)
	benchLoop(b, h.http.URL+"/mcp", headers, body)
}

// BenchmarkBareHandler is the floor: a net/http handler decoding the same
// JSON-RPC body and answering fixed JSON.
func BenchmarkBareHandler(b *testing.B) {
	h := newHarness(b)
	headers, body := benchRequest(h)
	fixed := []byte(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"complete","content":[{"type":"text","text":"{\"connections\":[]}"}],"structuredContent":{"connections":[]}}}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  json.RawMessage `json:"params"`
		}
		if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed)
	}))
	defer srv.Close()
	benchLoop(b, srv.URL+"/mcp", headers, body)
}

// benchOpens runs one tools/call b.N times (sequentially, so the count is
// exact) and reports how many token sets each call decrypted (opens/op).
func benchOpens(b *testing.B, tool string, args map[string]any) {
	h := newHarness(b)
	alice := h.principal("alice")
	for _, p := range []string{"github", "google"} {
		for _, login := range []string{"a", "b"} {
			h.connect(alice, p, p+"-"+login, []string{"read:user"})
		}
	}
	h.connect(vault.Principal{Issuer: alice.Issuer, Subject: "bob"}, "github", "bob-gh", nil)
	if tool == toolRequest {
		// One github account, so the call needs no choice: four connections
		// of alice's (two google, one github, and one github that needs
		// reconnecting) plus this one: five.
		conns, _ := h.store.ListConnections(b.Context(), alice)
		for _, c := range conns {
			if c.AccountLogin == "github-b" {
				h.store.UpdateConnectionMeta(b.Context(), c.ID, func(c vault.Connection) (vault.Connection, error) {
					c.Status = vault.StatusNeedsReconnect
					return c, nil
				})
			}
		}
	}
	h.connect(alice, "google", "google-c", nil)
	headers := h.modernHeaders("alice", "tools/call", tool)
	body := []byte(modernBody(1, "tools/call", "{}", map[string]any{"name": tool, "arguments": args}))
	call := func() {
		req, _ := http.NewRequest(http.MethodPost, h.http.URL+"/mcp", bytes.NewReader(body))
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := h.http.Client().Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || bytes.Contains(out, []byte(`"isError":true`)) {
			b.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	call() // warm the token cache and the connection's last use
	before := h.keys.Opens()
	b.ResetTimer()
	for b.Loop() {
		call()
	}
	b.ReportMetric(float64(h.keys.Opens()-before)/float64(b.N), "opens/op")
}

// BenchmarkListConnectionsOpens: list_connections for a person with five
// connections decrypts nothing (want 0 opens/op).
func BenchmarkListConnectionsOpens(b *testing.B) {
	benchOpens(b, toolList, map[string]any{})
}

// BenchmarkProviderRequestOpens: provider_request for a person with five
// connections decrypts exactly the one it uses (want 1 opens/op).
func BenchmarkProviderRequestOpens(b *testing.B) {
	benchOpens(b, toolRequest, map[string]any{"provider": "github", "method": "GET", "path": "/user"})
}
