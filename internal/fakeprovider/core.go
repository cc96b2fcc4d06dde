// Package fakeprovider runs httptest servers on 127.0.0.1 that behave like
// GitHub's and Google's OAuth endpoints and APIs, for credbroker's tests. It
// is test-support code: it imports "testing" (servers are started with a
// testing.TB and closed by its Cleanup) and must not be linked into the
// broker itself.
//
// The fakes imitate GitHub's and Google's documentation, not credbroker's
// code: every quirk they reproduce is listed, with the page it comes from,
// in docs/TESTING.md ("Provider quirks the fakes reproduce"). When the
// broker and the documentation disagree, the fake follows the
// documentation and a test fails.
//
// GitHub (NewGitHub): consent at GET /login/oauth/authorize; tokens at POST
// /login/oauth/access_token with the client's credentials in the body only,
// form-encoded unless Accept asks for JSON, errors as HTTP 200 with an error
// field (bad_verification_code, incorrect_client_credentials,
// redirect_uri_mismatch); PKCE S256 checked; scopes normalised (a scope
// implied by another requested one is dropped) and answered comma-separated;
// one grant per user and app; optional expiring tokens with rotating refresh
// tokens (GitHub Apps: no scopes, the old access token dies with its refresh
// token); tokens unused for a year stop working; API GET /user, GET
// /user/repos (User-Agent required); grant and token deletion at DELETE
// /applications/{client_id}/grant and …/token (basic auth as the app, a
// valid access token, 422 otherwise). No OIDC.
//
// Google (NewGoogle): OIDC discovery, JWKS, consent at /o/oauth2/v2/auth
// (granular consent: each non-sign-in scope is a checkbox, unchecked), POST
// /token (authorization_code with PKCE, refresh_token; a refresh token the
// first time an offline grant is made, or again with prompt=consent), the
// scope answered under Google's long names (email →
// https://www.googleapis.com/auth/userinfo.email, openid added), one grant
// per user and client that include_granted_scopes=true extends, RS256 ID
// tokens with the hd claim for Workspace accounts, GET /v1/userinfo, POST
// /revoke (ends the whole grant; 400 invalid_token for a dead token), per-API
// hosts (APIURL), and the 7-day refresh token of an app in Testing status.
//
// Consent pages follow the broker's stable UI contract: a form with
// <button type="submit" name="decision" value="approve"> and value="deny".
//
// Both record an ordered event log (Events) and counters (Counts) so tests
// can assert what happened and in which order, accept injected failures
// (FailNextTokens, SetAuthorizeError), issue unique random tokens and compare
// every secret in constant time.
package fakeprovider

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"credbroker/internal/countdown"
	"credbroker/internal/fakepages"
)

// Options configure a fake provider. Zero values get defaults.
type Options struct {
	ClientID     string // default "fake-client-id"
	ClientSecret string // default "fake-client-secret"
	// RedirectURIs registered for the client. Empty: any http://127.0.0.1
	// or http://localhost redirect URI is accepted (known only later).
	RedirectURIs []string

	// The account that signs in (changeable with SetUser).
	Login   string // GitHub login; default "octocat"
	ID      int64  // default 12345 (GitHub) / 1234567890 (Google)
	Email   string // default "<login>@example.test"
	Name    string // default "The Octocat" / "Test User"
	Subject string // Google "sub"; default the decimal ID
	// HostedDomain is the Google Workspace domain of the account (the ID
	// token's hd claim); empty for a consumer account.
	HostedDomain string

	// AccessTTL is the access token lifetime: Google default 1h; GitHub
	// default 8h, used only with ExpiringTokens.
	AccessTTL time.Duration
	// ExpiringTokens (GitHub only) makes access tokens expire and issues
	// rotating refresh tokens, as GitHub Apps do.
	ExpiringTokens bool
	// AutoApprove skips the consent page: /authorize redirects at once as if
	// the user had approved (every requested scope).
	AutoApprove bool
	// Testing (Google only): the app's OAuth consent screen is in
	// "Testing" publishing status, so refresh tokens for more than the
	// sign-in scopes expire after 7 days.
	Testing bool
	// IssParameter (Google only) is RFC 9207 in the authorization
	// response: "" sends none and advertises none (Google's documented
	// behaviour); "send" advertises authorization_response_iss_parameter_
	// supported and sends the issuer; "omit" advertises it but sends none;
	// "wrong" advertises it and sends another issuer (a mix-up attack);
	// "wrong-unadvertised" advertises nothing, as Google does, and sends
	// another issuer (the same attack on a client that checks iss only
	// where it was promised).
	IssParameter string

	Now    func() time.Time // default time.Now
	Logger *slog.Logger     // nil: discard
}

