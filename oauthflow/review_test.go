package oauthflow

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/fakeprovider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// Tests for the security review of oauthflow: dead GitHub refresh tokens,
// redirects on API and token requests, redaction at the response cap and
// forced refreshes joining another flight.

// reviewCaller is a Caller with provider "p" (token endpoint srv/token, API
// base srv/api plus allowed) and connection "c1" holding ts.
func reviewCaller(t *testing.T, srv, allowed string, maxResp int64, ts vault.TokenSet, updated time.Time) (*Caller, *memstore.Store) {
	t.Helper()
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv + `/authorize
    token_url: ` + srv + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv + `/api/user, id_field: id}
    api: {base_url: ` + srv + `/api` + allowed + `}
`
	reg, err := ParseProviders("review", []byte(doc), func(string) string { return "s" })
	if err != nil {
		t.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	st := memstore.New(kr)
	if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
		Provider: "p", AccountID: "1", Status: vault.StatusActive, Token: ts, Updated: updated}); err != nil {
		t.Fatal(err)
	}
	k, err := NewCaller(CallerOptions{Store: st, Providers: reg, MaxResponseBody: maxResp, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return k, st
}

// TestReviewBadRefreshTokenNeedsReconnect: GitHub refuses a dead refresh
// token with HTTP 200 and error=bad_refresh_token; the connection must
// become needs_reconnect at once (no retries), like invalid_grant.
func TestReviewBadRefreshTokenNeedsReconnect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		spent bool // a refresh token that worked once (rotation) or one GitHub never issued
	}{
		{"spent refresh token", true},
		{"unknown refresh token", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const redirect = "https://broker.test/oauth/github/callback"
			gh := fakeprovider.NewGitHub(t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "gh-secret",
				RedirectURIs: []string{redirect}, ExpiringTokens: true, AutoApprove: true})
			conf := oauth2.Config{ClientID: "gh-client", ClientSecret: "gh-secret", RedirectURL: redirect,
				Endpoint: oauth2.Endpoint{AuthURL: gh.AuthURL(), TokenURL: gh.TokenURL(), AuthStyle: oauth2.AuthStyleInHeader}}
			rt := "ghr_neverissued0123456789"
			if tc.spent {
				noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
				resp, err := noFollow.Get(conf.AuthCodeURL("st"))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				loc, err := url.Parse(resp.Header.Get("Location"))
				if err != nil || loc.Query().Get("code") == "" {
					t.Fatalf("authorize answered %d %q", resp.StatusCode, resp.Header.Get("Location"))
				}
				tok, err := conf.Exchange(ctx, loc.Query().Get("code"))
				if err != nil || tok.RefreshToken == "" {
					t.Fatalf("exchange: %v (refresh token %t)", err, tok != nil && tok.RefreshToken != "")
				}
				rt = tok.RefreshToken
				// Spend it behind the broker's back: GitHub rotates on use.
				if _, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: rt}).Token(); err != nil {
					t.Fatal(err)
				}
			}
			doc := `providers:
  github:
    type: oauth2
    authorization_url: ` + gh.AuthURL() + `
    token_url: ` + gh.TokenURL() + `
    client_id: gh-client
    client_secret: ${S}
    account: {url: ` + gh.URL() + `/user, id_field: id}
    api: {base_url: ` + gh.URL() + `}
`
			reg, err := ParseProviders("review", []byte(doc), func(string) string { return "gh-secret" })
			if err != nil {
				t.Fatal(err)
			}
			kr, _ := vault.ParseKeys(vault.GenerateKey())
			st := memstore.New(kr)
			if _, err := st.CreateConnection(ctx, vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
				Provider: "github", AccountID: "12345", Status: vault.StatusActive,
				Token: vault.TokenSet{AccessToken: "ghu_expired", RefreshToken: vault.Secret(rt), TokenType: "bearer", Expiry: time.Now().Add(-time.Minute)}}); err != nil {
				t.Fatal(err)
			}
			k, err := NewCaller(CallerOptions{Store: st, Providers: reg, RetryBackoff: time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			before := len(gh.Events())
			if _, err := k.Token(ctx, "c1"); !errors.Is(err, ErrNeedsReconnect) {
				t.Fatalf("Token: %v, want ErrNeedsReconnect", err)
			}
			got, _ := st.GetConnection(ctx, "c1")
			if got.Status != vault.StatusNeedsReconnect || got.Token.RefreshToken != vault.Secret(rt) {
				t.Fatalf("status %s (refresh token kept: %t), want needs_reconnect with tokens untouched",
					got.Status, got.Token.RefreshToken == vault.Secret(rt))
			}
			var refreshes []fakeprovider.Event
			for _, e := range gh.Events()[before:] {
				if e.Kind == "token" {
					refreshes = append(refreshes, e)
				}
			}
			if len(refreshes) != 1 || refreshes[0].Status != http.StatusOK || refreshes[0].Error != "bad_refresh_token" {
				t.Fatalf("token requests = %+v, want exactly one answered 200 bad_refresh_token", refreshes)
			}
			// A needs_reconnect connection does not reach the provider again.
			if _, err := k.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/user"}); !errors.Is(err, ErrNeedsReconnect) {
				t.Fatalf("Do after: %v", err)
			}
			if n := len(gh.Events()); n != before+1 {
				t.Errorf("provider saw %d more requests, want 1", n-before)
			}
		})
	}
}

