package fakeprovider

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
)

const (
	googleDefaultAccess = time.Hour
	// googleTestingRefresh is the life of a refresh token issued to an app
	// in "Testing" publishing status for more than the sign-in scopes.
	googleTestingRefresh = 7 * 24 * time.Hour

	googleUserinfoEmail   = "https://www.googleapis.com/auth/userinfo.email"
	googleUserinfoProfile = "https://www.googleapis.com/auth/userinfo.profile"
)

// googleLongNames are the names Google answers for the OpenID Connect
// scopes email and profile.
var googleLongNames = map[string]string{"email": googleUserinfoEmail, "profile": googleUserinfoProfile}

// googleScope returns the name Google answers for s.
func googleScope(s string) string {
	if l, ok := googleLongNames[s]; ok {
		return l
	}
	return s
}

// googleSignIn reports whether s is a sign-in scope (granted as a block,
// never a granular choice).
func googleSignIn(s string) bool {
	return s == "openid" || s == googleUserinfoEmail || s == googleUserinfoProfile
}

// googleScopeList renders granted scopes as Google answers them: long
// names, the sign-in scopes first (email, openid, profile), then the rest
// in the order granted.
func googleScopeList(scopes []string) string {
	short := func(s string) string {
		for k, v := range googleLongNames {
			if v == s {
				return k
			}
		}
		return s
	}
	out := slices.Clone(scopes)
	sort.SliceStable(out, func(i, j int) bool {
		si, sj := googleSignIn(out[i]), googleSignIn(out[j])
		if si != sj {
			return si
		}
		return si && short(out[i]) < short(out[j])
	})
	return strings.Join(out, " ")
}

// googleGrant is what a user has granted the client: Google keeps one
// grant per user and client.
type googleGrant struct {
	scopes []string
	// refreshIssued: a refresh token was issued for this grant already,
	// so access_type=offline alone does not issue another.
	refreshIssued bool
}

// googleAPI is one of Google's per-API hosts.
type googleAPI struct {
	name string
	srv  *httptest.Server
}

// Google is a fake of Google's OAuth 2.0 / OpenID Connect endpoints and a
// slice of its APIs, served from several hosts as Google serves them.
type Google struct {
	*core
	srv    *httptest.Server
	signer jose.Signer
	jwks   jose.JSONWebKeySet
	apis   map[string]*googleAPI
	// grants by user subject; guarded by core.mu.
	grants map[string]*googleGrant
}

// NewGoogle starts a fake Google on 127.0.0.1 (issuer = its URL) and closes
// it when tb ends.
//
// Routes:
//
//	GET  /.well-known/openid-configuration  discovery
//	GET  /oauth2/v3/certs                   JWKS
//	GET  /o/oauth2/v2/auth                  consent page (or injected error / AutoApprove)
//	POST /o/oauth2/v2/auth                  the consent form's decision (granular: scope=… checked)
//	POST /token                             authorization_code and refresh_token grants
//	GET  /v1/userinfo                       OIDC userinfo (Bearer)
//	POST /revoke                            ends the whole grant (form token=…)
//
// API hosts (APIURL):
//
//	www    GET /calendar/v3/users/me/calendarList  (calendar or calendar.readonly)
//	       GET /drive/v3/files                     (drive, drive.readonly or drive.metadata.readonly)
//	gmail  GET /gmail/v1/users/me/profile          (gmail.readonly, gmail.modify or https://mail.google.com/)
//	people GET /v1/people/me                       (profile)
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
	g := &Google{core: c, signer: signer, grants: map[string]*googleGrant{}, apis: map[string]*googleAPI{},
		jwks: jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: kid, Algorithm: string(jose.RS256), Use: "sig"}}}}
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
	for _, name := range []string{"www", "gmail", "people"} {
		api := &googleAPI{name: name}
		api.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { g.api(w, r, name) }))
		tb.Cleanup(api.srv.Close)
		g.apis[name] = api
	}
	return g
}

// Issuer is the OIDC issuer (the server URL).
func (g *Google) Issuer() string { return g.srv.URL }

// APIURL is the base URL of one of Google's API hosts: "www" (stands for
// https://www.googleapis.com), "gmail" (https://gmail.googleapis.com) or
// "people" (https://people.googleapis.com).
func (g *Google) APIURL(name string) string {
	api, ok := g.apis[name]
	if !ok {
		panic("fakeprovider: no Google API host " + name)
	}
	return api.srv.URL
}

// Client returns an HTTP client for the server.
func (g *Google) Client() *http.Client { return g.srv.Client() }

// GrantedScopes returns what u has granted the client, as Google answers
// it ("" when there is no grant).
func (g *Google) GrantedScopes(u User) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gr := g.grants[fmt.Sprint(u.ID)]; gr != nil {
		return googleScopeList(gr.scopes)
	}
	return ""
}

