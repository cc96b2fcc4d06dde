// Package demoprovider is the `demo` third-party provider of `broker dev`: a
// small in-memory OAuth 2.0 authorization server with an API, mountable under
// a path (e.g. http://127.0.0.1:8080/dev/provider), so a newcomer can connect
// an account without any real provider. It is also the authorization server
// of the demo MCP server (internal/demomcp), as hosted MCP servers' are:
// RFC 8414 metadata, dynamic client registration, PKCE, resource indicators.
//
// Routes, relative to BaseURL's path:
//
//	GET  /authorize   consent page: <select name="account"> of the demo accounts
//	                  (alice-demo 1001, bob-demo 1002; the first selected) and
//	                  <button type="submit" name="decision" value="approve"> / value="deny"
//	POST /authorize   the consent form's decision; redirects with code (or
//	                  error=access_denied), state and iss (RFC 9207)
//	POST /token       JSON; authorization_code (PKCE S256 required) and refresh_token
//	POST /register    RFC 7591 dynamic client registration (JSON): public
//	                  (token_endpoint_auth_method none) and confidential clients
//	                  (client_secret_basic, the default, or client_secret_post)
//	POST /revoke      RFC 7009 (client authentication, form token=…)
//	GET  /api/user    {"id":1001,"login":"alice-demo"} for the token's account
//	GET  /api/repos   a small list of demo repositories
//	GET  /style.css   the pages' stylesheet
//
// and, outside it, the RFC 8414 metadata at the issuer's path-inserted
// well-known URL (BaseURL is the issuer):
//
//	GET  /.well-known/oauth-authorization-server<BaseURL's path>
//
// so mount both (Mount does): mux.Handle("/dev/provider/", p.Handler()) and
// mux.Handle("GET /.well-known/oauth-authorization-server/dev/provider", p.Handler()).
//
// Clients: the static client of Options (public when ClientSecret is
// empty; it may authenticate with basic or the form, and always gets
// refresh tokens) and the registered ones, which authenticate exactly as
// they registered, get refresh tokens only when they registered the
// refresh_token grant, and whose redirect URIs (https, or http on a
// loopback host) are matched exactly at /authorize. A code or refresh
// token is redeemed only by the client it was issued to.
//
// Resource indicators (RFC 8707): /authorize takes at most one resource,
// which must be one of Options.Resources (else error=invalid_target); the
// grant, and every token issued from it, is bound to it. A token request
// (code or refresh) may repeat it; any other value is refused with
// invalid_target (a refused refresh spends nothing), and without one the
// grant's resource applies. Tokens bound to a resource are for that
// resource only: the demo API refuses them, and Introspect names the
// resource for the resource server to check (internal/demomcp).
//
// The same provider runs an API-key service, demo-keys, for services that
// have no OAuth (the broker's type: api_key):
//
//	GET  /keys          a page showing each demo account's key (<code class="key"
//	                    data-login="alice-demo">), with a "Make a new key" button per account
//	POST /keys          account=<id>: replace that account's key (the old one stops working)
//	GET  /keys-api/me   with X-Api-Key: a current key → {"id":1001,"login":"alice-demo"};
//	                    anything else → 401 {"error":"invalid_key"}
//
// Keys are "demo_" plus 43 base64url characters, made afresh when the
// provider starts.
//
// Tokens: access tokens live AccessTTL (default 5 minutes), refresh tokens
// RefreshIdleTTL (default 30 days; shorter models a provider's idle
// expiry). Refresh tokens rotate: each refresh_token grant returns a new refresh token and spends the
// old one. Presenting a spent refresh token answers invalid_grant and, as the
// OAuth 2.0 Security BCP recommends for reuse detection, revokes every token
// of that grant. Revoking either token of a grant at /revoke ends the whole
// grant. API calls with a missing, unknown, revoked or expired token get 401
// with a Bearer WWW-Authenticate challenge.
//
// Every interaction is appended to an ordered event log (Events), so tests
// can assert the order of token requests and API calls, and the resource
// each authorization and token request named. State lives in memory.
package demoprovider

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"credbroker/internal/countdown"
	"credbroker/internal/fakepages"
)