// TestReviewRedirectRechecksAllowList: a same-host redirect is followed
// only to a method and path the allow-list names; otherwise the caller
// gets the 3xx and the target never sees the token.
func TestReviewRedirectRechecksAllowList(t *testing.T) {
	const token = "gho_REDIRECTTOKEN0123456789"
	var (
		mu   sync.Mutex
		hits []string // "METHOD /path" that reached a redirect target with the token
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if code := r.URL.Query().Get("redirect"); code != "" && strings.HasPrefix(r.URL.Path, "/api/user") {
			_, _ = io.ReadAll(r.Body)
			status, _ := strconv.Atoi(code)
			w.Header().Set("Location", r.URL.Query().Get("to"))
			w.WriteHeader(status)
			return
		}
		mu.Lock()
		hits = append(hits, r.Method+" "+r.URL.Path)
		mu.Unlock()
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	k, _ := reviewCaller(t, srv.URL, ", allowed_paths: [GET /user, POST /user/keys, GET /admin/read]", 0,
		vault.TokenSet{AccessToken: token, TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}, time.Now())
	for _, tc := range []struct {
		name, method, path string
		code               int
		to                 string
		wantStatus         int
		wantHit            string // the request the target must see ("" none)
	}{
		{"307 to a path not in the allow-list", "GET", "/user", 307, "/api/admin", 307, ""},
		{"308 to a path not in the allow-list", "GET", "/user", 308, "/api/admin/delete", 308, ""},
		{"302 to a path not in the allow-list", "GET", "/user", 302, "/api/orgs/x", 302, ""},
		{"307 replays POST to a GET-only path", "POST", "/user/keys", 307, "/api/admin/read", 307, ""},
		{"307 replays POST to a path allowing another method", "POST", "/user/keys", 307, "/api/user/emails", 307, ""},
		{"303 turns POST into an allowed GET", "POST", "/user/keys", 303, "/api/admin/read", 200, "GET /api/admin/read"},
		{"307 to an allowed path", "GET", "/user", 307, "/api/user/repos", 200, "GET /api/user/repos"},
		{"redirect escaping the base", "GET", "/user", 307, "/admin/read", 307, ""},
		{"redirect with dot segments", "GET", "/user", 307, "/api/user/../admin", 307, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			hits = nil
			mu.Unlock()
			resp, err := k.Do(context.Background(), "c1", APIRequest{Method: tc.method, Path: tc.path, Body: []byte(`{"k":1}`),
				Query: url.Values{"redirect": {strconv.Itoa(tc.code)}, "to": {tc.to}}})
			if err != nil || resp.Status != tc.wantStatus {
				t.Fatalf("Do = %d, %v; want %d", resp.Status, err, tc.wantStatus)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.wantHit == "" && len(hits) != 0 || tc.wantHit != "" && (len(hits) != 1 || hits[0] != tc.wantHit) {
				t.Fatalf("redirect targets reached with the token: %q, want %q", hits, tc.wantHit)
			}
		})
	}
}

// TestReviewRedactionAtCap: the connection's token is redacted from API
// answers even when it straddles the response cap or is JSON- or
// URL-encoded, and a partial token never shows at the cut.
func TestReviewRedactionAtCap(t *testing.T) {
	const (
		limit   = 1000
		plain   = "gho_PLAINTOKEN0123456789abcdef"
		special = "ya29.a0/Bx+c=d&e<f>g"
	)
	jsonEsc := func(s string) string { b, _ := json.Marshal(s); return string(b[1 : len(b)-1]) }
	for _, tc := range []struct {
		name, token, echo string
		// pad bytes come before echo, tail after it.
		pad, tail     int
		wantTruncated bool
	}{
		{"literal straddling the cap", plain, plain, limit - 10, 50, true},
		{"literal straddling the cap, body ends with it", plain, plain, limit - 3, 0, true},
		{"literal inside", plain, plain, 10, 10, false},
		{"JSON-escaped", special, jsonEsc(special), 10, 10, false},
		{"JSON-escaped straddling the cap", special, jsonEsc(special), limit - 12, 100, true},
		{"JSON with escaped slashes", special, strings.ReplaceAll(jsonEsc(special), "/", `\/`), 10, 10, false},
		{"URL-encoded", special, url.QueryEscape(special), 10, 10, false},
		{"URL-encoded straddling the cap", special, url.QueryEscape(special), limit - 5, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.echo == tc.token && tc.token == special {
				t.Fatal("test needs an encoded form that differs from the token")
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "<https://api.test/next?access_token="+tc.echo+">")
				io.WriteString(w, strings.Repeat("x", tc.pad)+tc.echo+strings.Repeat("y", tc.tail))
			}))
			t.Cleanup(srv.Close)
			k, _ := reviewCaller(t, srv.URL, "", limit, vault.TokenSet{AccessToken: vault.Secret(tc.token), TokenType: "bearer",
				Expiry: time.Now().Add(time.Hour)}, time.Now())
			resp, err := k.Do(context.Background(), "c1", APIRequest{Method: "GET", Path: "/echo"})
			if err != nil {
				t.Fatal(err)
			}
			body := string(resp.Body)
			if len(body) > limit || resp.Truncated != tc.wantTruncated {
				t.Fatalf("body %d bytes, truncated %t; want at most %d, truncated %t", len(body), resp.Truncated, limit, tc.wantTruncated)
			}
			// The token is replaced whole; what followed it is kept up to the
			// cap (in the provider's bytes), and the answer is cut at the cap
			// (possibly through the replacement).
			want := strings.Repeat("x", tc.pad) + "REDACTED" + strings.Repeat("y", min(tc.tail, max(0, limit-tc.pad-len(tc.echo))))
			want = want[:min(len(want), limit)]
			if body != want {
				t.Errorf("body = ...%q (%d bytes), want ...%q (%d bytes)", body[max(0, len(body)-40):], len(body), want[max(0, len(want)-40):], len(want))
			}
			// No piece of the echoed token (6 bytes is enough to tell) survives.
			for i := 0; i+6 <= len(tc.echo); i++ {
				if piece := tc.echo[i : i+6]; strings.Contains(body, piece) || strings.Contains(resp.Header.Get("Link"), tc.echo) {
					t.Fatalf("answer still holds %q of the token: ...%q / Link %q", piece, body[max(0, len(body)-40):], resp.Header.Get("Link"))
				}
			}
		})
	}
	t.Run("token past the cap shifted by an earlier replacement", func(t *testing.T) {
		// Replacing the first token shortens the text; the second one,
		// past the cap, must not slide into the answer.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, plain+strings.Repeat("x", limit-len(plain)+3)+plain+"tail")
		}))
		t.Cleanup(srv.Close)
		k, _ := reviewCaller(t, srv.URL, "", limit, vault.TokenSet{AccessToken: plain, TokenType: "bearer",
			Expiry: time.Now().Add(time.Hour)}, time.Now())
		resp, err := k.Do(context.Background(), "c1", APIRequest{Method: "GET", Path: "/echo"})
		if err != nil {
			t.Fatal(err)
		}
		want := "REDACTED" + strings.Repeat("x", limit-len(plain))
		if string(resp.Body) != want || !resp.Truncated {
			t.Fatalf("body = ...%q (%d bytes, truncated %t), want %d bytes ending in x", resp.Body[max(0, len(resp.Body)-40):], len(resp.Body), resp.Truncated, len(want))
		}
	})
}

