package oauthflow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2"

	"credbroker/connections"
	"credbroker/internal/loopback"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
)

// Options configures a Flow.
type Options struct {
	// PublicURL is the broker's external base URL (no trailing slash). The
	// redirect URIs are PublicURL+"/auth/callback" (broker sign-in) and
	// PublicURL+"/oauth/{provider}/callback".
	PublicURL string
	// Issuer, ClientID and ClientSecret are the broker's own OIDC login at
	// the organisation's IdP (the issuer of the MCP bearer tokens).
	Issuer       string
	ClientID     string
	ClientSecret vault.Secret
	// Connections decides every step of a connect link (open, decline,
	// a form's key, the provider's callback), lists and disconnects.
	Connections *connections.Service
	// CookieKeys is the key ring for cookies (pass kr.Derive("cookies")).
	CookieKeys *vault.Keyring
	HTTPClient *http.Client
	Logger     *slog.Logger
	Now        func() time.Time
	// DevMode (loopback only): cookies without Secure and __Host- prefix.
	DevMode bool
	// Telemetry receives audit events (nil: none).
	Telemetry *telemetry.Recorder
	// Tracing, when set, traces the browser steps (oauthflow.landing,
	// .consent, .key_entry, .signin_callback, .callback and the
	// .token_exchange inside a callback). Nil: off.
	Tracing trace.TracerProvider
	// Apps lists and removes the apps a person allowed at the broker's
	// authorization server ("Apps with access"); nil: no such section.
	Apps Apps
	// ClientAddr is the address of the client behind a request, which
	// security events name (nil: the connection's peer, see
	// internal/clientaddr).
	ClientAddr func(*http.Request) string
	// ClientMetadataURL is the broker's Client ID Metadata Document at
	// upstream MCP servers; served at ClientMetadataPath when it is that
	// https URL.
	ClientMetadataURL string
}

// Flow serves the browser side of credbroker. See the package doc for routes.
type Flow struct {
	opts    Options
	log     *slog.Logger
	now     func() time.Time
	client  *http.Client
	jar     *cookieJar
	kit     *web.Kit
	idp     *oidc.Provider
	idpConf oauth2.Config
	idpVer  *oidc.IDTokenVerifier
	// keepIdP: the catalogue has entries that connect by assertion, so
	// the sign-in asks for offline access and keeps the person's IdP
	// session (Connections.KeepIdPSession).
	keepIdP bool

	providers *provider.Registry
}