const (
	defaultAccessTTL = 5 * time.Minute
	refreshTTL       = 30 * 24 * time.Hour
	codeTTL          = 5 * time.Minute
	pendingTTL       = 10 * time.Minute
	maxBody          = 64 << 10
	cspHeader        = "default-src 'none'; style-src 'self'; base-uri 'none'; frame-ancestors 'none'"
)

// Options configure the demo provider.
type Options struct {
	// BaseURL is the absolute URL the provider is served at, e.g.
	// "http://127.0.0.1:8080/dev/provider" (no trailing slash).
	BaseURL      string
	ClientID     string
	ClientSecret string // empty: a public client (PKCE only)
	RedirectURIs []string
	AccessTTL    time.Duration // default 5 minutes
	// RefreshIdleTTL, when set, expires a refresh token that was not used
	// within it (idle expiry, as some providers do): refresh tokens rotate,
	// so each one lives RefreshIdleTTL from its issue. Default: 30 days.
	RefreshIdleTTL time.Duration
	Now            func() time.Time // default time.Now
	Logger         *slog.Logger     // nil: discard
	// Resources are the resource indicators (RFC 8707) the provider
	// issues tokens for, as absolute URIs compared exactly (an MCP
	// server's URL, e.g. "http://127.0.0.1:8080/dev/mcp-upstream").
	// None: every resource parameter is refused with invalid_target.
	Resources []string
}

// Account is a demo account that can be connected.
type Account struct {
	ID    int64  `json:"id"`
	Login string `json:"login"`
}

// Accounts are the demo accounts offered on the consent page, first selected.
var accounts = []Account{{ID: 1001, Login: "alice-demo"}, {ID: 1002, Login: "bob-demo"}}

// Accounts returns the demo accounts offered on the consent page.
func Accounts() []Account { return slices.Clone(accounts) }

// Event is one recorded interaction, in order.
type Event struct {
	Seq       int
	Time      time.Time
	Kind      string // "authorize", "approve", "deny", "token", "api", "revoke", "register"
	GrantType string // token events
	Account   string // the account concerned, when known
	Client    string // the client concerned, when known
	// Resource is the resource parameter the request carried (authorize
	// and token events; "" when none), so tests can see that a client
	// named it on every leg.
	Resource string
	// Token is the Fingerprint of the token concerned: presented (api,
	// revoke, refused refresh) or issued (successful token requests).
	Token  string
	Method string
	Path   string
	Status int
	Error  string // the OAuth error code answered, if any ("invalid_grant", …)
}

// Provider is the running demo provider. Its methods are safe for concurrent use.
type Provider struct {
	opts      Options
	path      string
	wellKnown string // the RFC 8414 metadata's path
	log       *slog.Logger
	handler   http.Handler

	// loseAnswers makes the next refreshes do their work (spend the old
	// refresh token, issue new ones) and then answer 502, as a gateway
	// whose upstream finished the request would.
	loseAnswers countdown.Countdown
	// failRevocations makes the next revocation requests answer 503
	// without revoking anything.
	failRevocations countdown.Countdown

	mu      sync.Mutex         // guards the fields below
	clients map[string]*client // by client_id: the static one and the registered ones
	pending map[string]*pendingAuth
	codes   map[string]*codeGrant // by key(code)
	tokens  map[string]*token     // by key(token)
	events  []Event
	seq     int
	// apiKeys are the demo-keys service's current keys, by account login.
	apiKeys map[string]string
}

// FailRevocations makes the next n revocation requests answer 503
// Service Unavailable, revoking nothing.
func (p *Provider) FailRevocations(n int) {
	p.failRevocations.Set(n)
}

// LoseRefreshAnswers makes the next n refreshes rotate the tokens and then
// answer 502 Bad Gateway instead of the new tokens: the provider consumed
// the refresh token, but the client never learns the new one.
func (p *Provider) LoseRefreshAnswers(n int) {
	p.loseAnswers.Set(n)
}

type pendingAuth struct {
	client                                         *client
	redirectURI, scope, state, challenge, resource string
	created                                        time.Time
}

type codeGrant struct {
	req     pendingAuth
	account Account
	expiry  time.Time
	used    bool
}

type token struct {
	refresh  bool
	grantID  string
	clientID string
	scope    string
	resource string // the RFC 8707 resource the grant is bound to ("" none)
	account  Account
	expiry   time.Time
	spent    bool // refresh token already exchanged
	revoked  bool
}

