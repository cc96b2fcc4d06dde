package provider

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/fakeprovider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// storeWith returns a store holding connection c1 of provider name with
// ts, and a Client over reg.
func storeWith(t *testing.T, doc string, ts vault.TokenSet, status vault.ConnectionStatus, opts Options) (*Client, *memstore.Store) {
	t.Helper()
	reg, err := ParseProviders("t", []byte(doc), func(string) string { return "secret-value" })
	if err != nil {
		t.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	st := memstore.New(kr)
	if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
		Provider: "p", AccountID: "1", Status: status, Token: ts, Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	opts.Store, opts.Providers = st, reg
	if opts.RetryBackoff == 0 {
		opts.RetryBackoff = time.Millisecond
	}
	k, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return k, st
}

// TestRevocationClientAuthentication: an RFC 7009 revocation authenticates
// the client the way the entry's token_endpoint_auth says; GitHub's grant
// deletion always uses basic, as GitHub requires.
func TestRevocationClientAuthentication(t *testing.T) {
	type seen struct{ basic, form bool }
	var (
		mu  sync.Mutex
		got []seen
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		id, secret, basic := r.BasicAuth()
		s := seen{basic: basic && id == "c" && secret == "secret-value",
			form: r.PostForm.Get("client_id") == "c" && r.PostForm.Get("client_secret") == "secret-value"}
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		if s.basic == s.form { // exactly one method, as RFC 6749 2.3 asks
			http.Error(w, `{"error":"invalid_client"}`, http.StatusUnauthorized)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, auth, style string
		want              seen
	}{
		{"rfc7009 client_secret_post", "client_secret_post", "rfc7009", seen{form: true}},
		{"rfc7009 client_secret_basic", "client_secret_basic", "rfc7009", seen{basic: true}},
		{"github_grant with client_secret_post", "client_secret_post", "github_grant", seen{basic: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv.URL + `/authorize
    token_url: ` + srv.URL + `/token
    token_endpoint_auth: ` + tc.auth + `
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv.URL + `/user, id_field: id}
    revocation: {style: ` + tc.style + `, url: "` + srv.URL + `/revoke/{client_id}"}
`
			k, st := storeWith(t, doc, vault.TokenSet{AccessToken: "at", RefreshToken: "rt", Expiry: time.Now().Add(time.Hour)}, vault.StatusActive, Options{})
			c, _ := st.GetConnection(context.Background(), "c1")
			mu.Lock()
			got = nil
			mu.Unlock()
			rev, err := k.Revoke(context.Background(), c, false)
			mu.Lock()
			defer mu.Unlock()
			if rev != Revoked || err != nil || len(got) != 1 || got[0] != tc.want {
				t.Fatalf("Revoke = %s, %v; the endpoint saw %+v, want %+v", rev, err, got, tc.want)
			}
		})
	}
}

// TestGitHubNotFoundCountsOnlyForLiveTokens: a 404 to a grant deletion
// means GitHub no longer knows the token. That says the grant is gone only
// when the token was valid by everything the broker knows; for a token
// that may have expired or was already refused, it says nothing.
func TestGitHubNotFoundCountsOnlyForLiveTokens(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	}))
	t.Cleanup(srv.Close)
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv.URL + `/authorize
    token_url: ` + srv.URL + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv.URL + `/user, id_field: id}
    revocation: {style: github_grant, url: "` + srv.URL + `/applications/{client_id}/grant"}
`
	for _, tc := range []struct {
		name   string
		ts     vault.TokenSet
		status vault.ConnectionStatus
		want   Revocation
	}{
		{"live non-expiring token", vault.TokenSet{AccessToken: "gho_live"}, vault.StatusActive, Revoked},
		{"live expiring token", vault.TokenSet{AccessToken: "ghu_live", Expiry: time.Now().Add(time.Hour)}, vault.StatusActive, Revoked},
		{"token already refused", vault.TokenSet{AccessToken: "gho_dead"}, vault.StatusNeedsReconnect, NotConfirmed},
		{"expired token, nothing to refresh with", vault.TokenSet{AccessToken: "ghu_old", Expiry: time.Now().Add(-time.Hour)}, vault.StatusActive, NotConfirmed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, st := storeWith(t, doc, tc.ts, tc.status, Options{})
			c, _ := st.GetConnection(context.Background(), "c1")
			if rev, err := k.Revoke(context.Background(), c, false); rev != tc.want || (err != nil) != (tc.want == NotConfirmed) {
				t.Fatalf("Revoke = %s, %v; want %s", rev, err, tc.want)
			}
		})
	}
}

// pauseFirst holds the first API request it sees until release is
// closed, after telling held; the rest pass at once.
type pauseFirst struct {
	next    http.RoundTripper
	path    string
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (p *pauseFirst) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path == p.path {
		first := false
		p.once.Do(func() { first = true })
		if first {
			close(p.held)
			<-p.release
		}
	}
	return p.next.RoundTrip(r)
}

// TestRotationElsewhere: GitHub App tokens rotate, and the old access
// token stops working when its refresh token is used. A request already
// under way with the old token (another broker replica refreshed
// meanwhile) gets 401; the broker takes the stored new token and retries,
// without refreshing again and without marking the connection.
func TestRotationElsewhere(t *testing.T) {
	ctx := context.Background()
	const redirect = "https://broker.test/oauth/github/callback"
	gh := fakeprovider.NewGitHub(t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "secret-value",
		RedirectURIs: []string{redirect}, ExpiringTokens: true, AutoApprove: true})
	conf := oauth2.Config{ClientID: "gh-client", ClientSecret: "secret-value", RedirectURL: redirect,
		Endpoint: oauth2.Endpoint{AuthURL: gh.AuthURL(), TokenURL: gh.TokenURL(), AuthStyle: oauth2.AuthStyleInParams}}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(conf.AuthCodeURL("st"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	tok, err := conf.Exchange(ctx, loc.Query().Get("code"))
	if err != nil {
		t.Fatal(err)
	}
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + gh.AuthURL() + `
    token_url: ` + gh.TokenURL() + `
    token_endpoint_auth: client_secret_post
    client_id: gh-client
    client_secret: ${S}
    account: {url: ` + gh.URL() + `/user, id_field: id}
    api: {base_url: ` + gh.URL() + `}
`
	pause := &pauseFirst{next: http.DefaultTransport, path: "/user", held: make(chan struct{}), release: make(chan struct{})}
	a, st := storeWith(t, doc, TokenSet(tok), vault.StatusActive, Options{HTTPClient: &http.Client{Transport: pause}})
	// Replica b's clock runs eight hours ahead: to b the token is due for
	// a refresh, to a it is fresh.
	b, err := New(Options{Store: st, Providers: a.Providers(), Now: func() time.Time { return time.Now().Add(8 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		resp APIResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := a.Do(ctx, "c1", APIRequest{Method: http.MethodGet, Path: "/user"})
		done <- result{r, err}
	}()
	<-pause.held // a has read the stored token and is sending it
	if _, err := b.Token(ctx, "c1"); err != nil {
		t.Fatalf("replica b's refresh: %v", err)
	}
	close(pause.release)
	r := <-done
	if r.err != nil || r.resp.Status != http.StatusOK {
		t.Fatalf("a's call: %d %v, want 200 on the retry", r.resp.Status, r.err)
	}
	var statuses []int
	for _, e := range gh.Events() {
		if e.Kind == "api" {
			statuses = append(statuses, e.Status)
		}
	}
	if len(statuses) != 2 || statuses[0] != http.StatusUnauthorized || statuses[1] != http.StatusOK {
		t.Fatalf("GitHub answered %v, want 401 to the rotated-out token then 200", statuses)
	}
	if n := gh.Counts().Refresh; n != 1 {
		t.Errorf("%d refreshes, want b's only", n)
	}
	if c, _ := st.GetConnection(ctx, "c1"); c.Status != vault.StatusActive {
		t.Errorf("status %s, want active", c.Status)
	}
}

// TestAPIHostsKeepTheirGuards: a provider with several API hosts (Google)
// sends a request only to the host it names, checks that host's
// allow-list, and never follows a redirect to another of its hosts.
func TestAPIHostsKeepTheirGuards(t *testing.T) {
	const token = "ya29.HOSTTOKEN0123456789"
	var (
		mu   sync.Mutex
		hits []string
	)
	record := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, name+" "+r.URL.Path+" "+r.Header.Get("Authorization"))
			mu.Unlock()
			if to := r.URL.Query().Get("to"); to != "" {
				http.Redirect(w, r, to, http.StatusFound)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"host":"` + name + `"}`))
		}
	}
	www := httptest.NewServer(record("www"))
	t.Cleanup(www.Close)
	gmail := httptest.NewServer(record("gmail"))
	t.Cleanup(gmail.Close)
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + www.URL + `/authorize
    token_url: ` + www.URL + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + www.URL + `/user, id_field: id}
    api:
      base_url: ` + www.URL + `
      allowed_paths: [/calendar/v3/]
      hosts: [{base_url: ` + gmail.URL + `/gmail/v1, allowed_paths: ["GET /users/me/"]}]
`
	k, _ := storeWith(t, doc, vault.TokenSet{AccessToken: token, Expiry: time.Now().Add(time.Hour)}, vault.StatusActive, Options{})
	gmailHost := strings.TrimPrefix(gmail.URL, "http://")
	for _, tc := range []struct {
		name     string
		req      APIRequest
		refused  bool
		status   int
		wantHits []string
	}{
		{"default host", APIRequest{Path: "/calendar/v3/calendars"}, false, 200, []string{"www /calendar/v3/calendars"}},
		{"named host, its base path", APIRequest{Host: gmailHost, Path: "/users/me/profile"}, false, 200, []string{"gmail /gmail/v1/users/me/profile"}},
		{"another host's path", APIRequest{Host: gmailHost, Path: "/calendar/v3/calendars"}, true, 0, nil},
		{"method not allowed on that host", APIRequest{Host: gmailHost, Method: http.MethodPost, Path: "/users/me/profile"}, true, 0, nil},
		{"unknown host", APIRequest{Host: "attacker.example", Path: "/calendar/v3/calendars"}, true, 0, nil},
		{"redirect to another of the provider's hosts", APIRequest{Host: gmailHost, Path: "/users/me/profile",
			Query: url.Values{"to": {www.URL + "/calendar/v3/calendars"}}}, false, http.StatusFound, []string{"gmail /gmail/v1/users/me/profile"}},
		{"redirect to another host, same path", APIRequest{Host: gmailHost, Path: "/users/me/profile",
			Query: url.Values{"to": {www.URL + "/gmail/v1/users/me/labels"}}}, false, http.StatusFound, []string{"gmail /gmail/v1/users/me/profile"}},
		{"redirect out of the host's base", APIRequest{Host: gmailHost, Path: "/users/me/profile",
			Query: url.Values{"to": {"/elsewhere"}}}, false, http.StatusFound, []string{"gmail /gmail/v1/users/me/profile"}},
		{"redirect within the host's base", APIRequest{Host: gmailHost, Path: "/users/me/profile",
			Query: url.Values{"to": {"/gmail/v1/users/me/labels"}}}, false, 200, []string{"gmail /gmail/v1/users/me/profile", "gmail /gmail/v1/users/me/labels"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			hits = nil
			mu.Unlock()
			if tc.req.Method == "" {
				tc.req.Method = http.MethodGet
			}
			resp, err := k.Do(context.Background(), "c1", tc.req)
			var re *RequestError
			if tc.refused != errors.As(err, &re) || !tc.refused && (err != nil || resp.Status != tc.status) {
				t.Fatalf("Do = %d, %v; want refused=%v status %d", resp.Status, err, tc.refused, tc.status)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(hits) != len(tc.wantHits) {
				t.Fatalf("hits %q, want %q", hits, tc.wantHits)
			}
			for i, h := range hits {
				if h != tc.wantHits[i]+" Bearer "+token {
					t.Fatalf("hit %q, want %q with the token", h, tc.wantHits[i])
				}
			}
		})
	}
}

