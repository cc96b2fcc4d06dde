package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/demoprovider"
	"credbroker/internal/demoprovider/demotest"
	"credbroker/internal/logbuf"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// demoRig is the demo provider (rotating refresh tokens, event log) on
// loopback, a store and a Client.
type demoRig struct {
	t      *testing.T
	demo   *demoprovider.Provider
	url    string
	store  *memstore.Store
	reg    *Registry
	caller *Client
	logs   *logbuf.Buffer
	// apiHook runs at every API request before the demo provider sees it.
	apiHook atomic.Pointer[func(r *http.Request)]
	// tokenFail makes the next n token requests answer 503.
	tokenFail atomic.Int32

	mu     sync.Mutex // guards issued
	issued []string
}

const rigRedirect = "https://broker.test/oauth/demo/callback"

func newDemoRig(t *testing.T, extraYAML string) *demoRig {
	t.Helper()
	r := &demoRig{t: t, logs: &logbuf.Buffer{}}
	mux := http.NewServeMux()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.HasSuffix(req.URL.Path, "/token") && r.tokenFail.Load() > 0 {
			r.tokenFail.Add(-1)
			http.Error(w, `{"error":"temporarily_unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		if strings.Contains(req.URL.Path, "/api/") {
			if h := r.apiHook.Load(); h != nil {
				(*h)(req)
			}
		}
		mux.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	var err error
	r.demo, err = demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/demo", ClientID: "demo-client",
		ClientSecret: "demo-secret-value", RedirectURIs: []string{rigRedirect}})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/demo/", r.demo.Handler())
	r.url = srv.URL + "/demo"
	doc := `providers:
  demo:
    type: oauth2
    authorization_url: ` + r.url + `/authorize
    token_url: ` + r.url + `/token
    client_id: demo-client
    client_secret: ${DEMO_SECRET}
    account: {url: ` + r.url + `/api/user, id_field: id, login_field: login}
    api: {base_url: ` + r.url + `/api}
` + extraYAML
	r.reg, err = ParseProviders("rig", []byte(doc), func(string) string { return "demo-secret-value" })
	if err != nil {
		t.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	r.store = memstore.New(kr)
	r.caller, err = New(Options{Store: r.store, Providers: r.reg, RetryBackoff: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// authorize runs the demo consent for account and exchanges the code.
func (r *demoRig) authorize(account string) *oauth2.Token {
	r.t.Helper()
	tok := demotest.Client{AuthURL: r.url + "/authorize", TokenURL: r.url + "/token", ClientID: "demo-client",
		ClientSecret: "demo-secret-value", RedirectURL: rigRedirect}.CodeFlow(r.t, account, nil)
	r.mu.Lock()
	r.issued = append(r.issued, tok.AccessToken, tok.RefreshToken)
	r.mu.Unlock()
	return tok
}

// connect stores a connection with fresh demo tokens; expiry overrides the
// stored expiry when non-zero (the provider still honours the token).
func (r *demoRig) connect(expiry time.Time) vault.Connection {
	r.t.Helper()
	tok := r.authorize("1001")
	if !expiry.IsZero() {
		tok.Expiry = expiry
	}
	now := time.Now()
	c, err := r.store.CreateConnection(context.Background(), vault.Connection{
		ID: "conn-1", Principal: vault.Principal{Issuer: "https://idp.test", Subject: "alice"}, Provider: "demo",
		AccountID: "1001", AccountLogin: "alice-demo", Status: vault.StatusActive, Created: now, Updated: now,
		Token: vault.TokenSet{AccessToken: vault.Secret(tok.AccessToken), RefreshToken: vault.Secret(tok.RefreshToken), TokenType: "Bearer", Expiry: tok.Expiry},
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *demoRig) events(kind string) []demoprovider.Event {
	var out []demoprovider.Event
	for _, e := range r.demo.Events() {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// checkNoTokens fails if any token value the provider issued (as seen by
// the store) appears in text.
func (r *demoRig) checkNoTokens(where, text string) {
	r.t.Helper()
	c, err := r.store.GetConnection(context.Background(), "conn-1")
	vals := append([]string(nil), r.issued...)
	if err == nil {
		vals = append(vals, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal())
	}
	for _, v := range vals {
		if v != "" && strings.Contains(text, v) {
			r.t.Errorf("%s contains a provider token", where)
		}
	}
}

// TestConcurrentRefreshOnce: 100 concurrent requests on an expired token
// → exactly one refresh reaches the rotating provider, all 100 succeed,
// and the rotated refresh token is in the store before the new access
// token is first used (checked by reading the store at API-call time).
func TestConcurrentRefreshOnce(t *testing.T) {
	r := newDemoRig(t, "")
	old := r.connect(time.Now().Add(-time.Minute))
	var badOrder atomic.Int32
	hook := func(req *http.Request) {
		presented := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer ")
		c, err := r.store.GetConnection(context.Background(), "conn-1")
		if err != nil || c.Token.AccessToken.Reveal() != presented || c.Token.RefreshToken == old.Token.RefreshToken {
			badOrder.Add(1)
		}
	}
	r.apiHook.Store(&hook)
	const n = 100
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			resp, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"})
			if err == nil && (resp.Status != 200 || !bytes.Contains(resp.Body, []byte("alice-demo"))) {
				err = fmt.Errorf("HTTP %d %s", resp.Status, resp.Body)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("request failed: %v", err)
		}
	}
	var refreshes int
	for _, e := range r.events("token") {
		if e.GrantType == "refresh_token" {
			refreshes++
		}
	}
	if refreshes != 1 {
		t.Errorf("%d refresh requests reached the provider, want exactly 1", refreshes)
	}
	if got := len(r.events("api")); got != n {
		t.Errorf("%d API calls, want %d", got, n)
	}
	if badOrder.Load() != 0 {
		t.Errorf("%d API calls used an access token not (yet) in the store with its rotated refresh token", badOrder.Load())
	}
	// Event order: the refresh precedes every API call, and every API call
	// presented the refreshed access token.
	evs := r.demo.Events()
	var refreshSeq int
	var newAT string
	for _, e := range evs {
		if e.Kind == "token" && e.GrantType == "refresh_token" {
			refreshSeq, newAT = e.Seq, e.Token
		}
	}
	for _, e := range evs {
		if e.Kind == "api" && (e.Seq < refreshSeq || e.Token != newAT) {
			t.Fatalf("API call #%d before the refresh #%d or with another token", e.Seq, refreshSeq)
		}
	}
	r.checkNoTokens("logs", r.logs.String())
}

// TestForcedRefreshOn401: an unexpired token the API refuses is refreshed
// once and the request retried once.
func TestForcedRefreshOn401(t *testing.T) {
	r := newDemoRig(t, "")
	r.connect(time.Now().Add(time.Hour))
	// Revoke the access token at the provider only: the stored expiry still says it is valid.
	c, _ := r.store.GetConnection(context.Background(), "conn-1")
	_, err := r.store.UpdateConnection(context.Background(), "conn-1", func(old vault.Connection) (vault.Connection, error) {
		old.Token.AccessToken = "stale-access-token-unknown-to-provider"
		return old, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/repos"})
	if err != nil || resp.Status != 200 {
		t.Fatalf("Do: %v %+v", err, resp)
	}
	now, _ := r.store.GetConnection(context.Background(), "conn-1")
	if now.Token.RefreshToken == c.Token.RefreshToken || now.LastRefreshed.IsZero() {
		t.Error("the 401 did not lead to a stored refresh")
	}
	if api := r.events("api"); len(api) != 2 || api[0].Status != 401 || api[1].Status != 200 {
		t.Errorf("API events = %+v, want a 401 then a 200", api)
	}
}

// TestInvalidGrantNeedsReconnect: a refused refresh token marks the
// connection needs_reconnect (audit-logged) and no further call reaches the
// provider. (Reconnecting the same account is connections'
// TestReconnectSameAccountKeepsTheConnection.)
func TestInvalidGrantNeedsReconnect(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	// Spend the stored refresh token behind the broker's back: reuse
	// detection revokes the grant, so the broker's refresh gets invalid_grant.
	conf := oauth2.Config{ClientID: "demo-client", ClientSecret: "demo-secret-value", Endpoint: oauth2.Endpoint{TokenURL: r.url + "/token", AuthStyle: oauth2.AuthStyleInHeader}}
	if _, err := conf.TokenSource(context.Background(), &oauth2.Token{RefreshToken: c.Token.RefreshToken.Reveal()}).Token(); err != nil {
		t.Fatal(err)
	}
	_, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"})
	if !errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("err = %v, want ErrNeedsReconnect", err)
	}
	got, _ := r.store.GetConnection(context.Background(), "conn-1")
	if got.Status != vault.StatusNeedsReconnect || got.Token.RefreshToken != c.Token.RefreshToken {
		t.Fatalf("status %s (tokens changed: %v), want needs_reconnect with tokens untouched", got.Status, got.Token.RefreshToken != c.Token.RefreshToken)
	}
	if logs := r.logs.String(); !strings.Contains(logs, "event=needs_reconnect") && !strings.Contains(logs, `"event":"needs_reconnect"`) {
		t.Error("no audit log line for needs_reconnect")
	}
	// Further calls do not hit the provider again.
	before := len(r.demo.Events())
	if _, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"}); !errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("second call: %v", err)
	}
	if len(r.demo.Events()) != before {
		t.Error("a needs_reconnect connection still reached the provider")
	}
	r.checkNoTokens("logs", r.logs.String())
}

// TestRefreshProviderDown: 5xx from the token endpoint → bounded retries,
// then ErrProviderUnavailable, with the stored tokens untouched; a later
// call succeeds.
func TestRefreshProviderDown(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	r.tokenFail.Store(3)
	_, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"})
	if !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	if r.tokenFail.Load() != 0 {
		t.Errorf("%d failing answers unused: the caller did not retry 3 times", r.tokenFail.Load())
	}
	got, _ := r.store.GetConnection(context.Background(), "conn-1")
	if got.Version != c.Version || got.Status != vault.StatusActive {
		t.Fatalf("stored connection changed: version %d→%d, status %s", c.Version, got.Version, got.Status)
	}
	r.tokenFail.Store(2) // two failures, then success within the bound
	if resp, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"}); err != nil || resp.Status != 200 {
		t.Fatalf("after recovery: %v", err)
	}
}

// TestRefreshSurvivesCallerCancel: the caller going away does not lose a
// rotated refresh token: the flight finishes and saves.
func TestRefreshSurvivesCallerCancel(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.caller.Token(ctx, "conn-1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		got, _ := r.store.GetConnection(context.Background(), "conn-1")
		if got.Token.RefreshToken != c.Token.RefreshToken {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the rotated refresh token was never saved after the caller left")
}
