package provider

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
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/fakeprovider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// Refresh edge cases: a dead GitHub refresh token answered with HTTP 200,
// and a forced refresh that joins another flight.

// singleConnClient is a Client with provider "p" (token endpoint srv/token, API
// base srv/api plus allowed) and connection "c1" holding ts.
func singleConnClient(t *testing.T, srv, allowed string, maxResp int64, ts vault.TokenSet, updated time.Time) (*Client, *memstore.Store) {
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
	k, err := New(Options{Store: st, Providers: reg, MaxResponseBody: maxResp, RetryBackoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return k, st
}

// TestBadRefreshTokenNeedsReconnect: GitHub refuses a dead refresh
// token with HTTP 200 and error=bad_refresh_token; the connection must
// become needs_reconnect at once (no retries), like invalid_grant.
func TestBadRefreshTokenNeedsReconnect(t *testing.T) {
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
				Endpoint: oauth2.Endpoint{AuthURL: gh.AuthURL(), TokenURL: gh.TokenURL(), AuthStyle: oauth2.AuthStyleInParams}}
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
    token_endpoint_auth: client_secret_post
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
			k, err := New(Options{Store: st, Providers: reg, RetryBackoff: time.Millisecond})
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

// TestForcedRefreshJoiningAFlight: a 401 whose forced refresh joins
// a flight started by Token() that hands back the refused token itself
// must still refresh and retry.
func TestForcedRefreshJoiningAFlight(t *testing.T) {
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
	k, st := singleConnClient(t, srv.URL, "", 0, vault.TokenSet{AccessToken: "T0", RefreshToken: "R0", TokenType: "bearer",
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
	waitFor(t, "Do's forced refresh to join Token()'s flight", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		f := k.flights["c1"]
		return f != nil && f.joined > 0
	})
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
