package tracing_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"credbroker/internal/tracing"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// TestConfigFromEnv: tracing is on only when an OTLP endpoint is set or
// OTEL_TRACES_EXPORTER=otlp; none and OTEL_SDK_DISABLED force it off; an
// unsupported exporter or protocol is an error.
func TestConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		env      map[string]string
		on       bool
		endpoint string
		err      string
	}{
		{env: nil},
		{env: map[string]string{"OTEL_SERVICE_NAME": "x"}},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, on: true, endpoint: "http://collector:4318/v1/traces"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c.example/t"}, on: true, endpoint: "https://c.example/t"},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, on: true},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, err: `OTEL_TRACES_EXPORTER="jaeger" is not supported`},
		{env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, err: "not supported"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, err: "http/protobuf"},
		{env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, err: "http(s) URL"},
	} {
		c, err := tracing.ConfigFromEnv(env(tc.env))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.env, err, tc.err)
			}
			continue
		}
		if err != nil || c.Enabled != tc.on || c.Endpoint != tc.endpoint {
			t.Errorf("%v: %+v %v, want on=%v endpoint %q", tc.env, c, err, tc.on, tc.endpoint)
		}
	}
}

// TestSetupOffStartsNothing: off, Setup returns a nil provider, a shutdown
// that does nothing, and no goroutine; an unsupported exporter fails.
func TestSetupOffStartsNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	tp, shutdown, err := tracing.Setup(context.Background(), env(nil), "test")
	if err != nil || tp != nil {
		t.Fatalf("Setup off: %v %v", tp, err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("goroutines %d → %d with tracing off", before, after)
	}
	if tracing.Tracer(nil) != nil {
		t.Error("Tracer(nil) is not nil")
	}
	if _, _, err := tracing.Setup(context.Background(), env(map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}), "test"); err == nil {
		t.Error("Setup accepted OTEL_TRACES_EXPORTER=zipkin")
	}
}

// TestSetupExportsOTLPHTTP: on, spans reach an OTLP/HTTP receiver on
// loopback when shutdown flushes them, redacted.
func TestSetupExportsOTLPHTTP(t *testing.T) {
	var mu sync.Mutex
	var got []*coltracepb.ExportTraceServiceRequest
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("receiver got %s %s", r.URL.Path, r.Header.Get("Content-Type"))
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Error(err)
		}
		mu.Lock()
		got = append(got, &req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Write(out)
	}))
	defer recv.Close()
	tp, shutdown, err := tracing.Setup(context.Background(), env(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": recv.URL}), "v1.2.3")
	if err != nil || tp == nil {
		t.Fatalf("Setup: %v %v", tp, err)
	}
	_, span := tracing.Tracer(tp).Start(context.Background(), "mcp.request")
	span.SetAttributes(attribute.String("mcp.method", "tools/call"), attribute.String("access_token", "gho_abcdefghijkl1234"))
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) == 0 {
		t.Fatal("the receiver got nothing")
	}
	rs := got[0].ResourceSpans[0]
	var service string
	for _, a := range rs.Resource.Attributes {
		if a.Key == "service.name" {
			service = a.Value.GetStringValue()
		}
	}
	sp := rs.ScopeSpans[0].Spans[0]
	attrs := map[string]string{}
	for _, a := range sp.Attributes {
		attrs[a.Key] = a.Value.GetStringValue()
	}
	if service != "credbroker" || sp.Name != "mcp.request" || attrs["mcp.method"] != "tools/call" || attrs["access_token"] != "REDACTED" {
		t.Fatalf("exported service %q span %q attrs %v", service, sp.Name, attrs)
	}
}

// TestRedactingExporter: whatever a caller set, the exported span carries
// no token, code, principal, grant id, cookie or URL query.
func TestRedactingExporter(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	secrets := []string{"gho_secretsecret1234", "ya29.secretsecret", "the-code-value", "alice-sub", "grant-123",
		"sessioncookievalue", "q=secretquery", "Zx9Kq2Lm8Np4Rs6Tv1Wy3Ab5Cd7Ef9Gh0Ij", "eyJhbGciOi.eyJzdWIiOi.sig"}
	_, span := tracing.Tracer(tp).Start(context.Background(), "op gho_secretsecret1234")
	span.SetAttributes(
		attribute.String("url.full", "https://api.example/v1/user?q=secretquery#frag"),
		attribute.String("http.target", "/v1/user?q=secretquery"),
		attribute.String("code", "the-code-value"),
		attribute.String("enduser.id", "alice-sub"),
		attribute.String("grant_id", "grant-123"),
		attribute.String("http.request.header.cookie", "sessioncookievalue"),
		attribute.String("note", "Authorization: Bearer ya29.secretsecret and see https://x.example/p?q=secretquery"),
		attribute.String("opaque", "id Zx9Kq2Lm8Np4Rs6Tv1Wy3Ab5Cd7Ef9Gh0Ij here"),
		attribute.StringSlice("list", []string{"eyJhbGciOi.eyJzdWIiOi.sig"}),
		attribute.Int("http.response.status_code", 200),
		attribute.String("mcp.outcome", "input_required"),
	)
	span.AddEvent("waited", trace.WithAttributes(attribute.String("refresh_token", "gho_secretsecret1234")))
	span.SetStatus(codes.Error, "failed with access_token=gho_secretsecret1234")
	span.End()
	spans := mem.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	dump := s.Name + " " + s.Status.Description
	attrs := map[string]attribute.Value{}
	for _, a := range s.Attributes {
		dump += " " + string(a.Key) + "=" + a.Value.Emit()
		attrs[string(a.Key)] = a.Value
	}
	for _, e := range s.Events {
		dump += " " + e.Name
		for _, a := range e.Attributes {
			dump += " " + string(a.Key) + "=" + a.Value.Emit()
		}
	}
	for _, sec := range secrets {
		if strings.Contains(dump, sec) {
			t.Errorf("%q survives: %s", sec, dump)
		}
	}
	if v := attrs["url.full"].AsString(); v != "https://api.example/v1/user" {
		t.Errorf("url.full = %q", v)
	}
	if v := attrs["http.target"].AsString(); v != "/v1/user" {
		t.Errorf("http.target = %q", v)
	}
	if attrs["http.response.status_code"].AsInt64() != 200 || attrs["mcp.outcome"].AsString() != "input_required" {
		t.Errorf("safe attributes changed: %s", dump)
	}
}