// New validates opts, discovers the IdP and parses the templates.
func New(ctx context.Context, opts Options) (*Flow, error) {
	var missing []string
	for _, m := range []struct {
		ok   bool
		name string
	}{
		{opts.PublicURL != "", "PublicURL"}, {opts.Issuer != "", "Issuer"}, {opts.ClientID != "", "ClientID"},
		{opts.Connections != nil, "Connections"},
		{opts.CookieKeys != nil, "CookieKeys"},
	} {
		if !m.ok {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("oauthflow: missing options: %s", strings.Join(missing, ", "))
	}
	pu, err := url.Parse(opts.PublicURL)
	if err != nil || pu.Host == "" || (pu.Scheme != "https" && !(pu.Scheme == "http" && loopback.Host(pu.Hostname()))) {
		return nil, fmt.Errorf("oauthflow: PublicURL %q must be an https URL (http only on loopback)", opts.PublicURL)
	}
	if opts.DevMode && !loopback.Host(pu.Hostname()) {
		return nil, fmt.Errorf("oauthflow: DevMode needs a loopback PublicURL, not %q", opts.PublicURL)
	}
	opts.PublicURL = strings.TrimRight(opts.PublicURL, "/")
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	f := &Flow{
		// With tracing on, every request to the IdP (discovery, keys, the
		// sign-in's code exchange) is an "idp.http <METHOD>" client span.
		opts: opts, log: opts.Logger, now: opts.Now, client: tracing.WrapIdPClient(opts.HTTPClient, opts.Tracing),
		jar:       newCookieJar(opts.CookieKeys, opts.DevMode || pu.Scheme == "http", opts.Now),
		providers: opts.Connections.Providers(),
	}
	f.kit, err = web.NewKit(web.KitOptions{Door: "oauthflow", Unchanged: "Nothing was connected.",
		RedactPath: redactPath, ClientAddr: opts.ClientAddr, Tracing: opts.Tracing, SpanAttrs: f.spanAttrs, Logger: opts.Logger})
	if err != nil {
		return nil, err
	}
	f.idp, err = oidc.NewProvider(f.clientCtx(ctx), opts.Issuer)
	if err != nil {
		return nil, fmt.Errorf("oauthflow: discover IdP %s: %w", opts.Issuer, err)
	}
	ep := f.idp.Endpoint()
	ep.AuthStyle = oauth2.AuthStyleInHeader
	f.idpConf = oauth2.Config{
		ClientID: opts.ClientID, ClientSecret: opts.ClientSecret.Reveal(),
		Endpoint: ep, RedirectURL: opts.PublicURL + "/auth/callback",
		Scopes: []string{oidc.ScopeOpenID, "email", "profile"},
	}
	f.idpVer = f.idp.Verifier(&oidc.Config{ClientID: opts.ClientID, Now: opts.Now})
	if f.keepIdP = f.providers.NeedsIdPSessions(); f.keepIdP {
		// A refresh token, so the broker can present a fresh ID token
		// of the person when it asks for an ID-JAG later; the IdP asks
		// for this consent once, at sign-in.
		f.idpConf.Scopes = append(f.idpConf.Scopes, oidc.ScopeOfflineAccess)
	}
	return f, nil
}

// clientCtx carries the configured HTTP client for x/oauth2 and go-oidc.
func (f *Flow) clientCtx(ctx context.Context) context.Context {
	ctx = context.WithValue(ctx, oauth2.HTTPClient, f.client)
	return oidc.ClientContext(ctx, f.client)
}

// tokenCtx carries, for x/oauth2, a copy of the configured HTTP client
// that never follows redirects: a token request carries the code, the
// PKCE verifier and the client secret, which a 307/308 would replay to
// wherever it points.
func (f *Flow) tokenCtx(ctx context.Context) context.Context {
	return context.WithValue(ctx, oauth2.HTTPClient, provider.NoRedirectClient(f.client))
}

// Register mounts the browser routes on the site's browser side, which
// gives every answer the page headers and every POST the cross-origin
// check; the steps of a connect link and the sign-in are server spans
// (Options.Tracing).
func (f *Flow) Register(site *web.Site) {
	for _, rt := range []struct {
		pattern, span string
		h             http.HandlerFunc
	}{
		{"GET /connect/{grant}", "oauthflow.landing", f.handleLanding},
		{"POST /connect/{grant}", "oauthflow.consent", f.handleDecision},
		{"POST /connect/{grant}/key", "oauthflow.key_entry", f.handleKeySubmit},
		{"GET /connections/{id}/key", "", f.handleReplaceKeyPage},
		{"POST /connections/{id}/key", "", f.handleReplaceKey},
		{"GET /auth/callback", "oauthflow.signin_callback", f.handleLoginCallback},
		{"GET /oauth/{provider}/callback", "oauthflow.callback", f.handleProviderCallback},
		{"GET /connections", "", f.handleConnections},
		{"POST /connections/{id}/disconnect", "", f.handleDisconnect},
		{"POST /connections/{provider}/connect", "", f.handleConnect},
		{"POST /connections/apps/{id}/remove", "", f.handleRemoveApp},
		{"POST /logout", "", f.handleLogout},
	} {
		f.kit.Route(site.Browser, rt.pattern, rt.span, rt.h)
	}
	// A document for authorization servers, not a page.
	site.API.HandleFunc("GET "+ClientMetadataPath, f.handleClientMetadata)
}

// startLogin redirects the browser to the IdP and remembers where to return.
func (f *Flow) startLogin(w http.ResponseWriter, r *http.Request, returnTo string) {
	ls := loginState{
		State: randomToken(), Verifier: oauth2.GenerateVerifier(), Nonce: randomToken(),
		ReturnTo: returnTo, Expires: f.now().Add(loginTTL),
	}
	if err := f.jar.set(w, "login", ls, loginTTL); err != nil {
		f.fail(w, r, nil, http.StatusInternalServerError, "internal", err)
		return
	}
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(ls.Verifier), oauth2.SetAuthURLParam("nonce", ls.Nonce)}
	if f.jar.loggedOut(r) {
		// After POST /logout the IdP must ask again, so the person can
		// switch accounts (its own session would sign the old one back in).
		opts = append(opts, oauth2.SetAuthURLParam("prompt", "login"))
	}
	http.Redirect(w, r, f.idpConf.AuthCodeURL(ls.State, opts...), http.StatusFound)
}

// safeReturn accepts only broker-relative paths.
func safeReturn(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.HasPrefix(p, "/\\") || strings.ContainsAny(p, "\r\n") {
		return "/connections"
	}
	return p
}

