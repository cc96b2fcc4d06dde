package authserver

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// The JWT bearer grant is tested against the real development IdP over
// loopback: the broker discovers it and fetches its keys as it would any
// IdP's. ID-JAGs come from its token exchange, or, for the refusals, are
// signed with its key (devidp.IdP.Sign) to say what the IdP would not.

const (
	jagClient = "host-at-idp" // the host's client at the IdP
	jagSecret = "host-idp-secret"
)

type jagEnv struct {
	*harness
	idp      *devidp.IdP
	rec      *telemetry.Recorder
	audit    *logbuf.Buffer
	clientID string // the confidential host client registered at the broker
	secret   string
}

// newJAGEnv starts an IdP and a broker trusting it, with policy (nil:
// any) and a confidential client registered by dynamic registration.
func newJAGEnv(t *testing.T, mods ...func(*Options)) *jagEnv {
	t.Helper()
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: jagClient, Secret: jagSecret, RedirectURIs: []string{"http://127.0.0.1/cb"}}})
	audit := &logbuf.Buffer{}
	rec := telemetry.New(telemetry.Options{Audit: slog.New(slog.NewJSONHandler(audit, nil))})
	h := newHarness(t, append([]func(*Options){func(o *Options) {
		o.IdPIssuer = idp.Issuer()
		o.Scopes = []string{"broker"}
		o.Telemetry = rec
		o.IDJAG.Policy = IDJAGPolicy{Mode: IDJAGAny}
	}}, mods...)...)
	status, out := h.register(map[string]any{"redirect_uris": []string{"https://host.example/cb"}, "token_endpoint_auth_method": "client_secret_basic",
		"client_name": "Enterprise host"})
	if status != http.StatusCreated {
		t.Fatalf("register: %d %v", status, out)
	}
	e := &jagEnv{harness: h, idp: idp, rec: rec, audit: audit, clientID: out["client_id"].(string), secret: out["client_secret"].(string)}
	idp.SetIDJAGRules([]devidp.IDJAGRule{
		{User: "alice", Client: jagClient, Audience: h.srv.URL, Resources: []string{h.srv.URL + "/mcp"}, Scopes: []string{"broker"}, AudienceClientID: e.clientID},
		{User: "bob", Client: jagClient, Audience: h.srv.URL, Deny: true},
	})
	return e
}

// claims is a valid ID-JAG's claim set for alice and the env's client.
func (e *jagEnv) claims() map[string]any {
	now := e.clock.Now()
	return map[string]any{
		"iss": e.idp.Issuer(), "sub": "alice", "aud": e.srv.URL, "client_id": e.clientID, "jti": randomID(12),
		"iat": now.Unix(), "exp": now.Add(4 * time.Minute).Unix(), "resource": e.srv.URL + "/mcp", "scope": "broker",
	}
}

