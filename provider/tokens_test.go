package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	// tokenFail makes the next n token requests answer tokenFailStatus
	// (503 when unset) without reaching the demo provider.
	tokenFail       atomic.Int32
	tokenFailStatus atomic.Int32

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
			status := int(r.tokenFailStatus.Load())
			if status == 0 {
				status = http.StatusServiceUnavailable
			}
			http.Error(w, `{"error":"temporarily_unavailable"}`, status)
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

// TestRefreshProviderDown: a 5xx from the token endpoint ends the refresh
// at once (the request reached the provider, which may have spent a
// rotating refresh token: it is not re-posted), with
// ErrProviderUnavailable and the stored tokens untouched; the next use
// tries again and succeeds.
func TestRefreshProviderDown(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	r.tokenFail.Store(3)
	_, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"})
	if !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	if n := r.tokenFail.Load(); n != 2 {
		t.Errorf("%d token requests were sent, want exactly 1 (a written request is never re-sent)", 3-n)
	}
	got, _ := r.store.GetConnection(context.Background(), "conn-1")
	if got.Version != c.Version || got.Status != vault.StatusActive {
		t.Fatalf("stored connection changed: version %d→%d, status %s", c.Version, got.Version, got.Status)
	}
	r.tokenFail.Store(0)
	if resp, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"}); err != nil || resp.Status != 200 {
		t.Fatalf("after recovery: %v", err)
	}
}

// TestRefreshRetriedOnlyWhenNeverSent: a 429 (the provider says it did not
// process the request) and dial failures (the request never left) are
// retried within the bound; the refresh then succeeds.
func TestRefreshRetriedOnlyWhenNeverSent(t *testing.T) {
	t.Run("429", func(t *testing.T) {
		r := newDemoRig(t, "")
		r.connect(time.Now().Add(-time.Minute))
		r.tokenFailStatus.Store(http.StatusTooManyRequests)
		r.tokenFail.Store(2)
		if resp, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"}); err != nil || resp.Status != 200 {
			t.Fatalf("after two 429s: %v", err)
		}
		if n := r.tokenFail.Load(); n != 0 {
			t.Fatalf("%d 429 answers unused: not retried", n)
		}
	})
	t.Run("dial failures", func(t *testing.T) {
		r := newDemoRig(t, "")
		r.connect(time.Now().Add(-time.Minute))
		var failDials atomic.Int32
		failDials.Store(2)
		dialer := &net.Dialer{}
		client, err := New(Options{Store: r.store, Providers: r.reg, RetryBackoff: time.Millisecond, HTTPClient: &http.Client{
			Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				if failDials.Add(-1) >= 0 {
					return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
				}
				return dialer.DialContext(ctx, network, addr)
			}}}})
		if err != nil {
			t.Fatal(err)
		}
		before := len(r.events("token"))
		if resp, err := client.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"}); err != nil || resp.Status != 200 {
			t.Fatalf("after two failed dials: %v", err)
		}
		if n := len(r.events("token")) - before; n != 1 {
			t.Fatalf("%d token requests reached the provider, want 1", n)
		}
	})
}

// TestRefreshNotResentAfterLostAnswer: the provider rotates the tokens,
// then the answer is lost (502). Re-posting the spent refresh token at
// once would trip the provider's reuse detection and end the grant; the
// refresh instead fails once, the connection stays active, and the
// provider saw exactly one refresh.
func TestRefreshNotResentAfterLostAnswer(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(-time.Minute))
	r.demo.LoseRefreshAnswers(1)
	_, err := r.caller.Do(context.Background(), "conn-1", APIRequest{Method: "GET", Path: "/user"})
	if !errors.Is(err, ErrProviderUnavailable) || errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("err = %v, want ErrProviderUnavailable", err)
	}
	if n := len(r.events("token")); n != 2 { // the code exchange, then one refresh
		t.Fatalf("%d token requests, want the exchange and exactly one refresh: %+v", n, r.events("token"))
	}
	got, _ := r.store.GetConnection(context.Background(), "conn-1")
	if got.Status != vault.StatusActive || got.Token.RefreshToken != c.Token.RefreshToken {
		t.Fatalf("after a lost answer: status %s, tokens changed %v", got.Status, got.Token.RefreshToken != c.Token.RefreshToken)
	}
	r.checkNoTokens("logs", r.logs.String())
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