// User is the provider account that signs in.
type User struct {
	Login   string
	ID      int64
	Email   string
	Name    string
	Subject string
	// HostedDomain: the Google Workspace domain (hd claim), if any.
	HostedDomain string
}

// Event is one recorded interaction, in order.
type Event struct {
	Seq       int
	Time      time.Time
	Kind      string // "authorize", "approve", "deny", "token", "api", "userinfo", "revoke"
	GrantType string // token events: "authorization_code" or "refresh_token"
	Token     string // api/userinfo/revoke: the token presented; token: the access token issued
	Method    string
	Path      string
	Status    int
	Error     string // the OAuth/API error answered, if any
	// Scope is what a token answer said was granted; Host the server
	// that answered (Google's API hosts); UserAgent the client's.
	Scope     string
	Host      string
	UserAgent string
	// Query is an authorization request's parameters.
	Query url.Values
}

// Counts are totals per kind of event.
type Counts struct {
	Authorize, Approve, Deny int
	Token, TokenErrors       int // all token requests; those answered with an error
	Refresh                  int // successful refresh_token grants
	API, APIErrors           int // API and userinfo calls; those refused
	Revoke                   int // grant and token deletions, revocations
}

// pendingAuth is an authorization request waiting for the user's decision.
type pendingAuth struct {
	id          string
	redirectURI string
	scope       string
	state       string
	nonce       string
	challenge   string
	method      string
	offline     bool // Google: access_type=offline
	consent     bool // Google: prompt=consent
	incremental bool // Google: include_granted_scopes=true
	hd          string
	created     time.Time
}

// codeGrant is an issued authorization code.
type codeGrant struct {
	req     pendingAuth
	user    User
	expiry  time.Time
	used    bool
	grantID string
}

// token is an issued access or refresh token.
type token struct {
	refresh bool
	grantID string
	// pair links an access token to the refresh token issued with it.
	pair     string
	scope    string
	nonce    string
	user     User
	expiry   time.Time // zero: never
	lastUsed time.Time
	revoked  bool
}

// core is the state and behaviour both fakes share.
type core struct {
	opts    Options
	log     *slog.Logger
	server  string // base URL, set after start
	prefix  string // token prefix
	rprefix string // refresh token prefix

	// idleTTL: a non-expiring token unused this long stops working
	// (GitHub: one year); zero: never.
	idleTTL time.Duration

	// failTokens and failAPI are the injected failures of the token
	// endpoint and of API calls still to come.
	failTokens, failAPI countdown.Countdown

	mu           sync.Mutex // guards the fields below
	user         User
	pending      map[string]*pendingAuth
	codes        map[string]*codeGrant
	tokens       map[string]*token
	events       []Event
	authzErr     string
	authzErrDesc string
}

