package provider

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"golang.org/x/oauth2"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// The client side of enterprise-managed authorization, against the real
// development IdP (its RFC 8693 token exchange, its per-user policy, its
// refresh tokens) and the rig's authorization server taking the JWT
// bearer grant: an authorization server that checks each ID-JAG as the
// draft says (typ, the IdP's signature from its JWKS, aud its issuer,
// resource its server, client_id the authenticated client, exp).

const (
	brokerIdPClient = "broker"
	brokerIdPSecret = "broker-idp-secret"
	brokerSignIn    = "https://broker.test/auth/callback"
)

// jagRig is an mcp rig whose entry is auth: enterprise, the dev IdP as
// the organisation's IdP, and a Client with a telemetry recorder whose
// audit log and own log are kept.
type jagRig struct {
	*mcpRig
	idp  *devidp.IdP
	k    *Client
	p    *Provider
	rec  *telemetry.Recorder
	logs *logbuf.Buffer

	mu   sync.Mutex // guards jags
	jags []map[string]any
}

func newJAGRig(t *testing.T) *jagRig {
	r := &jagRig{mcpRig: newMCPRig(t, "127.0.0.1"), logs: &logbuf.Buffer{}}
	r.as.set("grant_types_supported", []string{"authorization_code", grantJWTBearer})
	r.idp = devidptest.Start(t, append(devidp.DefaultUsers(), devidp.User{Username: "dave", Password: "dave", Subject: "dave"}), []devidp.Client{{ID: brokerIdPClient, Secret: brokerIdPSecret, RedirectURIs: []string{brokerSignIn}}})
	r.idp.SetIDJAGRules([]devidp.IDJAGRule{
		{User: "bob", Client: brokerIdPClient, Audience: r.as.base, Deny: true},
		{User: "*", Client: brokerIdPClient, Audience: r.as.base, Resources: []string{r.up.url}, Scopes: []string{"issues:read"}, AudienceClientID: "static-client"},
	})
	keys := oidc.NewRemoteKeySet(context.Background(), r.idp.Issuer()+"/keys")
	r.as.jwtBearer = func(client string, f url.Values) (string, string) {
		claims, typ, err := verifyJAG(keys, f.Get("assertion"))
		r.mu.Lock()
		r.jags = append(r.jags, claims)
		r.mu.Unlock()
		switch {
		case err != nil || typ != typIDJAG:
			return "", "invalid_grant"
		case claims["iss"] != r.idp.Issuer(), claims["aud"] != r.as.base, claims["resource"] != r.up.url:
			return "", "invalid_grant"
		case claims["client_id"] != client:
			return "", "invalid_grant"
		case time.Unix(int64(claims["exp"].(float64)), 0).Before(time.Now()):
			return "", "invalid_grant"
		}
		return claims["sub"].(string), ""
	}
	r.rec = telemetry.New(telemetry.Options{Providers: []string{"linear"}, Audit: slog.New(slog.NewJSONHandler(r.logs, nil))})
	reg := r.registry("      auth: enterprise\n", "    client_id: static-client\n    client_secret: ${LINEAR_SECRET}\n")
	r.k = r.client(reg, func(o *Options) {
		o.IdP = &OrgIdP{Issuer: r.idp.Issuer(), ClientID: brokerIdPClient, ClientSecret: brokerIdPSecret}
		o.IdPSessions = r.store
		o.HTTPClient = &http.Client{Timeout: 10 * time.Second}
		o.Telemetry = r.rec
		o.Logger = slog.New(slog.NewJSONHandler(r.logs, nil))
	})
	r.p, _ = reg.Lookup("linear")
	return r
}

// verifyJAG checks an ID-JAG's signature with the IdP's keys and returns
// its claims and typ.
func verifyJAG(keys *oidc.RemoteKeySet, raw string) (map[string]any, string, error) {
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		return nil, "", err
	}
	payload, err := keys.VerifySignature(context.Background(), raw)
	if err != nil {
		return nil, "", err
	}
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, "", err
	}
	typ, _ := jws.Signatures[0].Protected.ExtraHeaders["typ"].(string)
	return claims, typ, nil
}

