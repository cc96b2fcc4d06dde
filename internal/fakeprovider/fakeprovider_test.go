package fakeprovider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/fakeprovider"
)

const callback = "http://127.0.0.1:1/cb" // never dialled

// noFollow stops at the client's callback.
var noFollow = &http.Client{
	Timeout: 10 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

var requestField = regexp.MustCompile(`name="request" value="([^"]+)"`)

// consent GETs the authorize URL, checks the button contract and submits
// decision; it returns the redirect to the client's callback.
func consent(t *testing.T, authURL, decision string) url.Values {
	t.Helper()
	resp := submitConsent(t, authURL, url.Values{"decision": {decision}})
	resp.Body.Close()
	return redirectQuery(t, resp)
}

// submitConsent GETs the authorize URL, checks the button contract and
// posts form with the page's request id; the caller closes the answer.
func submitConsent(t *testing.T, authURL string, form url.Values) *http.Response {
	t.Helper()
	resp, err := noFollow.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("authorize: %d %s", resp.StatusCode, body)
	}
	for _, want := range []string{
		`<button type="submit" name="decision" value="approve">`,
		`<button type="submit" name="decision" value="deny">`,
	} {
		if !bytes.Contains(body, []byte(want)) {
			t.Fatalf("consent page lacks %s", want)
		}
	}
	if bytes.Contains(body, []byte("<script")) || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Fatal("consent page: script or no CSP")
	}
	m := requestField.FindSubmatch(body)
	if m == nil {
		t.Fatalf("consent page without request id: %s", body)
	}
	form.Set("request", string(m[1]))
	action := resp.Request.URL.ResolveReference(&url.URL{Path: resp.Request.URL.Path})
	resp, err = noFollow.PostForm(action.String(), form)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func redirectQuery(t *testing.T, resp *http.Response) url.Values {
	t.Helper()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusFound || !strings.HasPrefix(loc, callback) {
		t.Fatalf("want redirect to client, got %d %q", resp.StatusCode, loc)
	}
	u, _ := url.Parse(loc)
	return u.Query()
}

func githubConfig(g *fakeprovider.GitHub) oauth2.Config {
	return oauth2.Config{
		ClientID: g.ClientID(), ClientSecret: g.ClientSecret(), RedirectURL: callback,
		Endpoint: oauth2.Endpoint{AuthURL: g.AuthURL(), TokenURL: g.TokenURL(), AuthStyle: oauth2.AuthStyleInParams},
		Scopes:   []string{"repo", "read:user"},
	}
}

func apiGet(t *testing.T, base, path, auth string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+path, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func retrieveCode(t *testing.T, err error) string {
	t.Helper()
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		t.Fatalf("want *oauth2.RetrieveError, got %v", err)
	}
	return re.ErrorCode
}

func TestGitHubFlow(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{})
	cfg := githubConfig(g)
	ctx := context.Background()
	v := oauth2.GenerateVerifier()
	q := consent(t, cfg.AuthCodeURL("st1", oauth2.S256ChallengeOption(v)), "approve")
	if q.Get("state") != "st1" || q.Get("code") == "" {
		t.Fatalf("callback %v", q)
	}
	tok, err := cfg.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.AccessToken, "gho_") || tok.RefreshToken != "" || !tok.Expiry.IsZero() {
		t.Fatalf("token %+v", tok)
	}
	if got := tok.Extra("scope"); got != "repo,read:user" {
		t.Errorf("scope %v", got)
	}
	// Both auth schemes work on the API.
	for _, auth := range []string{"Bearer " + tok.AccessToken, "token " + tok.AccessToken} {
		status, user := apiGet(t, g.URL(), "/user", auth)
		if status != 200 || user["login"] != "octocat" || user["id"] != float64(12345) {
			t.Fatalf("GET /user: %d %v", status, user)
		}
	}
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer gho_nope"); status != 401 {
		t.Fatalf("bad token: %d", status)
	}
	// Revoke the grant: the token stops working.
	body, _ := json.Marshal(map[string]string{"access_token": tok.AccessToken})
	req, _ := http.NewRequest(http.MethodDelete, g.URL()+"/applications/"+g.ClientID()+"/grant", bytes.NewReader(body))
	req.SetBasicAuth(g.ClientID(), g.ClientSecret())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+tok.AccessToken); status != 401 || g.TokenValid(tok.AccessToken) {
		t.Fatalf("revoked token still works: %d", status)
	}

	// The event log tells the story in order.
	var kinds []string
	for _, e := range g.Events() {
		kinds = append(kinds, e.Kind+":"+e.Error)
	}
	want := "authorize: approve: token: api: api: api:bad_credentials revoke: api:bad_credentials"
	if got := strings.Join(kinds, " "); got != want {
		t.Fatalf("events\n got %s\nwant %s", got, want)
	}
	if ev := g.Events()[2]; ev.GrantType != "authorization_code" || ev.Token != tok.AccessToken {
		t.Fatalf("token event %+v", ev)
	}
	if c := g.Counts(); c.Token != 1 || c.API != 4 || c.APIErrors != 2 || c.Revoke != 1 || c.Approve != 1 {
		t.Fatalf("counts %+v", c)
	}
}