func newCore(opts Options, defID int64, defName string) *core {
	if opts.ClientID == "" {
		opts.ClientID = "fake-client-id"
	}
	if opts.ClientSecret == "" {
		opts.ClientSecret = "fake-client-secret"
	}
	if opts.Login == "" {
		opts.Login = "octocat"
	}
	if opts.ID == 0 {
		opts.ID = defID
	}
	if opts.Email == "" {
		opts.Email = opts.Login + "@example.test"
	}
	if opts.Name == "" {
		opts.Name = defName
	}
	if opts.Subject == "" {
		opts.Subject = fmt.Sprint(opts.ID)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &core{
		opts: opts,
		log:  log,
		user: User{Login: opts.Login, ID: opts.ID, Email: opts.Email, Name: opts.Name, Subject: opts.Subject,
			HostedDomain: opts.HostedDomain},
		pending: map[string]*pendingAuth{},
		codes:   map[string]*codeGrant{},
		tokens:  map[string]*token{},
	}
}

// SetUser changes the account that signs in on later approvals.
func (c *core) SetUser(u User) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u.Subject == "" {
		u.Subject = fmt.Sprint(u.ID)
	}
	c.user = u
}

// FailNextAPI makes the next n API calls answer 401 as to a token the
// provider no longer accepts.
func (c *core) FailNextAPI(n int) {
	c.failAPI.Set(n)
}

// UserRevokesAccess is the person removing the app in their account
// settings: every token the app holds for user (by ID) stops working.
func (c *core) UserRevokesAccess(u User) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.tokens {
		if t.user.ID == u.ID {
			t.revoked = true
		}
	}
}

// User returns the account that signs in.
func (c *core) User() User {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.user
}

// FailNextTokens makes the next n token requests answer HTTP 500.
func (c *core) FailNextTokens(n int) {
	c.failTokens.Set(n)
}

// SetAuthorizeError makes every authorization request redirect back at once
// with error=code and error_description=description (e.g. "access_denied").
// An empty code restores normal behaviour.
func (c *core) SetAuthorizeError(code, description string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.authzErr, c.authzErrDesc = code, description
}

// Events returns a copy of the event log, oldest first.
func (c *core) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Counts totals the event log.
func (c *core) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n Counts
	for _, e := range c.events {
		switch e.Kind {
		case "authorize":
			n.Authorize++
		case "approve":
			n.Approve++
		case "deny":
			n.Deny++
		case "token":
			n.Token++
			if e.Error != "" {
				n.TokenErrors++
			} else if e.GrantType == "refresh_token" {
				n.Refresh++
			}
		case "api", "userinfo":
			n.API++
			if e.Error != "" {
				n.APIErrors++
			}
		case "revoke":
			n.Revoke++
		}
	}
	return n
}

// ClientID returns the registered client id.
func (c *core) ClientID() string { return c.opts.ClientID }

// ClientSecret returns the registered client secret.
func (c *core) ClientSecret() string { return c.opts.ClientSecret }

// URL returns the server's base URL.
func (c *core) URL() string { return c.server }

// TokenValid reports whether tok is a live (unexpired, unrevoked) access token.
func (c *core) TokenValid(tok string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.lookupToken(tok)
	return ok && !t.refresh && c.live(t)
}

// record appends an event; callers hold c.mu.
func (c *core) record(e Event) {
	e.Seq = len(c.events) + 1
	e.Time = c.opts.Now()
	c.events = append(c.events, e)
}

func (c *core) recordLocked(e Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.record(e)
}

func (c *core) live(t *token) bool {
	now := c.opts.Now()
	if t.expiry.IsZero() && c.idleTTL > 0 && now.Sub(t.lastUsed) > c.idleTTL {
		t.revoked = true
	}
	return !t.revoked && (t.expiry.IsZero() || now.Before(t.expiry))
}

// clientCreds takes the client's credentials from HTTP Basic (whose parts
// RFC 6749 2.3.1 form-encodes, as x/oauth2 does) or from the form.
func clientCreds(r *http.Request) (id, secret string) {
	if id, secret, ok := r.BasicAuth(); ok {
		uid, err1 := url.QueryUnescape(id)
		usec, err2 := url.QueryUnescape(secret)
		if err1 != nil || err2 != nil {
			return "", ""
		}
		return uid, usec
	}
	return r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
}

