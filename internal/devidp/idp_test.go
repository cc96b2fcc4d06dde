package devidp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/htmlform"
)

const rpCallback = "http://127.0.0.1:1/rp/callback" // never dialled: redirects to it are stopped

// browser is an HTTP client with a cookie jar that stops at the RP's callback.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{
		Jar:     jar,
		Timeout: 10 * time.Second,
		CheckRedirect: func(req *http.Request, _ []*http.Request) error {
			if req.URL.Host == "127.0.0.1:1" {
				return http.ErrUseLastResponse
			}
			return nil
		},
	}
}

// page is one response: its final URL, status and body.
type page struct {
	url    *url.URL
	status int
	body   string
	loc    string // Location when the RP callback was reached
	header http.Header
}

func get(t *testing.T, c *http.Client, u string) page {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	return read(t, resp)
}

func read(t *testing.T, resp *http.Response) page {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return page{url: resp.Request.URL, status: resp.StatusCode, body: string(b), loc: resp.Header.Get("Location"), header: resp.Header}
}

// submitLogin posts the sign-in form found on p as a browser would: its
// hidden inputs (auth request id, CSRF token) plus the credentials.
func submitLogin(t *testing.T, c *http.Client, p page, user, pass string) page {
	t.Helper()
	return post(t, c, loginForm(t, p, url.Values{"username": {user}, "password": {pass}}), nil)
}

// loginForm reads the sign-in form on p: where it posts and what.
func loginForm(t *testing.T, p page, extra url.Values) form {
	t.Helper()
	target, vals, err := htmlform.Find(p.url, p.body, "login", extra)
	if err != nil {
		t.Fatalf("no sign-in form on %s (status %d): %v\n%s", p.url, p.status, err, p.body)
	}
	return form{target: target.String(), vals: vals}
}

type form struct {
	target string
	vals   url.Values
}