// New validates opts and builds the provider.
func New(opts Options) (*Provider, error) {
	var problems []error
	u, err := url.Parse(opts.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(u.Path, "/") {
		problems = append(problems, fmt.Errorf("BaseURL %q must be an absolute http(s) URL without query or trailing slash", opts.BaseURL))
	}
	if opts.ClientID == "" {
		problems = append(problems, errors.New("ClientID is required"))
	}
	if len(opts.RedirectURIs) == 0 {
		problems = append(problems, errors.New("at least one redirect URI is required"))
	}
	for _, r := range opts.RedirectURIs {
		if ru, err := url.Parse(r); err != nil || !ru.IsAbs() || ru.Fragment != "" {
			problems = append(problems, fmt.Errorf("bad redirect URI %q", r))
		}
	}
	if opts.AccessTTL < 0 || opts.RefreshIdleTTL < 0 {
		problems = append(problems, errors.New("AccessTTL and RefreshIdleTTL must not be negative"))
	}
	for _, r := range opts.Resources {
		if err := checkResource(r); err != nil {
			problems = append(problems, fmt.Errorf("resource: %w", err))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("demoprovider: %w", errors.Join(problems...))
	}
	if opts.AccessTTL == 0 {
		opts.AccessTTL = defaultAccessTTL
	}
	if opts.RefreshIdleTTL == 0 || opts.RefreshIdleTTL > refreshTTL {
		opts.RefreshIdleTTL = refreshTTL
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opts.RedirectURIs = slices.Clone(opts.RedirectURIs)
	opts.Resources = slices.Clone(opts.Resources)
	p := &Provider{
		opts:      opts,
		path:      u.Path,
		wellKnown: "/.well-known/oauth-authorization-server" + u.Path,
		log:       opts.Logger,
		clients: map[string]*client{opts.ClientID: {
			id: opts.ClientID, redirectURIs: opts.RedirectURIs, refresh: true,
		}},
		pending: map[string]*pendingAuth{},
		codes:   map[string]*codeGrant{},
		tokens:  map[string]*token{},
		apiKeys: map[string]string{},
	}
	for _, a := range accounts {
		p.apiKeys[a.Login] = newAPIKey()
	}
	if opts.ClientSecret != "" {
		p.clients[opts.ClientID].secretKey = key(opts.ClientSecret)
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+p.wellKnown, p.metadata)
	mux.HandleFunc("POST "+p.path+"/register", p.register)
	mux.HandleFunc("GET "+p.path+"/authorize", p.authorize)
	mux.HandleFunc("POST "+p.path+"/authorize", p.decide)
	mux.HandleFunc("POST "+p.path+"/token", p.token)
	mux.HandleFunc("POST "+p.path+"/revoke", p.revoke)
	mux.HandleFunc("GET "+p.path+"/api/user", p.api)
	mux.HandleFunc("GET "+p.path+"/api/repos", p.api)
	mux.HandleFunc("GET "+p.path+"/style.css", fakepages.Stylesheet(css))
	mux.HandleFunc("GET "+p.path+"/keys", p.keysPage)
	mux.HandleFunc("POST "+p.path+"/keys", p.rotateKeyForm)
	mux.HandleFunc("GET "+p.path+"/keys-api/me", p.keysAPI)
	p.handler = mux
	return p, nil
}

// Handler serves every route under BaseURL's path and the metadata; it
// expects the full request path (mount it as mux.Handle("/dev/provider/",
// p.Handler()) plus the metadata path, or use Mount).
func (p *Provider) Handler() http.Handler { return p.handler }

// Mount registers the provider's routes on mux: everything under BaseURL's
// path and the RFC 8414 metadata at MetadataURL's path.
func (p *Provider) Mount(mux *http.ServeMux) {
	mux.Handle(p.path+"/", p.handler)
	mux.Handle("GET "+p.wellKnown, p.handler)
}

// Issuer is the provider's issuer identifier (RFC 8414): BaseURL.
// MetadataURL is where its authorization server metadata is served, and
// RegisterURL its dynamic client registration endpoint.
func (p *Provider) Issuer() string { return p.opts.BaseURL }
func (p *Provider) MetadataURL() string {
	u, _ := url.Parse(p.opts.BaseURL) // validated by New
	u.Path = p.wellKnown
	return u.String()
}
func (p *Provider) RegisterURL() string { return p.opts.BaseURL + "/register" }

// Resources returns the resource indicators the provider issues tokens
// for (Options.Resources).
func (p *Provider) Resources() []string { return slices.Clone(p.opts.Resources) }

// AuthURL, TokenURL and RevokeURL are the endpoints for an oauth2.Config
// and a provider catalogue; APIBase is the API's base URL.
func (p *Provider) AuthURL() string   { return p.opts.BaseURL + "/authorize" }
func (p *Provider) TokenURL() string  { return p.opts.BaseURL + "/token" }
func (p *Provider) RevokeURL() string { return p.opts.BaseURL + "/revoke" }
func (p *Provider) APIBase() string   { return p.opts.BaseURL + "/api" }

// KeysURL is the demo-keys page showing each account's key; KeysAPIBase
// is the demo-keys API's base URL.
func (p *Provider) KeysURL() string     { return p.opts.BaseURL + "/keys" }
func (p *Provider) KeysAPIBase() string { return p.opts.BaseURL + "/keys-api" }

// KeyPattern is what a demo-keys key looks like (a regular expression
// for providers.yaml's pattern).
const KeyPattern = `demo_[A-Za-z0-9_-]{43}`

func newAPIKey() string { return "demo_" + randomToken(32) }

// APIKey returns the current demo-keys key of the account login ("" if
// there is no such account).
func (p *Provider) APIKey(login string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.apiKeys[login]
}

// RotateKey gives account login a new demo-keys key and returns it; the
// old key is refused from now on.
func (p *Provider) RotateKey(login string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.apiKeys[login]; !ok {
		return "", fmt.Errorf("demoprovider: no account %q", login)
	}
	k := newAPIKey()
	p.apiKeys[login] = k
	p.record(Event{Kind: "rotate-key", Account: login, Token: Fingerprint(k)})
	return k, nil
}

// Events returns a copy of the event log, oldest first.
func (p *Provider) Events() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// Fingerprint is how the event log names a token without holding it: the
// first 16 hex digits of its SHA-256.
func Fingerprint(token string) string {
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:8])
}

// maxEvents bounds the log of a long-running `broker dev`.
const maxEvents = 10000

// record appends an event; callers hold p.mu.
func (p *Provider) record(e Event) {
	p.seq++
	e.Seq = p.seq
	e.Time = p.opts.Now()
	if len(p.events) >= maxEvents {
		p.events = slices.Delete(p.events, 0, len(p.events)-maxEvents+1)
	}
	p.events = append(p.events, e)
	p.log.Debug("demoprovider: event", "kind", e.Kind, "grant_type", e.GrantType, "account", e.Account, "status", e.Status, "error", e.Error)
}

func (p *Provider) recordLocked(e Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.record(e)
}

func (p *Provider) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ev := Event{Kind: "authorize", Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, Resource: q.Get("resource")}
	p.mu.Lock()
	c := p.clients[q.Get("client_id")]
	if c != nil {
		ev.Client = c.id
	}
	p.record(ev)
	p.mu.Unlock()
	if c == nil {
		p.errorPage(w, http.StatusBadRequest, "Unknown application (client_id).")
		return
	}
	redirect := q.Get("redirect_uri")
	if !slices.Contains(c.redirectURIs, redirect) {
		p.errorPage(w, http.StatusBadRequest, "The redirect_uri is not registered for this application.")
		return
	}
	state := q.Get("state")
	bad := func(code, desc string) {
		http.Redirect(w, r, withQuery(redirect, url.Values{"error": {code}, "error_description": {desc}, "state": {state}, "iss": {p.Issuer()}}), http.StatusFound)
	}
	switch {
	case q.Get("response_type") != "code":
		bad("unsupported_response_type", "response_type must be code")
		return
	case q.Get("code_challenge") == "" || q.Get("code_challenge_method") != "S256":
		bad("invalid_request", "PKCE with code_challenge_method=S256 is required")
		return
	}
	resource, err := p.requestedResource(q["resource"])
	if err != nil {
		bad("invalid_target", err.Error())
		return
	}
	id := randomToken(16)
	pa := &pendingAuth{client: c, redirectURI: redirect, scope: strings.Join(strings.Fields(q.Get("scope")), " "), state: state,
		challenge: q.Get("code_challenge"), resource: resource, created: p.opts.Now()}
	p.mu.Lock()
	for k, old := range p.pending {
		if p.opts.Now().Sub(old.created) > pendingTTL {
			delete(p.pending, k)
		}
	}
	p.pending[id] = pa
	p.mu.Unlock()
	p.render(w, http.StatusOK, "consent", consentData{RequestID: id, ClientID: c.id, ClientName: c.name, Scope: pa.scope,
		Resource: resource, Accounts: accounts})
}