// clientOK compares client credentials in constant time.
func (c *core) clientOK(id, secret string) bool {
	a := subtle.ConstantTimeCompare([]byte(id), []byte(c.opts.ClientID))
	b := subtle.ConstantTimeCompare([]byte(secret), []byte(c.opts.ClientSecret))
	return a&b == 1
}

// redirectOK reports whether uri may receive codes for the client.
func (c *core) redirectOK(uri string) bool {
	if len(c.opts.RedirectURIs) > 0 {
		return slices.Contains(c.opts.RedirectURIs, uri)
	}
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "http" || u.Fragment != "" {
		return false
	}
	h := u.Hostname()
	return h == "127.0.0.1" || h == "localhost" || h == "::1"
}

// pkceOK checks an S256 (or plain, when the request used it) verifier.
func pkceOK(challenge, method, verifier string) bool {
	if challenge == "" {
		return verifier == ""
	}
	if verifier == "" {
		return false
	}
	got := verifier
	if method == "" || method == "S256" {
		sum := sha256.Sum256([]byte(verifier))
		got = base64.RawURLEncoding.EncodeToString(sum[:])
	}
	return subtle.ConstantTimeCompare([]byte(got), []byte(challenge)) == 1
}

// key is the map key of a secret (token or code): maps are indexed by its
// SHA-256, so a lookup never compares secret bytes directly.
func key(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return string(sum[:])
}

// lookupToken finds tok; callers hold c.mu.
func (c *core) lookupToken(tok string) (*token, bool) {
	if tok == "" {
		return nil, false
	}
	t, ok := c.tokens[key(tok)]
	return t, ok
}

// newPending stores an authorization request and returns its id.
func (c *core) newPending(p pendingAuth) string {
	p.id = randomToken("", 16)
	p.created = c.opts.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, old := range c.pending {
		if c.opts.Now().Sub(old.created) > 10*time.Minute {
			delete(c.pending, id)
		}
	}
	c.pending[p.id] = &p
	return p.id
}

// takePending removes and returns a pending request.
func (c *core) takePending(id string) (pendingAuth, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.pending[id]
	if !ok {
		return pendingAuth{}, false
	}
	delete(c.pending, id)
	return *p, true
}

// readApproval reads a consent form's POST and returns the pending
// request the person approved. Otherwise it writes the answer and reports
// false: a refusal is recorded and redirected back with access_denied, the
// state and the provider's own denied parameters; an unreadable form, an
// unknown request or no decision (choose: the words for it) gets the
// provider's error page.
func (c *core) readApproval(w http.ResponseWriter, r *http.Request, provider, choose string, denied url.Values) (pendingAuth, bool) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		errorPage(w, http.StatusBadRequest, provider, "The form could not be read.")
		return pendingAuth{}, false
	}
	p, ok := c.takePending(r.PostForm.Get("request"))
	if !ok {
		errorPage(w, http.StatusBadRequest, provider, "This authorization request is unknown or was already answered.")
		return pendingAuth{}, false
	}
	switch r.PostForm.Get("decision") {
	case "approve":
		return p, true
	case "deny":
		c.recordLocked(Event{Kind: "deny", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound, Error: "access_denied"})
		params := url.Values{"error": {"access_denied"}, "state": {p.state}}
		for k, v := range denied {
			params[k] = v
		}
		http.Redirect(w, r, authorizeRedirect(p.redirectURI, params), http.StatusFound)
	default:
		errorPage(w, http.StatusBadRequest, provider, choose)
	}
	return pendingAuth{}, false
}

// issueCode creates a single-use code for an approved request. Both
// providers keep one grant per user and app, so the grant is the user's.
func (c *core) issueCode(p pendingAuth) string {
	code := randomToken("", 20)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.codes[key(code)] = &codeGrant{req: p, user: c.user, expiry: c.opts.Now().Add(10 * time.Minute), grantID: fmt.Sprint(c.user.ID)}
	return code
}

