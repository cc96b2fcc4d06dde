package fakeprovider

import (
	"crypto/subtle"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	maxBody              = 64 << 10
	githubRefreshTTL     = 15897600 * time.Second // what GitHub reports for refresh tokens
	githubDefaultAccess  = 8 * time.Hour
	githubIdleTTL        = 365 * 24 * time.Hour // OAuth tokens unused this long are revoked
	githubDocsURL        = "https://docs.github.com/rest"
	githubOAuthErrorsURL = "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors"
)

// githubImplied is GitHub's scope hierarchy ("Available scopes" in Scopes
// for OAuth apps): each scope and the scopes it includes. A token is saved
// with a normalised list, without the scopes another requested scope
// includes.
var githubImplied = map[string][]string{
	"repo":                  {"repo:status", "repo_deployment", "public_repo", "repo:invite", "security_events"},
	"admin:repo_hook":       {"write:repo_hook", "read:repo_hook"},
	"write:repo_hook":       {"read:repo_hook"},
	"admin:org":             {"write:org", "read:org", "manage_runners:org"},
	"write:org":             {"read:org"},
	"admin:public_key":      {"write:public_key", "read:public_key"},
	"write:public_key":      {"read:public_key"},
	"user":                  {"read:user", "user:email", "user:follow"},
	"project":               {"read:project"},
	"write:packages":        {"read:packages"},
	"admin:gpg_key":         {"write:gpg_key", "read:gpg_key"},
	"write:gpg_key":         {"read:gpg_key"},
	"admin:ssh_signing_key": {"write:ssh_signing_key", "read:ssh_signing_key"},
	"write:ssh_signing_key": {"read:ssh_signing_key"},
	"codespace":             {"codespace:secrets"},
	"admin:enterprise":      {"manage_runners:enterprise", "manage_billing:enterprise", "read:enterprise"},
}

