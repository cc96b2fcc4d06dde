package oauthflow

import (
	"errors"
	"net/http"

	"credbroker/connections"
	"credbroker/provider"
	"credbroker/vault"
)

// redirectURL is the provider callback of p.
func (f *Flow) redirectURL(p *provider.Provider) string {
	return f.opts.PublicURL + "/oauth/" + p.Name + "/callback"
}

// restart is what a page says when only a fresh link helps.
const restart = "Go back to your app and ask it to connect again; it will give you a fresh link."

// open opens connect link id for the signed-in person (connections.Open)
// and renders the page for every outcome that stops the flow. ok is true
// only for an open request of the signed-in person at a configured
// provider.
func (f *Flow) open(w http.ResponseWriter, r *http.Request, s *session, id, stage string) (connections.ConnectRequest, bool) {
	cr, err := f.opts.Connections.Open(r.Context(), s.principal(), id, stage)
	if err != nil {
		f.linkFailed(w, r, s, id, stage, err)
		return cr, false
	}
	return cr, true
}

// linkFailed renders why connect link id cannot go on (a
// *connections.LinkError), or the generic failure.
func (f *Flow) linkFailed(w http.ResponseWriter, r *http.Request, s *session, id, stage string, err error) {
	var le *connections.LinkError
	if !errors.As(err, &le) {
		f.fail(w, r, s, http.StatusInternalServerError, "load grant", err)
		return
	}
	ch := s.chrome()
	switch le.Problem {
	case connections.LinkNotYours:
		ref := connections.Ref(id)
		f.securityEvent(r, "identity_mismatch", s, "stage", stage, "grant_ref", ref)
		f.renderMismatch(w, mismatchPage{Chrome: ch, Identity: s.Display, Reference: ref})
	case connections.LinkExpired:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect link has expired",
			Message: "Connect links work for a few minutes only. Nothing was connected.", Next: restart})
	case connections.LinkUsed:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect link was already used",
			Message: "The connection for this link is already complete. A link works once.",
			Next:    "Return to your app; it can continue. Manage connections on My connections."})
	case connections.LinkDeclined:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect request was declined",
			Message: "This request was declined earlier, so it cannot be used any more.",
			Next:    "If you do want to connect, ask your app to start again."})
	case connections.LinkProviderGone:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusNotFound, Heading: "Provider not available",
			Message: "This broker is not configured for the provider this link asks for.",
			Next:    "Tell your administrator; the provider may have been removed from the broker's configuration."})
	case connections.LinkScopeNotAllowed:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusBadRequest, Heading: "Permission not allowed",
			Message: "The app asked for a permission this broker does not allow for " + le.Provider.DisplayName + ".",
			Next:    "Ask your app to request fewer permissions, or ask your administrator."})
	case connections.LinkTooManyAttempts:
		name := "the provider"
		if le.Provider != nil {
			name = le.Provider.DisplayName
		}
		f.log.Warn("key entry: too many attempts for one link", "provider", name, "grant_ref", connections.Ref(id))
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusTooManyRequests, Heading: "Too many keys tried with this link",
			Message: "This connect link has checked as many keys as it may. Nothing was sent to " + name + " and nothing was stored.", Next: restart})
	case connections.LinkNotConsented:
		f.securityEvent(r, "callback_consent_mismatch", s, "provider", r.PathValue("provider"), "grant_ref", connections.Ref(id))
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusConflict, Heading: "Connection not approved",
			Message: "This connection was not approved by you in this browser. Nothing was connected.", Next: "Open the link from your app again."})
	default:
		f.renderError(w, errorPage{Chrome: ch, Status: http.StatusNotFound, Heading: "Unknown connect link",
			Message: "This connect link is not valid. It may be mistyped or it was never issued.", Next: restart})
	}
}

// handleLanding is GET /connect/{grant}: sign in, compare, show the
// provider's step: consent before a redirect, or a form.
func (f *Flow) handleLanding(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("grant")
	s := f.jar.session(r)
	if s == nil {
		if !connections.ValidLinkID(id) {
			f.linkFailed(w, r, nil, id, "landing", &connections.LinkError{Problem: connections.LinkUnknown})
			return
		}
		f.startLogin(w, r, "/connect/"+id)
		return
	}
	cr, ok := f.open(w, r, s, id, "landing")
	if !ok {
		return
	}
	switch step := cr.Provider.Kind.(type) {
	case provider.FormStep:
		f.formLanding(w, r, s, cr, step)
	case provider.RedirectStep:
		f.consentLanding(w, r, s, cr, step)
	default:
		f.fail(w, r, s, http.StatusInternalServerError, "landing", errors.New("the provider has no browser step"))
	}
}

