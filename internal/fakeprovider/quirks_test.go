package fakeprovider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/internal/fakeprovider"
)

// Each test here pins one documented quirk of the real provider that the
// fake reproduces (docs/TESTING.md lists them with their sources).

// code runs the authorization request at authURL with AutoApprove and
// returns the code.
func code(t *testing.T, authURL string) string {
	t.Helper()
	resp, err := noFollow.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return redirectQuery(t, resp).Get("code")
}

func TestGitHubClientCredentialsInBodyOnly(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true, ExpiringTokens: true})
	ctx := context.Background()
	basic := githubConfig(g)
	basic.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
	if _, err := basic.Exchange(ctx, code(t, basic.AuthCodeURL("s"))); retrieveCode(t, err) != "incorrect_client_credentials" {
		t.Fatalf("code exchange with HTTP basic: %v, want incorrect_client_credentials", err)
	}
	post := githubConfig(g)
	tok, err := post.Exchange(ctx, code(t, post.AuthCodeURL("s")))
	if err != nil {
		t.Fatal(err)
	}
	stale := &oauth2.Token{RefreshToken: tok.RefreshToken}
	if _, err := basic.TokenSource(ctx, stale).Token(); retrieveCode(t, err) != "incorrect_client_credentials" {
		t.Fatalf("refresh with HTTP basic: %v, want incorrect_client_credentials", err)
	}
	if _, err := post.TokenSource(ctx, stale).Token(); err != nil {
		t.Fatalf("refresh with the body: %v", err)
	}
}

func TestGitHubNormalisesScopes(t *testing.T) {
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true})
	cfg := githubConfig(g)
	cfg.Scopes = []string{"repo", "public_repo", "user", "user:email", "gist", "read:org", "admin:org"}
	tok, err := cfg.Exchange(context.Background(), code(t, cfg.AuthCodeURL("s")))
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Extra("scope"); got != "repo,user,gist,admin:org" {
		t.Fatalf("scope = %q, want repo,user,gist,admin:org", got)
	}
}

func TestGitHubAppTokens(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true, ExpiringTokens: true, Now: func() time.Time { return now }})
	cfg := githubConfig(g)
	ctx := context.Background()
	tok, err := cfg.Exchange(ctx, code(t, cfg.AuthCodeURL("s")))
	if err != nil {
		t.Fatal(err)
	}
	if tok.Extra("scope") != "" || tok.Extra("refresh_token_expires_in") == nil || !strings.HasPrefix(tok.AccessToken, "ghu_") {
		t.Fatalf("GitHub App answer: scope %q, refresh_token_expires_in %v", tok.Extra("scope"), tok.Extra("refresh_token_expires_in"))
	}
	fresh, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token()
	if err != nil {
		t.Fatal(err)
	}
	// The old access token stops working with its refresh token.
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+tok.AccessToken); status != http.StatusUnauthorized {
		t.Fatalf("old access token after rotation: %d, want 401", status)
	}
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+fresh.AccessToken); status != http.StatusOK {
		t.Fatalf("new access token: %d", status)
	}
}

// deleteApp calls DELETE /applications/{client_id}/{what}.
func deleteApp(t *testing.T, g *fakeprovider.GitHub, what, token string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"access_token": token})
	req, _ := http.NewRequest(http.MethodDelete, g.URL()+"/applications/"+g.ClientID()+"/"+what, bytes.NewReader(body))
	req.SetBasicAuth(g.ClientID(), g.ClientSecret())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestGitHubGrantAndTokenDeletion(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true, Now: func() time.Time { return now }})
	cfg := githubConfig(g)
	ctx := context.Background()
	issue := func() string {
		tok, err := cfg.Exchange(ctx, code(t, cfg.AuthCodeURL("s")))
		if err != nil {
			t.Fatal(err)
		}
		return tok.AccessToken
	}
	a, b, c := issue(), issue(), issue()
	if got := deleteApp(t, g, "token", a); got != http.StatusNoContent || g.TokenValid(a) || !g.TokenValid(b) {
		t.Fatalf("token deletion: %d; a valid %v, b valid %v", got, g.TokenValid(a), g.TokenValid(b))
	}
	if got := deleteApp(t, g, "grant", a); got != http.StatusUnprocessableEntity {
		t.Fatalf("grant deletion with a dead token: %d, want 422", got)
	}
	if got := deleteApp(t, g, "grant", b); got != http.StatusNoContent || g.TokenValid(c) {
		t.Fatalf("grant deletion: %d; the user's other token still valid: %v", got, g.TokenValid(c))
	}

	t.Run("expired GitHub App token", func(t *testing.T) {
		app := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true, ExpiringTokens: true, Now: func() time.Time { return now }})
		acfg := githubConfig(app)
		tok, err := acfg.Exchange(ctx, code(t, acfg.AuthCodeURL("s")))
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(9 * time.Hour)
		if got := deleteApp(t, app, "grant", tok.AccessToken); got != http.StatusUnprocessableEntity {
			t.Fatalf("grant deletion with an expired token: %d, want 422", got)
		}
	})
}