func TestGitHubTokenResponseFormat(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true})
	for _, tc := range []struct {
		accept, wantType string
	}{
		{"", "application/x-www-form-urlencoded"},
		{"application/json", "application/json"},
	} {
		t.Run(tc.wantType, func(t *testing.T) {
			resp, err := noFollow.Get(g.AuthURL() + "?client_id=" + g.ClientID() + "&redirect_uri=" + url.QueryEscape(callback) + "&state=s")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			code := redirectQuery(t, resp).Get("code")
			form := url.Values{"client_id": {g.ClientID()}, "client_secret": {g.ClientSecret()}, "code": {code}}
			req, _ := http.NewRequest(http.MethodPost, g.TokenURL(), strings.NewReader(form.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tc.accept != "" {
				req.Header.Set("Accept", tc.accept)
			}
			resp, err = http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.wantType) || !bytes.Contains(b, []byte("gho_")) {
				t.Fatalf("%s: %s", resp.Header.Get("Content-Type"), b)
			}
		})
	}
}

func TestGitHubErrors(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true})
	cfg := githubConfig(g)
	ctx := context.Background()
	code := func(v string) string {
		resp, err := noFollow.Get(cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return redirectQuery(t, resp).Get("code")
	}
	tests := []struct {
		name string
		run  func() error
		want string
	}{
		{"wrong verifier", func() error {
			_, err := cfg.Exchange(ctx, code(oauth2.GenerateVerifier()), oauth2.VerifierOption(oauth2.GenerateVerifier()))
			return err
		}, "bad_verification_code"},
		{"missing verifier", func() error {
			_, err := cfg.Exchange(ctx, code(oauth2.GenerateVerifier()))
			return err
		}, "bad_verification_code"},
		{"unknown code", func() error { _, err := cfg.Exchange(ctx, "nope"); return err }, "bad_verification_code"},
		{"reused code", func() error {
			v := oauth2.GenerateVerifier()
			c := code(v)
			if _, err := cfg.Exchange(ctx, c, oauth2.VerifierOption(v)); err != nil {
				return err
			}
			_, err := cfg.Exchange(ctx, c, oauth2.VerifierOption(v))
			return err
		}, "bad_verification_code"},
		{"wrong secret", func() error {
			c2 := cfg
			c2.ClientSecret = "wrong"
			v := oauth2.GenerateVerifier()
			_, err := c2.Exchange(ctx, code(v), oauth2.VerifierOption(v))
			return err
		}, "incorrect_client_credentials"},
		{"redirect mismatch", func() error {
			v := oauth2.GenerateVerifier()
			c := code(v)
			c2 := cfg
			c2.RedirectURL = "http://127.0.0.1:1/other"
			_, err := c2.Exchange(ctx, c, oauth2.VerifierOption(v))
			return err
		}, "redirect_uri_mismatch"},
		{"refresh without expiring tokens", func() error {
			_, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: "ghr_x"}).Token()
			return err
		}, "bad_refresh_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := retrieveCode(t, tc.run()); got != tc.want {
				t.Fatalf("error %q, want %q", got, tc.want)
			}
		})
	}
	// GitHub reports these with HTTP 200.
	for _, e := range g.Events() {
		if e.Kind == "token" && e.Error != "" && e.Status != http.StatusOK {
			t.Errorf("token error answered %d", e.Status)
		}
	}

	t.Run("injected 500", func(t *testing.T) {
		g.FailNextTokens(1)
		v := oauth2.GenerateVerifier()
		c := code(v)
		var re *oauth2.RetrieveError
		if _, err := cfg.Exchange(ctx, c, oauth2.VerifierOption(v)); !errors.As(err, &re) || re.Response.StatusCode != 500 {
			t.Fatalf("want 500, got %v", err)
		}
		if _, err := cfg.Exchange(ctx, c, oauth2.VerifierOption(v)); err != nil {
			t.Fatalf("after the injected failure: %v", err)
		}
	})
	t.Run("injected access_denied with markup", func(t *testing.T) {
		g.SetAuthorizeError("access_denied", `<b>no</b>`)
		defer g.SetAuthorizeError("", "")
		resp, err := noFollow.Get(cfg.AuthCodeURL("s9"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		q := redirectQuery(t, resp)
		if q.Get("error") != "access_denied" || q.Get("error_description") != "<b>no</b>" || q.Get("state") != "s9" {
			t.Fatalf("%v", q)
		}
	})
	t.Run("unknown client and redirect", func(t *testing.T) {
		for _, u := range []string{
			g.AuthURL() + "?client_id=nobody&redirect_uri=" + url.QueryEscape(callback),
			g.AuthURL() + "?client_id=" + g.ClientID() + "&redirect_uri=" + url.QueryEscape("https://evil.example/cb"),
		} {
			resp, err := noFollow.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode < 400 || resp.Header.Get("Location") != "" {
				t.Fatalf("%s: %d", u, resp.StatusCode)
			}
		}
	})
}

func TestGitHubDeny(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{})
	cfg := githubConfig(g)
	q := consent(t, cfg.AuthCodeURL("st"), "deny")
	if q.Get("error") != "access_denied" || q.Get("error_description") == "" || q.Get("code") != "" || q.Get("state") != "st" {
		t.Fatalf("%v", q)
	}
	if c := g.Counts(); c.Deny != 1 || c.Approve != 0 {
		t.Fatalf("counts %+v", c)
	}
}