// TestStoreObserver: each store operation is one vault.<op> span carrying
// the operation only, under the caller's span; a nil provider observes
// nothing.
func TestStoreObserver(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	st := memstore.New(kr)
	if tracing.StoreObserver(nil) != nil {
		t.Fatal("StoreObserver(nil) observes")
	}
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	ws := vault.Observe(st, tracing.StoreObserver(tp))
	if _, err := ws.GetConnection(context.Background(), "conn-secret-id"); err == nil {
		t.Fatal("found a connection in an empty store")
	}
	// The one-transaction connect (vault.GrantConnector) survives
	// observation: with tracing on, the callback must not fall back to
	// two writes.
	gc := ws.Connector()
	if gc == nil {
		t.Fatal("the traced store hides vault.GrantConnector")
	}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	if _, _, err := gc.Connect(ctx, vault.ConnectionWrite{}, "no-such-grant", nil); err == nil || errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Connect on an unknown grant: %v", err)
	}
	parent.End()
	spans := mem.GetSpans()
	if len(spans) != 3 || spans[1].Name != "vault.connect" || spans[1].Parent.SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("spans %+v", spans)
	}
	if spans[0].Name != "vault.get_connection" || spans[0].Status.Code != codes.Error {
		t.Fatalf("spans %+v", spans)
	}
	for _, a := range spans[0].Attributes {
		if strings.Contains(a.Value.Emit(), "conn-secret-id") {
			t.Fatal("the span names the connection id")
		}
	}
}

// TestWrapIdPClient: off, the client is returned as is; on, each request
// to the IdP is a client span under the caller's span with the method, the
// host and the status (5xx and transport failures marked as errors), no
// URL, and no trace context sent to the IdP.
func TestWrapIdPClient(t *testing.T) {
	plain := &http.Client{Timeout: time.Second}
	if tracing.WrapIdPClient(plain, nil) != plain {
		t.Fatal("tracing off: the client was wrapped")
	}
	var sawTraceparent bool
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawTraceparent = sawTraceparent || r.Header.Get("traceparent") != ""
		if r.URL.Path == "/broken" {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		io.WriteString(w, "{}")
	}))
	defer idp.Close()
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	c := tracing.WrapIdPClient(plain, tp)
	if c == plain || plain.Transport != nil {
		t.Fatal("the client was not copied, or the original was changed")
	}
	ctx, parent := tp.Tracer("test").Start(context.Background(), "parent")
	for _, path := range []string{"/issuer/.well-known/openid-configuration?x=secret", "/broken"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, idp.URL+path, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:1/token", nil)
	if _, err := c.Do(req); err == nil {
		t.Fatal("a request to a closed port succeeded")
	}
	parent.End()

	spans := mem.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 3 requests and the parent", len(spans))
	}
	want := []struct {
		name, status string
		code         codes.Code
	}{{"idp.http GET", "200", codes.Unset}, {"idp.http GET", "502", codes.Error}, {"idp.http POST", "", codes.Error}}
	for i, w := range want {
		s := spans[i]
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if s.Name != w.name || s.SpanKind != trace.SpanKindClient || s.Parent.SpanID() != parent.SpanContext().SpanID() ||
			attrs["http.response.status_code"] != w.status || s.Status.Code != w.code || attrs["server.address"] != "127.0.0.1" {
			t.Errorf("span %d: %s kind %v status %v attributes %v", i, s.Name, s.SpanKind, s.Status, attrs)
		}
		for k, v := range attrs {
			if strings.Contains(v, "/") || strings.Contains(v, "secret") {
				t.Errorf("span %d attribute %s = %q names a URL", i, k, v)
			}
		}
	}
	if sawTraceparent {
		t.Error("trace context was sent to the IdP")
	}
}