func TestGitHubIdleTokensAndUserRevocation(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := fakeprovider.NewGitHub(t, fakeprovider.Options{AutoApprove: true, Now: func() time.Time { return now }})
	cfg := githubConfig(g)
	ctx := context.Background()
	used, idle := func() (string, string) {
		a, err := cfg.Exchange(ctx, code(t, cfg.AuthCodeURL("s")))
		if err != nil {
			t.Fatal(err)
		}
		b, err := cfg.Exchange(ctx, code(t, cfg.AuthCodeURL("s")))
		if err != nil {
			t.Fatal(err)
		}
		return a.AccessToken, b.AccessToken
	}()
	now = now.Add(200 * 24 * time.Hour)
	apiGet(t, g.URL(), "/user", "Bearer "+used)
	now = now.Add(200 * 24 * time.Hour)
	if g.TokenValid(idle) || !g.TokenValid(used) {
		t.Fatalf("after 400 days: idle valid %v, used valid %v", g.TokenValid(idle), g.TokenValid(used))
	}
	g.UserRevokesAccess(g.User())
	if status, _ := apiGet(t, g.URL(), "/user", "Bearer "+used); status != http.StatusUnauthorized {
		t.Fatalf("after the user revoked the app: %d", status)
	}
	req, _ := http.NewRequest(http.MethodGet, g.URL()+"/user", nil)
	req.Header["User-Agent"] = []string{""} // sends none
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("API call without User-Agent: %d, want 403", resp.StatusCode)
	}
}

