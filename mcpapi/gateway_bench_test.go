package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
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
//
// fixed is an auth: none upstream answering every tools/call with the same
// bytes, written by a bare handler (what the go-sdk everything-server sends
// for test_simple_text): the figure is then the gateway's own work and the
// loopback hop. floor is the same call through a bare forwarder
// (encoding/json and net/http, no authentication or checks) to that
// upstream: fixed minus floor is what make bench calls the broker's own
// work.
func BenchmarkGatewayCall(b *testing.B) {
	open := newOpenUpstream(b)
	fixed := newFixedUpstream(b, nil)
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
  fixed:
    display_name: Fixed
    type: mcp
    mcp: {url: ` + fixed + `, auth: none}
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
	mux.Handle("POST /floor", benchForwarder(fixed))
	for _, tc := range []struct{ name, provider, tool, want string }{
		{"open", "open", "test_simple_text", "This is a simple text"},
		{"oauth", "up", "echo", `echo {}`},
		{"fixed", "fixed", "test_simple_text", "This is a simple text"},
		{"floor", "", "test_simple_text", "This is a simple text"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			body := []byte(modernBody(1, "tools/call", urlCaps, map[string]any{"name": tc.tool, "arguments": map[string]any{}}))
			path := "/mcp/u/" + tc.provider
			if tc.provider == "" {
				path = "/floor"
			}
			req := httptest.NewRequest(http.MethodPost, path, nil)
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
			// A minute of its own for each run (-count runs this function
			// again on the same harness, whose limits count per minute).
			h.clock.Advance(time.Minute)
			call()
			if w.code != http.StatusOK || !strings.Contains(w.body.String(), tc.want) {
				b.Fatalf("HTTP %d %s", w.code, w.body.Bytes())
			}
			b.ReportAllocs()
			n, cpu0 := 0, processCPU()
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
			// The process's CPU (both ends of the loopback hop), which other
			// work on a busy machine leaves alone as it does not ns/op.
			b.ReportMetric(float64(processCPU()-cpu0)/float64(n), "cpu-ns/op")
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

// fixedAnswer is the go-sdk everything-server's answer to test_simple_text
// (an event stream), its id to be filled in. It is sent as that server
// sends it: the event flushed as a chunk, the stream's end after it.
const fixedAnswer = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"_meta\":{\"io.modelcontextprotocol/serverInfo\":" +
	"{\"name\":\"mcp-conformance-test-server\",\"version\":\"1.0.0\"}},\"content\":[{\"type\":\"text\",\"text\":" +
	"\"This is a simple text response for testing.\"}],\"resultType\":\"complete\"}}\n\n"

// newFixedUpstream serves a stateless go-sdk server for everything but
// tools/call, which a bare handler answers with fixedAnswer; then, unless
// it is nil, hold runs before the stream ends (an upstream holding its
// stream open after the answer).
func newFixedUpstream(t testing.TB, hold func()) string {
	sdk := newOpenUpstream(t)
	proxy := &http.Client{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, fixedAnswer, msg.ID)
			w.(http.Flusher).Flush()
			if hold != nil {
				hold()
			}
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, sdk, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := proxy.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// benchForwarder is the floor of BenchmarkGatewayCall: as make bench's
// (bench/gateway.go), decode the JSON-RPC message, POST it to upstream
// with the MCP headers over a keep-alive client, answer the upstream's
// message (an event's data) as application/json.
func benchForwarder(upstream string) http.Handler {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  json.RawMessage `json:"params"`
		}
		if err != nil || json.Unmarshal(body, &msg) != nil || msg.Method == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodPost, upstream, bytes.NewReader(body))
		for _, k := range []string{"Content-Type", "Accept", "Mcp-Protocol-Version", "Mcp-Method", "Mcp-Name"} {
			req.Header[k] = r.Header[k]
		}
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		out, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
		resp.Body.Close()
		if err != nil {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		if d, ok := bytes.CutPrefix(out, []byte("event: message\ndata: ")); ok {
			out, _, _ = bytes.Cut(d, []byte("\n"))
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(out)
	})
}

// processCPU is the process's user and system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