// signIn is the broker's sign-in of user at the IdP (the code flow, with
// offline_access when offline), kept as the person's IdP session; it
// returns the person and the IdP's answer.
func (r *jagRig) signIn(user string, offline bool) (vault.Principal, *oauth2.Token) {
	r.t.Helper()
	ctx := context.Background()
	op, err := oidc.NewProvider(ctx, r.idp.Issuer())
	if err != nil {
		r.t.Fatal(err)
	}
	conf := oauth2.Config{ClientID: brokerIdPClient, ClientSecret: brokerIdPSecret, Endpoint: op.Endpoint(), RedirectURL: brokerSignIn,
		Scopes: []string{oidc.ScopeOpenID, "email"}}
	if offline {
		conf.Scopes = append(conf.Scopes, oidc.ScopeOfflineAccess)
	}
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), brokerSignIn) {
			return http.ErrUseLastResponse
		}
		return nil
	}}
	verifier := oauth2.GenerateVerifier()
	resp, err := browser.Get(conf.AuthCodeURL("state", oauth2.S256ChallengeOption(verifier)))
	if err != nil {
		r.t.Fatal(err)
	}
	body := new(bytes.Buffer)
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	target, vals, err := htmlform.Find(resp.Request.URL, body.String(), "login", url.Values{"username": {user}, "password": {user}})
	if err != nil {
		r.t.Fatalf("the IdP's sign-in page: %v", err)
	}
	if resp, err = browser.PostForm(target.String(), vals); err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
	loc, _ := url.Parse(resp.Header.Get("Location"))
	tok, err := conf.Exchange(ctx, loc.Query().Get("code"), oauth2.VerifierOption(verifier))
	if err != nil {
		r.t.Fatalf("the sign-in's code exchange: %v", err)
	}
	idt, err := op.Verifier(&oidc.Config{ClientID: brokerIdPClient}).Verify(ctx, tok.Extra("id_token").(string))
	if err != nil {
		r.t.Fatal(err)
	}
	pr := vault.Principal{Issuer: idt.Issuer, Subject: idt.Subject}
	if err := r.k.KeepIdPSession(ctx, pr, tok, idt.Expiry); err != nil {
		r.t.Fatal(err)
	}
	return pr, tok
}

