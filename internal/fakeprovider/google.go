package fakeprovider

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const googleDefaultAccess = time.Hour

// Google is a fake of Google's OAuth 2.0 / OpenID Connect endpoints.
type Google struct {
	*core
	srv    *httptest.Server
	signer jose.Signer
	jwks   jose.JSONWebKeySet
}

// NewGoogle starts a fake Google on 127.0.0.1 (issuer = its URL) and closes
// it when tb ends.
//
// Routes:
//
//	GET  /.well-known/openid-configuration  discovery
//	GET  /oauth2/v3/certs                   JWKS
//	GET  /o/oauth2/v2/auth                  consent page (or injected error / AutoApprove)
//	POST /o/oauth2/v2/auth                  the consent form's decision
//	POST /token                             authorization_code and refresh_token grants
//	GET  /v1/userinfo                       OIDC userinfo (Bearer)
//	POST /revoke                            RFC 7009 (form token=…)
func NewGoogle(tb testing.TB, opts Options) *Google {
	tb.Helper()
	c := newCore(opts, 1234567890, "Test User")
	c.prefix, c.rprefix = "ya29.", "1//"
	if c.opts.AccessTTL == 0 {
		c.opts.AccessTTL = googleDefaultAccess
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatalf("fakeprovider: key: %v", err)
	}
	kid := randomToken("", 8)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader(jose.HeaderKey("kid"), kid))
	if err != nil {
		tb.Fatalf("fakeprovider: signer: %v", err)
	}
	g := &Google{core: c, signer: signer, jwks: jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
		{Key: &key.PublicKey, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"},
	}}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", g.discovery)
	mux.HandleFunc("GET /oauth2/v3/certs", g.certs)
	mux.HandleFunc("GET /o/oauth2/v2/auth", g.authorize)
	mux.HandleFunc("POST /o/oauth2/v2/auth", g.decide)
	mux.HandleFunc("POST /token", g.token)
	mux.HandleFunc("/v1/userinfo", g.userinfo)
	mux.HandleFunc("POST /revoke", g.revoke)
	g.srv = httptest.NewServer(mux)
	c.server = g.srv.URL
	tb.Cleanup(g.srv.Close)
	return g
}

// Issuer is the OIDC issuer (the server URL).
func (g *Google) Issuer() string { return g.srv.URL }

// Client returns an HTTP client for the server.
func (g *Google) Client() *http.Client { return g.srv.Client() }

func (g *Google) discovery(w http.ResponseWriter, _ *http.Request) {
	b := g.srv.URL
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                b,
		"authorization_endpoint":                b + "/o/oauth2/v2/auth",
		"token_endpoint":                        b + "/token",
		"userinfo_endpoint":                     b + "/v1/userinfo",
		"revocation_endpoint":                   b + "/revoke",
		"jwks_uri":                              b + "/oauth2/v3/certs",
		"response_types_supported":              []string{"code"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
		"scopes_supported":                      []string{"openid", "email", "profile"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_post", "client_secret_basic"},
		"claims_supported":                      []string{"aud", "email", "email_verified", "exp", "iat", "iss", "name", "sub", "nonce"},
		"code_challenge_methods_supported":      []string{"plain", "S256"},
		"grant_types_supported":                 []string{"authorization_code", "refresh_token"},
	})
}

func (g *Google) certs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, g.jwks)
}

func (g *Google) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g.recordLocked(Event{Kind: "authorize", Method: r.Method, Path: r.URL.Path, Status: http.StatusOK})
	if subtleEq(q.Get("client_id"), g.opts.ClientID) != 1 {
		errorPage(w, http.StatusUnauthorized, "Google", "Error 401: invalid_client. The OAuth client was not found.")
		return
	}
	redirect := q.Get("redirect_uri")
	if !g.redirectOK(redirect) {
		errorPage(w, http.StatusBadRequest, "Google", "Error 400: redirect_uri_mismatch.")
		return
	}
	scope := normalizeScope(q.Get("scope"), " ")
	state := q.Get("state")
	bad := func(code, desc string) {
		http.Redirect(w, r, authorizeRedirect(redirect, url.Values{"error": {code}, "error_description": {desc}, "state": {state}}), http.StatusFound)
	}
	switch {
	case q.Get("response_type") != "code":
		bad("unsupported_response_type", "response_type must be code")
		return
	case scope == "":
		bad("invalid_request", "Missing required parameter: scope")
		return
	case q.Get("code_challenge") != "" && q.Get("code_challenge_method") != "S256" && q.Get("code_challenge_method") != "plain":
		bad("invalid_request", "Invalid code_challenge_method")
		return
	}
	method := q.Get("code_challenge_method")
	if method == "" && q.Get("code_challenge") != "" {
		method = "plain"
	}
	prompts := strings.Fields(q.Get("prompt"))
	p := pendingAuth{
		redirectURI: redirect, scope: scope, state: state, nonce: q.Get("nonce"),
		challenge: q.Get("code_challenge"), method: method,
		offline: q.Get("access_type") == "offline" && containsString(prompts, "consent"),
	}
	g.mu.Lock()
	errCode, errDesc, email := g.authzErr, g.authzErrDesc, g.user.Email
	g.mu.Unlock()
	if errCode != "" {
		bad(errCode, errDesc)
		return
	}
	if g.opts.AutoApprove {
		g.approve(w, r, p)
		return
	}
	id := g.newPending(p)
	render(w, http.StatusOK, "consent", consentData{
		Provider: "Google", Action: "/o/oauth2/v2/auth", RequestID: id,
		ClientID: g.opts.ClientID, Scope: scope, Login: email,
	})
}