// googleCode runs Google's consent (checking the scopes in checked) and
// returns the code.
func googleCode(t *testing.T, authURL string, checked ...string) (string, []string) {
	t.Helper()
	resp, err := noFollow.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusFound {
		return redirectQuery(t, resp).Get("code"), nil
	}
	var choices []string
	for _, m := range strings.Split(string(body), `name="scope" value="`)[1:] {
		choices = append(choices, m[:strings.Index(m, `"`)])
	}
	form := url.Values{"request": {string(requestField.FindSubmatch(body)[1])}, "decision": {"approve"}, "scope": checked}
	resp, err = noFollow.PostForm(resp.Request.URL.Scheme+"://"+resp.Request.URL.Host+resp.Request.URL.Path, form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return redirectQuery(t, resp).Get("code"), choices
}

func TestGoogleScopesAndGrants(t *testing.T) {
	g := fakeprovider.NewGoogle(t, fakeprovider.Options{})
	ctx := context.Background()
	prov, err := oidc.NewProvider(ctx, g.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := googleConfig(g, prov)
	const cal = "https://www.googleapis.com/auth/calendar.readonly"
	const drive = "https://www.googleapis.com/auth/drive.readonly"
	exchange := func(c string) *oauth2.Token {
		t.Helper()
		tok, err := cfg.Exchange(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}

	// Scope expansion: email and profile come back under their long names,
	// with openid added.
	cfg.Scopes = []string{"email", "profile"}
	c, _ := googleCode(t, cfg.AuthCodeURL("s", oauth2.AccessTypeOffline))
	first := exchange(c)
	if got := first.Extra("scope"); got != "https://www.googleapis.com/auth/userinfo.email openid https://www.googleapis.com/auth/userinfo.profile" {
		t.Fatalf("scope = %q", got)
	}
	if first.RefreshToken == "" {
		t.Fatal("no refresh token on the first offline consent")
	}

	// Granular consent: each non-sign-in scope is an unchecked checkbox.
	cfg.Scopes = []string{"openid", "email", cal, drive}
	c, choices := googleCode(t, cfg.AuthCodeURL("s", oauth2.AccessTypeOffline), cal)
	if strings.Join(choices, " ") != cal+" "+drive {
		t.Fatalf("granular choices %q", choices)
	}
	partial := exchange(c)
	if got := partial.Extra("scope"); got != "https://www.googleapis.com/auth/userinfo.email openid "+cal || partial.RefreshToken != "" {
		t.Fatalf("granular answer: scope %q, refresh token %v", got, partial.RefreshToken != "")
	}

	// include_granted_scopes=true: the token covers the earlier grant too.
	cfg.Scopes = []string{drive}
	c, _ = googleCode(t, cfg.AuthCodeURL("s", oauth2.SetAuthURLParam("include_granted_scopes", "true")))
	inc := exchange(c)
	want := "https://www.googleapis.com/auth/userinfo.email openid https://www.googleapis.com/auth/userinfo.profile " + cal + " " + drive
	if got := inc.Extra("scope"); got != want {
		t.Fatalf("incremental scope = %q, want %q", got, want)
	}
	// A refresh answers the grant's scopes.
	fresh, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: first.RefreshToken}).Token()
	if err != nil || fresh.Extra("scope") != want {
		t.Fatalf("refresh: %v, scope %q", err, fresh.Extra("scope"))
	}

	// Per-host APIs check the token's scopes.
	for _, tc := range []struct {
		host, path, token string
		want              int
	}{
		{"www", "/calendar/v3/users/me/calendarList", inc.AccessToken, 200},
		{"www", "/calendar/v3/users/me/calendarList", first.AccessToken, 403},
		{"gmail", "/calendar/v3/users/me/calendarList", inc.AccessToken, 404},
		{"gmail", "/gmail/v1/users/me/profile", inc.AccessToken, 403},
		{"www", "/drive/v3/files", "ya29.nope", 401},
	} {
		if status, _ := apiGet(t, g.APIURL(tc.host), tc.path, "Bearer "+tc.token); status != tc.want {
			t.Errorf("%s %s: %d, want %d", tc.host, tc.path, status, tc.want)
		}
	}

	// Revoking any token ends the whole grant; the token is then dead.
	revoke := func(tok string) int {
		resp, err := http.PostForm(g.Issuer()+"/revoke", url.Values{"token": {tok}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := revoke(partial.AccessToken); got != 200 || g.TokenValid(inc.AccessToken) || g.GrantedScopes(g.User()) != "" {
		t.Fatalf("revoke: %d; other token valid %v", got, g.TokenValid(inc.AccessToken))
	}
	if got := revoke(first.RefreshToken); got != http.StatusBadRequest {
		t.Fatalf("revoking a dead token: %d, want 400 invalid_token", got)
	}
	// After the grant is gone, the next offline consent is a first one.
	cfg.Scopes = []string{"email"}
	c, _ = googleCode(t, cfg.AuthCodeURL("s", oauth2.AccessTypeOffline))
	if exchange(c).RefreshToken == "" {
		t.Fatal("no refresh token after the grant was revoked")
	}
}

func TestGoogleHostedDomainAndTesting(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	g := fakeprovider.NewGoogle(t, fakeprovider.Options{AutoApprove: true, Testing: true, HostedDomain: "corp.example", Now: clock})
	ctx := context.Background()
	prov, err := oidc.NewProvider(ctx, g.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	cfg := googleConfig(g, prov)
	cfg.Scopes = []string{"openid", "email", "https://www.googleapis.com/auth/calendar.readonly"}
	tok, err := cfg.Exchange(ctx, code(t, cfg.AuthCodeURL("s", oauth2.AccessTypeOffline, oauth2.SetAuthURLParam("hd", "other.example"))))
	if err != nil {
		t.Fatal(err)
	}
	idt, err := prov.Verifier(&oidc.Config{ClientID: g.ClientID(), Now: clock}).Verify(ctx, tok.Extra("id_token").(string))
	if err != nil {
		t.Fatal(err)
	}
	var claims struct {
		HD string `json:"hd"`
	}
	if err := idt.Claims(&claims); err != nil || claims.HD != "corp.example" {
		t.Fatalf("hd claim %q (hd=other.example does not keep the account out)", claims.HD)
	}
	// Testing publishing status: the refresh token lives 7 days.
	now = now.Add(6 * 24 * time.Hour)
	if _, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); err != nil {
		t.Fatalf("refresh on day 6: %v", err)
	}
	now = now.Add(2 * 24 * time.Hour)
	if _, err := cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: tok.RefreshToken}).Token(); retrieveCode(t, err) != "invalid_grant" {
		t.Fatalf("refresh on day 8: %v, want invalid_grant", err)
	}
}