// TestReviewForcedRefreshJoiningAFlight: a 401 whose forced refresh joins
// a flight started by Token() that hands back the refused token itself
// must still refresh and retry.
func TestReviewForcedRefreshJoiningAFlight(t *testing.T) {
	ctx := context.Background()
	var (
		mu       sync.Mutex
		seen     = map[string]int{} // API requests per access token
		refreshs []string           // refresh tokens spent
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/token":
			_ = r.ParseForm()
			mu.Lock()
			refreshs = append(refreshs, r.PostForm.Get("refresh_token"))
			n := len(refreshs)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"access_token": "at-new-" + strconv.Itoa(n),
				"refresh_token": "rt-new-" + strconv.Itoa(n), "token_type": "bearer", "expires_in": 3600})
		case "/api/user":
			tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
			mu.Lock()
			seen[tok]++
			first := seen[tok] == 1
			mu.Unlock()
			if tok == "T1" && first {
				// The API has not caught up with T1 yet: refused once.
				http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
				return
			}
			io.WriteString(w, `{"id":1}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	// T0 expires within the refresh margin: Token() starts a flight.
	k, st := reviewCaller(t, srv.URL, "", 0, vault.TokenSet{AccessToken: "T0", RefreshToken: "R0", TokenType: "bearer",
		Expiry: time.Now().Add(time.Minute)}, time.Now().Add(-time.Hour))
	// Another broker process is refreshing (holds the connection lock).
	unlock, err := k.locker.LockConnection(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	tokenDone := make(chan error, 1)
	go func() { _, err := k.Token(ctx, "c1"); tokenDone <- err }()
	waitFor(t, "Token() to start a flight", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return k.flights["c1"] != nil
	})
	// The other process stores T1; this process's next call uses it.
	if _, err := st.UpdateConnection(ctx, "c1", func(old vault.Connection) (vault.Connection, error) {
		old.Token = vault.TokenSet{AccessToken: "T1", RefreshToken: "R1", TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}
		old.LastRefreshed = time.Now()
		return old, nil
	}); err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp APIResponse
		err  error
	}
	doDone := make(chan result, 1)
	go func() {
		resp, err := k.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/user"})
		doDone <- result{resp, err}
	}()
	waitFor(t, "the API to refuse T1", func() bool { mu.Lock(); defer mu.Unlock(); return seen["T1"] == 1 })
	time.Sleep(150 * time.Millisecond) // let Do's forced refresh join Token()'s flight
	unlock()
	if err := <-tokenDone; err != nil {
		t.Fatalf("Token: %v", err)
	}
	res := <-doDone
	if res.err != nil || res.resp.Status != http.StatusOK {
		t.Fatalf("Do = %d, %v; want 200 after a forced refresh and one retry", res.resp.Status, res.err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(refreshs) != 1 || refreshs[0] != "R1" || seen["at-new-1"] != 1 || seen["T1"] != 1 {
		t.Fatalf("refreshes %q, API saw %v; want R1 spent once and the new token used once", refreshs, seen)
	}
	if c, _ := st.GetConnection(ctx, "c1"); c.Token.AccessToken != "at-new-1" || c.Token.RefreshToken != "rt-new-1" {
		t.Fatal("the refreshed tokens were not stored")
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// recorder is an HTTP server counting what reaches it.
type recorder struct {
	srv  *httptest.Server
	hits atomic.Int32
	mu   sync.Mutex
	seen []string // method, path and body of each request
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.hits.Add(1)
		rec.mu.Lock()
		rec.seen = append(rec.seen, r.Method+" "+r.URL.Path+" "+string(b))
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"access_token":"stolen","token_type":"bearer"}`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) check(t *testing.T) {
	t.Helper()
	if n := rec.hits.Load(); n != 0 {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		t.Fatalf("the redirect target received %d requests: %q", n, rec.seen)
	}
}