// normalizeGitHubScopes drops every requested scope another requested
// scope includes, keeping the request's order, comma-separated.
func normalizeGitHubScopes(requested string) string {
	parts := strings.FieldsFunc(requested, func(r rune) bool { return r == ' ' || r == ',' })
	var out []string
	for _, s := range parts {
		implied := false
		for _, o := range parts {
			if o != s && slices.Contains(githubImplied[o], s) {
				implied = true
				break
			}
		}
		if !implied && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

// GitHub is a fake of GitHub's OAuth App endpoints and a slice of its REST API.
type GitHub struct {
	*core
	srv *httptest.Server
}

// NewGitHub starts a fake GitHub on 127.0.0.1 and closes it when tb ends.
//
// Routes:
//
//	GET  /login/oauth/authorize              consent page (or injected error / AutoApprove)
//	POST /login/oauth/authorize              the consent form's decision
//	POST /login/oauth/access_token           code and refresh_token grants (client credentials in the body)
//	GET  /user, GET /user/repos              API (Authorization: Bearer or token; User-Agent required)
//	DELETE /applications/{client_id}/grant   delete the user's grant: every token (basic auth as the app)
//	DELETE /applications/{client_id}/token   delete one token (basic auth as the app)
func NewGitHub(tb testing.TB, opts Options) *GitHub {
	tb.Helper()
	c := newCore(opts, 12345, "The Octocat")
	c.prefix, c.rprefix = "gho_", "ghr_"
	if opts.ExpiringTokens {
		c.prefix = "ghu_" // GitHub App user access tokens
	}
	if c.opts.AccessTTL == 0 {
		c.opts.AccessTTL = githubDefaultAccess
	}
	c.idleTTL = githubIdleTTL
	g := &GitHub{core: c}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login/oauth/authorize", g.authorize)
	mux.HandleFunc("POST /login/oauth/authorize", g.decide)
	mux.HandleFunc("POST /login/oauth/access_token", g.token)
	mux.HandleFunc("GET /user", g.api)
	mux.HandleFunc("GET /user/repos", g.api)
	mux.HandleFunc("DELETE /applications/{client_id}/grant", g.revoke)
	mux.HandleFunc("DELETE /applications/{client_id}/token", g.revoke)
	mux.HandleFunc("/", g.api) // anything else: 404 as the API does, recorded
	g.srv = httptest.NewServer(mux)
	c.server = g.srv.URL
	tb.Cleanup(g.srv.Close)
	return g
}

// AuthURL and TokenURL are the endpoints for an oauth2.Config.
func (g *GitHub) AuthURL() string  { return g.srv.URL + "/login/oauth/authorize" }
func (g *GitHub) TokenURL() string { return g.srv.URL + "/login/oauth/access_token" }

// Client returns an HTTP client for the server.
func (g *GitHub) Client() *http.Client { return g.srv.Client() }

func (g *GitHub) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	g.recordLocked(Event{Kind: "authorize", Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, Query: q})
	if subtleEq(q.Get("client_id"), g.opts.ClientID) != 1 {
		errorPage(w, http.StatusNotFound, "GitHub", "The client_id is not valid.")
		return
	}
	redirect := q.Get("redirect_uri")
	if redirect == "" && len(g.opts.RedirectURIs) > 0 {
		redirect = g.opts.RedirectURIs[0]
	}
	if !g.redirectOK(redirect) {
		errorPage(w, http.StatusBadRequest, "GitHub", "The redirect_uri is not associated with this application.")
		return
	}
	method := q.Get("code_challenge_method")
	if q.Get("code_challenge") != "" && method != "S256" {
		errorPage(w, http.StatusBadRequest, "GitHub", "code_challenge_method must be S256.")
		return
	}
	p := pendingAuth{redirectURI: redirect, scope: normalizeGitHubScopes(q.Get("scope")), state: q.Get("state"),
		challenge: q.Get("code_challenge"), method: method}
	g.mu.Lock()
	errCode, errDesc, login := g.authzErr, g.authzErrDesc, g.user.Login
	g.mu.Unlock()
	if errCode != "" {
		http.Redirect(w, r, authorizeRedirect(redirect, url.Values{
			"error": {errCode}, "error_description": {errDesc}, "error_uri": {githubOAuthErrorsURL}, "state": {p.state},
		}), http.StatusFound)
		return
	}
	if g.opts.AutoApprove {
		g.approve(w, r, p)
		return
	}
	id := g.newPending(p)
	render(w, http.StatusOK, "consent", consentData{
		Provider: "GitHub", Action: "/login/oauth/authorize", RequestID: id,
		ClientID: g.opts.ClientID, Scope: p.scope, Login: login,
	})
}

func (g *GitHub) decide(w http.ResponseWriter, r *http.Request) {
	p, ok := g.readApproval(w, r, "GitHub", "Choose Authorize or Cancel.", url.Values{
		"error_description": {"The user has denied your application access."},
		"error_uri":         {githubOAuthErrorsURL},
	})
	if ok {
		g.approve(w, r, p)
	}
}

func (g *GitHub) approve(w http.ResponseWriter, r *http.Request, p pendingAuth) {
	code := g.issueCode(p)
	g.recordLocked(Event{Kind: "approve", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound})
	http.Redirect(w, r, authorizeRedirect(p.redirectURI, url.Values{"code": {code}, "state": {p.state}}), http.StatusFound)
}

// token answers both grants. GitHub answers errors with HTTP 200. The
// client authenticates with client_id and client_secret in the body, as
// GitHub documents for both grants; HTTP basic is not read.
func (g *GitHub) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	f := r.PostForm
	grant := f.Get("grant_type")
	if grant == "" {
		grant = "authorization_code"
	}
	ev := Event{Kind: "token", GrantType: grant, Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, UserAgent: r.UserAgent()}
	id, secret := f.Get("client_id"), f.Get("client_secret")
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failTokens.Take() {
		ev.Status, ev.Error = http.StatusInternalServerError, "server_error"
		g.record(ev)
		http.Error(w, "Internal Server Error", http.StatusInternalServerError)
		return
	}
	fail := func(code, desc string) {
		ev.Error = code
		g.record(ev)
		g.reply(w, r, url.Values{"error": {code}, "error_description": {desc}, "error_uri": {githubOAuthErrorsURL}})
	}
	if !g.clientOK(id, secret) {
		fail("incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect.")
		return
	}
	var (
		grantID, scope string
		user           User
	)
	switch grant {
	case "authorization_code":
		cg, ok := g.codes[key(f.Get("code"))]
		if !ok || cg.used || !g.opts.Now().Before(cg.expiry) {
			fail("bad_verification_code", "The code passed is incorrect or expired.")
			return
		}
		cg.used = true
		if ru := f.Get("redirect_uri"); ru != "" && ru != cg.req.redirectURI {
			fail("redirect_uri_mismatch", "The redirect_uri MUST match the registered callback URL for this application.")
			return
		}
		if !pkceOK(cg.req.challenge, cg.req.method, f.Get("code_verifier")) {
			fail("bad_verification_code", "The code_verifier does not match the code_challenge.")
			return
		}
		grantID, scope, user = cg.grantID, cg.req.scope, cg.user
	case "refresh_token":
		t, ok := g.lookupToken(f.Get("refresh_token"))
		if !g.opts.ExpiringTokens || !ok || !t.refresh || !g.live(t) {
			fail("bad_refresh_token", "The refresh token passed is incorrect or expired.")
			return
		}
		// Once a refresh token is used, it and the old access token no
		// longer work.
		g.revokePair(t.pair)
		grantID, scope, user = t.grantID, t.scope, t.user
	default:
		fail("unsupported_grant_type", "The grant type is not supported.")
		return
	}
	var ttl time.Duration
	if g.opts.ExpiringTokens {
		// GitHub App user tokens carry the app's permissions, no scopes:
		// the answer's scope is "".
		ttl, scope = g.opts.AccessTTL, ""
	}
	access, refresh, _ := g.issueTokens(grantID, scope, "", user, ttl, g.opts.ExpiringTokens, githubRefreshTTL)
	ev.Token, ev.Scope = access, scope
	g.record(ev)
	out := url.Values{"access_token": {access}, "scope": {scope}, "token_type": {"bearer"}}
	if refresh != "" {
		out.Set("expires_in", strconv.Itoa(int(ttl/time.Second)))
		out.Set("refresh_token", refresh)
		out.Set("refresh_token_expires_in", strconv.Itoa(int(githubRefreshTTL/time.Second)))
	}
	g.reply(w, r, out)
}