// issueTokens stores a new access token (and refresh token when wanted) for
// a grant; callers hold c.mu.
func (c *core) issueTokens(grantID, scope, nonce string, user User, ttl time.Duration, withRefresh bool, refreshTTL time.Duration) (access, refresh string, expiry time.Time) {
	now := c.opts.Now()
	access = randomToken(c.prefix, 30)
	if ttl > 0 {
		expiry = now.Add(ttl)
	}
	pair := randomToken("", 8)
	c.tokens[key(access)] = &token{grantID: grantID, pair: pair, scope: scope, nonce: nonce, user: user, expiry: expiry, lastUsed: now}
	if withRefresh {
		refresh = randomToken(c.rprefix, 40)
		var rexp time.Time
		if refreshTTL > 0 {
			rexp = now.Add(refreshTTL)
		}
		c.tokens[key(refresh)] = &token{refresh: true, grantID: grantID, pair: pair, scope: scope, nonce: nonce, user: user, expiry: rexp, lastUsed: now}
	}
	return access, refresh, expiry
}

// revokePair revokes a refresh token and the access token issued with it;
// callers hold c.mu.
func (c *core) revokePair(pair string) {
	for _, t := range c.tokens {
		if t.pair == pair {
			t.revoked = true
		}
	}
}

// revokeGrant revokes every token of a grant; callers hold c.mu.
func (c *core) revokeGrant(grantID string) {
	for _, t := range c.tokens {
		if t.grantID == grantID {
			t.revoked = true
		}
	}
}

// authorizeRedirect builds the redirect back to the client.
func authorizeRedirect(redirectURI string, params url.Values) string {
	u, _ := url.Parse(redirectURI) // validated before
	q := u.Query()
	for k, vs := range params {
		for _, v := range vs {
			if v != "" {
				q.Set(k, v)
			}
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// bearer extracts the token from "Authorization: Bearer x" or "token x".
func bearer(r *http.Request, allowTokenScheme bool) string {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok {
		return ""
	}
	if strings.EqualFold(scheme, "bearer") || (allowTokenScheme && strings.EqualFold(scheme, "token")) {
		return strings.TrimSpace(tok)
	}
	return ""
}

func randomToken(prefix string, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("fakeprovider: crypto/rand: " + err.Error())
	}
	if prefix == "" {
		return hex.EncodeToString(b)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// consentData is what the consent page shows.
type consentData struct {
	Provider  string
	Action    string
	RequestID string
	ClientID  string
	Scope     string
	Login     string
	Message   string
	// Choices are scopes the user may grant one by one (Google's granular
	// consent): unchecked checkboxes named "scope".
	Choices []string
}

var pages = fakepages.Parse("default-src 'none'; base-uri 'none'; frame-ancestors 'none'", `
{{define "consent"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorize · {{.Provider}} (fake)</title></head>
<body><main>
<h1>Authorize application</h1>
<p>{{.Provider}} (test double): <code>{{.ClientID}}</code> wants access to the account <strong>{{.Login}}</strong>.</p>
<p>Scopes: <code>{{.Scope}}</code></p>
<form method="post" action="{{.Action}}">
<input type="hidden" name="request" value="{{.RequestID}}">
{{range .Choices}}<label><input type="checkbox" name="scope" value="{{.}}"> {{.}}</label>
{{end}}
<button type="submit" name="decision" value="approve">Authorize</button>
<button type="submit" name="decision" value="deny">Cancel</button>
</form>
</main></body></html>{{end}}
{{define "error"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Error · {{.Provider}} (fake)</title></head>
<body><main><h1>Error</h1><p>{{.Message}}</p></main></body></html>{{end}}
`)

func render(w http.ResponseWriter, status int, name string, d consentData) {
	pages.Render(w, nil, status, name, d)
}

func errorPage(w http.ResponseWriter, status int, provider, msg string) {
	render(w, status, "error", consentData{Provider: provider, Message: msg})
}