// TestConsentRefusals: each fake answers a refusal on its consent page
// with the parameters its provider documents (GitHub's description and
// error_uri, Google's error and state alone), and a form without a
// decision with its own error page.
func TestConsentRefusals(t *testing.T) {
	github := fakeprovider.NewGitHub(t, fakeprovider.Options{})
	google := fakeprovider.NewGoogle(t, fakeprovider.Options{})
	ghcfg := githubConfig(github)
	gcfg := oauth2.Config{ClientID: google.ClientID(), RedirectURL: callback, Scopes: []string{"openid"},
		Endpoint: oauth2.Endpoint{AuthURL: google.Issuer() + "/o/oauth2/v2/auth"}}
	tests := []struct {
		name       string
		authURL    string
		counts     func() fakeprovider.Counts
		deniedKeys []string
		choose     string
	}{
		{"GitHub", ghcfg.AuthCodeURL("st"), github.Counts,
			[]string{"error", "error_description", "error_uri", "state"}, "Choose Authorize or Cancel."},
		{"Google", gcfg.AuthCodeURL("st"), google.Counts, []string{"error", "state"}, "Choose Allow or Cancel."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := consent(t, tt.authURL, "deny")
			var keys []string
			for k := range q {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			if !slices.Equal(keys, tt.deniedKeys) || q.Get("error") != "access_denied" || q.Get("state") != "st" {
				t.Errorf("refusal redirect %v, want the keys %v", q, tt.deniedKeys)
			}
			if c := tt.counts(); c.Deny != 1 || c.Approve != 0 {
				t.Errorf("counts %+v", c)
			}

			resp := submitConsent(t, tt.authURL, url.Values{})
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(body, []byte(tt.choose)) {
				t.Errorf("no decision: %d %s, want 400 saying %q", resp.StatusCode, body, tt.choose)
			}
			if c := tt.counts(); c.Deny != 1 || c.Approve != 0 {
				t.Errorf("no decision counted: %+v", c)
			}
		})
	}
}