// UserRevokesAccess is the person removing the app under "Third-party
// apps & services" in their Google Account: every token ends, and the
// next consent is a first one again.
func (g *Google) UserRevokesAccess(u User) {
	g.core.UserRevokesAccess(u)
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.grants, fmt.Sprint(u.ID))
}

func (g *Google) discovery(w http.ResponseWriter, _ *http.Request) {
	b := g.srv.URL
	doc := map[string]any{
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
		"claims_supported":                      []string{"aud", "email", "email_verified", "exp", "hd", "iat", "iss", "name", "sub", "nonce"},
		"code_challenge_methods_supported":      []string{"plain", "S256"},
		"grant_types_supported":                 []string{"authorization_code", "refresh_token"},
	}
	if g.opts.IssParameter != "" && g.opts.IssParameter != "wrong-unadvertised" {
		doc["authorization_response_iss_parameter_supported"] = true
	}
	writeJSON(w, http.StatusOK, doc)
}

// withIss adds RFC 9207's iss to authorization response parameters as
// IssParameter says.
func (g *Google) withIss(v url.Values) url.Values {
	switch g.opts.IssParameter {
	case "send":
		v.Set("iss", g.srv.URL)
	case "wrong", "wrong-unadvertised":
		v.Set("iss", "https://accounts.evil.example")
	}
	return v
}

func (g *Google) certs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, g.jwks)
}

// requestedScopes turns a scope parameter into Google's names: email and
// profile under their long names, openid added with either.
func requestedScopes(param string) []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, s := range strings.Fields(normalizeScope(param, " ")) {
		add(googleScope(s))
	}
	if slices.Contains(out, googleUserinfoEmail) || slices.Contains(out, googleUserinfoProfile) {
		add("openid")
	}
	return out
}

// granular reports whether the consent screen lets the user pick scopes
// one by one: with more than one non-sign-in scope, or one with sign-in
// scopes.
func granular(scopes []string) bool {
	signIn, other := 0, 0
	for _, s := range scopes {
		if googleSignIn(s) {
			signIn++
		} else {
			other++
		}
	}
	return other > 1 || other == 1 && signIn > 0
}

