package authserver

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"go.opentelemetry.io/otel/trace"

	"credbroker/apps"
	"credbroker/internal/clientaddr"
	"credbroker/internal/loopback"
	"credbroker/internal/outage"
	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/web"
)

// Person is who is signed in to the broker in a browser, as the broker's
// own sign-in (package oauthflow) established it.
type Person struct {
	Principal vault.Principal
	// Display is an email or name for pages.
	Display string
	// CSRF is the session's anti-forgery token, which forms echo.
	CSRF string
}

// Options configures a Server.
type Options struct {
	// PublicURL is the broker's external base URL: the issuer identifier
	// of its tokens and metadata (no trailing slash).
	PublicURL string
	// Resource is the MCP resource URI: the audience tokens name unless
	// another resource is asked for.
	Resource string
	// MoreResources reports the other resources tokens may be issued for
	// (the gateway's /mcp/u/{provider} endpoints), given a requested
	// resource with its scheme and host in lower case. Nil: none.
	MoreResources func(resource string) bool
	// IdPIssuer is the organisation's IdP: the issuer of every principal.
	IdPIssuer string
	// Store keeps clients, codes and app access.
	Store vault.AuthStore
	// Keys is the broker's key ring; signing and sealing keys are derived
	// from it, so replicas sharing the ring share them.
	Keys *vault.Keyring

	// Person reports who is signed in to the broker in the request's
	// browser. StartSignIn sends the browser to sign in and come back to
	// returnTo (a path on the broker). Both come from the browser front
	// door (oauthflow), wired by the caller.
	Person      func(r *http.Request) (Person, bool)
	StartSignIn func(w http.ResponseWriter, r *http.Request, returnTo string)

	// Registration opens dynamic client registration (RFC 7591).
	Registration bool
	// AllowPrivateMetadata lets Client ID Metadata Documents be fetched
	// from loopback, private and other special-use addresses (tests,
	// private networks). Off, such fetches are refused at dial time.
	AllowPrivateMetadata bool
	// MetadataTLS configures TLS for metadata fetches (nil: the system's).
	MetadataTLS *tls.Config
	// Scopes are the scopes the broker grants besides offline_access (the
	// MCP endpoint's required scope, when one is configured).
	Scopes []string

	// Apps is the apps core: consent memory, token families and their
	// lifetimes, liveness, removal. Nil: one on Store with the default
	// lifetimes, whose checks read the store each time.
	Apps *apps.Service
	// MaxClients caps registered clients (default 10000); RegistrationRate
	// caps registrations per remote address per minute (default 20);
	// UnusedClientTTL removes registered clients that never redeemed a
	// code (default 24h).
	MaxClients       int
	RegistrationRate int
	UnusedClientTTL  time.Duration
	// IDJAG configures enterprise-managed authorization: the JWT bearer
	// grant with ID-JAGs from the organisation's IdP (idjag.go). Off by
	// default.
	IDJAG IDJAGOptions
	// Clients are clients configured rather than registered (broker dev's
	// host client): looked up before the store, never expiring.
	Clients []StaticClient
	// Tracing, when set, makes each request to the authorization server's
	// endpoints a server span (authserver.authorize, .decision, .token,
	// .revoke, .register) with the route and the status. Nil: off.
	Tracing trace.TracerProvider
	// ClientAddr is the address of the client behind a request, which the
	// registration limit counts and the logs name (nil: the connection's
	// peer; behind a load balancer, the balancer's address unless its
	// X-Forwarded-For is trusted, see internal/clientaddr).
	ClientAddr func(*http.Request) string

	Logger    *slog.Logger
	Now       func() time.Time
	Telemetry *telemetry.Recorder
}

// Server is the broker's OAuth 2.1 authorization server. See the package
// doc for its routes.
type Server struct {
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	store   vault.AuthStore
	apps    *apps.Service
	policy  apps.Policy
	keys    *keySet
	seal    *vault.Keyring
	docs    *metadataCache
	limiter *windowLimiter
	kit     *web.Kit
	scopes  []string
	jag     *idjagVerifier
	// jagLifetime is the longest ID-JAG accepted (exp - iat).
	jagLifetime time.Duration
	// trusted are the issuers whose people the verifier accepts: the IdP
	// and the ID-JAG issuers trusted besides it.
	trusted []string
	static  map[string]*client

	metadata []byte
}