func (p *Provider) decide(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		p.errorPage(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	id := r.PostForm.Get("request")
	decision := r.PostForm.Get("decision")
	var acct Account
	found := false
	for _, a := range accounts {
		if strconv.FormatInt(a.ID, 10) == r.PostForm.Get("account") {
			acct, found = a, true
		}
	}
	if decision != "approve" && decision != "deny" || (decision == "approve" && !found) {
		p.errorPage(w, http.StatusBadRequest, "Choose an account, then Approve or Deny.")
		return
	}
	p.mu.Lock()
	pa, ok := p.pending[id]
	if ok {
		delete(p.pending, id)
	}
	if !ok || p.opts.Now().Sub(pa.created) > pendingTTL {
		p.mu.Unlock()
		p.errorPage(w, http.StatusBadRequest, "This authorization request is unknown, expired or already answered. Start again from the application.")
		return
	}
	if decision == "deny" {
		p.record(Event{Kind: "deny", Method: r.Method, Path: r.URL.Path, Status: http.StatusFound, Error: "access_denied"})
		p.mu.Unlock()
		http.Redirect(w, r, withQuery(pa.redirectURI, url.Values{
			"error": {"access_denied"}, "error_description": {"The user denied the request."}, "state": {pa.state}, "iss": {p.Issuer()},
		}), http.StatusFound)
		return
	}
	code := randomToken(24)
	p.codes[key(code)] = &codeGrant{req: *pa, account: acct, expiry: p.opts.Now().Add(codeTTL)}
	p.record(Event{Kind: "approve", Account: acct.Login, Client: pa.client.id, Resource: pa.resource, Method: r.Method, Path: r.URL.Path, Status: http.StatusFound})
	p.mu.Unlock()
	http.Redirect(w, r, withQuery(pa.redirectURI, url.Values{"code": {code}, "state": {pa.state}, "iss": {p.Issuer()}}), http.StatusFound)
}

// tokenResponse is the JSON body of a successful token request.
type tokenResponse struct {
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	RefreshToken string `json:"refresh_token,omitempty"`
	Scope        string `json:"scope,omitempty"`
}

func (p *Provider) token(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "the form could not be read")
		return
	}
	f := r.PostForm
	ev := Event{Kind: "token", GrantType: f.Get("grant_type"), Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, Resource: f.Get("resource")}
	p.mu.Lock()
	defer p.mu.Unlock()
	fail := func(status int, code, desc string) {
		ev.Status, ev.Error = status, code
		p.record(ev)
		if code == "invalid_client" {
			w.Header().Set("WWW-Authenticate", `Basic realm="demo"`)
		}
		oauthError(w, status, code, desc)
	}
	c, ok := p.authenticate(r)
	if !ok {
		fail(http.StatusUnauthorized, "invalid_client", "client authentication failed")
		return
	}
	ev.Client = c.id
	var (
		grantID, scope, resource string
		acct                     Account
	)
	now := p.opts.Now()
	switch ev.GrantType {
	case "authorization_code":
		cg, ok := p.codes[key(f.Get("code"))]
		if !ok || cg.used || !now.Before(cg.expiry) || cg.req.client.id != c.id {
			fail(http.StatusBadRequest, "invalid_grant", "the code is invalid, expired, already used or not issued to this client")
			return
		}
		cg.used = true
		if !sameResource(f["resource"], cg.req.resource) {
			fail(http.StatusBadRequest, "invalid_target", "the resource is not the one the authorization was granted for")
			return
		}
		if f.Get("redirect_uri") != cg.req.redirectURI {
			fail(http.StatusBadRequest, "invalid_grant", "redirect_uri does not match the authorization request")
			return
		}
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		if f.Get("code_verifier") == "" || subtle.ConstantTimeCompare([]byte(base64.RawURLEncoding.EncodeToString(sum[:])), []byte(cg.req.challenge)) != 1 {
			fail(http.StatusBadRequest, "invalid_grant", "code_verifier does not match the code_challenge")
			return
		}
		grantID, scope, resource, acct = randomToken(8), cg.req.scope, cg.req.resource, cg.account
	case "refresh_token":
		ev.Token = Fingerprint(f.Get("refresh_token"))
		if !c.refresh {
			fail(http.StatusBadRequest, "unauthorized_client", "the client did not register the refresh_token grant")
			return
		}
		t, ok := p.tokens[key(f.Get("refresh_token"))]
		if !ok || !t.refresh || t.clientID != c.id {
			fail(http.StatusBadRequest, "invalid_grant", "unknown refresh token")
			return
		}
		ev.Account = t.account.Login
		if t.spent {
			// Reuse of a rotated refresh token: end the whole grant.
			p.revokeGrant(t.grantID)
			fail(http.StatusBadRequest, "invalid_grant", "refresh token already used; the grant has been revoked")
			return
		}
		if t.revoked || !now.Before(t.expiry) {
			fail(http.StatusBadRequest, "invalid_grant", "refresh token expired or revoked")
			return
		}
		if !sameResource(f["resource"], t.resource) {
			// Refused before the token is spent: the client may retry right.
			fail(http.StatusBadRequest, "invalid_target", "the resource is not the one the grant is bound to")
			return
		}
		t.spent = true
		grantID, scope, resource, acct = t.grantID, t.scope, t.resource, t.account
	default:
		fail(http.StatusBadRequest, "unsupported_grant_type", "grant_type must be authorization_code or refresh_token")
		return
	}
	access, refresh := randomToken(32), ""
	p.tokens[key(access)] = &token{grantID: grantID, clientID: c.id, scope: scope, resource: resource, account: acct, expiry: now.Add(p.opts.AccessTTL)}
	if c.refresh {
		refresh = randomToken(32)
		p.tokens[key(refresh)] = &token{refresh: true, grantID: grantID, clientID: c.id, scope: scope, resource: resource, account: acct, expiry: now.Add(p.opts.RefreshIdleTTL)}
	}
	ev.Account, ev.Token = acct.Login, Fingerprint(access)
	if ev.GrantType == "refresh_token" && p.loseAnswers.Take() {
		ev.Status, ev.Error = http.StatusBadGateway, "answer_lost"
		p.record(ev)
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return
	}
	p.record(ev)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, tokenResponse{
		AccessToken: access, TokenType: "Bearer", ExpiresIn: int(p.opts.AccessTTL / time.Second),
		RefreshToken: refresh, Scope: scope,
	})
}