func (g *Google) decide(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		errorPage(w, http.StatusBadRequest, "Google", "The form could not be read.")
		return
	}
	p, ok := g.takePending(r.PostForm.Get("request"))
	if !ok {
		errorPage(w, http.StatusBadRequest, "Google", "This authorization request is unknown or was already answered.")
		return
	}
	switch r.PostForm.Get("decision") {
	case "approve":
		g.approve(w, r, p)
	case "deny":
		g.recordLocked(Event{Kind: "deny", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound, Error: "access_denied"})
		http.Redirect(w, r, authorizeRedirect(p.redirectURI, url.Values{"error": {"access_denied"}, "state": {p.state}}), http.StatusFound)
	default:
		errorPage(w, http.StatusBadRequest, "Google", "Choose Allow or Cancel.")
	}
}

func (g *Google) approve(w http.ResponseWriter, r *http.Request, p pendingAuth) {
	code := g.issueCode(p)
	g.recordLocked(Event{Kind: "approve", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound})
	http.Redirect(w, r, authorizeRedirect(p.redirectURI, url.Values{"code": {code}, "state": {p.state}, "scope": {p.scope}}), http.StatusFound)
}

func (g *Google) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": "bad form"})
		return
	}
	f := r.PostForm
	ev := Event{Kind: "token", GrantType: f.Get("grant_type"), Method: r.Method, Path: r.URL.Path, Status: http.StatusOK}
	id, secret := clientCreds(r)
	g.mu.Lock()
	defer g.mu.Unlock()
	fail := func(status int, code, desc string) {
		ev.Status, ev.Error = status, code
		g.record(ev)
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
	}
	if g.failTokens > 0 {
		g.failTokens--
		fail(http.StatusInternalServerError, "server_error", "Internal error (injected).")
		return
	}
	if !g.clientOK(id, secret) {
		fail(http.StatusUnauthorized, "invalid_client", "Unauthorized")
		return
	}
	var (
		grantID, scope, nonce string
		user                  User
		withRefresh           bool
	)
	switch ev.GrantType {
	case "authorization_code":
		cg, ok := g.codes[key(f.Get("code"))]
		if !ok || cg.used || !g.opts.Now().Before(cg.expiry) {
			fail(http.StatusBadRequest, "invalid_grant", "Bad Request")
			return
		}
		cg.used = true
		if f.Get("redirect_uri") != cg.req.redirectURI {
			fail(http.StatusBadRequest, "redirect_uri_mismatch", "Bad Request")
			return
		}
		if !pkceOK(cg.req.challenge, cg.req.method, f.Get("code_verifier")) {
			fail(http.StatusBadRequest, "invalid_grant", "Invalid code verifier.")
			return
		}
		grantID, scope, nonce, user, withRefresh = cg.grantID, cg.req.scope, cg.req.nonce, cg.user, cg.req.offline
	case "refresh_token":
		t, ok := g.lookupToken(f.Get("refresh_token"))
		if !ok || !t.refresh || !g.live(t) {
			fail(http.StatusBadRequest, "invalid_grant", "Token has been expired or revoked.")
			return
		}
		// Google does not rotate refresh tokens; the ID token on refresh has no nonce.
		grantID, scope, user = t.grantID, t.scope, t.user
	default:
		fail(http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+ev.GrantType)
		return
	}
	access, refresh, expiry := g.issueTokens(grantID, scope, nonce, user, g.opts.AccessTTL, withRefresh, 0)
	out := map[string]any{
		"access_token": access,
		"expires_in":   int(expiry.Sub(g.opts.Now()) / time.Second),
		"token_type":   "Bearer",
		"scope":        scope,
	}
	if refresh != "" {
		out["refresh_token"] = refresh
	}
	if containsString(strings.Fields(scope), "openid") {
		idt, err := g.idToken(user, nonce)
		if err != nil {
			fail(http.StatusInternalServerError, "server_error", "signing failed")
			return
		}
		out["id_token"] = idt
	}
	ev.Token = access
	g.record(ev)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// idToken signs an RS256 ID token; callers hold g.mu.
func (g *Google) idToken(u User, nonce string) (string, error) {
	now := g.opts.Now()
	claims := map[string]any{
		"iss": g.srv.URL, "sub": u.Subject, "aud": g.opts.ClientID, "azp": g.opts.ClientID,
		"email": u.Email, "email_verified": true, "name": u.Name,
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
	}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	jws, err := g.signer.Sign(payload)
	if err != nil {
		return "", err
	}
	return jws.CompactSerialize()
}

func (g *Google) userinfo(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r, false)
	ev := Event{Kind: "userinfo", Token: tok, Method: r.Method, Path: r.URL.Path}
	g.mu.Lock()
	t, ok := g.lookupToken(tok)
	if !ok || t.refresh || !g.live(t) {
		ev.Status, ev.Error = http.StatusUnauthorized, "invalid_token"
		g.record(ev)
		g.mu.Unlock()
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/", error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token", "error_description": "Invalid Credentials"})
		return
	}
	u := t.user
	ev.Status = http.StatusOK
	g.record(ev)
	g.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"sub": u.Subject, "email": u.Email, "email_verified": true, "name": u.Name,
	})
}

// revoke implements RFC 7009: revoking either token ends the whole grant,
// as Google does.
func (g *Google) revoke(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	_ = r.ParseForm()
	tok := r.PostForm.Get("token")
	ev := Event{Kind: "revoke", Token: tok, Method: r.Method, Path: r.URL.Path}
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.lookupToken(tok)
	if !ok || t.revoked {
		ev.Status, ev.Error = http.StatusBadRequest, "invalid_token"
		g.record(ev)
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_token", "error_description": "Token expired or revoked"})
		return
	}
	g.revokeGrant(t.grantID)
	ev.Status = http.StatusOK
	g.record(ev)
	writeJSON(w, http.StatusOK, map[string]any{})
}

func containsString(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