// New validates opts and builds the server. It performs no I/O.
func New(opts Options) (*Server, error) {
	var errs []error
	pu, err := url.Parse(opts.PublicURL)
	if err != nil || pu.Host == "" || pu.RawQuery != "" || pu.Fragment != "" ||
		(pu.Scheme != "https" && !(pu.Scheme == "http" && loopback.Host(pu.Hostname()))) {
		errs = append(errs, fmt.Errorf("PublicURL %q must be an https URL (http only on loopback)", opts.PublicURL))
	}
	opts.PublicURL = strings.TrimRight(opts.PublicURL, "/")
	if opts.Resource == "" {
		opts.Resource = opts.PublicURL + "/mcp"
	}
	for _, m := range []struct {
		ok   bool
		name string
	}{
		{opts.IdPIssuer != "", "IdPIssuer"}, {opts.Store != nil, "Store"}, {opts.Keys != nil, "Keys"},
		{opts.Person != nil, "Person"}, {opts.StartSignIn != nil, "StartSignIn"},
	} {
		if !m.ok {
			errs = append(errs, fmt.Errorf("%s is required", m.name))
		}
	}
	switch opts.IDJAG.Policy.Mode {
	case "", IDJAGOff:
		opts.IDJAG.Policy.Mode = IDJAGOff
	case IDJAGAny, IDJAGAllow:
		if opts.IDJAG.Ledger == nil {
			errs = append(errs, errors.New("IDJAG.Ledger is required when the JWT bearer grant is on (the store must keep spent assertions)"))
		}
	default:
		errs = append(errs, fmt.Errorf("IDJAG.Policy.Mode %q must be off, any or allow", opts.IDJAG.Policy.Mode))
	}
	for _, iss := range opts.IDJAG.TrustedIssuers {
		if u, err := url.Parse(iss); err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && loopback.Host(u.Hostname()))) {
			errs = append(errs, fmt.Errorf("trusted ID-JAG issuer %q must be an https URL (http only on loopback)", iss))
		}
	}
	static, err := staticClients(opts.Clients)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("authserver: %w", errors.Join(errs...))
	}
	if opts.IDJAG.MaxLifetime <= 0 {
		opts.IDJAG.MaxLifetime = defaultIDJAGLifetime
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = 10000
	}
	if opts.RegistrationRate <= 0 {
		opts.RegistrationRate = 20
	}
	if opts.UnusedClientTTL <= 0 {
		opts.UnusedClientTTL = 24 * time.Hour
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ClientAddr == nil {
		opts.ClientAddr = clientaddr.Trusted{}.Addr // the peer
	}
	if opts.Apps == nil {
		if opts.Apps, err = apps.New(apps.Options{Store: opts.Store, Telemetry: opts.Telemetry, Logger: opts.Logger, Now: opts.Now}); err != nil {
			return nil, err
		}
	}
	s := &Server{
		opts: opts, log: opts.Logger, now: opts.Now, store: opts.Store, apps: opts.Apps, policy: opts.Apps.Policy(),
		seal:    opts.Keys.Derive("authserver/pending-request"),
		docs:    newMetadataCache(newMetadataClient(opts.AllowPrivateMetadata, opts.MetadataTLS), opts.Now),
		limiter: newWindowLimiter(opts.RegistrationRate, time.Minute, opts.Now),
		jag:     newIDJAGVerifier(opts.IDJAG, opts.IdPIssuer), jagLifetime: opts.IDJAG.MaxLifetime,
		trusted: append([]string{opts.IdPIssuer}, opts.IDJAG.TrustedIssuers...), static: static,
	}
	for _, sc := range opts.Scopes {
		if sc != "" && !slices.Contains(s.scopes, sc) {
			s.scopes = append(s.scopes, sc)
		}
	}
	s.scopes = append(s.scopes, scopeOffline)
	if s.keys, err = newKeySet(opts.Keys); err != nil {
		return nil, err
	}
	if s.kit, err = web.NewKit(web.KitOptions{Door: "authserver", Pages: pages, Unchanged: "Nothing was authorized.",
		ClientAddr: opts.ClientAddr, Tracing: opts.Tracing, Logger: opts.Logger}); err != nil {
		return nil, err
	}
	if s.metadata, err = json.Marshal(s.serverMetadata()); err != nil {
		return nil, err
	}
	return s, nil
}