// redirectTransport answers 307 to another server for requests to trapURL
// while armed, and passes everything else on.
type redirectTransport struct {
	trapURL string
	to      string
	armed   atomic.Bool
}

func (rt *redirectTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt.armed.Load() && r.URL.String() == rt.trapURL {
		if r.Body != nil {
			r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusTemporaryRedirect, Status: "307 Temporary Redirect", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Location": {rt.to}}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestReviewTokenRequestsNotRedirected: the broker's IdP code exchange,
// the provider code exchange and revocation carry codes, verifiers, client
// secrets and tokens; a 307 to another server must not replay them there.
func TestReviewTokenRequestsNotRedirected(t *testing.T) {
	evil := newRecorder(t)
	var trap *httptest.Server
	h := newHarness(t, func(h *harness) (string, map[string]string) {
		trap = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, evil.srv.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}))
		h.t.Cleanup(trap.Close)
		h.gh = fakeprovider.NewGitHub(h.t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "gh-secret-value",
			RedirectURIs: []string{h.srv.URL + "/oauth/trapped/callback"}, AutoApprove: true})
		return `providers:
  trapped:
    display_name: Trapped
    type: oauth2
    authorization_url: ` + h.gh.AuthURL() + `
    token_url: ` + trap.URL + `/token
    client_id: gh-client
    client_secret: ${SECRET}
    default_scopes: [read:user]
    account: {url: ` + h.gh.URL() + `/user, id_field: id, login_field: login}
    revocation: {style: rfc7009, url: ` + trap.URL + `/revoke}
`, map[string]string{"SECRET": "gh-secret-value"}
	})
	idpTrap := &redirectTransport{trapURL: h.flow.idpConf.Endpoint.TokenURL, to: evil.srv.URL + "/idp-token"}
	h.flow.client = &http.Client{Timeout: 20 * time.Second, Transport: idpTrap}

	t.Run("IdP code exchange", func(t *testing.T) {
		idpTrap.armed.Store(true)
		defer idpTrap.armed.Store(false)
		a := h.newAgent()
		p := a.openConnect(h.grant("alice", "trapped", nil, "c"), "alice")
		mustStatus(t, p, http.StatusBadGateway)
		mustContain(t, p, "Sign-in failed")
		evil.check(t)
	})
	t.Run("provider code exchange", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "trapped", nil, "c")
		p := a.get(a.toCallback(g, "alice").String())
		if p.status < 400 {
			t.Fatalf("callback answered %d, want an error page", p.status)
		}
		if cs := h.connections("alice"); len(cs) != 0 {
			t.Fatalf("%d connections stored", len(cs))
		}
		evil.check(t)
	})
	t.Run("revocation", func(t *testing.T) {
		ok, err := h.flow.Revoke(context.Background(), vault.Connection{Provider: "trapped",
			Token: vault.TokenSet{AccessToken: "at-revoke-me", RefreshToken: "rt-revoke-me"}})
		if ok || err == nil || !strings.Contains(err.Error(), "307") {
			t.Fatalf("Revoke = %t, %v; want an HTTP 307 error", ok, err)
		}
		evil.check(t)
	})
	h.finalCheck()
}