// Introspection is what the provider knows about a live access token: what
// a resource server needs to decide (RFC 7662's claims, in-process).
type Introspection struct {
	Account  Account
	ClientID string
	Scopes   []string
	// Resource is the RFC 8707 resource the token is bound to ("" for a
	// token of the demo API).
	Resource string
	Expiry   time.Time
}

// Introspect describes the access token tok, or reports false when it is
// unknown, a refresh token, revoked or expired.
func (p *Provider) Introspect(tok string) (Introspection, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tokens[key(tok)]
	if !ok || t.refresh || t.revoked || !p.opts.Now().Before(t.expiry) {
		return Introspection{}, false
	}
	return Introspection{Account: t.account, ClientID: t.clientID, Scopes: strings.Fields(t.scope),
		Resource: t.resource, Expiry: t.expiry}, true
}

// revokeGrant revokes every token of a grant; callers hold p.mu.
func (p *Provider) revokeGrant(grantID string) {
	for _, t := range p.tokens {
		if t.grantID == grantID {
			t.revoked = true
		}
	}
}

// revoke implements RFC 7009: 200 for any token once the client is
// authenticated, so the answer says nothing about the token's validity.
func (p *Provider) revoke(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		oauthError(w, http.StatusBadRequest, "invalid_request", "the form could not be read")
		return
	}
	tok := r.PostForm.Get("token")
	ev := Event{Kind: "revoke", Method: r.Method, Path: r.URL.Path, Status: http.StatusOK, Token: Fingerprint(tok)}
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.authenticate(r)
	if !ok {
		ev.Status, ev.Error = http.StatusUnauthorized, "invalid_client"
		p.record(ev)
		w.Header().Set("WWW-Authenticate", `Basic realm="demo"`)
		oauthError(w, http.StatusUnauthorized, "invalid_client", "client authentication failed")
		return
	}
	if tok == "" {
		ev.Status, ev.Error = http.StatusBadRequest, "invalid_request"
		p.record(ev)
		oauthError(w, http.StatusBadRequest, "invalid_request", "token is required")
		return
	}
	if p.failRevocations.Take() {
		ev.Status, ev.Error = http.StatusServiceUnavailable, "temporarily_unavailable"
		p.record(ev)
		oauthError(w, http.StatusServiceUnavailable, "temporarily_unavailable", "try again later")
		return
	}
	ev.Client = c.id
	// A token of another client is left alone, with the same answer as an
	// unknown one.
	if t, ok := p.tokens[key(tok)]; ok && t.clientID == c.id {
		ev.Account = t.account.Login
		p.revokeGrant(t.grantID)
	}
	p.record(ev)
	w.WriteHeader(http.StatusOK)
}

