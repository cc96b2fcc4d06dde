package authserver

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/apps"
	"credbroker/internal/loopback"
	"credbroker/internal/untrusted"
	"credbroker/vault"
	"credbroker/web"
)

const (
	codeTTL    = time.Minute
	pendingTTL = 10 * time.Minute
	// pendingAAD separates sealed authorization requests from every other
	// value sealed with keys of the broker's ring.
	pendingAAD = "credbroker/authserver/pending/v1"
)

// pending is an authorization request validated by GET /authorize and
// waiting for the person's decision. It travels sealed in the consent
// form, so any replica can take the decision.
type pending struct {
	V           int      `json:"v"`
	ClientID    string   `json:"client_id"`
	RedirectURI string   `json:"redirect_uri"`
	State       string   `json:"state,omitempty"`
	Challenge   string   `json:"challenge"`
	Resource    string   `json:"resource"`
	Scopes      []string `json:"scopes,omitempty"`
	Issuer      string   `json:"iss"`
	Subject     string   `json:"sub"`
	Expires     int64    `json:"exp"`
	// Remembered marks a request the person had approved before, shown
	// the one-click page because the client's identity is not assured
	// (identityAssured): approving it issues a code under the remembered
	// consent and changes nothing else.
	Remembered bool `json:"remembered,omitempty"`
}

func (p *pending) principal() vault.Principal {
	return vault.Principal{Issuer: p.Issuer, Subject: p.Subject}
}

func (s *Server) sealPending(p pending) (string, error) {
	p.V = 1
	b, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(s.seal.Seal(b, []byte(pendingAAD))), nil
}

func (s *Server) openPending(sealed string) (pending, error) {
	if len(sealed) > 8<<10 {
		return pending{}, errors.New("too long")
	}
	ct, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return pending{}, err
	}
	b, _, err := s.seal.Open(ct, []byte(pendingAAD))
	if err != nil {
		return pending{}, err
	}
	var p pending
	if err := json.Unmarshal(b, &p); err != nil || p.V != 1 {
		return pending{}, errors.New("malformed")
	}
	if !s.now().Before(time.Unix(p.Expires, 0)) {
		return pending{}, errors.New("expired")
	}
	return p, nil
}

