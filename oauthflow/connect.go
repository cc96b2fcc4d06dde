package oauthflow

import (
	"errors"
	"net/http"
	"net/url"
	"slices"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"credbroker/binding"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// redirectURL is the provider callback of p.
func (f *Flow) redirectURL(p *provider.Provider) string {
	return f.opts.PublicURL + "/oauth/" + p.Name + "/callback"
}

// grantScopes returns the scopes to request for g at p.
func grantScopes(p *provider.Provider, g vault.Grant) []string {
	scopes := slices.Clone(g.Scopes)
	if len(scopes) == 0 {
		scopes = slices.Clone(p.DefaultScopes)
	}
	if p.Type == provider.TypeOIDC && !slices.Contains(scopes, oidc.ScopeOpenID) {
		scopes = append([]string{oidc.ScopeOpenID}, scopes...)
	}
	return scopes
}

// loadGrant authorizes the session against the grant and renders the page
// for every outcome that stops the flow. ok is true only for an open grant
// of the signed-in principal at a configured provider.
func (f *Flow) loadGrant(w http.ResponseWriter, r *http.Request, s *session, id, stage string) (vault.Grant, *provider.Provider, bool) {
	g, err := f.opts.Grants.Authorize(r.Context(), id, s.principal())
	ch := s.chrome()
	switch {
	case errors.Is(err, binding.ErrWrongPrincipal):
		ref := binding.Ref(id)
		f.securityEvent(r, "identity_mismatch", s, "stage", stage, "grant_ref", ref)
		f.audit(r.Context(), telemetry.Event{Kind: telemetry.EventIdentityMismatch, Principal: s.principal(),
			Provider: g.Provider, Grant: id, Outcome: "refused_at_" + stage})
		f.renderMismatch(w, mismatchPage{Chrome: ch, Identity: s.Display, Reference: ref})
		return g, nil, false
	case errors.Is(err, binding.ErrNotFound):
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusNotFound, Heading: "Unknown connect link",
			Message: "This connect link is not valid. It may be mistyped or it was never issued.",
			Next:    "Go back to your app and ask it to connect again; it will give you a fresh link."})
		return g, nil, false
	case errors.Is(err, binding.ErrExpired):
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect link has expired",
			Message: "Connect links work for a few minutes only. Nothing was connected.",
			Next:    "Go back to your app and ask it to connect again; it will give you a fresh link."})
		return g, nil, false
	case err != nil:
		f.fail(w, r, s, http.StatusInternalServerError, "load grant", err)
		return g, nil, false
	}
	switch g.State {
	case vault.GrantCompleted:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect link was already used",
			Message: "The connection for this link is already complete. A link works once.",
			Next:    "Return to your app; it can continue. Manage connections on My connections."})
		return g, nil, false
	case vault.GrantDenied:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect request was declined",
			Message: "This request was declined earlier, so it cannot be used any more.",
			Next:    "If you do want to connect, ask your app to start again."})
		return g, nil, false
	}
	p, ok := f.providers.Lookup(g.Provider)
	if !ok {
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusNotFound, Heading: "Provider not available",
			Message: "This broker is not configured for the provider this link asks for.",
			Next:    "Tell your administrator; the provider may have been removed from the broker's configuration."})
		return g, nil, false
	}
	for _, sc := range g.Scopes {
		if !p.ScopeAllowed(sc) {
			f.renderError(w, errorPage{Chrome: ch, Status: http.StatusBadRequest, Heading: "Permission not allowed",
				Message: "The app asked for a permission this broker does not allow for " + p.DisplayName + ".",
				Next:    "Ask your app to request fewer permissions, or ask your administrator."})
			return g, nil, false
		}
	}
	return g, p, true
}

// handleLanding is GET /connect/{grant}: sign in, compare, show consent.
func (f *Flow) handleLanding(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("grant")
	s := f.jar.session(r)
	if s == nil {
		if !binding.ValidID(id) {
			f.renderError(w, errorPage{Status: http.StatusNotFound, Heading: "Unknown connect link",
				Message: "This connect link is not valid. It may be mistyped or it was never issued.",
				Next:    "Go back to your app and ask it to connect again; it will give you a fresh link."})
			return
		}
		f.startLogin(w, r, "/connect/"+id)
		return
	}
	g, p, ok := f.loadGrant(w, r, s, id, "landing")
	if !ok {
		return
	}
	if p.IsAPIKey() {
		f.keyLanding(w, r, s, g, p)
		return
	}
	conf, _, err := f.opts.Client.OAuthConfig(r.Context(), p, f.redirectURL(p))
	if err != nil {
		f.providerUnavailable(w, r, s, p, err)
		return
	}
	au, _ := url.Parse(conf.Endpoint.AuthURL)
	page := consentPage{
		Chrome: s.chrome(), Provider: p.DisplayName, Domain: au.Hostname(), ClientName: g.ClientName,
		Server: g.Server, ServerUnnamed: g.Server == vault.UnnamedServer,
		Identity: s.Display, Action: "/connect/" + g.ID,
	}
	if page.ClientName == "" && page.Server == "" {
		page.ClientName = "an unnamed client"
	}
	for _, sc := range grantScopes(p, g) {
		page.Scopes = append(page.Scopes, plainScope(p, sc))
	}
	f.renderConsent(w, page, origin(conf.Endpoint.AuthURL))
}