func (g *Google) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g.recordLocked(Event{Kind: "authorize", Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, UserAgent: r.UserAgent(), Query: q})
	if subtleEq(q.Get("client_id"), g.opts.ClientID) != 1 {
		errorPage(w, http.StatusUnauthorized, "Google", "Error 401: invalid_client. The OAuth client was not found.")
		return
	}
	redirect := q.Get("redirect_uri")
	if !g.redirectOK(redirect) {
		errorPage(w, http.StatusBadRequest, "Google", "Error 400: redirect_uri_mismatch.")
		return
	}
	scopes := requestedScopes(q.Get("scope"))
	state := q.Get("state")
	bad := func(code, desc string) {
		http.Redirect(w, r, authorizeRedirect(redirect, url.Values{"error": {code}, "error_description": {desc}, "state": {state}}), http.StatusFound)
	}
	switch {
	case q.Get("response_type") != "code":
		bad("unsupported_response_type", "response_type must be code")
		return
	case len(scopes) == 0:
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
	p := pendingAuth{
		redirectURI: redirect, scope: strings.Join(scopes, " "), state: state, nonce: q.Get("nonce"),
		challenge: q.Get("code_challenge"), method: method,
		offline:     q.Get("access_type") == "offline",
		consent:     slices.Contains(strings.Fields(q.Get("prompt")), "consent"),
		incremental: q.Get("include_granted_scopes") == "true",
		// hd only steers the account chooser: any account can still sign in.
		hd: q.Get("hd"),
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
	d := consentData{Provider: "Google", Action: "/o/oauth2/v2/auth", RequestID: id, ClientID: g.opts.ClientID,
		Scope: googleScopeList(scopes), Login: email}
	if granular(scopes) {
		for _, s := range scopes {
			if !googleSignIn(s) {
				d.Choices = append(d.Choices, s)
			}
		}
	}
	render(w, http.StatusOK, "consent", d)
}

func (g *Google) decide(w http.ResponseWriter, r *http.Request) {
	p, ok := g.readApproval(w, r, "Google", "Choose Allow or Cancel.", nil)
	if !ok {
		return
	}
	requested := strings.Fields(p.scope)
	if granular(requested) {
		// Sign-in scopes come as a block; the others only when checked.
		var granted []string
		for _, s := range requested {
			if googleSignIn(s) || slices.Contains(r.PostForm["scope"], s) {
				granted = append(granted, s)
			}
		}
		p.scope = strings.Join(granted, " ")
	}
	g.approve(w, r, p)
}

func (g *Google) approve(w http.ResponseWriter, r *http.Request, p pendingAuth) {
	code := g.issueCode(p)
	g.recordLocked(Event{Kind: "approve", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound})
	http.Redirect(w, r, authorizeRedirect(p.redirectURI, g.withIss(url.Values{"code": {code}, "state": {p.state},
		"scope": {googleScopeList(strings.Fields(p.scope))}})), http.StatusFound)
}

// union returns a followed by what of b it lacks.
func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, s := range b {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (g *Google) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_request", "error_description": "bad form"})
		return
	}
	f := r.PostForm
	ev := Event{Kind: "token", GrantType: f.Get("grant_type"), Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, UserAgent: r.UserAgent()}
	// Google takes the client's credentials in the body or as HTTP basic
	// (its discovery document lists both).
	id, secret := clientCreds(r)
	g.mu.Lock()
	defer g.mu.Unlock()
	fail := func(status int, code, desc string) {
		ev.Status, ev.Error = status, code
		g.record(ev)
		w.Header().Set("Cache-Control", "no-store")
		writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
	}
	if g.failTokens.Take() {
		fail(http.StatusInternalServerError, "server_error", "Internal error (injected).")
		return
	}
	if !g.clientOK(id, secret) {
		fail(http.StatusUnauthorized, "invalid_client", "Unauthorized")
		return
	}
	var (
		grantID, nonce string
		scopes         []string
		user           User
		withRefresh    bool
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
		grantID, nonce, user = cg.grantID, cg.req.nonce, cg.user
		granted := strings.Fields(cg.req.scope)
		gr := g.grants[grantID]
		if gr == nil {
			gr = &googleGrant{}
			g.grants[grantID] = gr
		}
		gr.scopes = union(gr.scopes, granted)
		scopes = granted
		if cg.req.incremental {
			// include_granted_scopes=true: the token covers every scope
			// the user granted the client before, too.
			scopes = slices.Clone(gr.scopes)
		}
		// access_type=offline gives a refresh token the first time;
		// prompt=consent gives a new one every time.
		withRefresh = cg.req.offline && (cg.req.consent || !gr.refreshIssued)
		if withRefresh {
			gr.refreshIssued = true
		}
	case "refresh_token":
		t, ok := g.lookupToken(f.Get("refresh_token"))
		if !ok || !t.refresh || !g.live(t) {
			fail(http.StatusBadRequest, "invalid_grant", "Token has been expired or revoked.")
			return
		}
		// Google does not rotate refresh tokens; the answer lists the
		// grant's scopes; the ID token on refresh has no nonce.
		grantID, user = t.grantID, t.user
		scopes = strings.Fields(t.scope)
		if gr := g.grants[grantID]; gr != nil {
			scopes = slices.Clone(gr.scopes)
		}
	default:
		fail(http.StatusBadRequest, "unsupported_grant_type", "Invalid grant_type: "+ev.GrantType)
		return
	}
	var refreshTTL time.Duration
	if g.opts.Testing && slices.ContainsFunc(scopes, func(s string) bool { return !googleSignIn(s) }) {
		refreshTTL = googleTestingRefresh
	}
	scope := strings.Join(scopes, " ")
	access, refresh, expiry := g.issueTokens(grantID, scope, nonce, user, g.opts.AccessTTL, withRefresh, refreshTTL)
	out := map[string]any{
		"access_token": access,
		"expires_in":   int(expiry.Sub(g.opts.Now()) / time.Second),
		"token_type":   "Bearer",
		"scope":        googleScopeList(scopes),
	}
	if refresh != "" {
		out["refresh_token"] = refresh
	}
	if slices.Contains(scopes, "openid") {
		idt, err := g.idToken(user, nonce)
		if err != nil {
			fail(http.StatusInternalServerError, "server_error", "signing failed")
			return
		}
		out["id_token"] = idt
	}
	ev.Token, ev.Scope = access, googleScopeList(scopes)
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
	if u.HostedDomain != "" {
		// Only Google Workspace accounts carry hd.
		claims["hd"] = u.HostedDomain
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

// bearerToken looks up the bearer token of r: the token, or the answer
// already written (401) when it is not a live access token. Callers hold
// g.mu.
func (g *Google) bearerToken(w http.ResponseWriter, r *http.Request, ev *Event) (*token, bool) {
	tok := bearer(r, false)
	ev.Token = tok
	t, ok := g.lookupToken(tok)
	if !ok || t.refresh || !g.live(t) || g.failAPI.Take() {
		ev.Status, ev.Error = http.StatusUnauthorized, "invalid_token"
		g.record(*ev)
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/", error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token", "error_description": "Invalid Credentials"})
		return nil, false
	}
	return t, true
}

