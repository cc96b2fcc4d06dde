package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestTraceExportOnShutdown runs `broker dev` with OTEL_EXPORTER_OTLP_ENDPOINT
// pointing at a loopback OTLP/HTTP receiver and a batch delay longer than
// the test: the MCP request's span arrives when SIGTERM's graceful shutdown
// flushes the batch, and it names the service and carries no bearer.
func TestTraceExportOnShutdown(t *testing.T) {
	var mu sync.Mutex
	var spans []string
	var service string
	var raw strings.Builder
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		raw.Write(b)
		for _, rs := range req.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					service = a.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					spans = append(spans, s.Name)
				}
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	defer recv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", recv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
	t.Setenv("OTEL_SERVICE_NAME", "credbroker-test")

	d := startDev(t, freeAddr(t), t.TempDir())
	// The log is read from the process's stderr apart from its banner
	// (which says it is ready): wait for the line rather than race it.
	if !d.WaitStderr("tracing on", time.Minute) {
		t.Errorf("the log does not say tracing is on:\n%s", d.Stderr())
	}
	tok := d.Token("alice")
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest("POST", d.BaseURL+"/mcp", strings.NewReader(body))
	for k, v := range map[string]string{"Authorization": "Bearer " + tok, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("tools/list: HTTP %d", resp.StatusCode)
	}
	mu.Lock()
	before := len(spans)
	mu.Unlock()
	if before != 0 {
		t.Logf("%d spans arrived before shutdown", before)
	}
	d.Stop()
	mu.Lock()
	defer mu.Unlock()
	var mcp bool
	for _, s := range spans {
		mcp = mcp || s == "mcp.request"
	}
	if !mcp || service != "credbroker-test" {
		t.Fatalf("after shutdown the receiver holds spans %v of service %q, want mcp.request of credbroker-test", spans, service)
	}
	if strings.Contains(raw.String(), tok) {
		t.Fatal("the bearer token was exported")
	}
}