func (p *Provider) api(w http.ResponseWriter, r *http.Request) {
	scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	ev := Event{Kind: "api", Method: r.Method, Path: r.URL.Path, Token: Fingerprint(tok)}
	p.mu.Lock()
	var t *token
	if strings.EqualFold(scheme, "Bearer") && tok != "" {
		t = p.tokens[key(tok)]
	}
	now := p.opts.Now()
	if t == nil || t.refresh || t.revoked || !now.Before(t.expiry) || t.resource != "" {
		ev.Status, ev.Error = http.StatusUnauthorized, "invalid_token"
		challenge := `Bearer realm="demo"`
		switch {
		case tok == "":
			ev.Error = "missing_token"
		case t != nil && !t.refresh && t.resource != "":
			challenge += `, error="invalid_token", error_description="The access token is for another resource"`
		case t != nil && !t.refresh && !t.revoked:
			challenge += `, error="invalid_token", error_description="The access token expired"`
		default:
			challenge += `, error="invalid_token", error_description="The access token is invalid"`
		}
		p.record(ev)
		p.mu.Unlock()
		w.Header().Set("WWW-Authenticate", challenge)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_token", "message": "Bad credentials"})
		return
	}
	acct := t.account
	ev.Account, ev.Status = acct.Login, http.StatusOK
	p.record(ev)
	p.mu.Unlock()
	if strings.HasSuffix(r.URL.Path, "/api/user") {
		writeJSON(w, http.StatusOK, acct)
		return
	}
	writeJSON(w, http.StatusOK, []map[string]any{
		{"id": acct.ID*10 + 1, "name": "hello-demo", "full_name": acct.Login + "/hello-demo", "private": false},
		{"id": acct.ID*10 + 2, "name": "notes", "full_name": acct.Login + "/notes", "private": true},
	})
}

