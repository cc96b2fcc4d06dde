package demoprovider_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/demoprovider"
)

const callback = "http://127.0.0.1:1/oauth/demo/callback" // never dialled

// clock is an injectable, advanceable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type env struct {
	p     *demoprovider.Provider
	base  string
	cfg   oauth2.Config
	clock *clock
}

func start(t *testing.T) env {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	base := srv.URL + "/dev/provider"
	p, err := demoprovider.New(demoprovider.Options{
		BaseURL: base, ClientID: "broker", ClientSecret: "demo-secret",
		RedirectURIs: []string{callback}, Now: clk.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/dev/provider/", p.Handler())
	return env{p: p, base: base, clock: clk, cfg: oauth2.Config{
		ClientID: "broker", ClientSecret: "demo-secret", RedirectURL: callback, Scopes: []string{"user", "repos"},
		Endpoint: oauth2.Endpoint{AuthURL: p.AuthURL(), TokenURL: p.TokenURL(), AuthStyle: oauth2.AuthStyleInHeader},
	}}
}

var noFollow = &http.Client{
	Timeout:       10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

var requestField = regexp.MustCompile(`name="request" value="([^"]+)"`)

// consent opens the consent page and submits decision for account ("" = leave the default).
func (e env) consent(t *testing.T, authURL, decision, account string) url.Values {
	t.Helper()
	resp, err := noFollow.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("authorize: %d %s", resp.StatusCode, body)
	}
	page := string(body)
	for _, want := range []string{
		`<select name="account">`, `<option value="1001" selected>alice-demo</option>`, `<option value="1002">bob-demo</option>`,
		`<button type="submit" name="decision" value="approve">`, `<button type="submit" name="decision" value="deny">`,
	} {
		if !strings.Contains(page, want) {
			t.Fatalf("consent page lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, "<script") || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatal("script or missing CSP")
	}
	if account == "" {
		account = "1001"
	}
	form := url.Values{"request": {requestField.FindStringSubmatch(page)[1]}, "decision": {decision}, "account": {account}}
	resp, err = noFollow.PostForm(e.base+"/authorize", form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, callback) {
		t.Fatalf("want redirect to client: %d %q", resp.StatusCode, loc)
	}
	u, _ := url.Parse(loc)
	return u.Query()
}

// connect runs the whole code flow for account.
func (e env) connect(t *testing.T, account string) *oauth2.Token {
	t.Helper()
	v := oauth2.GenerateVerifier()
	q := e.consent(t, e.cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(v)), "approve", account)
	if q.Get("state") != "st" {
		t.Fatalf("state %q", q.Get("state"))
	}
	tok, err := e.cfg.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(v))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (e env) get(t *testing.T, path, accessToken string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.base+path, nil)
	if accessToken != "" {
		req.Header.Set("Authorization", "Bearer "+accessToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// refresh forces a refresh_token grant.
func (e env) refresh(refreshToken string) (*oauth2.Token, error) {
	return e.cfg.TokenSource(context.Background(), &oauth2.Token{RefreshToken: refreshToken, Expiry: time.Unix(1, 0)}).Token()
}

func oauthErr(t *testing.T, err error) string {
	t.Helper()
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		t.Fatalf("want RetrieveError, got %v", err)
	}
	return re.ErrorCode
}

func TestCodeFlowAndAPI(t *testing.T) {
	e := start(t)
	for _, tc := range []struct{ account, login string }{{"", "alice-demo"}, {"1002", "bob-demo"}} {
		t.Run(tc.login, func(t *testing.T) {
			tok := e.connect(t, tc.account)
			if tok.RefreshToken == "" || tok.TokenType != "Bearer" {
				t.Fatalf("token %+v", tok)
			}
			if d := time.Until(tok.Expiry); d < 4*time.Minute || d > 6*time.Minute {
				t.Fatalf("expires in %v, want 5m", d)
			}
			status, body, _ := e.get(t, "/api/user", tok.AccessToken)
			var u demoprovider.Account
			if err := json.Unmarshal([]byte(body), &u); err != nil || status != 200 || u.Login != tc.login {
				t.Fatalf("GET /api/user: %d %s", status, body)
			}
			status, body, _ = e.get(t, "/api/repos", tok.AccessToken)
			if status != 200 || !strings.Contains(body, tc.login+"/hello-demo") {
				t.Fatalf("GET /api/repos: %d %s", status, body)
			}
		})
	}
	// alice is 1001.
	tok := e.connect(t, "")
	if _, body, _ := e.get(t, "/api/user", tok.AccessToken); strings.TrimSpace(body) != `{"id":1001,"login":"alice-demo"}` {
		t.Fatalf("body %s", body)
	}
}

func TestDeny(t *testing.T) {
	e := start(t)
	q := e.consent(t, e.cfg.AuthCodeURL("st", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())), "deny", "")
	if q.Get("error") != "access_denied" || q.Get("code") != "" || q.Get("state") != "st" {
		t.Fatalf("%v", q)
	}
}

func TestAuthorizeRefusals(t *testing.T) {
	e := start(t)
	v := oauth2.GenerateVerifier()
	tests := []struct {
		name      string
		url       string
		wantError string // redirected error; "" = error page, no redirect
	}{
		{"no PKCE", e.cfg.AuthCodeURL("s"), "invalid_request"},
		{"plain PKCE", e.cfg.AuthCodeURL("s", oauth2.SetAuthURLParam("code_challenge", v), oauth2.SetAuthURLParam("code_challenge_method", "plain")), "invalid_request"},
		{"unknown client", strings.Replace(e.cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)), "client_id=broker", "client_id=evil", 1), ""},
		{"unregistered redirect", strings.Replace(e.cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)), url.QueryEscape(callback), url.QueryEscape("http://127.0.0.1:1/evil"), 1), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := noFollow.Get(tc.url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			loc := resp.Header.Get("Location")
			if tc.wantError == "" {
				if resp.StatusCode != 400 || loc != "" {
					t.Fatalf("got %d %q", resp.StatusCode, loc)
				}
				return
			}
			u, _ := url.Parse(loc)
			if resp.StatusCode != 302 || u.Query().Get("error") != tc.wantError {
				t.Fatalf("got %d %q %s", resp.StatusCode, loc, body)
			}
		})
	}
	t.Run("hostile decision form", func(t *testing.T) {
		for _, form := range []url.Values{
			{"request": {"nope"}, "decision": {"approve"}, "account": {"1001"}},
			{"request": {"x"}, "decision": {"approve"}, "account": {"9999"}},
			{"request": {"x"}, "decision": {"<script>"}, "account": {"1001"}},
		} {
			resp, err := noFollow.PostForm(e.base+"/authorize", form)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || strings.Contains(string(b), "<script>") {
				t.Fatalf("%v: %d", form, resp.StatusCode)
			}
		}
	})
}