func TestGitHubExpiringTokens(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{ExpiringTokens: true, AutoApprove: true, Now: clock, Login: "hubot", ID: 7})
	cfg := githubConfig(g)
	ctx := context.Background()
	v := oauth2.GenerateVerifier()
	resp, err := noFollow.Get(cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	tok, err := cfg.Exchange(ctx, redirectQuery(t, resp).Get("code"), oauth2.VerifierOption(v))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok.RefreshToken, "ghr_") || tok.Expiry.IsZero() {
		t.Fatalf("token %+v", tok)
	}
	if _, user := apiGet(t, g.URL(), "/user", "Bearer "+tok.AccessToken); user["login"] != "hubot" {
		t.Fatalf("user %v", user)
	}
	now = now.Add(9 * time.Hour) // past the 8h access lifetime
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+tok.AccessToken); status != 401 {
		t.Fatalf("expired token: %d", status)
	}
	expired := *tok
	expired.Expiry = time.Now().Add(-time.Minute)
	tok2, err := cfg.TokenSource(ctx, &expired).Token()
	if err != nil {
		t.Fatal(err)
	}
	if tok2.RefreshToken == tok.RefreshToken || tok2.AccessToken == tok.AccessToken {
		t.Fatal("refresh did not rotate")
	}
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+tok2.AccessToken); status != 200 {
		t.Fatalf("new token: %d", status)
	}
	// The spent refresh token is refused.
	if _, err := cfg.TokenSource(ctx, &expired).Token(); retrieveCode(t, err) != "bad_refresh_token" {
		t.Fatalf("reuse: %v", err)
	}
	if c := g.Counts(); c.Refresh != 1 || c.TokenErrors != 1 {
		t.Fatalf("counts %+v", c)
	}
}

// googleConfig sets AuthStyleInHeader: with auto-detection x/oauth2 would
// retry a failed token request with the other style, swallowing one
// injected 500.
func googleConfig(g *fakeprovider.Google, prov *oidc.Provider) oauth2.Config {
	ep := prov.Endpoint()
	ep.AuthStyle = oauth2.AuthStyleInHeader
	return oauth2.Config{
		ClientID: g.ClientID(), ClientSecret: g.ClientSecret(), RedirectURL: callback,
		Endpoint: ep, Scopes: []string{oidc.ScopeOpenID, "email"},
	}
}

func TestGoogleFlow(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	g := fakeprovider.NewGoogle(t, fakeprovider.Options{Now: clock, AccessTTL: 10 * time.Minute, Email: "ada@example.test", Subject: "42"})
	ctx := context.Background()
	prov, err := oidc.NewProvider(ctx, g.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := googleConfig(g, prov)
	verifier := prov.Verifier(&oidc.Config{ClientID: g.ClientID(), Now: clock})
	var rev struct {
		Revocation string `json:"revocation_endpoint"`
	}
	if err := prov.Claims(&rev); err != nil || rev.Revocation == "" {
		t.Fatalf("no revocation endpoint: %v", err)
	}

	tests := []struct {
		name        string
		opts        []oauth2.AuthCodeOption
		wantRefresh bool
	}{
		{"online", nil, false},
		// access_type=offline gives a refresh token the first time only;
		// prompt=consent gives a new one every time.
		{"offline, first time", []oauth2.AuthCodeOption{oauth2.AccessTypeOffline}, true},
		{"offline again without consent prompt", []oauth2.AuthCodeOption{oauth2.AccessTypeOffline}, false},
		{"offline with consent prompt", []oauth2.AuthCodeOption{oauth2.AccessTypeOffline, oauth2.ApprovalForce}, true},
	}
	var last *oauth2.Token
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, nonce := oauth2.GenerateVerifier(), oauth2.GenerateVerifier()
			opts := append([]oauth2.AuthCodeOption{oauth2.S256ChallengeOption(v), oidc.Nonce(nonce)}, tc.opts...)
			q := consent(t, cfg.AuthCodeURL("st", opts...), "approve")
			tok, err := cfg.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v))
			if err != nil {
				t.Fatal(err)
			}
			if (tok.RefreshToken != "") != tc.wantRefresh {
				t.Fatalf("refresh token present=%v", tok.RefreshToken != "")
			}
			idt, err := verifier.Verify(ctx, tok.Extra("id_token").(string))
			if err != nil {
				t.Fatal(err)
			}
			var claims struct {
				Email    string `json:"email"`
				Verified bool   `json:"email_verified"`
			}
			_ = idt.Claims(&claims)
			if idt.Subject != "42" || idt.Nonce != nonce || claims.Email != "ada@example.test" || !claims.Verified {
				t.Fatalf("id token sub=%q nonce=%q %+v", idt.Subject, idt.Nonce, claims)
			}
			info, err := prov.UserInfo(ctx, oauth2.StaticTokenSource(tok))
			if err != nil || info.Email != "ada@example.test" {
				t.Fatalf("userinfo %v %+v", err, info)
			}
			last = tok
		})
	}

	// Expiry and refresh (no rotation at Google).
	now = now.Add(11 * time.Minute)
	if _, err := prov.UserInfo(ctx, oauth2.StaticTokenSource(last)); err == nil {
		t.Fatal("expired access token accepted")
	}
	stale := *last
	stale.Expiry = time.Now().Add(-time.Second)
	fresh, err := cfg.TokenSource(ctx, &stale).Token()
	if err != nil {
		t.Fatal(err)
	}
	if fresh.AccessToken == last.AccessToken || fresh.RefreshToken != last.RefreshToken {
		t.Fatalf("refresh: %+v", fresh)
	}
	if _, err := prov.UserInfo(ctx, oauth2.StaticTokenSource(fresh)); err != nil {
		t.Fatal(err)
	}

	// RFC 7009 revocation of the refresh token ends the grant.
	resp, err := http.PostForm(rev.Revocation, url.Values{"token": {last.RefreshToken}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("revoke: %d", resp.StatusCode)
	}
	if g.TokenValid(fresh.AccessToken) {
		t.Fatal("access token survived revocation")
	}
	if _, err := cfg.TokenSource(ctx, &stale).Token(); retrieveCode(t, err) != "invalid_grant" {
		t.Fatal("revoked refresh token accepted")
	}

	// Ordering: the refresh happened before the revocation.
	var refreshSeq, revokeSeq int
	for _, e := range g.Events() {
		if e.Kind == "token" && e.GrantType == "refresh_token" && e.Error == "" {
			refreshSeq = e.Seq
		}
		if e.Kind == "revoke" {
			revokeSeq = e.Seq
		}
	}
	if refreshSeq == 0 || revokeSeq <= refreshSeq {
		t.Fatalf("refresh %d revoke %d", refreshSeq, revokeSeq)
	}
}