// keysPage is GET /keys: every demo account with its current key.
func (p *Provider) keysPage(w http.ResponseWriter, r *http.Request) {
	var d consentData
	p.mu.Lock()
	for _, a := range accounts {
		d.Keys = append(d.Keys, accountKey{Account: a, Key: p.apiKeys[a.Login]})
	}
	p.mu.Unlock()
	p.render(w, http.StatusOK, "keys", d)
}

// rotateKeyForm is POST /keys: account=<id> gets a new key.
func (p *Provider) rotateKeyForm(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		p.errorPage(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	for _, a := range accounts {
		if strconv.FormatInt(a.ID, 10) == r.PostForm.Get("account") {
			_, _ = p.RotateKey(a.Login)
			http.Redirect(w, r, "keys", http.StatusSeeOther)
			return
		}
	}
	p.errorPage(w, http.StatusBadRequest, "Unknown account.")
}

// keysAPI is GET /keys-api/me: the account whose key is in X-Api-Key.
func (p *Provider) keysAPI(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("X-Api-Key")
	ev := Event{Kind: "keys-api", Method: r.Method, Path: r.URL.Path, Token: Fingerprint(key)}
	var acct *Account
	p.mu.Lock()
	for i, a := range accounts {
		if cur := p.apiKeys[a.Login]; key != "" && subtle.ConstantTimeCompare([]byte(key), []byte(cur)) == 1 {
			acct = &accounts[i]
		}
	}
	if acct == nil {
		ev.Status, ev.Error = http.StatusUnauthorized, "invalid_key"
		if key == "" {
			ev.Error = "missing_key"
		}
	} else {
		ev.Status, ev.Account = http.StatusOK, acct.Login
	}
	p.record(ev)
	p.mu.Unlock()
	if acct == nil {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "invalid_key", "message": "A valid X-Api-Key header is required."})
		return
	}
	writeJSON(w, http.StatusOK, *acct)
}

