package main

import (
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// TestReconnectAfterInvalidGrant is issue 6's revocation path end to end:
// the provider refuses the refresh token (invalid_grant) → the connection
// becomes needs_reconnect → provider_request answers a url elicitation that
// says so → the person reconnects in the browser (the real sign-in, consent
// and provider pages, over HTTP) → the retry runs the request on the same
// connection id, now active with new tokens.
func TestReconnectAfterInvalidGrant(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	b := startDemoBroker(t, ctx)
	old := b.connectAlice(t, ctx) // stored with an expired access token
	bearer := b.bearer(t, "alice")

	// The user revokes the broker's access at the provider: the refresh
	// token is dead.
	form := url.Values{"token": {old.RefreshToken}}
	req, _ := http.NewRequest(http.MethodPost, b.demo.RevokeURL(), strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(devDemoClientID, "demo-secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("revoke at the provider: %v %v", err, resp)
	}
	resp.Body.Close()

	args := map[string]any{"provider": "demo", "method": "GET", "path": "/user"}
	first, err := mcpCall(http.DefaultClient, b.srv.URL, "", bearer, "provider_request", args, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, link := elicitation(t, first)
	if !strings.Contains(first.Raw, "revoked or has expired") {
		t.Errorf("the elicitation does not say the access was revoked or expired: %s", first.Raw)
	}
	c, err := b.store.GetConnection(ctx, "conn-alice-demo")
	if err != nil || c.Status != vault.StatusNeedsReconnect {
		t.Fatalf("connection after invalid_grant: %v %v, want needs_reconnect", c.Status, err)
	}

	// The browser step, as a person does it.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, Timeout: 20 * time.Second}
	get, _ := http.NewRequest(http.MethodGet, link, nil)
	p := fetch(t, browser, get)
	p = submitForm(t, browser, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	p = submitForm(t, browser, p, "/connect/", url.Values{"decision": {"approve"}})
	p = submitForm(t, browser, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
		t.Fatalf("browser ended on %s (HTTP %d):\n%.2000s", p.url, p.status, p.body)
	}

	retry, err := mcpCall(http.DefaultClient, b.srv.URL, "", bearer, "provider_request", args, map[string]any{
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}},
		"requestState":   first.Result.RequestState,
	})
	if err != nil {
		t.Fatal(err)
	}
	if retry.Result.ResultType != "complete" || retry.Result.IsError || !strings.Contains(retry.Raw, `\"login\":\"alice-demo\"`) {
		t.Fatalf("retry answered %s", retry.Raw)
	}
	list, err := b.store.ListConnections(ctx, vault.Principal{Issuer: b.idp.Issuer(), Subject: "alice"})
	if err != nil || len(list) != 1 {
		t.Fatalf("alice has %d connections (%v), want the one, reconnected", len(list), err)
	}
	now, err := b.store.GetConnection(ctx, list[0].ID) // a listing carries no tokens
	if err != nil {
		t.Fatal(err)
	}
	if now.ID != "conn-alice-demo" || now.Status != vault.StatusActive || now.Token.RefreshToken.Reveal() == old.RefreshToken {
		t.Fatalf("after reconnecting: id %s status %s, refresh token replaced %v", now.ID, now.Status, now.Token.RefreshToken.Reveal() != old.RefreshToken)
	}
	for _, secret := range []string{old.AccessToken, old.RefreshToken, now.Token.AccessToken.Reveal(), now.Token.RefreshToken.Reveal()} {
		if strings.Contains(first.Raw+retry.Raw+p.body+b.logs.String(), secret) {
			t.Fatal("a provider token appears in an answer, a page or a log line")
		}
	}
}