func TestTokenRefusals(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	code := func(v string) string {
		return e.consent(t, e.cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)), "approve", "").Get("code")
	}
	tests := []struct {
		name string
		run  func() error
		want string
	}{
		{"wrong verifier", func() error {
			_, err := e.cfg.Exchange(ctx, code(oauth2.GenerateVerifier()), oauth2.VerifierOption(oauth2.GenerateVerifier()))
			return err
		}, "invalid_grant"},
		{"no verifier", func() error { _, err := e.cfg.Exchange(ctx, code(oauth2.GenerateVerifier())); return err }, "invalid_grant"},
		{"code reuse", func() error {
			v := oauth2.GenerateVerifier()
			c := code(v)
			if _, err := e.cfg.Exchange(ctx, c, oauth2.VerifierOption(v)); err != nil {
				return err
			}
			_, err := e.cfg.Exchange(ctx, c, oauth2.VerifierOption(v))
			return err
		}, "invalid_grant"},
		{"wrong secret", func() error {
			cfg := e.cfg
			cfg.ClientSecret = "nope"
			v := oauth2.GenerateVerifier()
			_, err := cfg.Exchange(ctx, code(v), oauth2.VerifierOption(v))
			return err
		}, "invalid_client"},
		{"expired code", func() error {
			v := oauth2.GenerateVerifier()
			c := code(v)
			e.clock.Add(6 * time.Minute)
			_, err := e.cfg.Exchange(ctx, c, oauth2.VerifierOption(v))
			return err
		}, "invalid_grant"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := oauthErr(t, tc.run()); got != tc.want {
				t.Fatalf("got %q want %q", got, tc.want)
			}
		})
	}
}

