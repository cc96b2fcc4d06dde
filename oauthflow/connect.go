package oauthflow

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"credbroker/connections"
	"credbroker/provider"
	"credbroker/web"
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

// linkPages are the pages of the connect-link problems that need no
// more than words ("%s" is the provider's name).
var linkPages = map[connections.LinkProblem]web.ErrorPage{
	connections.LinkUnknown: {Status: http.StatusNotFound, Heading: "Unknown connect link",
		Message: "This connect link is not valid. It may be mistyped or it was never issued.", Next: restart},
	connections.LinkExpired: {Status: http.StatusGone, Heading: "This connect link has expired",
		Message: "Connect links work for a few minutes only. Nothing was connected.", Next: restart},
	connections.LinkUsed: {Status: http.StatusGone, Heading: "This connect link was already used",
		Message: "The connection for this link is already complete. A link works once.",
		Next:    "Return to your app; it can continue. Manage connections on My connections."},
	connections.LinkDeclined: {Status: http.StatusGone, Heading: "This connect request was declined",
		Message: "This request was declined earlier, so it cannot be used any more.",
		Next:    "If you do want to connect, ask your app to start again."},
	connections.LinkProviderGone: {Status: http.StatusNotFound, Heading: "Provider not available",
		Message: "This broker is not configured for the provider this link asks for.",
		Next:    "Tell your administrator; the provider may have been removed from the broker's configuration."},
	connections.LinkScopeNotAllowed: {Status: http.StatusBadRequest, Heading: "Permission not allowed",
		Message: "The app asked for a permission this broker does not allow for %s.",
		Next:    "Ask your app to request fewer permissions, or ask your administrator."},
	connections.LinkTooManyAttempts: {Status: http.StatusTooManyRequests, Heading: "Too many keys tried with this link",
		Message: "This connect link has checked as many keys as it may. Nothing was sent to %s and nothing was stored.", Next: restart},
	connections.LinkNotConsented: {Status: http.StatusConflict, Heading: "Connection not approved",
		Message: "This connection was not approved by you in this browser. Nothing was connected.", Next: "Open the link from your app again."},
}

// linkFailed renders why connect link id cannot go on (a
// *connections.LinkError), or the generic failure.
func (f *Flow) linkFailed(w http.ResponseWriter, r *http.Request, s *session, id, stage string, err error) {
	var le *connections.LinkError
	if !errors.As(err, &le) {
		f.fail(w, r, s, http.StatusInternalServerError, "load grant", err)
		return
	}
	ref := connections.Ref(id)
	name := "the provider"
	if le.Provider != nil {
		name = le.Provider.DisplayName
	}
	switch le.Problem {
	case connections.LinkNotYours:
		f.securityEvent(r, "identity_mismatch", s, "stage", stage, "grant_ref", ref)
		f.renderMismatch(w, mismatchPage{Chrome: s.chrome(), Identity: s.Display, Reference: ref})
		return
	case connections.LinkTooManyAttempts:
		f.log.Warn("key entry: too many attempts for one link", "provider", name, "grant_ref", ref)
	case connections.LinkNotConsented:
		f.securityEvent(r, "callback_consent_mismatch", s, "provider", r.PathValue("provider"), "grant_ref", ref)
	}
	page, ok := linkPages[le.Problem]
	if !ok {
		page = linkPages[connections.LinkUnknown]
	}
	page.Chrome = s.chrome()
	if strings.Contains(page.Message, "%s") {
		page.Message = fmt.Sprintf(page.Message, name)
	}
	f.renderError(w, page)
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
		Chrome: s.chrome(), Provider: p.DisplayName, Domain: ar.Endpoint.Hostname(), requester: requesterOf(g),
		Identity: s.Display, Action: "/connect/" + g.ID, Why: connections.WhyAsked(g),
	}
	if gw, ok := p.Kind.(provider.Gateway); ok {
		page.Relay = gw.Upstream().URL
	}
	added := f.opts.Connections.Added(r.Context(), s.principal(), cr, ar.Scopes)
	for _, sc := range ar.Scopes {
		line := plainScope(p, sc)
		line.New = slices.Contains(added, sc)
		page.Scopes = append(page.Scopes, line)
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
	f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadGateway, Heading: p.DisplayName + " is not reachable",
		Message: "The broker could not reach " + p.DisplayName + ". Nothing was connected.",
		Next:    "Try the link again in a few minutes."})
}

// The two kinds of form post: their body's limit and what their refusal
// pages say (web.Kit.PostedForm gives the headings).
var (
	plainForm = web.Form{Limit: 4096,
		SignedOut: web.ErrorPage{Message: "Your sign-in expired before you submitted the form. Nothing changed.",
			Next: "Open the link again; you will be asked to sign in first."},
		Refused: web.ErrorPage{Message: "This form was not accepted: it is out of date or did not come from this page.",
			Next: "Reload the page and try again."}}
	// keyForm: every field at its largest, percent-encoded.
	keyForm = web.Form{Limit: 128 << 10, SignedOut: plainForm.SignedOut,
		Refused: web.ErrorPage{Message: "This form was not accepted: it is out of date or did not come from this page. Nothing was sent or stored.",
			Next: "Reload the page and enter the key again."}}
)

// postedForm reads a POSTed form of the signed-in person: their session,
// the body (bounded), and its CSRF token checked against the session
// (web.Kit.PostedForm, which renders a refusal).
func (f *Flow) postedForm(w http.ResponseWriter, r *http.Request, k web.Form) (*session, bool) {
	s := f.jar.session(r)
	return s, f.kit.PostedForm(w, r, s.visitor(), k)
}

// postedLink is the preamble of a connect link's form post: the posted
// form of the signed-in person (postedForm) and their open request,
// re-checked (open: the person against the request's, and that it is
// still open, so a replayed post after success stops here).
func (f *Flow) postedLink(w http.ResponseWriter, r *http.Request, k web.Form, stage string) (*session, connections.ConnectRequest, bool) {
	s, ok := f.postedForm(w, r, k)
	if !ok {
		return nil, connections.ConnectRequest{}, false
	}
	cr, ok := f.open(w, r, s, r.PathValue("grant"), stage)
	return s, cr, ok
}

// approved reads a form's decision: true for approve. For deny it calls
// deny; a form with neither (buttons names the two) gets a page saying
// nothing happened (nothing: what did not happen; next: what to do).
func (f *Flow) approved(w http.ResponseWriter, r *http.Request, s *session, buttons, nothing, next string, deny func()) bool {
	switch r.PostFormValue("decision") {
	case "approve":
		return true
	case "deny":
		deny()
	default:
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "No decision",
			Message: "The form did not say " + buttons + ". " + nothing, Next: next})
	}
	return false
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
	s, cr, ok := f.postedLink(w, r, plainForm, "decision")
	if !ok {
		return
	}
	if !f.approved(w, r, s, "Approve or Deny", "Nothing changed.", "Open the link again and choose.", func() { f.decline(w, r, s, cr) }) {
		return
	}
	p, g := cr.Provider, cr.Grant
	if _, redirect := p.Kind.(provider.RedirectStep); !redirect {
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Enter the key on the connect page",
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
	web.SetPageHeaders(w.Header(), originOf(ar))
	http.Redirect(w, r, ar.URL, http.StatusSeeOther)
}