func TestGoogleErrors(t *testing.T) {
	g := fakeprovider.NewGoogle(t, fakeprovider.Options{AutoApprove: true, RedirectURIs: []string{callback}})
	ctx := context.Background()
	prov, err := oidc.NewProvider(ctx, g.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := googleConfig(g, prov)
	code := func(v string) string {
		resp, err := noFollow.Get(cfg.AuthCodeURL("s", oauth2.S256ChallengeOption(v)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return redirectQuery(t, resp).Get("code")
	}
	tests := []struct {
		name string
		run  func() error
		want string
	}{
		{"wrong verifier", func() error {
			_, err := cfg.Exchange(ctx, code(oauth2.GenerateVerifier()), oauth2.VerifierOption(oauth2.GenerateVerifier()))
			return err
		}, "invalid_grant"},
		{"wrong secret", func() error {
			c2 := cfg
			c2.ClientSecret = "x"
			v := oauth2.GenerateVerifier()
			_, err := c2.Exchange(ctx, code(v), oauth2.VerifierOption(v))
			return err
		}, "invalid_client"},
		{"injected 500", func() error {
			g.FailNextTokens(1)
			v := oauth2.GenerateVerifier()
			_, err := cfg.Exchange(ctx, code(v), oauth2.VerifierOption(v))
			return err
		}, "server_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := retrieveCode(t, tc.run()); got != tc.want {
				t.Fatalf("got %q want %q", got, tc.want)
			}
		})
	}
	t.Run("unregistered redirect", func(t *testing.T) {
		c2 := cfg
		c2.RedirectURL = "http://127.0.0.1:1/other"
		resp, err := noFollow.Get(c2.AuthCodeURL("s"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 || resp.Header.Get("Location") != "" {
			t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("Location"))
		}
	})
	t.Run("injected access_denied", func(t *testing.T) {
		g.SetAuthorizeError("access_denied", "")
		defer g.SetAuthorizeError("", "")
		resp, err := noFollow.Get(cfg.AuthCodeURL("s7"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if q := redirectQuery(t, resp); q.Get("error") != "access_denied" || q.Get("state") != "s7" {
			t.Fatalf("%v", q)
		}
	})
}

func TestTokensAreUnique(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true})
	cfg := githubConfig(g)
	seen := map[string]bool{}
	for range 20 {
		resp, err := noFollow.Get(cfg.AuthCodeURL("s"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tok, err := cfg.Exchange(context.Background(), redirectQuery(t, resp).Get("code"))
		if err != nil {
			t.Fatal(err)
		}
		if seen[tok.AccessToken] {
			t.Fatal("duplicate token")
		}
		seen[tok.AccessToken] = true
	}
}