// post sends f with the given extra headers (Origin, Referer, ...).
func post(t *testing.T, c *http.Client, f form, header http.Header) page {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.target, strings.NewReader(f.vals.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return read(t, resp)
}

// callbackParams returns the query of the redirect to the RP, failing otherwise.
func callbackParams(t *testing.T, p page) url.Values {
	t.Helper()
	if p.status != http.StatusFound || !strings.HasPrefix(p.loc, rpCallback) {
		t.Fatalf("want redirect to RP, got %d %q: %s", p.status, p.loc, p.body)
	}
	u, err := url.Parse(p.loc)
	if err != nil {
		t.Fatal(err)
	}
	return u.Query()
}

type rp struct {
	provider *oidc.Provider
	config   oauth2.Config
	verifier *oidc.IDTokenVerifier
}

func newRP(t *testing.T, idp *devidp.IdP, id, secret string) rp {
	t.Helper()
	ctx := context.Background()
	prov, err := oidc.NewProvider(ctx, idp.Issuer())
	if err != nil {
		t.Fatalf("discovery: %v", err)
	}
	return rp{
		provider: prov,
		config: oauth2.Config{
			ClientID: id, ClientSecret: secret, Endpoint: prov.Endpoint(),
			RedirectURL: rpCallback, Scopes: []string{oidc.ScopeOpenID, "email", "profile"},
		},
		verifier: prov.Verifier(&oidc.Config{ClientID: id}),
	}
}

// login runs the code flow up to the token response and verifies the ID token.
func (r rp) login(t *testing.T, c *http.Client, user, pass string, extra ...oauth2.AuthCodeOption) (*oidc.IDToken, *oauth2.Token) {
	t.Helper()
	verifier, state, nonce := oauth2.GenerateVerifier(), oauth2.GenerateVerifier(), oauth2.GenerateVerifier()
	opts := append([]oauth2.AuthCodeOption{oauth2.S256ChallengeOption(verifier), oidc.Nonce(nonce)}, extra...)
	p := get(t, c, r.config.AuthCodeURL(state, opts...))
	if p.status == http.StatusOK {
		p = submitLogin(t, c, p, user, pass)
	}
	q := callbackParams(t, p)
	if q.Get("state") != state {
		t.Fatalf("state = %q, want %q", q.Get("state"), state)
	}
	tok, err := r.config.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := r.verifier.Verify(context.Background(), raw)
	if err != nil {
		t.Fatalf("verify id token: %v", err)
	}
	if idt.Nonce != nonce {
		t.Fatalf("nonce = %q, want %q", idt.Nonce, nonce)
	}
	return idt, tok
}

func TestDiscovery(t *testing.T) {
	idp := devidptest.Start(t, nil, nil)
	resp, err := http.Get(idp.Issuer() + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if m["issuer"] != idp.Issuer() || !strings.HasPrefix(m["authorization_endpoint"].(string), idp.Issuer()+"/") ||
		!strings.HasPrefix(m["jwks_uri"].(string), idp.Issuer()+"/") {
		t.Fatalf("discovery = %s", raw)
	}
	if got, _ := json.Marshal(m["code_challenge_methods_supported"]); !strings.Contains(string(got), "S256") {
		t.Errorf("S256 not advertised: %s", got)
	}
	if got, _ := json.Marshal(m["token_endpoint_auth_methods_supported"]); !strings.Contains(string(got), "client_secret_post") ||
		!strings.Contains(string(got), "client_secret_basic") {
		t.Errorf("auth methods: %s", got)
	}
}

func TestCodeFlow(t *testing.T) {
	idp := devidptest.Start(t, nil, nil)
	clients := []struct {
		name   string
		client devidp.Client
		style  oauth2.AuthStyle
	}{
		{"confidential basic", devidp.Client{ID: "web-basic", Secret: "s3cret-basic", RedirectURIs: []string{rpCallback}}, oauth2.AuthStyleInHeader},
		{"confidential post", devidp.Client{ID: "web-post", Secret: "s3cret-post", RedirectURIs: []string{rpCallback}}, oauth2.AuthStyleInParams},
		{"public", devidp.Client{ID: "native", RedirectURIs: []string{rpCallback}}, oauth2.AuthStyleInParams},
	}
	for _, tc := range clients {
		t.Run(tc.name, func(t *testing.T) {
			if err := idp.AddClient(tc.client); err != nil {
				t.Fatal(err)
			}
			r := newRP(t, idp, tc.client.ID, tc.client.Secret)
			r.config.Endpoint.AuthStyle = tc.style
			for _, u := range []struct{ user, sub, email, name string }{
				{"alice", "alice", "alice@example.test", "Alice"},
				{"bob", "bob", "bob@example.test", "Bob"},
			} {
				c := browser(t) // a fresh browser per user: no session
				idt, tok := r.login(t, c, u.user, u.user)
				var claims struct {
					Email, Name string
					Nonce       string
				}
				if err := idt.Claims(&claims); err != nil {
					t.Fatal(err)
				}
				if idt.Subject != u.sub || claims.Email != u.email || claims.Name != u.name || idt.Issuer != idp.Issuer() {
					t.Fatalf("id token: sub=%q iss=%q claims=%+v", idt.Subject, idt.Issuer, claims)
				}
				info, err := r.provider.UserInfo(context.Background(), oauth2.StaticTokenSource(tok))
				if err != nil {
					t.Fatalf("userinfo: %v", err)
				}
				if info.Subject != u.sub || info.Email != u.email {
					t.Fatalf("userinfo = %+v", info)
				}
			}
		})
	}
}

func TestSessionAndPromptLogin(t *testing.T) {
	idp := devidptest.Start(t, nil, []devidp.Client{
		{ID: "a", Secret: "sa", RedirectURIs: []string{rpCallback}},
		{ID: "b", Secret: "sb", RedirectURIs: []string{rpCallback}},
	})
	c := browser(t)
	ra, rb := newRP(t, idp, "a", "sa"), newRP(t, idp, "b", "sb")
	ra.login(t, c, "alice", "alice")

	// Same browser, another client: the session cookie completes it at once.
	p := get(t, c, rb.config.AuthCodeURL("st", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
	if q := callbackParams(t, p); q.Get("code") == "" {
		t.Fatalf("no code: %v", q)
	}
	// And a full second login with token exchange works too.
	if idt, _ := rb.login(t, c, "", ""); idt.Subject != "alice" {
		t.Fatalf("sub = %q", idt.Subject)
	}

	// prompt=login shows the form despite the session; bob can switch in.
	p = get(t, c, ra.config.AuthCodeURL("st", oauth2.SetAuthURLParam("prompt", "login")))
	if p.status != http.StatusOK || !strings.Contains(p.body, `name="password"`) {
		t.Fatalf("prompt=login: %d %s", p.status, p.body)
	}
	if idt, _ := ra.login(t, c, "bob", "bob", oauth2.SetAuthURLParam("prompt", "login")); idt.Subject != "bob" {
		t.Fatalf("sub = %q", idt.Subject)
	}

	// prompt=none without a session: login_required back to the client.
	p = get(t, browser(t), ra.config.AuthCodeURL("st2", oauth2.SetAuthURLParam("prompt", "none")))
	if q := callbackParams(t, p); q.Get("error") != "login_required" || q.Get("state") != "st2" {
		t.Fatalf("prompt=none: %v", q)
	}
}

func TestLoginPage(t *testing.T) {
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "a", Secret: "sa", RedirectURIs: []string{rpCallback}}})
	r := newRP(t, idp, "a", "sa")
	c := browser(t)
	p := get(t, c, r.config.AuthCodeURL("st"))
	if p.status != http.StatusOK {
		t.Fatalf("status %d", p.status)
	}
	if got := strings.Count(p.body, `type="submit"`) + strings.Count(p.body, "<button"); got != 2 { // one <button type="submit">
		t.Errorf("want exactly one submit button, body: %s", p.body)
	}
	for _, want := range []string{`name="username"`, `name="password"`, `<form method="post"`} {
		if !strings.Contains(p.body, want) {
			t.Errorf("page lacks %s", want)
		}
	}
	if strings.Contains(p.body, "<script") || !strings.Contains(p.header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("CSP/script: %q", p.header.Get("Content-Security-Policy"))
	}

	tests := []struct {
		name, user, pass string
	}{
		{"wrong password", "alice", "bob"},
		{"unknown user", "mallory", "x"},
		{"hostile username", `<script>alert(1)</script>`, "x"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := submitLogin(t, c, p, tc.user, tc.pass)
			if got.status != http.StatusUnauthorized || !strings.Contains(got.body, "Wrong username or password") ||
				!strings.Contains(got.body, `name="password"`) {
				t.Fatalf("got %d: %s", got.status, got.body)
			}
			if strings.Contains(got.body, "<script>") {
				t.Fatalf("unescaped input: %s", got.body)
			}
			p = got
		})
	}
	// The form shown again still works.
	q := callbackParams(t, submitLogin(t, c, p, "alice", "alice"))
	if q.Get("code") == "" || q.Get("state") != "st" {
		t.Fatalf("callback %v", q)
	}
	// The request is spent: its form cannot be replayed.
	if got := submitLogin(t, c, p, "alice", "alice"); got.status != http.StatusBadRequest {
		t.Fatalf("replay: %d", got.status)
	}
}