// outcomes is credbroker_upstream_idjag_total{provider="linear"} by outcome.
func (r *jagRig) outcomes() map[string]float64 {
	r.t.Helper()
	mfs, err := r.rec.Registry().Gather()
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "credbroker_upstream_idjag_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["provider"] == "linear" {
				out[labels["outcome"]] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// audits returns the audit events of kind in the log, decoded.
func (r *jagRig) audits(kind string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(r.logs.String(), "\n") {
		var ev map[string]any
		if json.Unmarshal([]byte(line), &ev) == nil && ev["event"] == kind && ev["audit"] == true {
			out = append(out, ev)
		}
	}
	return out
}

// TestConnectByAssertion: alice, signed in with offline access, is
// connected with no browser step: the IdP issues an ID-JAG for exactly
// the server's authorization server and its resource, naming the
// broker's client there, and the authorization server redeems it; the
// connection holds the access token only. The audit event and the
// counter say "issued". When her ID token has expired, the refresh token
// gets a new one (rotated and stored) before the exchange. Neither the
// IdP's refresh token nor its ID token is in the result or a log line.
func TestConnectByAssertion(t *testing.T) {
	r := newJAGRig(t)
	ctx := context.Background()
	alice, signIn := r.signIn("alice", true)
	if signIn.RefreshToken == "" {
		t.Fatal("the IdP issued no refresh token for offline_access")
	}
	if !r.k.ConnectsByAssertion(r.p) || !r.k.Providers().NeedsIdPSessions() {
		t.Fatal("an enterprise entry does not connect by assertion")
	}
	ex, err := r.k.ConnectByAssertion(ctx, r.p, alice, []string{"issues:read"}, "mcp")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Token.AccessToken == "" || ex.Token.RefreshToken != "" || ex.Account.ID == "" {
		t.Fatalf("result %+v: want an access token, no refresh token, an account", ex.Account)
	}
	reqs := r.as.requests("/token")
	if len(reqs) != 1 {
		t.Fatalf("%d token requests, want 1", len(reqs))
	}
	f := reqs[0].Values
	if f.Get("grant_type") != grantJWTBearer || f.Get("resource") != r.up.url || f.Get("scope") != "issues:read" ||
		reqs[0].BasicUser != "static-client" || reqs[0].BasicPass != "static-secret" {
		t.Errorf("the JWT bearer request: %v as %q", f, reqs[0].BasicUser)
	}
	jag := r.jags[0]
	if jag["aud"] != r.as.base || jag["resource"] != r.up.url || jag["client_id"] != "static-client" || jag["sub"] != "alice" || jag["scope"] != "issues:read" {
		t.Errorf("the ID-JAG the authorization server got: %v", jag)
	}
	if got := r.outcomes(); got[telemetry.UpstreamIDJAGIssued] != 1 || len(got) != 1 {
		t.Errorf("credbroker_upstream_idjag_total = %v, want issued 1", got)
	}
	if evs := r.audits(telemetry.EventUpstreamIDJAGIssued); len(evs) != 1 || evs[0]["via"] != "mcp" || evs[0]["provider"] != "linear" {
		t.Errorf("audit events %s: %v", telemetry.EventUpstreamIDJAGIssued, evs)
	}

	// The stored ID token has expired: the refresh token gets another
	// (rotated), stored before it is used.
	if _, err := r.store.UpdateIdPSession(ctx, alice, func(s vault.IdPSession) (vault.IdPSession, error) {
		s.IDTokenExpires = r.clock.Now().Add(-time.Minute)
		return s, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.k.ConnectByAssertion(ctx, r.p, alice, nil, "mcp"); err != nil {
		t.Fatalf("after the ID token expired: %v", err)
	}
	s, err := r.store.GetIdPSession(ctx, alice)
	if err != nil || s.RefreshToken == vault.Secret(signIn.RefreshToken) || s.RefreshToken == "" || !s.IDTokenExpires.After(r.clock.Now()) {
		t.Fatalf("the session after a refresh: rotated %v, %v", s.RefreshToken != vault.Secret(signIn.RefreshToken), err)
	}
	if got := r.outcomes(); got[telemetry.UpstreamIDJAGIssued] != 2 {
		t.Errorf("credbroker_upstream_idjag_total = %v, want issued 2", got)
	}
	logs := r.logs.String()
	for _, secret := range append(r.idp.IssuedRefreshTokens(), signIn.Extra("id_token").(string)) {
		if strings.Contains(logs, secret) {
			t.Error("an IdP token reached a log line")
		}
	}
}

// TestAssertionRefusals: each refusal is an *AssertionRefusedError
// whose reason names no secret, an upstream_idjag_refused audit event
// and a count by outcome, and nothing is connected.
func TestAssertionRefusals(t *testing.T) {
	r := newJAGRig(t)
	ctx := context.Background()
	alice, _ := r.signIn("alice", true)
	bob, _ := r.signIn("bob", true)
	carol := vault.Principal{Issuer: r.idp.Issuer(), Subject: "carol"}
	dave, _ := r.signIn("dave", false)
	cases := []struct {
		name    string
		who     vault.Principal
		before  func()
		outcome string
		// sentToAS: an assertion reached the authorization server.
		sentToAS bool
	}{
		{name: "the IdP's policy says no", who: bob, outcome: telemetry.UpstreamIDJAGIdPRefused},
		{name: "no IdP session", who: carol, outcome: telemetry.UpstreamIDJAGNoSession},
		{name: "ID token expired and no refresh token", who: dave, before: func() {
			r.store.UpdateIdPSession(ctx, dave, func(s vault.IdPSession) (vault.IdPSession, error) {
				s.IDTokenExpires = r.clock.Now()
				return s, nil
			})
		}, outcome: telemetry.UpstreamIDJAGNoSession},
		{name: "the authorization server refuses the ID-JAG", who: alice, before: func() {
			r.idp.SetIDJAGRules([]devidp.IDJAGRule{{User: "*", Client: brokerIdPClient, Audience: r.as.base, Resources: []string{r.up.url},
				AudienceClientID: "another-client"}})
		}, outcome: telemetry.UpstreamIDJAGServerRefused, sentToAS: true},
		{name: "the authorization server takes no JWT bearer grant", who: alice, before: func() {
			r.as.set("grant_types_supported", []string{"authorization_code"})
			r.k.upstream("linear").auth = nil // rediscover
		}, outcome: telemetry.UpstreamIDJAGNotSupported},
		{name: "the IdP ended the session", who: alice, before: func() {
			r.as.set("grant_types_supported", []string{grantJWTBearer})
			r.k.upstream("linear").auth = nil
			r.idp.RevokeRefreshTokens("alice")
			r.store.UpdateIdPSession(ctx, alice, func(s vault.IdPSession) (vault.IdPSession, error) {
				s.IDTokenExpires = r.clock.Now()
				return s, nil
			})
		}, outcome: telemetry.UpstreamIDJAGSessionEnded},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.before != nil {
				c.before()
			}
			sent := len(r.as.requests("/token"))
			_, err := r.k.ConnectByAssertion(ctx, r.p, c.who, nil, "mcp")
			var ar *AssertionRefusedError
			if !errors.As(err, &ar) || ar.Outcome != c.outcome {
				t.Fatalf("err = %v, want a refusal %s", err, c.outcome)
			}
			if got := len(r.as.requests("/token")) - sent; got != map[bool]int{true: 1}[c.sentToAS] {
				t.Errorf("%d requests reached the authorization server", got)
			}
			if got := r.outcomes()[c.outcome]; got < 1 {
				t.Errorf("credbroker_upstream_idjag_total{outcome=%s} = %v", c.outcome, got)
			}
			evs := r.audits(telemetry.EventUpstreamIDJAGRefused)
			if len(evs) != i+1 || evs[i]["outcome"] != c.outcome || evs[i]["err"] != ar.Reason {
				t.Errorf("audit events %s: %v", telemetry.EventUpstreamIDJAGRefused, evs)
			}
		})
	}
	if _, err := r.store.GetIdPSession(ctx, alice); !errors.Is(err, vault.ErrNotFound) {
		t.Errorf("a session the IdP ended is kept: %v", err)
	}
	if n := r.outcomes()[telemetry.UpstreamIDJAGIssued]; n != 0 {
		t.Errorf("%v issued", n)
	}
}

// TestRenewByAssertion: a connection made by assertion has no refresh
// token; when the server refuses its access token (a forced refresh) or
// it expires, a new ID-JAG gets the next one, no browser involved; when
// the IdP then refuses, the connection needs reconnecting.
func TestRenewByAssertion(t *testing.T) {
	r := newJAGRig(t)
	ctx := context.Background()
	alice, _ := r.signIn("alice", true)
	ex, err := r.k.ConnectByAssertion(ctx, r.p, alice, nil, "mcp")
	if err != nil {
		t.Fatal(err)
	}
	now := r.clock.Now()
	c, err := r.store.CreateConnection(ctx, vault.Connection{ID: "conn-jag", Principal: alice, Provider: "linear", AccountID: ex.Account.ID,
		AccountLogin: ex.Account.Login, Scopes: ex.Scopes, Token: ex.Token, Status: vault.StatusActive, Created: now, Updated: now})
	if err != nil {
		t.Fatal(err)
	}
	got, err := r.k.ForceRefresh(ctx, c.ID, ex.Token.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if got.Token.AccessToken == ex.Token.AccessToken || got.Token.AccessToken == "" || got.Status != vault.StatusActive {
		t.Fatalf("after a forced renewal: same token %v, status %s", got.Token.AccessToken == ex.Token.AccessToken, got.Status)
	}
	// The access token expires; the IdP no longer vouches for alice.
	if _, err := r.store.UpdateConnection(ctx, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Token.Expiry = r.clock.Now().Add(-time.Second)
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	r.idp.SetIDJAGRules(nil)
	if _, err := r.k.Token(ctx, c.ID); !errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("renewal refused by the IdP: %v, want ErrNeedsReconnect", err)
	}
	if got := r.outcomes(); got[telemetry.UpstreamIDJAGIssued] != 2 || got[telemetry.UpstreamIDJAGIdPRefused] != 1 {
		t.Errorf("credbroker_upstream_idjag_total = %v", got)
	}
	if evs := r.audits(telemetry.EventUpstreamIDJAGRefused); len(evs) != 1 || evs[0]["via"] != "background" {
		t.Errorf("audit events %s: %v", telemetry.EventUpstreamIDJAGRefused, evs)
	}
}

// TestCheckIDJAG: the broker sends the authorization server only an
// ID-JAG (by its typ) for exactly its issuer and the server.
func TestCheckIDJAG(t *testing.T) {
	const aud, res = "https://as.example", "https://mcp.example/mcp"
	jwt := func(head, claims map[string]any) string {
		h, _ := json.Marshal(head)
		c, _ := json.Marshal(claims)
		return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c) + ".c2ln"
	}
	typ := map[string]any{"typ": typIDJAG, "alg": "RS256"}
	for _, c := range []struct {
		name string
		jag  string
		ok   bool
	}{
		{"ok", jwt(typ, map[string]any{"aud": aud, "resource": res}), true},
		{"aud an array of one", jwt(typ, map[string]any{"aud": []string{aud}, "resource": res}), true},
		{"no resource", jwt(typ, map[string]any{"aud": aud}), true},
		{"media type form", jwt(map[string]any{"typ": "application/" + typIDJAG}, map[string]any{"aud": aud}), true},
		{"another audience", jwt(typ, map[string]any{"aud": "https://evil.example", "resource": res}), false},
		{"two audiences", jwt(typ, map[string]any{"aud": []string{aud, "https://evil.example"}}), false},
		{"another resource", jwt(typ, map[string]any{"aud": aud, "resource": "https://mcp.example/other"}), false},
		{"an ID token", jwt(map[string]any{"typ": "JWT"}, map[string]any{"aud": aud}), false},
		{"not a JWT", "opaque-grant", false},
		{"unreadable", "a.b.c", false},
	} {
		if err := checkIDJAG(c.jag, aud, res); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok %v", c.name, err, c.ok)
		}
	}
}

// TestCheckUpstreamIDJAG: `broker upstreams check` says whether an
// enterprise entry's authorization server takes ID-JAGs.
func TestCheckUpstreamIDJAG(t *testing.T) {
	r := newJAGRig(t)
	c, err := r.k.CheckUpstream(context.Background(), "linear")
	if err != nil || c.IDJAG != "id-jag" || c.Registration != "static" {
		t.Fatalf("check = %+v, %v", c, err)
	}
	r.as.set("grant_types_supported", []string{"authorization_code"})
	r.k.upstream("linear").auth = nil
	if c, err = r.k.CheckUpstream(context.Background(), "linear"); err != nil || c.IDJAG != "no id-jag: code flow only" {
		t.Fatalf("without the JWT bearer grant: %+v, %v", c, err)
	}
}