// handleAuthorize is GET /authorize (RFC 6749 section 4.1.1 with PKCE,
// RFC 8707 and RFC 9207). Until the client and its redirect URI are known
// to be valid, failures are an error page; afterwards they go back to the
// client's redirect URI with iss.
func (s *Server) handleAuthorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k, v := range q {
		if len(v) > 1 {
			s.renderError(w, web.ErrorPage{Heading: "The app's request is malformed",
				Message: "The app sent parameter " + untrustedName(k) + " more than once, so the broker cannot tell what it asks for.",
				Next:    "Tell the app's maker; nothing was authorized."})
			return
		}
	}
	clientID := q.Get("client_id")
	if clientID == "" {
		s.renderError(w, web.ErrorPage{Heading: "The app's request is incomplete",
			Message: "The app did not say who it is (no client_id).", Next: "Go back to the app and try again; nothing was authorized."})
		return
	}
	c, err := s.lookupClient(r.Context(), clientID)
	if err != nil {
		s.clientErrorPage(w, r, clientID, err)
		return
	}
	redirect := q.Get("redirect_uri")
	if redirect == "" && len(c.RedirectURIs) == 1 {
		redirect = c.RedirectURIs[0]
	}
	if redirect == "" || !redirectAllowed(c.RedirectURIs, redirect) {
		s.log.Info("authserver: authorization refused", "client_id", clientID, "reason", "unregistered redirect_uri")
		s.renderError(w, web.ErrorPage{Heading: "This app's return address is not registered",
			Message: "The app asked to be sent back to an address it did not register (redirect_uri " + untrusted.Quote(redirect) + "), so the broker will not send anything there.",
			Next:    "Nothing was authorized. If you did not start this, close this page; otherwise tell the app's maker."})
		return
	}
	state := q.Get("state")
	fail := func(code, desc string) {
		s.log.Info("authserver: authorization refused", "client_id", clientID, "error", code, "reason", desc)
		s.redirectWith(w, r, redirect, url.Values{"error": {code}, "error_description": {desc}, "state": {state}})
	}
	if rt := q.Get("response_type"); rt != "code" {
		fail("unsupported_response_type", "response_type must be code")
		return
	}
	challenge, method := q.Get("code_challenge"), q.Get("code_challenge_method")
	switch {
	case challenge == "":
		fail("invalid_request", "PKCE is required: send code_challenge with code_challenge_method=S256")
		return
	case method != "S256":
		fail("invalid_request", "code_challenge_method must be S256 (plain and absent methods are not accepted)")
		return
	case !validChallenge(challenge):
		fail("invalid_request", "code_challenge must be the 43-character base64url SHA-256 of the code verifier")
		return
	}
	resource := s.opts.Resource
	if raw, ok := q["resource"]; ok {
		if resource, ok = s.resourceOf(raw[0]); !ok {
			fail("invalid_target", s.resourceHint())
			return
		}
	}
	if !slices.Contains(c.GrantTypes, grantCode) {
		fail("unauthorized_client", "this client is not registered for the authorization_code grant")
		return
	}
	scopes := s.grantableScopes(q.Get("scope"))
	prompts := strings.Fields(q.Get("prompt"))
	noPrompt := slices.Contains(prompts, "none")
	person, ok := s.opts.Person(r)
	if !ok {
		if noPrompt {
			fail("login_required", "the person is not signed in to the broker")
			return
		}
		s.opts.StartSignIn(w, r, r.URL.RequestURI())
		return
	}
	if person.Principal.Issuer != s.opts.IdPIssuer {
		s.renderError(w, web.ErrorPage{Chrome: chromeOf(person), Status: http.StatusForbidden, Heading: "Signed in with another identity provider",
			Message: "This browser is signed in to the broker through an identity provider the broker no longer uses.",
			Next:    "Sign out and try again."})
		return
	}
	p := pending{
		ClientID: c.ID, RedirectURI: redirect, State: state, Challenge: challenge, Resource: resource,
		Scopes: scopes, Issuer: person.Principal.Issuer, Subject: person.Principal.Subject,
		Expires: s.now().Add(pendingTTL).Unix(),
	}
	if !slices.Contains(prompts, "consent") {
		app, covered, err := s.apps.Remembered(r.Context(), p.request(c, s.opts.Resource))
		switch {
		case err != nil:
			s.fail(w, r, person, "find app access", err)
			return
		case covered && identityAssured(c, redirect):
			// Consent given before covers this request, and only this
			// client can redeem the code (RFC 8252 section 8.6): no page.
			s.issueCode(w, r, c, p, app)
			return
		case covered:
			// Remembered, but any local program could be listening at
			// the redirect or claim the client_id: one click.
			if noPrompt {
				fail("interaction_required", "the person must confirm this app again: its identity cannot be assured (a public client or a loopback or private-use redirect URI)")
				return
			}
			p.Remembered = true
		}
	}
	if noPrompt {
		fail("consent_required", "the person has not approved this app for this request")
		return
	}
	s.renderConsent(w, r, person, c, p)
}

// renderConsent shows the consent page for p: the full one, or the
// one-click confirmation of a remembered consent (p.Remembered).
func (s *Server) renderConsent(w http.ResponseWriter, r *http.Request, person Person, c *client, p pending) {
	sealed, err := s.sealPending(p)
	if err != nil {
		s.fail(w, r, person, "seal request", err)
		return
	}
	page := consentPage{
		Chrome: chromeOf(person), ClientName: untrusted.Clip(c.displayName(), 120), Verified: c.host,
		RedirectHost: redirectHost(p.RedirectURI), RedirectTarget: redirectTarget(p.RedirectURI), Identity: person.Display,
		Scopes: scopeLines(p.Scopes), Request: sealed, Action: "/authorize/decision", Remembered: p.Remembered,
	}
	if p.Resource != s.opts.Resource {
		page.Gateway = p.Resource
	}
	s.kit.Render(w, http.StatusOK, "app_consent", page, formTarget(p.RedirectURI))
}

// identityAssured reports whether a code sent to redirect can only end up
// with client c, so a remembered consent may be applied without a page
// (RFC 8252 section 8.6): an https redirect URI that is not on a loopback
// host, of a confidential client (it must authenticate to redeem the
// code) or of a metadata-document client whose redirect is on the very
// host (and port) its document was fetched from. Never for a loopback or
// private-use redirect, where any program on the person's machine can
// listen or register the scheme, nor for another public client.
func identityAssured(c *client, redirect string) bool {
	u, err := url.Parse(redirect)
	if err != nil || u.Scheme != "https" || u.User != nil || loopback.Host(u.Hostname()) {
		return false
	}
	if c.AuthMethod != authNone {
		return true
	}
	return c.host != "" && strings.EqualFold(u.Host, c.host)
}

// redirectTarget renders a redirect URI for the one-click page: scheme,
// host, port and path, clipped (the query is the client's business).
func redirectTarget(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "?"
	}
	t := u.Scheme + ":"
	if u.Host != "" {
		t += "//" + u.Host
	}
	return untrusted.Clip(t+u.EscapedPath(), 200)
}