func (g *Google) userinfo(w http.ResponseWriter, r *http.Request) {
	ev := Event{Kind: "userinfo", Method: r.Method, Path: r.URL.Path, UserAgent: r.UserAgent()}
	g.mu.Lock()
	t, ok := g.bearerToken(w, r, &ev)
	if !ok {
		g.mu.Unlock()
		return
	}
	u := t.user
	ev.Status = http.StatusOK
	g.record(ev)
	g.mu.Unlock()
	info := map[string]any{"sub": u.Subject, "email": u.Email, "email_verified": true, "name": u.Name}
	if u.HostedDomain != "" {
		info["hd"] = u.HostedDomain
	}
	writeJSON(w, http.StatusOK, info)
}

// googleRoutes are the API methods each host serves and the scopes any of
// which the call needs.
var googleRoutes = map[string]map[string][]string{
	"www": {
		"GET /calendar/v3/users/me/calendarList": {"https://www.googleapis.com/auth/calendar", "https://www.googleapis.com/auth/calendar.readonly"},
		"GET /drive/v3/files": {"https://www.googleapis.com/auth/drive", "https://www.googleapis.com/auth/drive.readonly",
			"https://www.googleapis.com/auth/drive.metadata.readonly"},
	},
	"gmail": {
		"GET /gmail/v1/users/me/profile": {"https://www.googleapis.com/auth/gmail.readonly", "https://www.googleapis.com/auth/gmail.modify", "https://mail.google.com/"},
	},
	"people": {
		"GET /v1/people/me": {googleUserinfoProfile},
	},
}

// api serves one of Google's API hosts.
func (g *Google) api(w http.ResponseWriter, r *http.Request, host string) {
	ev := Event{Kind: "api", Method: r.Method, Path: r.URL.Path, Host: host, UserAgent: r.UserAgent()}
	g.mu.Lock()
	t, ok := g.bearerToken(w, r, &ev)
	if !ok {
		g.mu.Unlock()
		return
	}
	need, known := googleRoutes[host][r.Method+" "+r.URL.Path]
	have := strings.Fields(t.scope)
	switch {
	case !known:
		ev.Status, ev.Error = http.StatusNotFound, "not_found"
	case !slices.ContainsFunc(need, func(s string) bool { return slices.Contains(have, s) }):
		ev.Status, ev.Error = http.StatusForbidden, "insufficient_scopes"
	default:
		ev.Status = http.StatusOK
	}
	u := t.user
	g.record(ev)
	g.mu.Unlock()
	switch ev.Status {
	case http.StatusNotFound:
		writeJSON(w, http.StatusNotFound, map[string]any{"error": map[string]any{"code": 404, "message": "Not Found", "status": "NOT_FOUND"}})
	case http.StatusForbidden:
		w.Header().Set("WWW-Authenticate", `Bearer realm="https://accounts.google.com/", error="insufficient_scope"`)
		writeJSON(w, http.StatusForbidden, map[string]any{"error": map[string]any{"code": 403,
			"message": "Request had insufficient authentication scopes.", "status": "PERMISSION_DENIED"}})
	default:
		switch {
		case strings.HasPrefix(r.URL.Path, "/calendar/"):
			writeJSON(w, http.StatusOK, map[string]any{"kind": "calendar#calendarList", "items": []map[string]any{
				{"kind": "calendar#calendarListEntry", "id": u.Email, "summary": u.Email, "primary": true}}})
		case host == "people":
			writeJSON(w, http.StatusOK, map[string]any{"resourceName": "people/" + u.Subject, "names": []map[string]any{{"displayName": u.Name}}})
		case strings.HasPrefix(r.URL.Path, "/drive/"):
			writeJSON(w, http.StatusOK, map[string]any{"kind": "drive#fileList", "files": []map[string]any{
				{"kind": "drive#file", "id": "1a2b3c", "name": "Notes", "mimeType": "application/vnd.google-apps.document"}}})
		default:
			writeJSON(w, http.StatusOK, map[string]any{"emailAddress": u.Email, "messagesTotal": 42, "threadsTotal": 17, "historyId": "1234"})
		}
	}
}

// revoke ends the whole grant of the token's user, whichever token is
// given: 200 on success, 400 invalid_token for a token that is unknown,
// expired or revoked already. No client authentication is needed.
func (g *Google) revoke(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	_ = r.ParseForm()
	tok := r.Form.Get("token")
	ev := Event{Kind: "revoke", Token: tok, Method: r.Method, Path: r.URL.Path, UserAgent: r.UserAgent()}
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.lookupToken(tok)
	if !ok || !g.live(t) {
		ev.Status, ev.Error = http.StatusBadRequest, "invalid_token"
		g.record(ev)
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "invalid_token", "error_description": "Token expired or revoked"})
		return
	}
	g.revokeGrant(t.grantID)
	delete(g.grants, t.grantID)
	ev.Status = http.StatusOK
	g.record(ev)
	writeJSON(w, http.StatusOK, map[string]any{})
}