func (e *jagEnv) sign(claims map[string]any) string {
	e.t.Helper()
	tok, err := e.idp.Sign("oauth-id-jag+jwt", claims)
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// redeem presents assertion at /token as the env's client.
func (e *jagEnv) redeem(assertion string, extra url.Values) tokenAnswer {
	e.t.Helper()
	f := url.Values{"grant_type": {grantJWTBearer}, "assertion": {assertion}}
	for k, v := range extra {
		f[k] = v
	}
	return e.post("/token", f, e.clientID, e.secret)
}

// outcomes returns credbroker_idjag_grants_total by outcome.
func (e *jagEnv) outcomes() map[string]float64 {
	e.t.Helper()
	mfs, err := e.rec.Registry().Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "credbroker_idjag_grants_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// idToken is an ID token of the IdP for user at client (as the host holds
// after signing in there).
func (e *jagEnv) idToken(sub, aud string, ttl time.Duration) string {
	e.t.Helper()
	now := time.Now()
	tok, err := e.idp.Sign("JWT", map[string]any{"iss": e.idp.Issuer(), "sub": sub, "aud": aud, "iat": now.Unix(), "exp": now.Add(ttl).Unix()})
	if err != nil {
		e.t.Fatal(err)
	}
	return tok
}

// exchange asks the IdP for an ID-JAG (RFC 8693) as the host.
func (e *jagEnv) exchange(idToken string, extra url.Values) (int, map[string]any) {
	e.t.Helper()
	f := url.Values{"grant_type": {"urn:ietf:params:oauth:grant-type:token-exchange"},
		"requested_token_type": {"urn:ietf:params:oauth:token-type:id-jag"}, "audience": {e.srv.URL},
		"resource": {e.srv.URL + "/mcp"}, "subject_token": {idToken},
		"subject_token_type": {"urn:ietf:params:oauth:token-type:id_token"}}
	for k, v := range extra {
		f[k] = v
	}
	req, _ := http.NewRequest(http.MethodPost, e.idp.Issuer()+"/oauth/token", strings.NewReader(f.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(jagClient, jagSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// TestIDJAGGrant: a host trades alice's ID token at the IdP for an ID-JAG
// and redeems it here: an access token naming alice as the IdP knows her,
// for this resource, no refresh token, no consent page; the app is marked
// as let in by the organisation; a replay and a person the IdP no longer
// vouches for get nothing new.
func TestIDJAGGrant(t *testing.T) {
	e := newJAGEnv(t)
	alice := vault.Principal{Issuer: e.idp.Issuer(), Subject: "alice"}

	status, x := e.exchange(e.idToken("alice", jagClient, time.Hour), nil)
	if status != 200 || x["issued_token_type"] != "urn:ietf:params:oauth:token-type:id-jag" || x["token_type"] != "N_A" {
		t.Fatalf("token exchange: %d %v", status, x)
	}
	jag := x["access_token"].(string)

	tok := e.redeem(jag, nil)
	if tok.Status != 200 || tok.AccessToken == "" || tok.TokenType != "Bearer" || tok.Scope != "broker" {
		t.Fatalf("redeem: %+v", tok)
	}
	if tok.RefreshToken != "" {
		t.Fatal("a refresh token was issued for an ID-JAG (the draft: SHOULD NOT)")
	}
	info, err := e.as.Verifier()(t.Context(), tok.AccessToken)
	if err != nil {
		t.Fatal(err)
	}
	if info.Principal != alice || info.ClientID != e.clientID || len(info.Audiences) != 1 || info.Audiences[0] != e.srv.URL+"/mcp" {
		t.Fatalf("the token names %+v for %s at %v", info.Principal, info.ClientID, info.Audiences)
	}
	apps, err := e.as.apps.List(t.Context(), alice)
	if err != nil || len(apps) != 1 || !apps[0].ByOrganisation || !apps[0].Active || apps[0].Name != "Enterprise host" {
		t.Fatalf("apps %+v, %v", apps, err)
	}
	// No consent was recorded: the browser's /authorize still asks.
	b := e.browser("alice")
	if p := b.get(e.authorizeURL(e.clientID, "https://host.example/cb", newPKCE(), nil)); p.status != http.StatusOK || !strings.Contains(p.body, "Allow an app") {
		t.Fatalf("the organisation's grant skipped the person's consent in the browser: HTTP %d", p.status)
	}

	// The same ID-JAG again: its jti is spent.
	if again := e.redeem(jag, nil); again.Status != 400 || again.Error != "invalid_grant" || !strings.Contains(again.Desc, "used before") {
		t.Fatalf("replay: %+v", again)
	}

	// The IdP stops vouching for alice: no new ID-JAG, so no new token.
	e.idp.SetIDJAGRules([]devidp.IDJAGRule{{User: "alice", Client: jagClient, Audience: e.srv.URL, Deny: true}})
	if status, x := e.exchange(e.idToken("alice", jagClient, time.Hour), nil); status != 400 || x["error"] != "invalid_grant" {
		t.Fatalf("exchange after the IdP stopped vouching: %d %v", status, x)
	}

	got := e.outcomes()
	if got[telemetry.IDJAGGranted] != 1 || got[telemetry.IDJAGReplayed] != 1 {
		t.Fatalf("credbroker_idjag_grants_total = %v", got)
	}
	for _, want := range []string{`"msg":"audit: idjag_granted"`, `"msg":"audit: idjag_refused"`, `"outcome":"replayed"`} {
		if !strings.Contains(e.audit.String(), want) {
			t.Errorf("audit log lacks %s:\n%s", want, e.audit.String())
		}
	}
	for _, secret := range []string{jag, tok.AccessToken, e.secret} {
		if strings.Contains(e.logs.String(), secret) || strings.Contains(e.audit.String(), secret) {
			t.Fatal("an ID-JAG, token or secret was logged")
		}
	}
}

// TestIDJAGMetadata: the grant type and the ID-JAG profile are advertised
// only while the policy lets the grant in.
func TestIDJAGMetadata(t *testing.T) {
	for _, on := range []bool{true, false} {
		e := newJAGEnv(t, func(o *Options) {
			if !on {
				o.IDJAG.Policy = IDJAGPolicy{Mode: IDJAGOff}
			}
		})
		resp, err := http.Get(e.srv.URL + "/.well-known/oauth-authorization-server")
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			Grants   []string `json:"grant_types_supported"`
			Profiles []string `json:"authorization_grant_profiles_supported"`
		}
		json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		hasGrant := strings.Contains(strings.Join(m.Grants, " "), grantJWTBearer)
		hasProfile := len(m.Profiles) == 1 && m.Profiles[0] == "urn:ietf:params:oauth:grant-profile:id-jag"
		if hasGrant != on || hasProfile != on {
			t.Errorf("policy on %v: grant_types_supported %v, authorization_grant_profiles_supported %v", on, m.Grants, m.Profiles)
		}
	}
}

// TestIDJAGRefusals: every refusal the issue lists, each a precise RFC
// 6749 error, an audit event and a metric, storing nothing: no app access,
// and the refused assertion's jti is still unspent (a valid ID-JAG with
// the same jti is then accepted).
func TestIDJAGRefusals(t *testing.T) {
	e := newJAGEnv(t)
	alice := vault.Principal{Issuer: e.idp.Issuer(), Subject: "alice"}

	// Another IdP, not trusted, with its own key.
	other := devidptest.Start(t, nil, nil)
	// A key the IdP never published, and the IdP's public key bytes (what
	// an attacker reads from its JWKS) for the HMAC confusion.
	stray, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(e.idp.Issuer() + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	jwksBytes, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var jwks jose.JSONWebKeySet
	if err := json.Unmarshal(jwksBytes, &jwks); err != nil || len(jwks.Keys) == 0 {
		t.Fatalf("IdP JWKS: %v", err)
	}
	idpKID := jwks.Keys[0].KeyID

	with := func(mod func(c map[string]any)) func(jti string) string {
		return func(jti string) string {
			c := e.claims()
			c["jti"] = jti
			mod(c)
			return e.sign(c)
		}
	}
	now := e.clock.Now()
	cases := []struct {
		name, code, desc, outcome string
		status                    int
		assertion                 func(jti string) string
		client                    [2]string // another client's credentials
		form                      url.Values
	}{
		{name: "wrong typ", code: "invalid_grant", desc: "typ must be oauth-id-jag+jwt", outcome: telemetry.IDJAGType, assertion: func(jti string) string {
			c := e.claims()
			c["jti"] = jti
			tok, _ := e.idp.Sign("JWT", c)
			return tok
		}},
		{name: "wrong aud", code: "invalid_grant", desc: "aud must be this authorization server's issuer", outcome: telemetry.IDJAGAudience,
			assertion: with(func(c map[string]any) { c["aud"] = "https://other-as.example" })},
		{name: "aud with a second audience", code: "invalid_grant", desc: "alone", outcome: telemetry.IDJAGAudience,
			assertion: with(func(c map[string]any) { c["aud"] = []string{e.srv.URL, "https://other-as.example"} })},
		{name: "wrong resource", code: "invalid_grant", desc: "resource must be this broker's MCP endpoint", outcome: telemetry.IDJAGResource,
			assertion: with(func(c map[string]any) { c["resource"] = "https://other.example/mcp" })},
		{name: "gateway resource", code: "invalid_grant", desc: "resource must be this broker's MCP endpoint", outcome: telemetry.IDJAGResource,
			assertion: with(func(c map[string]any) { c["resource"] = e.srv.URL + "/mcp/u/github" })},
		{name: "wrong client_id", code: "invalid_grant", desc: "issued for another client", outcome: telemetry.IDJAGClientMismatch,
			assertion: with(func(c map[string]any) { c["client_id"] = "someone-else" })},
		{name: "untrusted issuer", code: "invalid_grant", desc: "issuer is not trusted", outcome: telemetry.IDJAGUntrustedIssuer,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"], c["iss"] = jti, other.Issuer()
				tok, _ := other.Sign("oauth-id-jag+jwt", c)
				return tok
			}},
		{name: "issuer claim forged onto another IdP's signature", code: "invalid_grant", desc: "signature does not verify", outcome: telemetry.IDJAGSignature,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				tok, _ := other.Sign("oauth-id-jag+jwt", c)
				return tok
			}},
		{name: "expired", code: "invalid_grant", desc: "expired", outcome: telemetry.IDJAGExpired,
			assertion: with(func(c map[string]any) {
				c["iat"], c["exp"] = now.Add(-5*time.Minute).Unix(), now.Add(-time.Minute).Unix()
			})},
		{name: "not yet valid (iat)", code: "invalid_grant", desc: "issued in the future", outcome: telemetry.IDJAGNotYetValid,
			assertion: with(func(c map[string]any) {
				c["iat"], c["exp"] = now.Add(2*time.Minute).Unix(), now.Add(5*time.Minute).Unix()
			})},
		{name: "not yet valid (nbf)", code: "invalid_grant", desc: "not valid yet", outcome: telemetry.IDJAGNotYetValid,
			assertion: with(func(c map[string]any) { c["nbf"] = now.Add(2 * time.Minute).Unix() })},
		{name: "too long-lived", code: "invalid_grant", desc: "lives longer than", outcome: telemetry.IDJAGTooLongLived,
			assertion: with(func(c map[string]any) { c["exp"] = now.Add(time.Hour).Unix() })},
		{name: "alg none", code: "invalid_grant", desc: "algorithm \"none\" is not accepted", outcome: telemetry.IDJAGAlgorithm,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				return unsigned(t, map[string]any{"alg": "none", "typ": "oauth-id-jag+jwt", "kid": idpKID}, c)
			}},
		{name: "HS256 with the JWKS's public key bytes", code: "invalid_grant", desc: "algorithm \"HS256\" is not accepted", outcome: telemetry.IDJAGAlgorithm,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: jwksBytes},
					(&jose.SignerOptions{}).WithType("oauth-id-jag+jwt").WithHeader("kid", idpKID))
				if err != nil {
					t.Fatal(err)
				}
				return signRaw(t, signer, c)
			}},
		{name: "HS256 with the public modulus", code: "invalid_grant", desc: "algorithm \"HS256\" is not accepted", outcome: telemetry.IDJAGAlgorithm,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				n := jwks.Keys[0].Key.(*rsa.PublicKey).N
				signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: new(big.Int).Set(n).Bytes()},
					(&jose.SignerOptions{}).WithType("oauth-id-jag+jwt").WithHeader("kid", idpKID))
				if err != nil {
					t.Fatal(err)
				}
				return signRaw(t, signer, c)
			}},
		{name: "unknown kid", code: "invalid_grant", desc: "signature does not verify", outcome: telemetry.IDJAGSignature,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: stray},
					(&jose.SignerOptions{}).WithType("oauth-id-jag+jwt").WithHeader("kid", "not-a-key-of-the-idp"))
				if err != nil {
					t.Fatal(err)
				}
				return signRaw(t, signer, c)
			}},
		{name: "the IdP's kid on a stray key", code: "invalid_grant", desc: "signature does not verify", outcome: telemetry.IDJAGSignature,
			assertion: func(jti string) string {
				c := e.claims()
				c["jti"] = jti
				signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: stray},
					(&jose.SignerOptions{}).WithType("oauth-id-jag+jwt").WithHeader("kid", idpKID))
				if err != nil {
					t.Fatal(err)
				}
				return signRaw(t, signer, c)
			}},
		{name: "scope the broker does not offer", code: "invalid_grant", desc: "does not offer", outcome: telemetry.IDJAGScope,
			assertion: with(func(c map[string]any) { c["scope"] = "broker admin" })},
		{name: "no jti", code: "invalid_grant", desc: "must carry a jti", outcome: telemetry.IDJAGMalformed,
			assertion: with(func(c map[string]any) { delete(c, "jti") })},
		{name: "no sub", code: "invalid_grant", desc: "must name its subject", outcome: telemetry.IDJAGMalformed,
			assertion: with(func(c map[string]any) { delete(c, "sub") })},
		{name: "exp of the wrong type", code: "invalid_grant", desc: "exp", outcome: telemetry.IDJAGMalformed,
			assertion: with(func(c map[string]any) { c["exp"] = "tomorrow" })},
		{name: "not a JWS", code: "invalid_grant", desc: "not a compact JWS", outcome: telemetry.IDJAGMalformed,
			assertion: func(string) string { return "not.a.jwt" }},
		{name: "no assertion", code: "invalid_request", desc: "assertion is required", outcome: telemetry.IDJAGMalformed,
			assertion: func(string) string { return "" }},
		{name: "another resource in the token request", code: "invalid_target", desc: "resource must be", outcome: telemetry.IDJAGResource,
			assertion: with(func(map[string]any) {}), form: url.Values{"resource": {"https://other.example/mcp"}}},
	}
	valid := 0
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := e.outcomes()[tc.outcome]
			jti := randomID(12)
			a := e.redeem(tc.assertion(jti), tc.form)
			status := tc.status
			if status == 0 {
				status = 400
			}
			if a.Status != status || a.Error != tc.code || !strings.Contains(a.Desc, tc.desc) || a.AccessToken != "" {
				t.Fatalf("answer %+v, want HTTP %d %s (%s)", a, status, tc.code, tc.desc)
			}
			if after := e.outcomes()[tc.outcome]; after != before+1 {
				t.Errorf("credbroker_idjag_grants_total{outcome=%q} went from %v to %v", tc.outcome, before, after)
			}
			if !strings.Contains(e.audit.String(), `"outcome":"`+tc.outcome+`"`) {
				t.Errorf("no idjag_refused audit event with outcome %s", tc.outcome)
			}
			// Nothing stored: no app for alice, and the jti is unspent.
			if apps := e.apps2(alice); len(apps) != valid {
				t.Fatalf("a refusal stored app access: %+v", apps)
			}
			c := e.claims()
			c["jti"] = jti
			if ok := e.redeem(e.sign(c), nil); ok.Status != 200 {
				t.Fatalf("a valid ID-JAG with the refused one's jti: %+v", ok)
			}
			valid = 1
		})
	}

	t.Run("replayed jti", func(t *testing.T) {
		jag := e.sign(e.claims())
		if a := e.redeem(jag, nil); a.Status != 200 {
			t.Fatal(a)
		}
		a := e.redeem(jag, nil)
		if a.Status != 400 || a.Error != "invalid_grant" || !strings.Contains(a.Desc, "used before") {
			t.Fatalf("replay: %+v", a)
		}
	})
	t.Run("public client under any", func(t *testing.T) {
		id, _ := e.publicClient()
		c := e.claims()
		c["client_id"] = id
		a := e.post("/token", url.Values{"grant_type": {grantJWTBearer}, "assertion": {e.sign(c)}, "client_id": {id}})
		if a.Status != 400 || a.Error != "unauthorized_client" || !strings.Contains(a.Desc, "confidential clients") {
			t.Fatalf("public client: %+v", a)
		}
	})
	t.Run("wrong client secret", func(t *testing.T) {
		a := e.post("/token", url.Values{"grant_type": {grantJWTBearer}, "assertion": {e.sign(e.claims())}}, e.clientID, "wrong")
		if a.Status != 401 || a.Error != "invalid_client" {
			t.Fatalf("wrong secret: %+v", a)
		}
	})

	for _, p := range []struct {
		name, code, desc, outcome string
		policy                    IDJAGPolicy
	}{
		{"client not on the allow-list", "unauthorized_client", "may not use the JWT bearer grant", telemetry.IDJAGClientNotAllowed,
			IDJAGPolicy{Mode: IDJAGAllow, Clients: []string{"someone-else", "https://host.example/client.json"}}},
		{"policy off", "unsupported_grant_type", "turned off", telemetry.IDJAGPolicyOff, IDJAGPolicy{Mode: IDJAGOff}},
	} {
		t.Run(p.name, func(t *testing.T) {
			pe := newJAGEnv(t, func(o *Options) { o.IDJAG.Policy = p.policy })
			a := pe.redeem(pe.sign(pe.claims()), nil)
			if a.Status != 400 || a.Error != p.code || !strings.Contains(a.Desc, p.desc) {
				t.Fatalf("answer %+v, want %s", a, p.code)
			}
			if got := pe.outcomes()[p.outcome]; got != 1 {
				t.Errorf("credbroker_idjag_grants_total{outcome=%q} = %v", p.outcome, got)
			}
			if !strings.Contains(pe.audit.String(), `"msg":"audit: idjag_refused"`) {
				t.Error("no idjag_refused audit event")
			}
			if apps := pe.apps2(vault.Principal{Issuer: pe.idp.Issuer(), Subject: "alice"}); len(apps) != 0 {
				t.Fatalf("stored: %+v", apps)
			}
		})
	}
	t.Run("client on the allow-list", func(t *testing.T) {
		pe := newJAGEnv(t)
		pe.as.opts.IDJAG.Policy = IDJAGPolicy{Mode: IDJAGAllow, Clients: []string{pe.clientID}}
		if a := pe.redeem(pe.sign(pe.claims()), nil); a.Status != 200 {
			t.Fatalf("allowed client: %+v", a)
		}
	})
}