func TestRefreshRotationAndReuse(t *testing.T) {
	e := start(t)
	tok := e.connect(t, "")
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	if next.RefreshToken == "" || next.RefreshToken == tok.RefreshToken || next.AccessToken == tok.AccessToken {
		t.Fatalf("no rotation: %+v", next)
	}
	if status, _, _ := e.get(t, "/api/user", next.AccessToken); status != 200 {
		t.Fatalf("new access token: %d", status)
	}
	// The spent refresh token is refused, and its reuse ends the grant.
	if _, err := e.refresh(tok.RefreshToken); oauthErr(t, err) != "invalid_grant" {
		t.Fatal("spent refresh token accepted")
	}
	if _, err := e.refresh(next.RefreshToken); oauthErr(t, err) != "invalid_grant" {
		t.Fatal("grant survived refresh token reuse")
	}
	if status, _, _ := e.get(t, "/api/user", next.AccessToken); status != 401 {
		t.Fatalf("access token survived reuse detection: %d", status)
	}
	// Another grant is untouched.
	other := e.connect(t, "1002")
	if _, err := e.refresh(other.RefreshToken); err != nil {
		t.Fatal(err)
	}

	// The log shows the order: refresh ok, then the refused reuse.
	var got []string
	for _, ev := range e.p.Events() {
		if ev.Kind == "token" {
			got = append(got, ev.GrantType+":"+ev.Error)
		}
	}
	want := "authorization_code: refresh_token: refresh_token:invalid_grant refresh_token:invalid_grant authorization_code: refresh_token:"
	if strings.Join(got, " ") != want {
		t.Fatalf("token events\n got %s\nwant %s", strings.Join(got, " "), want)
	}
}

func TestExpiry(t *testing.T) {
	e := start(t)
	tok := e.connect(t, "")
	e.clock.Add(4 * time.Minute)
	if status, _, _ := e.get(t, "/api/user", tok.AccessToken); status != 200 {
		t.Fatalf("before expiry: %d", status)
	}
	e.clock.Add(2 * time.Minute)
	status, _, h := e.get(t, "/api/user", tok.AccessToken)
	if status != 401 || !strings.Contains(h.Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Fatalf("after expiry: %d %q", status, h.Get("WWW-Authenticate"))
	}
	// A refresh brings it back.
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatal(err)
	}
	if status, _, _ := e.get(t, "/api/user", next.AccessToken); status != 200 {
		t.Fatalf("after refresh: %d", status)
	}
	// 401 challenges for missing and bogus tokens.
	for _, tokv := range []string{"", "bogus"} {
		status, _, h := e.get(t, "/api/repos", tokv)
		if status != 401 || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("%q: %d %q", tokv, status, h.Get("WWW-Authenticate"))
		}
	}
	// A refresh token is not an access token.
	if status, _, _ := e.get(t, "/api/user", next.RefreshToken); status != 401 {
		t.Fatal("refresh token accepted as access token")
	}
}

