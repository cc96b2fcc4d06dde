package adminapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/bearer"
	"credbroker/vault"
)

// TestTraceRequests: with tracing on, every admin request is one
// adminapi.request server span with the matched route and the status
// (refusals and unknown routes included), and no span names the admin or
// the person a request is about, even before the redacting exporter
// (this provider has none).
func TestTraceRequests(t *testing.T) {
	conns := newConnections(t, nil)
	claim, _ := ParseClaim("groups=admins")
	const admin, target = "root-admin-subject", "alice-target-subject"
	verify := func(_ context.Context, raw string) (bearer.TokenInfo, error) {
		if raw != "good-admin-token" {
			return bearer.TokenInfo{}, bearer.ErrInvalidToken
		}
		return bearer.TokenInfo{Principal: vault.Principal{Issuer: "https://idp.example", Subject: admin},
			Claims: json.RawMessage(`{"groups":["admins"]}`)}, nil
	}
	mem := tracetest.NewInMemoryExporter()
	api, err := New(Options{Connections: conns, Verify: verify, Claim: claim,
		Tracing: sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	defer srv.Close()
	call := func(method, path, token string) int {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{"delete":false}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	list := "/admin/v1/connections?" + url.Values{"iss": {"https://idp.example"}, "sub": {target}}.Encode()
	want := []struct {
		method, path, token, route string
		status                     int
	}{
		{"GET", list, "good-admin-token", "GET /admin/v1/connections", 200},
		{"GET", list, "", "GET /admin/v1/connections", 401},
		{"GET", list, "forged", "GET /admin/v1/connections", 401},
		{"POST", "/admin/v1/providers/demo/disable", "good-admin-token", "POST /admin/v1/providers/{name}/disable", 200},
		{"GET", "/admin/v1/" + target, "good-admin-token", "/", 404},
	}
	for _, w := range want {
		if got := call(w.method, w.path, w.token); got != w.status {
			t.Fatalf("%s %s: HTTP %d, want %d", w.method, w.path, got, w.status)
		}
	}
	spans := mem.GetSpans()
	if len(spans) != len(want) {
		t.Fatalf("%d spans for %d requests", len(spans), len(want))
	}
	for i, s := range spans {
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if s.Name != "adminapi.request" || s.SpanKind != trace.SpanKindServer || attrs["http.route"] != want[i].route ||
			attrs["http.response.status_code"] != strconv.Itoa(want[i].status) {
			t.Errorf("span %d: %s kind %v attributes %v, want route %q status %d", i, s.Name, s.SpanKind, attrs, want[i].route, want[i].status)
		}
		for k, v := range attrs {
			if strings.Contains(v, admin) || strings.Contains(v, target) || strings.Contains(v, "idp.example") {
				t.Errorf("span %d attribute %s = %q names a person", i, k, v)
			}
		}
	}
}