// apps2 returns p's app access records straight from the store.
func (e *jagEnv) apps2(p vault.Principal) []vault.AppAccess {
	e.t.Helper()
	list, err := e.store.ListAppAccess(e.t.Context(), p)
	if err != nil {
		e.t.Fatal(err)
	}
	return list
}

// unsigned renders a JWS with header hdr, claims and an empty signature.
func unsigned(t *testing.T, hdr, claims map[string]any) string {
	t.Helper()
	h, _ := json.Marshal(hdr)
	c, _ := json.Marshal(claims)
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c) + "."
}

func signRaw(t *testing.T, s jose.Signer, claims map[string]any) string {
	t.Helper()
	b, _ := json.Marshal(claims)
	jws, err := s.Sign(b)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestParseIDJAGPolicy(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "off", true}, {"off", "off", true}, {"any", "any", true},
		{"abc, https://host.example/client.json", "abc,https://host.example/client.json", true},
		{"abc,any", "", false}, {" , ", "", false}, {"https://host.example/", "", false},
	} {
		p, err := ParseIDJAGPolicy(tc.in)
		if (err == nil) != tc.ok || (tc.ok && p.String() != tc.want) {
			t.Errorf("ParseIDJAGPolicy(%q) = %q, %v", tc.in, p.String(), err)
		}
	}
}

