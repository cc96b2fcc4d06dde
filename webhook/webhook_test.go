package webhook_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/webhook"
)

func newSecret(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// received is one request the receiver saw.
type received struct {
	header http.Header
	body   []byte
}

// receiver answers the first fail requests with 500, then 200, and keeps
// every request.
type receiver struct {
	mu   sync.Mutex
	fail int
	got  []received
	srv  *httptest.Server
	seen chan struct{}
}

func newReceiver(t *testing.T, fail int) *receiver {
	r := &receiver{fail: fail, seen: make(chan struct{}, 100)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, received{header: req.Header.Clone(), body: body})
		failing := len(r.got) <= r.fail
		r.mu.Unlock()
		r.seen <- struct{}{}
		if failing {
			http.Error(w, "not now", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

type stack struct {
	store *memstore.Store
	pub   *webhook.Publisher
	disp  *webhook.Dispatcher
	rec   *telemetry.Recorder
	now   time.Time
	mu    sync.Mutex
}

func (s *stack) clock() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *stack) advance(d time.Duration) {
	s.mu.Lock()
	s.now = s.now.Add(d)
	s.mu.Unlock()
}

func newStack(t *testing.T, cfg *webhook.Config) *stack {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	s := &stack{now: time.Now()}
	s.pub = webhook.NewPublisher(cfg, s.clock)
	s.store = memstore.NewWith(kr, memstore.Options{Changes: s.pub.Hook()})
	s.rec = telemetry.New(telemetry.Options{WebhookEndpoints: cfg.Names()})
	s.disp, err = webhook.NewDispatcher(webhook.DispatchOptions{Config: cfg, Store: s.store, Timeout: 2 * time.Second,
		Backoff: time.Second, Telemetry: s.rec, Now: s.clock})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

func conn(id string) vault.Connection {
	return vault.Connection{ID: id, Principal: alice, Provider: "demo", AccountID: "1001", AccountLogin: "alice-demo",
		Scopes: []string{"profile"}, Status: vault.StatusActive, Created: time.Now(), Updated: time.Now(),
		Token: vault.TokenSet{AccessToken: "at-very-secret-access", RefreshToken: "rt-very-secret-refresh", TokenType: "Bearer"}}
}

// TestRetriesThenDelivers: a receiver that fails three times gets the
// same event a fourth time and accepts it; every attempt carries the same
// webhook-id and body and a signature that the Standard Webhooks project's
// own Go library verifies; the backoff between attempts grows.
func TestRetriesThenDelivers(t *testing.T) {
	r := newReceiver(t, 3)
	secret := newSecret(t)
	ep, err := webhook.NewEndpoint("ops", r.srv.URL+"/hook", secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := newStack(t, &webhook.Config{Endpoints: []webhook.Endpoint{ep}})
	if _, err := s.store.CreateConnection(t.Context(), conn("conn_1")); err != nil {
		t.Fatal(err)
	}
	var at []time.Time
	for len(at) < 4 {
		n, err := s.disp.RunOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			at = append(at, s.clock())
			continue
		}
		if len(at) == 0 {
			t.Fatal("the event was not due at once")
		}
		s.advance(50 * time.Millisecond)
	}
	got := r.requests()
	if len(got) != 4 {
		t.Fatalf("receiver saw %d requests, want 4", len(got))
	}
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	id := got[0].header.Get("webhook-id")
	for i, g := range got {
		if err := wh.VerifyIgnoringTimestamp(g.body, g.header); err != nil {
			t.Fatalf("attempt %d: the Standard Webhooks library rejects the signature: %v", i+1, err)
		}
		if g.header.Get("webhook-id") != id || !bytes.Equal(g.body, got[0].body) {
			t.Fatalf("attempt %d changed the id or body", i+1)
		}
		if strings.Contains(string(g.body), "very-secret") {
			t.Fatalf("a payload carries a token: %s", g.body)
		}
	}
	// The library's full check, timestamp included, passes on the
	// attempts' own clock.
	if err := wh.Verify(got[3].body, got[3].header); err != nil {
		t.Fatalf("the library rejects the last attempt: %v", err)
	}
	var ev struct {
		Type string
		Data webhook.ConnectionData
	}
	if err := json.Unmarshal(got[0].body, &ev); err != nil || ev.Type != webhook.ConnectionCreated ||
		ev.Data.ConnectionID != "conn_1" || ev.Data.Principal.Subject != "alice" || ev.Data.AccountLogin != "alice-demo" {
		t.Fatalf("payload %s (%v)", got[0].body, err)
	}
	w1, w3 := at[1].Sub(at[0]), at[3].Sub(at[2])
	if w1 < 500*time.Millisecond || w3 <= w1 {
		t.Fatalf("waits between attempts %v then %v: want at least half the backoff, growing", w1, w3)
	}
	if n, _, _ := s.store.OutboxDepth(t.Context()); n != 0 {
		t.Fatalf("%d deliveries left in the outbox", n)
	}
	m := scrape(t, s.rec)
	for _, want := range []string{
		`credbroker_webhook_deliveries_total{endpoint="ops",outcome="failed"} 3`,
		`credbroker_webhook_deliveries_total{endpoint="ops",outcome="delivered"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s:\n%s", want, m)
		}
	}
}

func scrape(t *testing.T, rec *telemetry.Recorder) string {
	t.Helper()
	w := httptest.NewRecorder()
	rec.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	return w.Body.String()
}

// TestGiveUp: 410 Gone ends a delivery at once; a delivery still failing
// a day after its event is given up; a redirect is not followed.
func TestGiveUp(t *testing.T) {
	var hits sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := hits.LoadOrStore(r.URL.Path, new(int))
		*n.(*int)++
		switch r.URL.Path {
		case "/gone":
			w.WriteHeader(http.StatusGone)
		case "/moved":
			http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
		case "/elsewhere":
			w.WriteHeader(http.StatusOK)
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	var eps []webhook.Endpoint
	for _, name := range []string{"gone", "moved", "down"} {
		ep, err := webhook.NewEndpoint(name, srv.URL+"/"+name, newSecret(t), []string{webhook.ConnectionDeleted})
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, ep)
	}
	s := newStack(t, &webhook.Config{Endpoints: eps})
	ctx := t.Context()
	if _, err := s.store.CreateConnection(ctx, conn("conn_2")); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := s.store.OutboxDepth(ctx); n != 0 {
		t.Fatalf("connection.created reached endpoints that only want connection.deleted: %d deliveries", n)
	}
	if err := s.store.DeleteConnection(ctx, "conn_2"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.disp.RunOnce(ctx); err != nil || n != 3 {
		t.Fatalf("first round claimed %d (%v), want 3", n, err)
	}
	if n, _, _ := s.store.OutboxDepth(ctx); n != 2 {
		t.Fatalf("after 410 Gone %d deliveries are left, want 2 (moved, down)", n)
	}
	if _, ok := hits.Load("/elsewhere"); ok {
		t.Fatal("the redirect was followed")
	}
	for range 40 {
		s.advance(time.Hour)
		if _, err := s.disp.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _, _ := s.store.OutboxDepth(ctx); n != 0 {
		t.Fatalf("%d deliveries are still retried more than a day later", n)
	}
	m := scrape(t, s.rec)
	for _, want := range []string{`outcome="gone"} 1`, `credbroker_webhook_deliveries_total{endpoint="down",outcome="expired"} 1`} {
		if !strings.Contains(m, want) {
			t.Fatalf("metrics lack %s:\n%s", want, m)
		}
	}
	if n, _ := hits.Load("/down"); *n.(*int) > 30 {
		t.Fatalf("a dead endpoint got %d attempts in a day: the backoff does not grow", *n.(*int))
	}
}

func TestConfig(t *testing.T) {
	good := newSecret(t)
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("too short"))
	env := map[string]string{"GOOD": good, "SHORT": short}
	getenv := func(k string) string { return env[k] }
	cfg, err := webhook.ParseConfig("w.yaml", []byte(`endpoints:
  ops:
    url: https://ops.example.com/hook
    secret: ${GOOD}
    events: [connection.deleted, connection.deleted]
  local:
    url: http://127.0.0.1:9/hook
    secret: ${GOOD}
`), getenv)
	if err != nil {
		t.Fatal(err)
	}
	if names := cfg.Names(); len(names) != 2 || names[0] != "local" || !cfg.Endpoints[1].Wants(webhook.ConnectionDeleted) ||
		cfg.Endpoints[1].Wants(webhook.ConnectionCreated) || !cfg.Endpoints[0].Wants(webhook.ConnectionCreated) {
		t.Fatalf("config = %+v", cfg)
	}
	for _, tt := range []struct{ doc, want string }{
		{`endpoints: {}`, "no endpoints"},
		{"endpoints:\n  a: {url: https://x.example, secret: '${GOOD}', extra: 1}", "field extra not found"},
		{"endpoints:\n  a: {url: http://x.example, secret: '${GOOD}'}", "must use https"},
		{"endpoints:\n  a: {url: https://x.example, secret: whsec_abc}", "reference ${NAME}"},
		{"endpoints:\n  a: {url: https://x.example, secret: '${SHORT}'}", "want 24 to 64"},
		{"endpoints:\n  a: {url: https://x.example, secret: '${NOPE}'}", "NOPE is not set"},
		{"endpoints:\n  a: {url: https://x.example, secret: '${GOOD}', events: [connection.exploded]}", "unknown type"},
		{"endpoints:\n  A: {url: https://x.example, secret: '${GOOD}'}", "name"},
	} {
		if _, err := webhook.ParseConfig("w.yaml", []byte(tt.doc), getenv); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want %q", tt.doc, err, tt.want)
		}
	}
}
