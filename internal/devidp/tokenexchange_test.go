package devidp_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
)

// TestTokenExchangeIDJAG: a host signed in at the IdP trades the ID token
// for an ID-JAG (RFC 8693) that names the person, the audience, the
// resource and the host's client id there; the per-user, per-client
// policy says no to bob; the request is refused without client
// authentication, for another client's ID token, for another token type,
// and for a resource or audience the policy does not cover.
func TestTokenExchangeIDJAG(t *testing.T) {
	const aud, res = "https://broker.example", "https://broker.example/mcp"
	idp := devidptest.Start(t, nil, []devidp.Client{
		{ID: "host", Secret: "host-secret", RedirectURIs: []string{rpCallback}},
		{ID: "other", Secret: "other-secret", RedirectURIs: []string{rpCallback}},
		{ID: "public", RedirectURIs: []string{rpCallback}},
	})
	idp.SetIDJAGRules([]devidp.IDJAGRule{
		{User: "bob", Client: "host", Audience: aud, Deny: true},
		{User: "*", Client: "host", Audience: aud, Resources: []string{res}, Scopes: []string{"broker", "read"}, AudienceClientID: "host-at-broker"},
	})
	idToken := func(user, client, secret string) string {
		_, tok := newRP(t, idp, client, secret).login(t, browser(t), user, user)
		return tok.Extra("id_token").(string)
	}
	alice, bob := idToken("alice", "host", "host-secret"), idToken("bob", "host", "host-secret")
	aliceOther := idToken("alice", "other", "other-secret")

	exchange := func(subject string, auth [2]string, mod func(url.Values)) (int, map[string]any) {
		t.Helper()
		f := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
			"requested_token_type": {"urn:ietf:params:oauth:token-type:id-jag"}, "audience": {aud}, "resource": {res},
			"scope": {"broker admin"}, "subject_token": {subject}, "subject_token_type": {"urn:ietf:params:oauth:token-type:id_token"}}
		if mod != nil {
			mod(f)
		}
		req, _ := http.NewRequest(http.MethodPost, idp.Issuer()+"/oauth/token", strings.NewReader(f.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if auth[0] != "" {
			req.SetBasicAuth(auth[0], auth[1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("Cache-Control %q", cc)
		}
		return resp.StatusCode, out
	}
	host := [2]string{"host", "host-secret"}

	status, out := exchange(alice, host, nil)
	if status != 200 || out["issued_token_type"] != "urn:ietf:params:oauth:token-type:id-jag" || out["token_type"] != "N_A" ||
		out["scope"] != "broker" || out["expires_in"] != float64(300) {
		t.Fatalf("exchange: %d %v", status, out)
	}
	jag := out["access_token"].(string)
	// The ID-JAG verifies with the IdP's published keys and says what the
	// draft asks.
	prov, err := oidc.NewProvider(context.Background(), idp.Issuer())
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		JWKS string `json:"jwks_uri"`
	}
	prov.Claims(&d)
	payload, err := oidc.NewRemoteKeySet(context.Background(), d.JWKS).VerifySignature(context.Background(), jag)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	json.Unmarshal(payload, &c)
	iat, exp := c["iat"].(float64), c["exp"].(float64)
	if c["iss"] != idp.Issuer() || c["sub"] != "alice" || c["aud"] != aud || c["resource"] != res || c["client_id"] != "host-at-broker" ||
		c["scope"] != "broker" || c["jti"] == "" || exp-iat != 300 || time.Since(time.Unix(int64(iat), 0)) > time.Minute {
		t.Fatalf("ID-JAG claims %v", c)
	}
	if hdr := strings.SplitN(jag, ".", 2)[0]; !strings.Contains(mustB64(t, hdr), `"typ":"oauth-id-jag+jwt"`) {
		t.Fatalf("ID-JAG header %s", mustB64(t, hdr))
	}

	for _, tc := range []struct {
		name, subject string
		auth          [2]string
		mod           func(url.Values)
		status        int
		code          string
	}{
		{"the policy says no to bob", bob, host, nil, 400, "invalid_grant"},
		{"no client authentication", alice, [2]string{}, func(f url.Values) { f.Set("client_id", "host") }, 401, "invalid_client"},
		{"a public client", alice, [2]string{}, func(f url.Values) { f.Set("client_id", "public") }, 401, "invalid_client"},
		{"a wrong client secret", alice, [2]string{"host", "nope"}, nil, 401, "invalid_client"},
		{"another client's ID token", aliceOther, host, nil, 400, "invalid_grant"},
		{"a client the policy does not name", aliceOther, [2]string{"other", "other-secret"}, nil, 400, "invalid_grant"},
		{"another audience", alice, host, func(f url.Values) { f.Set("audience", "https://elsewhere.example") }, 400, "invalid_grant"},
		{"another resource", alice, host, func(f url.Values) { f.Set("resource", "https://elsewhere.example/mcp") }, 400, "invalid_target"},
		{"another requested token type", alice, host, func(f url.Values) { f.Set("requested_token_type", "urn:ietf:params:oauth:token-type:access_token") }, 400, "invalid_request"},
		{"not an ID token", "garbage", host, nil, 400, "invalid_grant"},
		{"no audience", alice, host, func(f url.Values) { f.Del("audience") }, 400, "invalid_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, out := exchange(tc.subject, tc.auth, tc.mod)
			if status != tc.status || out["error"] != tc.code || out["access_token"] != nil {
				t.Fatalf("%d %v, want %d %s", status, out, tc.status, tc.code)
			}
		})
	}

	// The code flow still goes to zitadel's token endpoint untouched.
	if _, tok := newRP(t, idp, "host", "host-secret").login(t, browser(t), "alice", "alice"); tok.AccessToken == "" {
		t.Fatal("code flow after token exchanges")
	}
}

func mustB64(t *testing.T, s string) string {
	t.Helper()
	b, err := base64URL(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func base64URL(s string) ([]byte, error) { return base64.RawURLEncoding.DecodeString(s) }