type accountKey struct {
	Account
	Key string
}

// consentData is what the consent page shows.
type consentData struct {
	RequestID  string
	ClientID   string
	ClientName string // self-asserted at registration
	Scope      string
	Resource   string
	Accounts   []Account
	Message    string
	Keys       []accountKey
}

var pages = fakepages.Parse(cspHeader, `
{{define "consent"}}{{template "head" "Authorize · Demo provider"}}
<body><main>
<h1>Demo provider</h1>
<p>The application <code>{{.ClientID}}</code>{{if .ClientName}} (calling itself “{{.ClientName}}”){{end}} asks to access a demo account{{if .Scope}} with the scopes <code>{{.Scope}}</code>{{end}}{{if .Resource}} at <code>{{.Resource}}</code>{{end}}.</p>
<form method="post" action="authorize">
<input type="hidden" name="request" value="{{.RequestID}}">
<label>Account
<select name="account">{{range $i, $a := .Accounts}}
<option value="{{$a.ID}}"{{if eq $i 0}} selected{{end}}>{{$a.Login}}</option>{{end}}
</select></label>
<div class="buttons">
<button type="submit" name="decision" value="approve">Approve</button>
<button type="submit" name="decision" value="deny">Deny</button>
</div>
</form>
<p class="note">This is a local demonstration provider for <code>broker dev</code>; no real account is involved.</p>
</main></body></html>{{end}}
{{define "keys"}}{{template "head" "API keys · Demo provider"}}
<body><main>
<h1>Demo provider: API keys</h1>
<p>The <code>demo-keys</code> service takes these keys in an <code>X-Api-Key</code> header. Copy your account's key and paste it into the broker's page.</p>
<table class="keys">
{{range .Keys}}<tr>
<th>{{.Login}}</th>
<td><code class="key" data-login="{{.Login}}">{{.Key}}</code></td>
<td><form method="post" action="keys"><input type="hidden" name="account" value="{{.ID}}"><button type="submit" name="rotate" value="{{.Login}}">Make a new key</button></form></td>
</tr>
{{end}}</table>
<p class="note">A new key replaces the old one at once: anything still using the old key gets 401. This is a local demonstration provider for <code>broker dev</code>; no real account is involved.</p>
</main></body></html>{{end}}
{{define "error"}}{{template "head" "Error · Demo provider"}}
<body><main><h1>Demo provider</h1><p class="error">{{.Message}}</p></main></body></html>{{end}}
`)

const css = `body{font-family:system-ui,sans-serif;background:#f3f6f4;margin:0}
table.keys th{text-align:left;padding-right:1rem}table.keys td{padding:.3rem}code.key{word-break:break-all}
main{max-width:28rem;margin:4rem auto;background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002}
label{display:block;margin:1rem 0}select{display:block;margin-top:.3rem;padding:.3rem}
.buttons button{margin-right:.6rem;padding:.5rem 1.2rem}.error{color:#a00}.note{color:#666;font-size:.9em}`

func (p *Provider) errorPage(w http.ResponseWriter, status int, msg string) {
	p.render(w, status, "error", consentData{Message: msg})
}

func (p *Provider) render(w http.ResponseWriter, status int, name string, d consentData) {
	pages.Render(w, p.log, status, name, d)
}

func oauthError(w http.ResponseWriter, status int, code, desc string) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, map[string]string{"error": code, "error_description": desc})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func withQuery(base string, params url.Values) string {
	u, _ := url.Parse(base) // registered URIs were validated by New
	q := u.Query()
	for k, vs := range params {
		if len(vs) > 0 && vs[0] != "" {
			q.Set(k, vs[0])
		}
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// key indexes secrets by their SHA-256 so lookups never compare secret bytes.
func key(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return string(sum[:])
}

func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("demoprovider: crypto/rand: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}