// TestIDJAGTrustedIssuer: an issuer trusted besides the IdP (discovered
// on first use) vouches for people of its own: the access token names its
// (iss, sub), and the verifier accepts that principal; an issuer not
// configured stays refused.
func TestIDJAGTrustedIssuer(t *testing.T) {
	second := devidptest.Start(t, nil, nil)
	e := newJAGEnv(t, func(o *Options) { o.IDJAG.TrustedIssuers = []string{second.Issuer()} })
	c := e.claims()
	c["iss"] = second.Issuer()
	jag, err := second.Sign("oauth-id-jag+jwt", c)
	if err != nil {
		t.Fatal(err)
	}
	tok := e.redeem(jag, nil)
	if tok.Status != 200 {
		t.Fatalf("redeem: %+v", tok)
	}
	info, err := e.as.Verifier()(t.Context(), tok.AccessToken)
	if err != nil || info.Principal != (vault.Principal{Issuer: second.Issuer(), Subject: "alice"}) {
		t.Fatalf("verifier: %+v, %v", info.Principal, err)
	}
	// The same broker without the option refuses that issuer.
	plain := newJAGEnv(t)
	c = plain.claims()
	c["iss"] = second.Issuer()
	jag, _ = second.Sign("oauth-id-jag+jwt", c)
	if a := plain.redeem(jag, nil); a.Status != 400 || !strings.Contains(a.Desc, "issuer is not trusted") {
		t.Fatalf("untrusted: %+v", a)
	}
}
