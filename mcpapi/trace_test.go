package mcpapi

import (
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"credbroker/internal/tracing"
)

const (
	headerTrace = "0af7651916cd43dd8448eb211c80319c"
	headerSpan  = "b7ad6b7169203331"
	metaTrace   = "4bf92f3577b34da6a3ce929d0e0e4736"
	metaSpan    = "00f067aa0ba902b7"
)

func tracedHarness(t *testing.T) (*harness, *tracetest.InMemoryExporter) {
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	return newHarness(t, func(o *Options) { o.Tracing = tp }), mem
}

func attrsOf(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

func onlyMCPSpan(t *testing.T, mem *tracetest.InMemoryExporter) tracetest.SpanStub {
	t.Helper()
	var out []tracetest.SpanStub
	for _, s := range mem.GetSpans() {
		if s.Name == "mcp.request" {
			out = append(out, s)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d mcp.request spans, want 1", len(out))
	}
	return out[0]
}

// TestTraceMCPRequestSpan: a modern tools/call is one mcp.request span with
// method, tool, era and outcome; an incoming traceparent header is its
// parent.
func TestTraceMCPRequestSpan(t *testing.T) {
	h, mem := tracedHarness(t)
	headers := h.modernHeaders("alice", "tools/call", "list_connections")
	headers["traceparent"] = "00-" + headerTrace + "-" + headerSpan + "-01"
	r := h.do(rawCall{headers: headers, body: modernBody(1, "tools/call", "{}", map[string]any{"name": "list_connections", "arguments": map[string]any{}})})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	s := onlyMCPSpan(t, mem)
	a := attrsOf(s.Attributes)
	if a["mcp.method"] != "tools/call" || a["mcp.tool"] != "list_connections" || a["mcp.era"] != versionModern || a["mcp.outcome"] != "complete" {
		t.Errorf("attributes %v", a)
	}
	if s.SpanContext.TraceID().String() != headerTrace || s.Parent.SpanID().String() != headerSpan || !s.Parent.IsRemote() {
		t.Errorf("span %s parent %s, want the traceparent header's", s.SpanContext.TraceID(), s.Parent.SpanID())
	}
	// An error answer names its JSON-RPC code; a request refused before
	// its body still gets a span.
	mem.Reset()
	r = h.do(rawCall{headers: h.modernHeaders("alice", "tools/call", "nope"), body: modernBody(2, "tools/call", "{}", map[string]any{"name": "nope", "arguments": map[string]any{}})})
	a = attrsOf(onlyMCPSpan(t, mem).Attributes)
	if a["mcp.outcome"] != "rpc_error" || a["rpc.jsonrpc.error_code"] != "-32602" {
		t.Errorf("unknown tool: %v (HTTP %d)", a, r.status)
	}
	mem.Reset()
	headers = h.modernHeaders("alice", "tools/call", "list_connections")
	delete(headers, "Authorization")
	h.do(rawCall{headers: headers, body: "{}"})
	if a = attrsOf(onlyMCPSpan(t, mem).Attributes); a["mcp.outcome"] != "unauthorized" || a["mcp.era"] != "none" {
		t.Errorf("unauthenticated: %v", a)
	}
}

// TestTraceMetaPropagation: a valid _meta trace context (SEP-414's
// traceparent and tracestate) is the span's parent, the traceparent
// header a link; an invalid one falls back to the header.
func TestTraceMetaPropagation(t *testing.T) {
	h, mem := tracedHarness(t)
	call := func(metaParent string) tracetest.SpanStub {
		mem.Reset()
		params := map[string]any{"name": "list_connections", "arguments": map[string]any{}}
		body := modernBody(1, "tools/call", "{}", params)
		var m map[string]any
		json.Unmarshal([]byte(body), &m)
		meta := m["params"].(map[string]any)["_meta"].(map[string]any)
		meta["traceparent"] = metaParent
		meta["tracestate"] = "vendor=1"
		b, _ := json.Marshal(m)
		headers := h.modernHeaders("alice", "tools/call", "list_connections")
		headers["traceparent"] = "00-" + headerTrace + "-" + headerSpan + "-01"
		if r := h.do(rawCall{headers: headers, body: string(b)}); r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		return onlyMCPSpan(t, mem)
	}
	s := call("00-" + metaTrace + "-" + metaSpan + "-01")
	if s.SpanContext.TraceID().String() != metaTrace || s.Parent.SpanID().String() != metaSpan {
		t.Errorf("parent %s/%s, want _meta's", s.Parent.TraceID(), s.Parent.SpanID())
	}
	if s.SpanContext.TraceState().Get("vendor") != "1" {
		t.Errorf("tracestate %q not continued", s.SpanContext.TraceState().String())
	}
	if len(s.Links) != 1 || s.Links[0].SpanContext.TraceID().String() != headerTrace || s.Links[0].SpanContext.SpanID().String() != headerSpan {
		t.Errorf("links %+v, want the header's context", s.Links)
	}
	s = call("00-not-a-valid-parent-01")
	if s.SpanContext.TraceID().String() != headerTrace || len(s.Links) != 0 {
		t.Errorf("invalid _meta context: trace %s links %d, want the header's and none", s.SpanContext.TraceID(), len(s.Links))
	}
}

// TestTraceLegacyEra: a 2025-11-25 request is traced too, with its era,
// and _meta's trace context works there as well.
func TestTraceLegacyEra(t *testing.T) {
	h, mem := tracedHarness(t)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_connections","arguments":{},"_meta":{"traceparent":"00-` + metaTrace + `-` + metaSpan + `-01"}}}`
	r := h.do(rawCall{headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + h.bearer("alice"), "MCP-Protocol-Version": versionLegacy}, body: body})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	s := onlyMCPSpan(t, mem)
	a := attrsOf(s.Attributes)
	if a["mcp.era"] != versionLegacy || a["mcp.tool"] != "list_connections" || a["mcp.outcome"] != "complete" {
		t.Errorf("attributes %v", a)
	}
	if s.SpanContext.TraceID().String() != metaTrace {
		t.Errorf("trace %s, want _meta's", s.SpanContext.TraceID())
	}
}