func (f *Flow) providerUnavailable(w http.ResponseWriter, r *http.Request, s *session, p *provider.Provider, err error) {
	f.log.Warn("provider unavailable", "provider", p.Name, "err", err)
	f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadGateway, Heading: p.DisplayName + " is not reachable",
		Message: "The broker could not reach " + p.DisplayName + ". Nothing was connected.",
		Next:    "Try the link again in a few minutes."})
}

// checkForm verifies the CSRF token of a POST against the session.
func (f *Flow) checkForm(w http.ResponseWriter, r *http.Request, s *session) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if err := r.ParseForm(); err != nil || !equalToken(r.PostFormValue("csrf"), s.CSRF) {
		f.securityEvent(r, "csrf_rejected", s, "path", redactPath(r.URL.Path))
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusForbidden, Heading: "Form expired",
			Message: "This form was not accepted: it is out of date or did not come from this page.",
			Next:    "Reload the page and try again."})
		return false
	}
	return true
}

func (f *Flow) signedOutPost(w http.ResponseWriter) {
	f.renderError(w, errorPage{Status: http.StatusUnauthorized, Heading: "You are signed out",
		Message: "Your sign-in expired before you submitted the form. Nothing changed.",
		Next:    "Open the link again; you will be asked to sign in first."})
}

// handleDecision is POST /connect/{grant}: Approve or Deny.
func (f *Flow) handleDecision(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s == nil {
		f.signedOutPost(w)
		return
	}
	if !f.checkForm(w, r, s) {
		return
	}
	g, p, ok := f.loadGrant(w, r, s, r.PathValue("grant"), "decision")
	if !ok {
		return
	}
	switch r.PostFormValue("decision") {
	case "deny":
		if _, err := f.opts.Grants.Deny(r.Context(), g.ID, s.principal()); err != nil {
			f.fail(w, r, s, http.StatusConflict, "deny grant", err)
			return
		}
		f.log.Info("grant denied in browser", "provider", p.Name, "grant_ref", binding.Ref(g.ID))
		f.renderDenied(w, deniedPage{Chrome: s.chrome(), Provider: p.DisplayName})
		return
	case "approve":
	default:
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "No decision",
			Message: "The form did not say Approve or Deny. Nothing changed.", Next: "Open the link again and choose."})
		return
	}
	if p.IsAPIKey() {
		f.keyApproveHere(w, s, p)
		return
	}
	conf, op, err := f.opts.Client.OAuthConfig(r.Context(), p, f.redirectURL(p))
	if err != nil {
		f.providerUnavailable(w, r, s, p, err)
		return
	}
	// The consent is not written here: loadGrant has checked what Approve
	// would (the signed-in person's grant, open, not expired), and the
	// sealed flow cookie below carries the consent, naming the person and
	// the grant, to the callback, which approves and completes the grant in
	// the one transaction that stores the connection (connections.Save). A
	// browser that never came through this form has no flow cookie for the
	// grant.
	fs := flowState{Iss: s.Issuer, Sub: s.Subject, State: randomToken(), Grant: g.ID, Provider: p.Name, Scopes: grantScopes(p, g), Expires: f.now().Add(flowTTL)}
	if fs.Expires.After(g.Expires) {
		fs.Expires = g.Expires
	}
	conf.Scopes = fs.Scopes
	var opts []oauth2.AuthCodeOption
	if p.PKCE {
		fs.Verifier = oauth2.GenerateVerifier()
		opts = append(opts, oauth2.S256ChallengeOption(fs.Verifier))
	}
	if op != nil {
		fs.Nonce = randomToken()
		opts = append(opts, oauth2.SetAuthURLParam("nonce", fs.Nonce))
	}
	for k, v := range p.ExtraAuthParams {
		opts = append(opts, oauth2.SetAuthURLParam(k, v))
	}
	if p.HostedDomain != "" {
		// Steers Google's account chooser; the callback checks the ID
		// token's hd claim, which is what proves the domain.
		opts = append(opts, oauth2.SetAuthURLParam("hd", p.HostedDomain))
	}
	if err := f.jar.set(w, "flow", fs, flowTTL); err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "flow cookie", err)
		return
	}
	f.log.Info("consent given; sending browser to provider", "provider", p.Name, "grant_ref", binding.Ref(g.ID))
	setPageHeaders(w.Header(), origin(conf.Endpoint.AuthURL))
	http.Redirect(w, r, conf.AuthCodeURL(fs.State, opts...), http.StatusSeeOther)
}