// consentLanding shows the consent page of a redirect step.
func (f *Flow) consentLanding(w http.ResponseWriter, r *http.Request, s *session, cr connections.ConnectRequest, step provider.RedirectStep) {
	p, g := cr.Provider, cr.Grant
	ar, err := f.opts.Connections.AuthRequest(r.Context(), cr, f.redirectURL(p))
	if err != nil {
		f.providerUnavailable(w, r, s, p, err)
		return
	}
	page := consentPage{
		Chrome: s.chrome(), Provider: p.DisplayName, Domain: ar.Endpoint.Hostname(), ClientName: g.ClientName,
		Server: g.Server, ServerUnnamed: g.Server == vault.UnnamedServer,
		Identity: s.Display, Action: "/connect/" + g.ID,
	}
	if page.ClientName == "" && page.Server == "" {
		page.ClientName = "an unnamed client"
	}
	for _, sc := range ar.Scopes {
		page.Scopes = append(page.Scopes, plainScope(p, sc))
	}
	f.render(w, http.StatusOK, step.ConsentPage(), page, originOf(ar))
}

// originOf returns the origin of an authorization request's endpoint,
// where a consent form may lead.
func originOf(ar provider.AuthRequest) string {
	return ar.Endpoint.Scheme + "://" + ar.Endpoint.Host
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

// decline declines open request cr on the person's word and says so.
func (f *Flow) decline(w http.ResponseWriter, r *http.Request, s *session, cr connections.ConnectRequest) {
	if err := f.opts.Connections.Decline(r.Context(), s.principal(), cr.Grant.ID, "browser"); err != nil {
		var le *connections.LinkError
		if errors.As(err, &le) {
			f.linkFailed(w, r, s, cr.Grant.ID, "decision", err)
			return
		}
		f.fail(w, r, s, http.StatusConflict, "deny grant", err)
		return
	}
	f.renderDenied(w, deniedPage{Chrome: s.chrome(), Provider: cr.Provider.DisplayName})
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
	cr, ok := f.open(w, r, s, r.PathValue("grant"), "decision")
	if !ok {
		return
	}
	switch r.PostFormValue("decision") {
	case "deny":
		f.decline(w, r, s, cr)
		return
	case "approve":
	default:
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "No decision",
			Message: "The form did not say Approve or Deny. Nothing changed.", Next: "Open the link again and choose."})
		return
	}
	p, g := cr.Provider, cr.Grant
	if _, redirect := p.Kind.(provider.RedirectStep); !redirect {
		f.renderError(w, errorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Enter the key on the connect page",
			Message: p.DisplayName + " is connected with a key, entered on the connect page. Nothing was stored.",
			Next:    "Open the connect link again and enter your " + p.DisplayName + " key."})
		return
	}
	ar, err := f.opts.Connections.AuthRequest(r.Context(), cr, f.redirectURL(p))
	if err != nil {
		f.providerUnavailable(w, r, s, p, err)
		return
	}
	// The consent is not written here: Open has checked what approving
	// would (the signed-in person's grant, open, not expired), and the
	// sealed flow cookie below carries the consent, naming the person and
	// the grant, to the callback, which approves and completes the grant in
	// the one transaction that stores the connection (connections.Complete).
	// A browser that never came through this form has no flow cookie for
	// the grant.
	fs := flowState{Iss: s.Issuer, Sub: s.Subject, State: ar.State, Verifier: ar.Verifier, Nonce: ar.Nonce,
		Grant: g.ID, Provider: p.Name, Scopes: ar.Scopes, Expires: f.now().Add(flowTTL)}
	if fs.Expires.After(g.Expires) {
		fs.Expires = g.Expires
	}
	if err := f.jar.set(w, "flow", fs, flowTTL); err != nil {
		f.fail(w, r, s, http.StatusInternalServerError, "flow cookie", err)
		return
	}
	f.log.Info("consent given; sending browser to provider", "provider", p.Name, "grant_ref", connections.Ref(g.ID))
	setPageHeaders(w.Header(), originOf(ar))
	http.Redirect(w, r, ar.URL, http.StatusSeeOther)
}