// scopeOffline is accepted and advertised so clients that ask for refresh
// tokens with it (SEP-2207) can; refresh tokens go to every client whose
// metadata lists the refresh_token grant, with or without it.
const scopeOffline = "offline_access"

// Issuer is the broker's issuer identifier (its public URL).
func (s *Server) Issuer() string { return s.opts.PublicURL }

// Register mounts the authorization server's routes on the site: the
// authorization request and the consent form on its browser side, the
// metadata, keys, token, revocation and registration endpoints (and their
// CORS preflights) on its API side. Each endpoint but the metadata is a
// server span (route, method and status, nothing from the query, form or
// headers, where codes, tokens, client secrets and redirect URIs travel).
func (s *Server) Register(site *web.Site) {
	s.kit.Route(site.Browser, "GET /authorize", "authserver.authorize", s.handleAuthorize)
	s.kit.Route(site.Browser, "POST /authorize/decision", "authserver.decision", s.handleDecision)
	s.kit.Route(site.API, "GET /.well-known/oauth-authorization-server", "", s.serveMetadata)
	s.kit.Route(site.API, "GET /.well-known/jwks.json", "", s.serveJWKS)
	s.kit.Route(site.API, "POST /token", "authserver.token", s.handleToken)
	s.kit.Route(site.API, "POST /revoke", "authserver.revoke", s.handleRevoke)
	s.kit.Route(site.API, "POST /register", "authserver.register", s.handleRegister)
	for _, p := range []string{"/token", "/revoke", "/register"} {
		s.kit.Route(site.API, "OPTIONS "+p, "", s.preflight)
	}
}

// asMetadata is the RFC 8414 document: the go-sdk's type (the one the
// broker reads upstream ones with), and the ID-JAG profiles it has no
// field for.
type asMetadata struct {
	oauthex.AuthServerMeta
	AuthorizationGrantProfilesSupported []string `json:"authorization_grant_profiles_supported,omitempty"`
}

func (s *Server) serverMetadata() asMetadata {
	base := s.opts.PublicURL
	m := asMetadata{AuthServerMeta: oauthex.AuthServerMeta{
		Issuer: base, AuthorizationEndpoint: base + "/authorize", TokenEndpoint: base + "/token",
		RevocationEndpoint: base + "/revoke", JWKSURI: base + "/.well-known/jwks.json",
		ScopesSupported: s.scopes, ResponseTypesSupported: []string{"code"}, ResponseModesSupported: []string{"query"},
		GrantTypesSupported:                        []string{grantCode, grantRefresh},
		TokenEndpointAuthMethodsSupported:          []string{authNone, authSecretBasic, authSecretPost},
		RevocationEndpointAuthMethodsSupported:     []string{authNone, authSecretBasic, authSecretPost},
		CodeChallengeMethodsSupported:              []string{"S256"},
		AuthorizationResponseIssParameterSupported: true,
		ClientIDMetadataDocumentSupported:          true,
	}}
	if s.opts.Registration {
		m.RegistrationEndpoint = base + "/register"
	}
	if s.opts.IDJAG.Policy.Mode != IDJAGOff {
		m.GrantTypesSupported = append(m.GrantTypesSupported, grantJWTBearer)
		m.AuthorizationGrantProfilesSupported = []string{profileIDJAG}
	}
	return m
}

func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Write(s.metadata)
}

func (s *Server) serveJWKS(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/jwk-set+json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Write(s.keys.jwks)
}

// preflight answers CORS preflights of the JSON endpoints, which browser
// based clients call cross-origin. None of them uses cookies.
func (s *Server) preflight(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Header().Set("Access-Control-Allow-Methods", "POST")
	w.Header().Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	w.Header().Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
}

// oauthError is an RFC 6749 error answer of the JSON endpoints. Desc is
// for the client; Err, if any, is for the log only.
type oauthError struct {
	Status int
	Code   string
	Desc   string
	Err    error
}

func (e *oauthError) Error() string { return e.Code + ": " + e.Desc }