// reply writes form-encoded unless the client's Accept asks for JSON.
func (g *GitHub) reply(w http.ResponseWriter, r *http.Request, v url.Values) {
	w.Header().Set("Cache-Control", "no-store")
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		m := map[string]any{}
		for k := range v {
			if n, err := strconv.Atoi(v.Get(k)); err == nil && strings.HasSuffix(k, "expires_in") {
				m[k] = n
			} else {
				m[k] = v.Get(k)
			}
		}
		writeJSON(w, http.StatusOK, m)
		return
	}
	w.Header().Set("Content-Type", "application/x-www-form-urlencoded; charset=utf-8")
	_, _ = io.WriteString(w, v.Encode())
}

func (g *GitHub) api(w http.ResponseWriter, r *http.Request) {
	tok := bearer(r, true)
	ev := Event{Kind: "api", Token: tok, Method: r.Method, Path: r.URL.Path, UserAgent: r.UserAgent()}
	if r.UserAgent() == "" {
		// "Requests with no User-Agent header will be rejected."
		ev.Status, ev.Error = http.StatusForbidden, "no_user_agent"
		g.recordLocked(ev)
		writeJSON(w, http.StatusForbidden, map[string]any{"message": "Request forbidden by administrative rules. Please make sure your request has a User-Agent header.",
			"documentation_url": githubDocsURL, "status": "403"})
		return
	}
	g.mu.Lock()
	t, ok := g.lookupToken(tok)
	valid := ok && !t.refresh && g.live(t) && !g.failAPI.Take()
	if !valid {
		ev.Status, ev.Error = http.StatusUnauthorized, "bad_credentials"
		g.record(ev)
		g.mu.Unlock()
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Bad credentials", "documentation_url": githubDocsURL, "status": "401"})
		return
	}
	t.lastUsed = g.opts.Now()
	u, scope := t.user, t.scope
	var body any
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/user":
		ev.Status = http.StatusOK
		body = map[string]any{
			"login": u.Login, "id": u.ID, "node_id": "MDQ6VXNlcj" + strconv.FormatInt(u.ID, 10),
			"type": "User", "name": u.Name, "email": u.Email,
			"html_url": "https://github.com/" + u.Login, "site_admin": false,
		}
	case r.Method == http.MethodGet && r.URL.Path == "/user/repos":
		ev.Status = http.StatusOK
		body = []map[string]any{
			{"id": 1296269, "name": "hello-world", "full_name": u.Login + "/hello-world", "private": false},
			{"id": 1296270, "name": "spoon-knife", "full_name": u.Login + "/spoon-knife", "private": true},
		}
	default:
		ev.Status, ev.Error = http.StatusNotFound, "not_found"
		body = map[string]any{"message": "Not Found", "documentation_url": githubDocsURL, "status": "404"}
	}
	g.record(ev)
	g.mu.Unlock()
	w.Header().Set("X-OAuth-Scopes", strings.ReplaceAll(scope, ",", ", "))
	writeJSON(w, ev.Status, body)
}

// revoke deletes the user's grant (…/grant: every token of the app for the
// user) or one token (…/token). GitHub requires basic authentication as
// the app and a valid access token; it documents 204 and 422.
func (g *GitHub) revoke(w http.ResponseWriter, r *http.Request) {
	ev := Event{Kind: "revoke", Method: r.Method, Path: r.URL.Path, UserAgent: r.UserAgent()}
	id, secret, ok := r.BasicAuth()
	var req struct {
		AccessToken string `json:"access_token"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	decErr := dec.Decode(&req)
	ev.Token = req.AccessToken
	g.mu.Lock()
	defer g.mu.Unlock()
	if !ok || subtleEq(r.PathValue("client_id"), id) != 1 || !g.clientOK(id, secret) {
		ev.Status, ev.Error = http.StatusUnauthorized, "bad_credentials"
		g.record(ev)
		writeJSON(w, http.StatusUnauthorized, map[string]any{"message": "Bad credentials", "documentation_url": githubDocsURL, "status": "401"})
		return
	}
	t, found := g.lookupToken(req.AccessToken)
	if decErr != nil || !found || t.refresh || !g.live(t) {
		// An unknown, revoked or expired token.
		ev.Status, ev.Error = http.StatusUnprocessableEntity, "validation_failed"
		g.record(ev)
		writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"message": "Validation Failed", "documentation_url": githubDocsURL, "status": "422"})
		return
	}
	if strings.HasSuffix(r.URL.Path, "/token") {
		t.revoked = true
	} else {
		g.revokeGrant(t.grantID)
	}
	ev.Status = http.StatusNoContent
	g.record(ev)
	w.WriteHeader(http.StatusNoContent)
}

// normalizeScope splits a scope list on spaces and commas and joins it with sep.
func normalizeScope(s, sep string) string {
	parts := strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
	return strings.Join(parts, sep)
}

func subtleEq(a, b string) int {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