func TestRevocation(t *testing.T) {
	e := start(t)
	revoke := func(tok, secret string) int {
		req, _ := http.NewRequest(http.MethodPost, e.p.RevokeURL(), strings.NewReader(url.Values{"token": {tok}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("broker", secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tests := []struct {
		name  string
		which func(*oauth2.Token) string
	}{
		{"refresh token", func(t *oauth2.Token) string { return t.RefreshToken }},
		{"access token", func(t *oauth2.Token) string { return t.AccessToken }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok := e.connect(t, "")
			if got := revoke(tc.which(tok), "wrong"); got != 401 {
				t.Fatalf("bad client: %d", got)
			}
			if status, _, _ := e.get(t, "/api/user", tok.AccessToken); status != 200 {
				t.Fatal("revoked by an unauthenticated request")
			}
			if got := revoke(tc.which(tok), "demo-secret"); got != 200 {
				t.Fatalf("revoke: %d", got)
			}
			if status, _, _ := e.get(t, "/api/user", tok.AccessToken); status != 401 {
				t.Fatal("access token works after revocation")
			}
			if _, err := e.refresh(tok.RefreshToken); oauthErr(t, err) != "invalid_grant" {
				t.Fatal("refresh token works after revocation")
			}
		})
	}
	// RFC 7009: unknown tokens still get 200.
	if got := revoke("never-issued", "demo-secret"); got != 200 {
		t.Fatalf("unknown token: %d", got)
	}
	// The log names tokens by fingerprint only.
	for _, ev := range e.p.Events() {
		if ev.Kind == "revoke" && ev.Token == "" {
			t.Fatalf("revoke event without fingerprint: %+v", ev)
		}
	}
}

// TestRevocationFailsOnDemand: FailRevocations(1) answers 503 once and
// revokes nothing; the next request revokes.
func TestRevocationFailsOnDemand(t *testing.T) {
	e := start(t)
	tok := e.connect(t, "")
	e.p.FailRevocations(1)
	revoke := func() int {
		req, _ := http.NewRequest(http.MethodPost, e.p.RevokeURL(), strings.NewReader(url.Values{"token": {tok.RefreshToken}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.SetBasicAuth("broker", "demo-secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := revoke(); got != http.StatusServiceUnavailable {
		t.Fatalf("first revocation: %d, want 503", got)
	}
	if status, _, _ := e.get(t, "/api/user", tok.AccessToken); status != 200 {
		t.Fatal("the failed revocation revoked")
	}
	if got := revoke(); got != 200 {
		t.Fatalf("second revocation: %d", got)
	}
	if status, _, _ := e.get(t, "/api/user", tok.AccessToken); status != 401 {
		t.Fatal("access token works after revocation")
	}
}

// TestRefreshIdleExpiry: a refresh token unused for RefreshIdleTTL is
// dead; one used in time is replaced by a new one with a new idle period.
func TestRefreshIdleExpiry(t *testing.T) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	p, err := demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/dev/provider", ClientID: "broker", ClientSecret: "demo-secret",
		RedirectURIs: []string{callback}, Now: clk.Now, RefreshIdleTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/dev/provider/", p.Handler())
	e := env{p: p, base: srv.URL + "/dev/provider", clock: clk, cfg: oauth2.Config{
		ClientID: "broker", ClientSecret: "demo-secret", RedirectURL: callback,
		Endpoint: oauth2.Endpoint{AuthURL: p.AuthURL(), TokenURL: p.TokenURL(), AuthStyle: oauth2.AuthStyleInHeader},
	}}
	tok := e.connect(t, "")
	clk.Add(59 * time.Minute)
	next, err := e.refresh(tok.RefreshToken)
	if err != nil {
		t.Fatalf("refresh within the idle period: %v", err)
	}
	clk.Add(59 * time.Minute) // 118 minutes after the first token, 59 after the second
	if next, err = e.refresh(next.RefreshToken); err != nil {
		t.Fatalf("second refresh within its idle period: %v", err)
	}
	clk.Add(61 * time.Minute)
	if _, err := e.refresh(next.RefreshToken); oauthErr(t, err) != "invalid_grant" {
		t.Fatal("an idle refresh token still works")
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		name string
		opts demoprovider.Options
	}{
		{"empty", demoprovider.Options{}},
		{"relative base", demoprovider.Options{BaseURL: "/dev/provider", ClientID: "c", RedirectURIs: []string{callback}}},
		{"trailing slash", demoprovider.Options{BaseURL: "http://127.0.0.1/p/", ClientID: "c", RedirectURIs: []string{callback}}},
		{"no redirect", demoprovider.Options{BaseURL: "http://127.0.0.1/p", ClientID: "c"}},
		{"bad redirect", demoprovider.Options{BaseURL: "http://127.0.0.1/p", ClientID: "c", RedirectURIs: []string{"/cb"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := demoprovider.New(tc.opts); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	// Every problem is reported at once.
	_, err := demoprovider.New(demoprovider.Options{})
	if msg := err.Error(); !strings.Contains(msg, "BaseURL") || !strings.Contains(msg, "ClientID") || !strings.Contains(msg, "redirect") {
		t.Fatalf("error %q", msg)
	}
}

// TestKeysService: the demo-keys page shows each account's key, the keys
// API answers the key's account and 401 otherwise, and "Make a new key"
// retires the old key at once. The event log holds fingerprints only.
func TestKeysService(t *testing.T) {
	e := start(t)
	page := func() string {
		resp, err := http.Get(e.p.KeysURL())
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Security-Policy") == "" {
			t.Fatalf("keys page: HTTP %d", resp.StatusCode)
		}
		return string(b)
	}
	shown := regexp.MustCompile(`<code class="key" data-login="([a-z-]+)">([^<]+)</code>`)
	keys := map[string]string{}
	for _, m := range shown.FindAllStringSubmatch(page(), -1) {
		keys[m[1]] = m[2]
	}
	keyRE := regexp.MustCompile(`^` + demoprovider.KeyPattern + `$`)
	for _, a := range demoprovider.Accounts() {
		if k := keys[a.Login]; !keyRE.MatchString(k) || k != e.p.APIKey(a.Login) {
			t.Fatalf("%s's key on the page = %q", a.Login, k)
		}
	}
	if keys["alice-demo"] == keys["bob-demo"] {
		t.Fatal("two accounts share a key")
	}
	me := func(key string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, e.p.KeysAPIBase()+"/me", nil)
		if key != "" {
			req.Header.Set("X-Api-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := me(keys["alice-demo"]); code != 200 || !strings.Contains(body, `"login":"alice-demo"`) || !strings.Contains(body, `"id":1001`) {
		t.Fatalf("alice's key: %d %s", code, body)
	}
	if code, body := me(keys["bob-demo"]); code != 200 || !strings.Contains(body, `"login":"bob-demo"`) {
		t.Fatalf("bob's key: %d %s", code, body)
	}
	for _, bad := range []string{"", "demo_" + strings.Repeat("x", 43), keys["alice-demo"] + "x"} {
		if code, body := me(bad); code != 401 || !strings.Contains(body, "invalid_key") {
			t.Fatalf("key %q: %d %s", bad, code, body)
		}
	}
	// The page's button makes a new key for that account only.
	resp, err := noFollow.PostForm(e.p.KeysURL(), url.Values{"account": {"1001"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("rotate: HTTP %d", resp.StatusCode)
	}
	fresh := e.p.APIKey("alice-demo")
	if fresh == keys["alice-demo"] || !strings.Contains(page(), fresh) {
		t.Fatal("alice's key did not change on the page")
	}
	if code, _ := me(keys["alice-demo"]); code != 401 {
		t.Fatalf("the old key still works (%d)", code)
	}
	if code, _ := me(fresh); code != 200 {
		t.Fatalf("the new key does not work (%d)", code)
	}
	if code, _ := me(keys["bob-demo"]); code != 200 {
		t.Fatal("bob's key stopped working")
	}
	var kinds []string
	for _, ev := range e.p.Events() {
		kinds = append(kinds, ev.Kind)
		for _, k := range []string{keys["alice-demo"], keys["bob-demo"], fresh} {
			if strings.Contains(ev.Token+ev.Error+ev.Path, k) {
				t.Fatal("the event log holds a key")
			}
		}
	}
	if !strings.Contains(strings.Join(kinds, " "), "keys-api keys-api") || !slices.Contains(kinds, "rotate-key") {
		t.Fatalf("events %v", kinds)
	}
}