// clientErrorPage renders why a client_id could not be resolved.
func (s *Server) clientErrorPage(w http.ResponseWriter, r *http.Request, clientID string, err error) {
	var fe *FetchError
	switch {
	case errors.Is(err, errUnknownClient):
		s.log.Info("authserver: authorization refused", "client_id", untrusted.Clip(clientID, 200), "reason", "unknown client")
		s.renderError(w, web.ErrorPage{Status: http.StatusBadRequest, Heading: "Unknown app",
			Message: "The app identified itself as " + untrusted.Quote(clientID) + ", which is not registered with this broker.",
			Next:    "Nothing was authorized. Go back to the app and connect again; it may need to register afresh."})
	case errors.As(err, &fe):
		s.log.Info("authserver: authorization refused", "client_id", untrusted.Clip(clientID, 200), "reason", fe.Reason, "err", fe.Err)
		s.renderError(w, web.ErrorPage{Status: http.StatusBadRequest, Heading: "The app's description could not be used",
			Message: "The app identified itself by the metadata document at " + untrusted.Quote(clientID) + ", but " + fe.Reason + ".",
			Next:    "Nothing was authorized. Tell the app's maker."})
	default:
		s.fail(w, r, Person{}, "look up client", err)
	}
}

// validChallenge: an S256 challenge is 43 base64url characters.
func validChallenge(c string) bool {
	if len(c) != 43 {
		return false
	}
	_, err := base64.RawURLEncoding.DecodeString(c)
	return err == nil
}

// resourceHint says which resources the broker issues tokens for.
func (s *Server) resourceHint() string {
	if s.opts.MoreResources == nil {
		return "resource must be this broker's MCP endpoint, " + s.opts.Resource
	}
	return "resource must be this broker's MCP endpoint, " + s.opts.Resource + ", or one of its gateway endpoints, " + s.opts.PublicURL + "/mcp/u/{provider}"
}

// resourceOf returns the broker resource a requested resource indicator
// names: the MCP endpoint, or one of MoreResources. Scheme and host compare
// case-insensitively, everything else exactly.
func (s *Server) resourceOf(requested string) (string, bool) {
	if sameResource(requested, s.opts.Resource) {
		return s.opts.Resource, true
	}
	u, err := url.Parse(requested)
	if err != nil || u.Fragment != "" || strings.Contains(requested, "#") || !u.IsAbs() || s.opts.MoreResources == nil {
		return "", false
	}
	u.Scheme, u.Host = strings.ToLower(u.Scheme), strings.ToLower(u.Host)
	canon := u.String()
	return canon, s.opts.MoreResources(canon)
}

// sameResource compares a requested resource indicator with the broker's
// resource URI: scheme and host case-insensitively (the MCP specification
// asks servers to accept upper case there), everything else exactly. A
// fragment is never acceptable (RFC 8707 section 2).
func sameResource(requested, resource string) bool {
	u, err := url.Parse(requested)
	if err != nil || u.Fragment != "" || strings.Contains(requested, "#") || !u.IsAbs() {
		return false
	}
	r, _ := url.Parse(resource)
	return strings.EqualFold(u.Scheme, r.Scheme) && strings.EqualFold(u.Host, r.Host) &&
		u.EscapedPath() == r.EscapedPath() && u.RawQuery == r.RawQuery
}

