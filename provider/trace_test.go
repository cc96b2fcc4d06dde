package provider

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"credbroker/internal/tracing"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

func spanAttrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.Emit()
	}
	return m
}

// TestTracePropagateTrace: API requests carry traceparent only to a
// provider whose entry says propagate_trace: true, never baggage; each
// request is a provider.request span with the HTTP client span under it,
// whose URL has no query.
func TestTracePropagateTrace(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]http.Header{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = r.Header.Clone()
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":1}`)
	}))
	defer srv.Close()
	entry := func(name, extra string) string {
		return "  " + name + `:
    type: oauth2
    authorization_url: ` + srv.URL + `/authorize
    token_url: ` + srv.URL + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv.URL + `/user, id_field: id}
    api: {base_url: ` + srv.URL + `/` + name + `}
` + extra
	}
	reg, err := ParseProviders("t", []byte("providers:\n"+entry("shares", "    propagate_trace: true\n")+entry("private", "")), func(string) string { return "s" })
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := reg.Lookup("shares"); !p.PropagateTrace {
		t.Fatal("propagate_trace: true not parsed")
	}
	if p, _ := reg.Lookup("private"); p.PropagateTrace {
		t.Fatal("propagate_trace defaults to true")
	}
	if _, err := ParseProviders("t", []byte("providers:\n"+entry("bad", "    propagate_trace: sometimes\n")), func(string) string { return "s" }); err == nil {
		t.Fatal("propagate_trace: sometimes accepted")
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	st := memstore.New(kr)
	for _, p := range []string{"shares", "private"} {
		if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: "c-" + p, Principal: vault.Principal{Issuer: "i", Subject: "s"},
			Provider: p, AccountID: "1", Status: vault.StatusActive,
			Token: vault.TokenSet{AccessToken: vault.Secret("at-" + p), TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}}); err != nil {
			t.Fatal(err)
		}
	}
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	k, err := New(Options{Store: st, Providers: reg, Tracing: tp})
	if err != nil {
		t.Fatal(err)
	}
	member, _ := baggage.NewMember("user", "alice")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(context.Background(), bag)
	ctx, parent := tracing.Tracer(tp).Start(ctx, "mcp.request")
	for _, p := range []string{"shares", "private"} {
		if _, err := k.Do(ctx, "c-"+p, APIRequest{Method: "GET", Path: "/x", Query: url.Values{"q": {"secret-query-value"}}}); err != nil {
			t.Fatal(err)
		}
	}
	parent.End()
	mu.Lock()
	shared, private := seen["/shares/x"], seen["/private/x"]
	mu.Unlock()
	if tp := shared.Get("Traceparent"); !strings.Contains(tp, parent.SpanContext().TraceID().String()) {
		t.Errorf("opted-in provider got traceparent %q", tp)
	}
	if private.Get("Traceparent") != "" || private.Get("Tracestate") != "" {
		t.Errorf("provider without propagate_trace got %q", private.Get("Traceparent"))
	}
	if shared.Get("Baggage") != "" || private.Get("Baggage") != "" {
		t.Error("baggage was sent to a provider")
	}
	var requests, https int
	spans := mem.GetSpans()
	for _, s := range spans {
		switch {
		case s.Name == "provider.request":
			requests++
			if s.Parent.SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("provider.request is not under the MCP span")
			}
		case strings.HasPrefix(s.Name, "provider.http"):
			https++
			a := spanAttrs(s.Attributes)
			if strings.Contains(a["url.full"], "?") || strings.Contains(a["url.full"], "secret-query-value") || a["url.full"] == "" {
				t.Errorf("url.full = %q", a["url.full"])
			}
			var under bool
			for _, p := range spans {
				under = under || p.Name == "provider.request" && p.SpanContext.SpanID() == s.Parent.SpanID()
			}
			if !under {
				t.Error("the HTTP span is not under provider.request")
			}
		}
		for _, kv := range s.Attributes {
			if v := kv.Value.Emit(); strings.Contains(v, "at-shares") || strings.Contains(v, "at-private") || strings.Contains(v, "secret-query-value") {
				t.Errorf("span %s attribute %s carries a secret", s.Name, kv.Key)
			}
		}
	}
	if requests != 2 || https != 2 {
		t.Fatalf("%d provider.request and %d HTTP spans, want 2 and 2", requests, https)
	}
}

// TestTraceRefreshWaiters: callers of one single-flight refresh each get a
// provider.token_refresh span; one is the leader, the others are waiters
// that link to the one provider.token_refresh.flight span.
func TestTraceRefreshWaiters(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	mem := tracetest.NewInMemoryExporter()
	tp := tracing.NewSyncProvider(mem)
	k, err := New(Options{Store: r.store, Providers: r.reg, Tracing: tp})
	if err != nil {
		t.Fatal(err)
	}
	// Hold the connection's lock so the flight waits until every caller
	// has joined it.
	unlock, err := k.locker.LockConnection(context.Background(), c.ID)
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := k.Do(context.Background(), c.ID, APIRequest{Method: "GET", Path: "/user"})
			errs <- err
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		k.mu.Lock()
		f := k.flights[c.ID]
		joined := 0
		if f != nil {
			joined = f.joined
		}
		k.mu.Unlock()
		if joined == n-1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d callers joined the flight, want %d", joined, n-1)
		}
		time.Sleep(5 * time.Millisecond)
	}
	unlock()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var flights []tracetest.SpanStub
	var leaders, waiters int
	var callers []tracetest.SpanStub
	for _, s := range mem.GetSpans() {
		switch s.Name {
		case "provider.token_refresh.flight":
			flights = append(flights, s)
		case "provider.token_refresh":
			callers = append(callers, s)
		}
	}
	if len(flights) != 1 || len(callers) != n {
		t.Fatalf("%d flight spans and %d caller spans, want 1 and %d", len(flights), len(callers), n)
	}
	fa := spanAttrs(flights[0].Attributes)
	if fa["refresh.waiters"] != "4" || fa["provider"] != "demo" {
		t.Errorf("flight attributes %v", fa)
	}
	for _, s := range callers {
		switch spanAttrs(s.Attributes)["refresh.role"] {
		case "leader":
			leaders++
			if flights[0].Parent.SpanID() != s.SpanContext.SpanID() {
				t.Error("the flight is not under its leader's span")
			}
		case "waiter":
			waiters++
			if len(s.Links) != 1 || s.Links[0].SpanContext.SpanID() != flights[0].SpanContext.SpanID() || len(s.Events) != 1 {
				t.Errorf("a waiter's links %v events %v, want the flight", s.Links, s.Events)
			}
		}
	}
	if leaders != 1 || waiters != n-1 {
		t.Fatalf("%d leaders and %d waiters, want 1 and %d", leaders, waiters, n-1)
	}
	// The token request is an HTTP span under the flight.
	var tokenHTTP bool
	for _, s := range mem.GetSpans() {
		if strings.HasPrefix(s.Name, "provider.http POST") && s.Parent.SpanID() == flights[0].SpanContext.SpanID() {
			tokenHTTP = true
		}
	}
	if !tokenHTTP {
		t.Error("no HTTP span of the token request under the flight")
	}
}