func TestRefusals(t *testing.T) {
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "a", Secret: "sa", RedirectURIs: []string{rpCallback}}})
	r := newRP(t, idp, "a", "sa")

	t.Run("unregistered redirect URI", func(t *testing.T) {
		cfg := r.config
		cfg.RedirectURL = "http://127.0.0.1:1/evil"
		p := get(t, browser(t), cfg.AuthCodeURL("st"))
		if p.status != http.StatusBadRequest || p.loc != "" {
			t.Fatalf("got %d loc=%q", p.status, p.loc)
		}
	})
	t.Run("unknown client", func(t *testing.T) {
		cfg := r.config
		cfg.ClientID = "nobody"
		if p := get(t, browser(t), cfg.AuthCodeURL("st")); p.status != http.StatusBadRequest || p.loc != "" {
			t.Fatalf("got %d loc=%q", p.status, p.loc)
		}
	})

	// Codes for the exchange tests.
	code := func(t *testing.T, verifier string) string {
		c := browser(t)
		p := submitLogin(t, c, get(t, c, r.config.AuthCodeURL("st", oauth2.S256ChallengeOption(verifier))), "alice", "alice")
		return callbackParams(t, p).Get("code")
	}
	exchangeErr := func(t *testing.T, cfg oauth2.Config, code string, opts ...oauth2.AuthCodeOption) {
		t.Helper()
		_, err := cfg.Exchange(context.Background(), code, opts...)
		var re *oauth2.RetrieveError
		if !errors.As(err, &re) {
			t.Fatalf("want RetrieveError, got %v", err)
		}
		if re.ErrorCode != "invalid_grant" && re.ErrorCode != "invalid_client" && re.ErrorCode != "unauthorized_client" {
			t.Fatalf("error code %q", re.ErrorCode)
		}
	}
	t.Run("wrong PKCE verifier", func(t *testing.T) {
		exchangeErr(t, r.config, code(t, oauth2.GenerateVerifier()), oauth2.VerifierOption(oauth2.GenerateVerifier()))
	})
	t.Run("wrong client secret", func(t *testing.T) {
		v := oauth2.GenerateVerifier()
		cfg := r.config
		cfg.ClientSecret = "nope"
		exchangeErr(t, cfg, code(t, v), oauth2.VerifierOption(v))
	})
	t.Run("code reuse", func(t *testing.T) {
		v := oauth2.GenerateVerifier()
		cd := code(t, v)
		if _, err := r.config.Exchange(context.Background(), cd, oauth2.VerifierOption(v)); err != nil {
			t.Fatal(err)
		}
		exchangeErr(t, r.config, cd, oauth2.VerifierOption(v))
	})
	t.Run("redirect URI mismatch at exchange", func(t *testing.T) {
		v := oauth2.GenerateVerifier()
		cfg := r.config
		cd := code(t, v)
		cfg.RedirectURL = "http://127.0.0.1:1/other"
		exchangeErr(t, cfg, cd, oauth2.VerifierOption(v))
	})
}

