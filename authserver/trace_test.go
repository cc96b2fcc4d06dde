package authserver

import (
	"net/url"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestTraceEndpoints: with tracing on, registration, the authorize page,
// the decision, the token exchange, a refresh and a revocation are server
// spans with their route and status, and no span carries a code, a token,
// a client secret, the verifier or the redirect URI, even before the
// redacting exporter (this provider has none).
func TestTraceEndpoints(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	h := newHarness(t, func(o *Options) { o.Tracing = sdktrace.NewTracerProvider(sdktrace.WithSyncer(mem)) })
	status, out := h.register(map[string]any{"redirect_uris": []string{"https://app.example/cb"}, "token_endpoint_auth_method": "client_secret_basic"})
	if status != 201 {
		t.Fatalf("register: %d %v", status, out)
	}
	secret := out["client_secret"].(string)
	clientID, redirect := h.publicClient()
	pk := newPKCE()
	code := h.approve(h.browser("alice"), h.authorizeURL(clientID, redirect, pk, nil), redirect)
	tok := h.exchange(clientID, code, redirect, pk, nil)
	if tok.Status != 200 || tok.RefreshToken == "" {
		t.Fatalf("exchange: %+v", tok)
	}
	again := h.refresh(clientID, tok.RefreshToken)
	if again.Status != 200 {
		t.Fatalf("refresh: %+v", again)
	}
	if got := h.post("/revoke", url.Values{"token": {again.RefreshToken}, "client_id": {clientID}}); got.Status != 200 {
		t.Fatalf("revoke: %+v", got)
	}
	if got := h.exchange(clientID, code, redirect, pk, nil); got.Status != 400 {
		t.Fatalf("replayed code: %+v", got)
	}

	spans := mem.GetSpans()
	count := map[string]int{}
	for _, s := range spans {
		count[s.Name]++
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if s.SpanKind != trace.SpanKindServer || attrs["http.route"] == "" || attrs["http.response.status_code"] == "" {
			t.Errorf("%s: kind %v, attributes %v", s.Name, s.SpanKind, attrs)
		}
		for k, v := range attrs {
			for what, secretValue := range map[string]string{"code": code, "access token": tok.AccessToken,
				"refresh token": tok.RefreshToken, "client secret": secret, "verifier": pk.verifier, "redirect URI": redirect} {
				if strings.Contains(v, secretValue) {
					t.Errorf("%s attribute %s carries the %s", s.Name, k, what)
				}
			}
		}
	}
	for name, want := range map[string]int{"authserver.register": 2, "authserver.authorize": 1, "authserver.decision": 1,
		"authserver.token": 3, "authserver.revoke": 1} {
		if count[name] < want {
			t.Errorf("%d %s spans, want at least %d (all: %v)", count[name], name, want, count)
		}
	}
	var replay bool
	for _, s := range spans {
		for _, a := range s.Attributes {
			if s.Name == "authserver.token" && a.Key == "http.response.status_code" && a.Value.AsInt64() == 400 {
				replay = true
			}
		}
	}
	if !replay {
		t.Error("the replayed code's 400 is not on an authserver.token span")
	}
}