// handleLoginCallback completes the broker's own sign-in.
func (f *Flow) handleLoginCallback(w http.ResponseWriter, r *http.Request) {
	ls, ok := f.jar.login(r)
	f.jar.clear(w, "login")
	q := r.URL.Query()
	if !ok {
		f.renderError(w, web.ErrorPage{Heading: "Sign-in expired", Status: http.StatusBadRequest,
			Message: "This sign-in attempt is unknown or took too long, so it was not accepted.",
			Next:    "Open the link from your app again; it will ask you to sign in afresh."})
		return
	}
	if !web.EqualToken(q.Get("state"), ls.State) {
		f.securityEvent(r, "login_state_mismatch", nil)
		f.renderError(w, web.ErrorPage{Heading: "Sign-in not accepted", Status: http.StatusBadRequest,
			Message: "The answer from the sign-in service did not match the sign-in this browser started.",
			Next:    "Open the link from your app again."})
		return
	}
	if e := q.Get("error"); e != "" {
		f.renderError(w, web.ErrorPage{Heading: "Sign-in did not complete", Status: http.StatusBadRequest,
			Message: "The sign-in service did not sign you in (" + e + ").", Detail: untrusted.Clip(q.Get("error_description"), 300),
			Next: "Open the link from your app again and complete the sign-in."})
		return
	}
	ctx := f.clientCtx(r.Context())
	tok, err := f.idpConf.Exchange(f.tokenCtx(r.Context()), q.Get("code"), oauth2.VerifierOption(ls.Verifier))
	if err != nil {
		f.log.Warn("broker sign-in: code exchange failed", "err", provider.DescribeTokenError(err))
		f.renderError(w, web.ErrorPage{Heading: "Sign-in failed", Status: http.StatusBadGateway,
			Message: "The sign-in service did not accept the sign-in.", Next: "Open the link from your app again."})
		return
	}
	raw, _ := tok.Extra("id_token").(string)
	idt, err := f.idpVer.Verify(ctx, raw)
	if err != nil || !web.EqualToken(idt.Nonce, ls.Nonce) {
		f.log.Warn("broker sign-in: ID token rejected", "err", err)
		f.renderError(w, web.ErrorPage{Heading: "Sign-in failed", Status: http.StatusBadGateway,
			Message: "The sign-in service's answer could not be verified.", Next: "Open the link from your app again."})
		return
	}
	var claims struct {
		Email string `json:"email"`
		Name  string `json:"name"`
		User  string `json:"preferred_username"`
	}
	_ = idt.Claims(&claims)
	disp := provider.FirstNonEmpty(claims.Email, claims.User, claims.Name, idt.Subject)
	s := session{Issuer: idt.Issuer, Subject: idt.Subject, Display: untrusted.Clip(disp, 120), CSRF: randomToken(), Expires: f.now().Add(sessionTTL)}
	if err := f.jar.set(w, "session", s, sessionTTL); err != nil {
		f.fail(w, r, nil, http.StatusInternalServerError, "internal", err)
		return
	}
	f.jar.clear(w, "logged_out")
	if f.keepIdP {
		if err := f.opts.Connections.KeepIdPSession(r.Context(), s.principal(), tok, idt.Expiry); err != nil {
			f.log.Warn("broker sign-in: the IdP session was not kept; ID-JAGs for this person need another sign-in", "err", err)
		}
	}
	f.log.Info("broker sign-in", "iss", s.Issuer, "sub", s.Subject)
	http.Redirect(w, r, safeReturn(ls.ReturnTo), http.StatusSeeOther)
}

// securityEvent logs an attempt the broker refused. It names the acting
// browser session, never the owner of the grant involved.
func (f *Flow) securityEvent(r *http.Request, event string, s *session, attrs ...any) {
	f.kit.SecurityEvent(r, event, s.visitor(), attrs...)
}

// fail logs err and renders a generic error page.
func (f *Flow) fail(w http.ResponseWriter, r *http.Request, s *session, status int, what string, err error) {
	if errors.Is(err, vault.ErrUnavailable) {
		// The storage outage: retryable, and nothing of the step was kept,
		// so a connect link works again as it is.
		f.opts.Telemetry.StoreUnavailable(telemetry.DoorPage)
		next := ""
		if strings.HasPrefix(r.URL.Path, "/connect/") || strings.HasPrefix(r.URL.Path, "/oauth/") {
			next = "Open the connect link from your app again in a few seconds: it still works."
		}
		f.kit.Unavailable(w, r, s.chrome(), what, next, err)
		return
	}
	f.kit.Fail(w, r, s.chrome(), status, what, err)
}

// redactPath hides grant ids in logged paths.
func redactPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/connect/"); ok {
		return "/connect/" + connections.Ref(rest)
	}
	return p
}