func TestMintAccessToken(t *testing.T) {
	idp := devidptest.Start(t, nil, nil)
	const aud = "http://127.0.0.1:8080/mcp"
	tok, exp, err := idp.MintAccessToken("alice", aud, []string{"mcp", "read"}, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(exp); d < 4*time.Minute || d > 6*time.Minute {
		t.Fatalf("expiry in %v", d)
	}
	prov, err := oidc.NewProvider(context.Background(), idp.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	var jwks struct {
		JWKSURI string `json:"jwks_uri"`
	}
	if err := prov.Claims(&jwks); err != nil {
		t.Fatal(err)
	}
	ks := oidc.NewRemoteKeySet(context.Background(), jwks.JWKSURI)
	v := oidc.NewVerifier(idp.Issuer(), ks, &oidc.Config{ClientID: aud})
	got, err := v.Verify(context.Background(), tok)
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	var c struct {
		S        string `json:"scope"`
		CID      string `json:"client_id"`
		J        string `json:"jti"`
		Nbf, Iat int64
	}
	if err := got.Claims(&c); err != nil {
		t.Fatal(err)
	}
	if got.Subject != "alice" || c.S != "mcp read" || c.CID != "dev" || c.J == "" || c.Nbf == 0 || c.Iat == 0 {
		t.Fatalf("claims sub=%q %+v", got.Subject, c)
	}
	// Another audience is refused; unknown users cannot be minted.
	if _, err := oidc.NewVerifier(idp.Issuer(), ks, &oidc.Config{ClientID: "other"}).Verify(context.Background(), tok); err == nil {
		t.Fatal("wrong audience accepted")
	}
	if _, _, err := idp.MintAccessToken("mallory", aud, nil, time.Minute); err == nil {
		t.Fatal("unknown user minted")
	}
	// A token signed by another IdP's key does not verify.
	other := devidptest.Start(t, nil, nil)
	forged, _, _ := other.MintAccessToken("alice", aud, nil, time.Minute)
	if _, err := v.Verify(context.Background(), forged); err == nil {
		t.Fatal("foreign token accepted")
	}
}

func TestNewValidation(t *testing.T) {
	for _, iss := range []string{"", "ftp://x", "http://127.0.0.1/x/", "http://127.0.0.1/x?q=1", "/relative"} {
		if _, err := devidp.New(devidp.Options{Issuer: iss}); err == nil {
			t.Errorf("issuer %q accepted", iss)
		}
	}
	if _, err := devidp.New(devidp.Options{Issuer: "http://127.0.0.1/i", Users: []devidp.User{{Username: "a", Subject: "a"}, {Username: "a", Subject: "b"}}}); err == nil {
		t.Error("duplicate user accepted")
	}
}

func TestIssuerAtRoot(t *testing.T) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	idp, err := devidp.New(devidp.Options{Issuer: srv.URL, Users: devidp.DefaultUsers(),
		Clients: []devidp.Client{{ID: "a", Secret: "sa", RedirectURIs: []string{rpCallback}}}})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/", idp.Handler())
	r := newRP(t, idp, "a", "sa")
	if idt, _ := r.login(t, browser(t), "bob", "bob"); idt.Subject != "bob" {
		t.Fatalf("sub %q", idt.Subject)
	}
}

// TestLoginCSRF: the sign-in form cannot be posted from another site or
// without the token this browser was given for this auth request (login
// CSRF: signing the visitor's browser in as someone else). Every refused
// post carries bob's correct password, so a refusal that came too late
// would sign bob in. Each case uses a fresh victim browser holding two open
// forms of its own, so one failing check does not spill into the next case.
func TestLoginCSRF(t *testing.T) {
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "a", Secret: "sa", RedirectURIs: []string{rpCallback}}})
	r := newRP(t, idp, "a", "sa")
	iss, _ := url.Parse(idp.Issuer())
	self := iss.Scheme + "://" + iss.Host
	bob := url.Values{"username": {"bob"}, "password": {"bob"}}
	loginPage := func(t *testing.T, c *http.Client) page {
		t.Helper()
		p := get(t, c, r.config.AuthCodeURL("st", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
		if p.status != http.StatusOK || !strings.Contains(p.body, `name="password"`) {
			t.Fatalf("no sign-in form (a session exists?): %d %s", p.status, p.body)
		}
		return p
	}
	with := func(f form, k, v string) form {
		vals := url.Values{}
		for key, vv := range f.vals {
			vals[key] = append([]string(nil), vv...)
		}
		if v == "" {
			vals.Del(k)
		} else {
			vals.Set(k, v)
		}
		return form{target: f.target, vals: vals}
	}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	// setup is one case's world: mallory's live request and its form (she
	// started it, so she can read its token), and a victim browser that
	// holds two open forms of its own.
	type world struct{ attack, own1, own2 form }
	setup := func(t *testing.T) (world, *http.Client) {
		t.Helper()
		w := world{attack: loginForm(t, loginPage(t, browser(t)), bob)}
		victim := browser(t)
		w.own1, w.own2 = loginForm(t, loginPage(t, victim), bob), loginForm(t, loginPage(t, victim), bob)
		if w.attack.vals.Get("csrf") == "" || w.own1.vals.Get("csrf") == w.own2.vals.Get("csrf") {
			t.Fatalf("tokens: attack %q, own %q and %q; want one per request", w.attack.vals.Get("csrf"), w.own1.vals.Get("csrf"), w.own2.vals.Get("csrf"))
		}
		return w, victim
	}

	refused := []struct {
		name   string
		post   func(w world) form
		header http.Header
	}{
		// The attack: another site posts mallory's live request from the
		// victim's browser.
		{"cross-site post of a live request", func(w world) form { return w.attack }, hdr("Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site")},
		{"cross-site post from a browser without Sec-Fetch-Site", func(w world) form { return w.attack }, hdr("Origin", "http://evil.example")},
		{"same post from a browser sending no Origin", func(w world) form { return w.attack }, nil},
		// The origin check alone: the victim's own valid form, posted from elsewhere.
		{"Origin of another site", func(w world) form { return w.own1 }, hdr("Origin", "http://evil.example")},
		{"Origin of another port", func(w world) form { return w.own1 }, hdr("Origin", "http://127.0.0.1:1")},
		{"opaque Origin", func(w world) form { return w.own1 }, hdr("Origin", "null")},
		{"Sec-Fetch-Site cross-site", func(w world) form { return w.own1 }, hdr("Sec-Fetch-Site", "cross-site")},
		{"Sec-Fetch-Site same-site", func(w world) form { return w.own1 }, hdr("Sec-Fetch-Site", "same-site")},
		{"Referer of another site without Origin", func(w world) form { return w.own1 }, hdr("Referer", "http://evil.example/page")},
		// The token check alone: same-origin posts.
		{"no token", func(w world) form { return with(w.own1, "csrf", "") }, hdr("Origin", self)},
		{"another request's token", func(w world) form { return with(w.own1, "csrf", w.own2.vals.Get("csrf")) }, hdr("Origin", self)},
		{"tampered token", func(w world) form { return with(w.own1, "csrf", w.own1.vals.Get("csrf")[1:]+"A") }, hdr("Origin", self)},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			w, victim := setup(t)
			got := post(t, victim, tt.post(w), tt.header)
			if got.status != http.StatusForbidden || got.loc != "" || !strings.Contains(got.body, "nobody was signed in") {
				t.Fatalf("got %d loc=%q: %s", got.status, got.loc, got.body)
			}
			if sc := got.header.Values("Set-Cookie"); len(sc) != 0 {
				t.Fatalf("refused post set cookies: %q", sc)
			}
			// Nobody signed in: mallory's request still waits for a
			// sign-in, and the victim's browser has no session.
			a := w.attack
			if p := get(t, browser(t), a.target+"?authRequestID="+url.QueryEscape(a.vals.Get("authRequestID"))); p.status != http.StatusOK || !strings.Contains(p.body, `name="password"`) {
				t.Fatalf("mallory's request was used: %d %s", p.status, p.body)
			}
			loginPage(t, victim)
		})
	}
	accepted := []struct {
		name   string
		header http.Header
	}{
		{"same-origin browser post", hdr("Origin", self, "Sec-Fetch-Site", "same-origin")},
		{"same-origin Referer without Origin", hdr("Referer", self+"/idp/login")},
		{"no Origin, no Referer", nil},
	}
	for _, tt := range accepted {
		t.Run(tt.name, func(t *testing.T) {
			w, victim := setup(t)
			f := with(with(w.own2, "username", "alice"), "password", "alice")
			if q := callbackParams(t, post(t, victim, f, tt.header)); q.Get("code") == "" {
				t.Fatalf("no code: %v", q)
			}
		})
	}
}