func oerr(status int, code, format string, args ...any) *oauthError {
	return &oauthError{Status: status, Code: code, Desc: fmt.Sprintf(format, args...)}
}

// writeJSON answers v with no caching, as every token endpoint answer must.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"server_error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("Pragma", "no-cache")
	h.Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(status)
	w.Write(b)
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, e *oauthError) {
	if errors.Is(e.Err, vault.ErrUnavailable) {
		// The storage outage, whatever the step: retryable.
		s.opts.Telemetry.StoreUnavailable(telemetry.DoorAuthServer)
		outage.SetRetryAfter(w.Header())
		e = &oauthError{Status: http.StatusServiceUnavailable, Code: "temporarily_unavailable", Desc: outage.Message, Err: e.Err}
	}
	if e.Status >= 500 {
		s.log.Error("authserver: request failed", "path", r.URL.Path, "error", e.Code, "err", e.Err)
	} else {
		s.log.Info("authserver: request refused", "path", r.URL.Path, "error", e.Code, "reason", e.Desc)
	}
	if e.Status == http.StatusUnauthorized && strings.HasPrefix(r.Header.Get("Authorization"), "Basic ") {
		w.Header().Set("WWW-Authenticate", `Basic realm="credbroker"`)
	}
	writeJSON(w, e.Status, map[string]string{"error": e.Code, "error_description": e.Desc})
}

// readForm parses an application/x-www-form-urlencoded POST body of at
// most 64 KiB and refuses repeated parameters (RFC 6749 section 3.2).
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, *oauthError) {
	ct := r.Header.Get("Content-Type")
	if mt, _, _ := strings.Cut(ct, ";"); strings.TrimSpace(strings.ToLower(mt)) != "application/x-www-form-urlencoded" {
		return nil, oerr(http.StatusBadRequest, "invalid_request", "the request body must be application/x-www-form-urlencoded")
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		return nil, oerr(http.StatusBadRequest, "invalid_request", "the request body is not a valid form")
	}
	if len(r.URL.RawQuery) > 0 {
		return nil, oerr(http.StatusBadRequest, "invalid_request", "parameters belong in the request body, not the URL")
	}
	for k, v := range r.PostForm {
		if len(v) > 1 {
			return nil, oerr(http.StatusBadRequest, "invalid_request", "parameter %s is repeated", untrustedName(k))
		}
	}
	return r.PostForm, nil
}

// untrustedName renders a parameter name from a request for a message.
func untrustedName(k string) string {
	if len(k) > 40 {
		k = k[:40]
	}
	return fmt.Sprintf("%q", k)
}

// randomID returns n random bytes, base64url: ids and secrets.
func randomID(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic("authserver: crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// windowLimiter allows max events per key per window (fixed windows).
type windowLimiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu     sync.Mutex // guards the fields below
	start  time.Time
	counts map[string]int
}

func newWindowLimiter(max int, window time.Duration, now func() time.Time) *windowLimiter {
	return &windowLimiter{max: max, window: window, now: now, counts: map[string]int{}}
}

// allow counts one event for key and reports whether it is within the limit.
func (l *windowLimiter) allow(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if now.Sub(l.start) >= l.window || now.Before(l.start) {
		l.start, l.counts = now, map[string]int{}
	}
	if l.counts[key] >= l.max {
		return false
	}
	l.counts[key]++
	return true
}

// GC removes expired authorization codes, registered clients that were
// never used and spent ID-JAG ids past their expiry. The caller runs it
// periodically.
func (s *Server) GC(ctx context.Context) (codes, clients int, err error) {
	now := s.now()
	codes, err = s.store.DeleteExpiredAuthCodes(ctx, now.Add(-time.Hour))
	if err != nil {
		return codes, 0, err
	}
	clients, err = s.store.DeleteUnusedOAuthClients(ctx, now.Add(-s.opts.UnusedClientTTL))
	if err != nil {
		return codes, clients, err
	}
	if l := s.opts.IDJAG.Ledger; l != nil {
		// An assertion is refused after its exp plus the leeway anyway.
		_, err = l.DeleteSpentAssertions(ctx, now.Add(-idjagLeeway))
	}
	return codes, clients, err
}
