package devidp

import (
	"credbroker/internal/fakepages"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// User is a person who can sign in.
type User struct {
	Username, Password, Subject, Email, Name string
	// Groups, when set, go into minted access tokens as the "groups"
	// claim (as many IdPs send group membership).
	Groups []string
}

// Client is a registered relying party. An empty Secret makes it a public
// client (token endpoint auth method none, PKCE required).
type Client struct {
	ID, Secret   string
	RedirectURIs []string
	// Native makes a confidential client a native app: its loopback
	// redirect URIs match on any port (a desktop host with a secret for
	// token exchange).
	Native bool
}

// Options configure an IdP.
type Options struct {
	// Issuer is the full issuer URL, which may have a path, e.g.
	// "http://127.0.0.1:8080/dev/idp". No trailing slash, no query.
	Issuer  string
	Users   []User
	Clients []Client
	// IDJAGRules is the token-exchange policy: which user may have which
	// client get ID-JAGs for which authorization server (tokenexchange.go).
	// None: every exchange is refused.
	IDJAGRules []IDJAGRule
	Logger     *slog.Logger // nil: discard
}

// DefaultUsers returns alice/alice and bob/bob.
func DefaultUsers() []User {
	return []User{
		{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"},
		{Username: "bob", Password: "bob", Subject: "bob", Email: "bob@example.test", Name: "Bob"},
	}
}

const (
	sessionCookie = "devidp_session"
	csrfCookie    = "devidp_csrf"
	csrfField     = "csrf"
	sessionTTL    = 8 * time.Hour
	maxFormBytes  = 16 << 10
	cspHeader     = "default-src 'none'; style-src 'self'; img-src 'self'; base-uri 'none'; frame-ancestors 'none'"
)

// IdP is a running development OpenID Provider. Its methods are safe for
// concurrent use.
type IdP struct {
	issuer   string
	path     string // the issuer's URL path without trailing slash ("" at the root)
	provider *op.Provider
	store    *storage
	signer   jose.Signer
	log      *slog.Logger
	handler  http.Handler
	// csrfKey keys the sign-in form's CSRF tokens (see csrfToken).
	csrfKey [32]byte
	// cop refuses cross-origin posts of the sign-in form.
	cop *http.CrossOriginProtection

	mu       sync.Mutex // guards sessions
	sessions map[string]session
}

type session struct {
	subject string
	expiry  time.Time
}

// New validates opts and builds the IdP with a fresh RS256 signing key.
func New(opts Options) (*IdP, error) {
	u, err := url.Parse(opts.Issuer)
	switch {
	case err != nil:
		return nil, fmt.Errorf("devidp: issuer: %w", err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return nil, fmt.Errorf("devidp: issuer %q must be an absolute http(s) URL", opts.Issuer)
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(u.Path, "/"):
		return nil, fmt.Errorf("devidp: issuer %q must have no query, fragment or trailing slash", opts.Issuer)
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, fmt.Errorf("devidp: generate key: %w", err)
	}
	keyID, err := randomString(8)
	if err != nil {
		return nil, err
	}
	p := &IdP{
		issuer:   opts.Issuer,
		path:     u.Path,
		log:      logger,
		sessions: map[string]session{},
		cop:      http.NewCrossOriginProtection(),
	}
	if _, err := rand.Read(p.csrfKey[:]); err != nil {
		return nil, fmt.Errorf("devidp: csrf key: %w", err)
	}
	// Behind a proxy that rewrites Host, the issuer's own origin still
	// counts as same-origin.
	if err := p.cop.AddTrustedOrigin(u.Scheme + "://" + u.Host); err != nil {
		return nil, fmt.Errorf("devidp: issuer origin: %w", err)
	}
	p.store = &storage{
		key:      key,
		keyID:    keyID,
		now:      time.Now,
		loginURL: func(id string) string { return p.path + "/login?authRequestID=" + url.QueryEscape(id) },
		users:    map[string]User{},
		clients:  map[string]Client{},
		requests: map[string]*authRequest{},
		codes:    map[string]string{},
		tokens:   map[string]*accessToken{},
		refresh:  map[string]*refreshGrant{},
	}
	for _, usr := range opts.Users {
		if err := p.AddUser(usr); err != nil {
			return nil, err
		}
	}
	for _, c := range opts.Clients {
		if err := p.AddClient(c); err != nil {
			return nil, err
		}
	}
	p.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("at+jwt").WithHeader(jose.HeaderKey("kid"), keyID))
	if err != nil {
		return nil, fmt.Errorf("devidp: signer: %w", err)
	}
	var cryptoKey [32]byte
	if _, err := rand.Read(cryptoKey[:]); err != nil {
		return nil, fmt.Errorf("devidp: crypto key: %w", err)
	}
	cfg := &op.Config{
		CryptoKey:      cryptoKey,
		CryptoKeyId:    keyID,
		CodeMethodS256: true,
		AuthMethodPost: true,
		// Refresh tokens for offline_access sign-ins (the broker keeps
		// people's IdP sessions for enterprise-managed authorization).
		GrantTypeRefreshToken: true,
	}
	var provOpts []op.Option
	if u.Scheme == "http" {
		provOpts = append(provOpts, op.WithAllowInsecure())
	}
	p.provider, err = op.NewProvider(cfg, p.store, op.StaticIssuer(opts.Issuer), provOpts...)
	if err != nil {
		return nil, fmt.Errorf("devidp: provider: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+p.path+"/login", p.loginPage)
	mux.HandleFunc("POST "+p.path+"/login", p.loginSubmit)
	mux.HandleFunc("GET "+p.path+"/style.css", fakepages.Stylesheet(css))
	mux.Handle(p.path+"/", http.StripPrefix(p.path, p.provider))
	p.handler = p.withTokenExchange(mux)
	p.SetIDJAGRules(opts.IDJAGRules)
	return p, nil
}

// AddClient registers (or replaces) a client at run time, e.g. once a
// test server's redirect URI is known.
func (p *IdP) AddClient(c Client) error {
	if c.ID == "" || len(c.RedirectURIs) == 0 {
		return errors.New("devidp: a client needs an id and at least one redirect URI")
	}
	for _, r := range c.RedirectURIs {
		if u, err := url.Parse(r); err != nil || !u.IsAbs() || u.Fragment != "" {
			return fmt.Errorf("devidp: client %q: bad redirect URI %q", c.ID, r)
		}
	}
	c.RedirectURIs = append([]string(nil), c.RedirectURIs...)
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	p.store.clients[c.ID] = c
	return nil
}

// AddUser adds a person who can sign in (at run time: a test's extra
// user).
func (p *IdP) AddUser(u User) error {
	if u.Username == "" || u.Subject == "" {
		return errors.New("devidp: every user needs a username and a subject")
	}
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	if _, dup := p.store.users[u.Username]; dup {
		return fmt.Errorf("devidp: duplicate user %q", u.Username)
	}
	p.store.users[u.Username] = u
	return nil
}

// Handler serves every path under the issuer's URL path. It expects the
// full request path (mount it as mux.Handle("/dev/idp/", p.Handler())).
func (p *IdP) Handler() http.Handler { return p.handler }

// Issuer returns the issuer URL.
func (p *IdP) Issuer() string { return p.issuer }

// MintAccessToken signs a JWT access token for username with the IdP's
// signing key: iss, sub (the user's Subject), aud=[audience], scope
// (space-joined), iat, nbf, exp=now+ttl, jti, client_id "dev" and, for a
// user with Groups, groups.
func (p *IdP) MintAccessToken(username, audience string, scopes []string, ttl time.Duration) (string, time.Time, error) {
	p.store.mu.Lock()
	u, ok := p.store.users[username]
	p.store.mu.Unlock()
	if !ok {
		return "", time.Time{}, fmt.Errorf("devidp: mint: unknown user %q", username)
	}
	if audience == "" || ttl <= 0 {
		return "", time.Time{}, errors.New("devidp: mint: audience and a positive ttl are required")
	}
	jti, err := randomString(16)
	if err != nil {
		return "", time.Time{}, err
	}
	now := time.Now()
	exp := now.Add(ttl)
	claims := map[string]any{
		"iss":       p.issuer,
		"sub":       u.Subject,
		"aud":       []string{audience},
		"scope":     strings.Join(scopes, " "),
		"iat":       now.Unix(),
		"nbf":       now.Unix(),
		"exp":       exp.Unix(),
		"jti":       jti,
		"client_id": "dev",
	}
	if len(u.Groups) > 0 {
		claims["groups"] = u.Groups
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("devidp: mint: %w", err)
	}
	jws, err := p.signer.Sign(payload)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("devidp: mint: %w", err)
	}
	tok, err := jws.CompactSerialize()
	if err != nil {
		return "", time.Time{}, fmt.Errorf("devidp: mint: %w", err)
	}
	return tok, time.Unix(exp.Unix(), 0), nil
}

// currentSession returns the subject of the browser's valid session, if any.
func (p *IdP) currentSession(r *http.Request) (string, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil || c.Value == "" {
		return "", false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.sessions[c.Value]
	if !ok || time.Now().After(s.expiry) {
		delete(p.sessions, c.Value)
		return "", false
	}
	return s.subject, true
}

func (p *IdP) startSession(w http.ResponseWriter, r *http.Request, subject string) error {
	id, err := randomString(24)
	if err != nil {
		return err
	}
	now := time.Now()
	p.mu.Lock()
	for k, s := range p.sessions {
		if now.After(s.expiry) {
			delete(p.sessions, k)
		}
	}
	p.sessions[id] = session{subject: subject, expiry: now.Add(sessionTTL)}
	p.mu.Unlock()
	path := p.path + "/"
	http.SetCookie(w, &http.Cookie{
		Name:     sessionCookie,
		Value:    id,
		Path:     path,
		MaxAge:   int(sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteLaxMode,
	})
	return nil
}

// callbackURL is where a completed request goes to receive its code.
func (p *IdP) callbackURL(id string) string {
	return p.path + "/authorize/callback?id=" + url.QueryEscape(id)
}

type loginData struct {
	RequestID string
	CSRF      string
	ClientID  string
	Username  string
	Error     string
	CSS       string
}

// The sign-in form is protected against cross-site posts (login CSRF: a
// page elsewhere signing the visitor's browser in as someone else) twice:
//
//   - Origin: a post whose Sec-Fetch-Site, Origin or (without Origin)
//     Referer names another origin is refused.
//   - Token: the form carries csrfToken(browser, request id), an HMAC under
//     a per-IdP random key of the auth request id and a random value held
//     in this browser's devidp_csrf cookie (HttpOnly, SameSite=Strict). A
//     post without the cookie, without the token, or with the token of
//     another request or another browser is refused. Binding the token to
//     the browser matters: whoever starts an auth request can open its
//     form and read that request's token, but cannot read or set another
//     browser's cookie.
//
// Both checks run before the password is looked at.

// browserIDBytes is the size of the random value in the devidp_csrf cookie.
const browserIDBytes = 24

// validBrowserID reports whether v has the shape of a devidp_csrf value.
func validBrowserID(v string) bool {
	b, err := base64.RawURLEncoding.DecodeString(v)
	return err == nil && len(b) == browserIDBytes
}

// browserID returns this browser's devidp_csrf value, setting a new cookie
// when it has none. An existing value is kept so that several sign-in
// forms open in one browser stay valid.
func (p *IdP) browserID(w http.ResponseWriter, r *http.Request) (string, error) {
	if c, err := r.Cookie(csrfCookie); err == nil && validBrowserID(c.Value) {
		return c.Value, nil
	}
	id, err := randomString(browserIDBytes)
	if err != nil {
		return "", err
	}
	http.SetCookie(w, &http.Cookie{
		Name:     csrfCookie,
		Value:    id,
		Path:     p.path + "/",
		MaxAge:   int(sessionTTL / time.Second),
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
	})
	return id, nil
}

// csrfToken is the sign-in form's token for auth request id in the browser
// whose devidp_csrf cookie holds browser. Neither value contains NUL, so
// the encoding is unambiguous.
func (p *IdP) csrfToken(browser, id string) string {
	m := hmac.New(sha256.New, p.csrfKey[:])
	m.Write([]byte("credbroker/devidp/login-csrf/v1\x00"))
	m.Write([]byte(browser))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkCSRFToken reports whether the post carries the token of auth request
// id for the browser that sent it, comparing in constant time.
func (p *IdP) checkCSRFToken(r *http.Request, id string) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || !validBrowserID(c.Value) {
		return false
	}
	return hmac.Equal([]byte(r.PostForm.Get(csrfField)), []byte(p.csrfToken(c.Value, id)))
}

// errCrossOrigin: the sign-in form was posted from another origin.
var errCrossOrigin = errors.New("devidp: cross-origin sign-in post")

// checkSameOrigin refuses a post that a browser says came from another
// origin: Sec-Fetch-Site and Origin through http.CrossOriginProtection
// (the issuer's origin is trusted), then, when there is no Origin header,
// a Referer naming another host. A post with neither header (a non-browser
// client, or a browser honouring the page's no-referrer policy on an old
// engine) is left to the token check.
func (p *IdP) checkSameOrigin(r *http.Request) error {
	if err := p.cop.Check(r); err != nil {
		return err
	}
	if r.Header.Get("Origin") != "" {
		return nil
	}
	ref := r.Header.Get("Referer")
	if ref == "" {
		return nil
	}
	u, err := url.Parse(ref)
	if err != nil || u.Host == "" {
		return errCrossOrigin
	}
	iss, _ := url.Parse(p.issuer)
	if u.Host == r.Host || u.Scheme == iss.Scheme && u.Host == iss.Host {
		return nil
	}
	return errCrossOrigin
}

func (p *IdP) loginPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("authRequestID")
	req, err := p.store.request(id)
	if err != nil || req.done {
		p.errorPage(w, http.StatusBadRequest, "This sign-in request is unknown or has expired. Start again from the application.")
		return
	}
	if sub, ok := p.currentSession(r); ok && !req.forceLogin() {
		p.finish(w, r, id, sub)
		return
	}
	if req.promptNone() {
		op.AuthRequestError(w, r, req, oidc.ErrLoginRequired(), p.provider)
		return
	}
	browser, err := p.browserID(w, r)
	if err != nil {
		p.errorPage(w, http.StatusInternalServerError, "Could not prepare the sign-in form.")
		return
	}
	p.renderLogin(w, http.StatusOK, loginData{RequestID: id, CSRF: p.csrfToken(browser, id), ClientID: req.clientID})
}

func (p *IdP) loginSubmit(w http.ResponseWriter, r *http.Request) {
	if err := p.checkSameOrigin(r); err != nil {
		p.log.Warn("devidp: sign-in post from another origin refused", "origin", r.Header.Get("Origin"))
		p.errorPage(w, http.StatusForbidden, "This sign-in form was sent from another site, so nobody was signed in. Start again from the application.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		p.errorPage(w, http.StatusBadRequest, "The form could not be read.")
		return
	}
	id := r.PostForm.Get("authRequestID")
	req, err := p.store.request(id)
	if err != nil || req.done {
		p.errorPage(w, http.StatusBadRequest, "This sign-in request is unknown or has expired. Start again from the application.")
		return
	}
	if !p.checkCSRFToken(r, id) {
		p.log.Warn("devidp: sign-in post without this browser's token for the request refused", "client", req.clientID)
		p.errorPage(w, http.StatusForbidden, "This sign-in form was not opened in this browser, so nobody was signed in. Start again from the application.")
		return
	}
	username, password := r.PostForm.Get("username"), r.PostForm.Get("password")
	p.store.mu.Lock()
	u, ok := p.store.users[username]
	p.store.mu.Unlock()
	want := u.Password
	if !ok {
		want = "\x00no-such-user"
	}
	if subtle.ConstantTimeCompare([]byte(want), []byte(password)) != 1 || !ok {
		p.log.Info("devidp: sign-in failed", "client", req.clientID)
		p.renderLogin(w, http.StatusUnauthorized, loginData{
			RequestID: id, CSRF: r.PostForm.Get(csrfField), ClientID: req.clientID, Username: username,
			Error: "Wrong username or password.",
		})
		return
	}
	if err := p.startSession(w, r, u.Subject); err != nil {
		p.errorPage(w, http.StatusInternalServerError, "Could not start a session.")
		return
	}
	p.log.Info("devidp: signed in", "subject", u.Subject, "client", req.clientID)
	p.finish(w, r, id, u.Subject)
}

// finish marks the request signed in and sends the browser to the OP's
// callback, which issues the code.
func (p *IdP) finish(w http.ResponseWriter, r *http.Request, id, subject string) {
	if err := p.store.completeRequest(id, subject); err != nil {
		p.errorPage(w, http.StatusBadRequest, "This sign-in request is unknown or has expired. Start again from the application.")
		return
	}
	http.Redirect(w, r, p.callbackURL(id), http.StatusFound)
}

var pages = fakepages.Parse(cspHeader, `
{{define "login"}}{{template "head" "Sign in · dev IdP"}}
<body><main>
<h1>Sign in</h1>
<p class="note">Development identity provider. Signing in for <code>{{.ClientID}}</code>.</p>
{{if .Error}}<p class="error" role="alert">{{.Error}}</p>{{end}}
<form method="post" action="login">
<input type="hidden" name="authRequestID" value="{{.RequestID}}">
<input type="hidden" name="csrf" value="{{.CSRF}}">
<label>Username <input name="username" autocomplete="username" value="{{.Username}}" required autofocus></label>
<label>Password <input type="password" name="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button>
</form>
</main></body></html>{{end}}
{{define "error"}}{{template "head" "Error · dev IdP"}}
<body><main><h1>Sign-in problem</h1><p class="error">{{.}}</p></main></body></html>{{end}}
`)

const css = `body{font-family:system-ui,sans-serif;background:#f4f5f7;margin:0}
main{max-width:24rem;margin:4rem auto;background:#fff;padding:2rem;border-radius:8px;box-shadow:0 1px 4px #0002}
label{display:block;margin:.8rem 0}input{display:block;width:100%;padding:.4rem;box-sizing:border-box}
button{margin-top:1rem;padding:.5rem 1.2rem}.error{color:#a00}.note{color:#555}`

func (p *IdP) renderLogin(w http.ResponseWriter, status int, d loginData) {
	p.render(w, status, "login", d)
}

func (p *IdP) errorPage(w http.ResponseWriter, status int, msg string) {
	p.render(w, status, "error", msg)
}

func (p *IdP) render(w http.ResponseWriter, status int, name string, data any) {
	pages.Render(w, p.log, status, name, data)
}

func randomString(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("devidp: random: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}