// grantableScopes returns the requested scopes the broker grants, in
// request order; scopes it does not know are left out (the token response
// and the token's scope claim say what was granted).
func (s *Server) grantableScopes(raw string) []string {
	var out []string
	for _, sc := range strings.Fields(raw) {
		if slices.Contains(s.scopes, sc) && !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	return out
}

// request is what p asks the person to allow, for the apps core.
func (p *pending) request(c *client, primary string) apps.Request {
	return apps.Request{Principal: p.principal(), ClientID: c.ID, ClientName: c.displayName(), RedirectURI: p.RedirectURI, Scopes: p.Scopes,
		Resource: p.Resource, Primary: primary}
}

// decisionForm is the consent form's post: its limit and what its
// refusals say (web.Kit.PostedForm).
var decisionForm = web.Form{Limit: 32 << 10,
	SignedOut: web.ErrorPage{Message: "Your sign-in to the broker expired before you decided, so nothing was authorized.",
		Next: "Go back to the app and connect again."},
	Refused: web.ErrorPage{Message: "This form was not accepted: it is out of date or did not come from the page the broker showed you. Nothing was authorized.",
		Next: "Go back to the app and connect again."}}

// handleDecision is POST /authorize/decision: the consent form.
func (s *Server) handleDecision(w http.ResponseWriter, r *http.Request) {
	person, ok := s.opts.Person(r)
	if !s.kit.PostedForm(w, r, visitorOf(person, ok), decisionForm) {
		return
	}
	p, err := s.openPending(r.PostFormValue("request"))
	if err != nil {
		s.renderError(w, web.ErrorPage{Chrome: chromeOf(person), Status: http.StatusBadRequest, Heading: "This request has expired",
			Message: "Approval pages work for a few minutes only. Nothing was authorized.", Next: "Go back to the app and connect again."})
		return
	}
	if p.principal() != person.Principal {
		s.kit.SecurityEvent(r, "authorize_identity_mismatch", visitorOf(person, true))
		s.renderError(w, web.ErrorPage{Chrome: chromeOf(person), Status: http.StatusForbidden, Heading: "Signed in as someone else",
			Message: "This approval page was shown to another person signed in to the broker. Nothing was authorized.",
			Next:    "Go back to the app and connect again."})
		return
	}
	c, err := s.lookupClient(r.Context(), p.ClientID)
	if err != nil {
		s.clientErrorPage(w, r, p.ClientID, err)
		return
	}
	if !redirectAllowed(c.RedirectURIs, p.RedirectURI) {
		s.renderError(w, web.ErrorPage{Chrome: chromeOf(person), Heading: "This app's return address is no longer registered",
			Message: "The app changed its registered addresses since you started. Nothing was authorized.",
			Next:    "Go back to the app and connect again."})
		return
	}
	switch r.PostFormValue("decision") {
	case "approve":
		if p.Remembered {
			// The one-click page: the remembered consent must still cover
			// the request (the app may have been removed or its consent
			// narrowed meanwhile); if not, the full page asks afresh.
			app, covered, err := s.apps.Remembered(r.Context(), p.request(c, s.opts.Resource))
			switch {
			case err != nil:
				s.fail(w, r, person, "find app access", err)
			case covered:
				s.issueCode(w, r, c, p, app)
			default:
				p.Remembered = false
				s.renderConsent(w, r, person, c, p)
			}
			return
		}
		app, err := s.apps.Approve(r.Context(), p.request(c, s.opts.Resource))
		if err != nil {
			s.fail(w, r, Person{}, "record consent", err)
			return
		}
		s.issueCode(w, r, c, p, app)
	case "deny":
		s.log.Info("authserver: authorization denied by the person", "client_id", c.ID, "sub", p.Subject)
		s.redirectWith(w, r, p.RedirectURI, url.Values{"error": {"access_denied"},
			"error_description": {"the person did not allow this app"}, "state": {p.State}})
	default:
		s.renderError(w, web.ErrorPage{Chrome: chromeOf(person), Heading: "No decision", Message: "The form carried no decision.",
			Next: "Go back to the app and connect again."})
	}
}

// issueCode stores a one-minute code under app, the person's consent to
// c, bound to the client, redirect URI, PKCE challenge, resource and
// person, and sends the browser back to the client with it.
func (s *Server) issueCode(w http.ResponseWriter, r *http.Request, c *client, p pending, app vault.AppAccess) {
	code := randomID(32)
	now := s.now()
	if err := s.store.CreateAuthCode(r.Context(), vault.AuthCode{
		Key: vault.SecretKey(code), ClientID: c.ID, RedirectURI: p.RedirectURI, Principal: p.principal(),
		Scopes: p.Scopes, Resource: p.Resource, Challenge: p.Challenge, AppID: app.ID, FamilyID: randomID(16),
		Created: now, Expires: now.Add(codeTTL),
	}); err != nil {
		s.fail(w, r, Person{}, "store code", err)
		return
	}
	s.redirectWith(w, r, p.RedirectURI, url.Values{"code": {code}, "state": {p.State}})
}

// redirectWith sends the browser to the client's redirect URI with params
// added to its query, and the broker's issuer (RFC 9207) on every answer.
func (s *Server) redirectWith(w http.ResponseWriter, r *http.Request, redirect string, params url.Values) {
	u, err := url.Parse(redirect)
	if err != nil {
		s.fail(w, r, Person{}, "redirect", err)
		return
	}
	q := u.Query()
	for k, v := range params {
		if len(v) == 1 && v[0] != "" {
			q.Set(k, v[0])
		}
	}
	q.Set("iss", s.opts.PublicURL)
	u.RawQuery = q.Encode()
	status := http.StatusFound
	if r.Method == http.MethodPost {
		status = http.StatusSeeOther
	}
	http.Redirect(w, r, u.String(), status)
}

// formTarget is the CSP form-action source allowing the consent form's
// redirect to reach redirect (browsers check redirects after a form post).
func formTarget(redirect string) string {
	u, err := url.Parse(redirect)
	if err != nil {
		return ""
	}
	if u.Scheme == "http" || u.Scheme == "https" {
		return u.Scheme + "://" + u.Host
	}
	return u.Scheme + ":"
}