// TestRefusedTokenReplacedMeanwhile: a 401 to a token with no refresh
// token marks the connection needs_reconnect, unless the stored token was
// replaced while the request was under way (the person reconnected): the
// new token is left alone.
func TestRefusedTokenReplacedMeanwhile(t *testing.T) {
	ctx := context.Background()
	gh := fakeprovider.NewGitHub(t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "secret-value",
		RedirectURIs: []string{"https://broker.test/cb"}, AutoApprove: true})
	conf := oauth2.Config{ClientID: "gh-client", ClientSecret: "secret-value", RedirectURL: "https://broker.test/cb",
		Endpoint: oauth2.Endpoint{AuthURL: gh.AuthURL(), TokenURL: gh.TokenURL(), AuthStyle: oauth2.AuthStyleInParams}}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(conf.AuthCodeURL("st"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	good, err := conf.Exchange(ctx, loc.Query().Get("code"))
	if err != nil {
		t.Fatal(err)
	}
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + gh.AuthURL() + `
    token_url: ` + gh.TokenURL() + `
    token_endpoint_auth: client_secret_post
    client_id: gh-client
    client_secret: ${S}
    account: {url: ` + gh.URL() + `/user, id_field: id}
    api: {base_url: ` + gh.URL() + `}
`
	pause := &pauseFirst{next: http.DefaultTransport, path: "/user", held: make(chan struct{}), release: make(chan struct{})}
	k, st := storeWith(t, doc, vault.TokenSet{AccessToken: "gho_revokedlongago"}, vault.StatusActive, Options{HTTPClient: &http.Client{Transport: pause}})
	done := make(chan error, 1)
	go func() {
		_, err := k.Do(ctx, "c1", APIRequest{Method: http.MethodGet, Path: "/user"})
		done <- err
	}()
	<-pause.held
	if _, err := st.UpdateConnection(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
		c.Token = TokenSet(good) // reconnected in the browser meanwhile
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	close(pause.release)
	if err := <-done; !errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("the refused call: %v, want ErrNeedsReconnect", err)
	}
	if c, _ := st.GetConnection(ctx, "c1"); c.Status != vault.StatusActive || c.Token.AccessToken.Reveal() != good.AccessToken {
		t.Fatalf("status %s; the new token was marked or replaced", c.Status)
	}
	if r, err := k.Do(ctx, "c1", APIRequest{Method: http.MethodGet, Path: "/user"}); err != nil || r.Status != http.StatusOK {
		t.Fatalf("next call: %d %v", r.Status, err)
	}
}
