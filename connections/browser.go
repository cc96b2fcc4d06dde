package connections

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"credbroker/binding"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// The browser half of a connect request: what the broker's pages ask
// about a connect link, answered with typed outcomes. A link's page opens
// the request (Open), shows its step (a redirect's consent, with
// AuthRequest; a form's fields), and ends it: Decline, EnterKey (a form
// step), or Complete (the provider's callback). Every refusal is a
// *LinkError or one of the provider package's typed errors, and changes
// nothing.

// LinkProblem says why a connect link cannot go on.
type LinkProblem int

const (
	// LinkUnknown: no such link (mistyped, never issued, or long gone).
	LinkUnknown LinkProblem = iota + 1
	// LinkNotYours: the link was started by another person (audited).
	LinkNotYours
	// LinkExpired: the link's time ran out before it was used.
	LinkExpired
	// LinkUsed: the link completed already; a link works once.
	LinkUsed
	// LinkDeclined: the request was declined earlier.
	LinkDeclined
	// LinkProviderGone: the provider is no longer configured.
	LinkProviderGone
	// LinkScopeNotAllowed: the request asks for a scope the catalogue no
	// longer allows.
	LinkScopeNotAllowed
	// LinkTooManyAttempts: the link checked as many keys as it may.
	LinkTooManyAttempts
	// LinkNotConsented: the provider's answer reached a browser whose
	// consent (the flow the door carried) is not this person's for this
	// link and provider.
	LinkNotConsented
)

// LinkError: the connect link cannot go on. Nothing was changed.
type LinkError struct {
	Problem LinkProblem
	// Provider is the link's provider when it is configured (for words).
	Provider *provider.Provider
}

func (e *LinkError) Error() string {
	switch e.Problem {
	case LinkNotYours:
		return "connections: the connect link belongs to another person"
	case LinkExpired:
		return "connections: the connect link expired"
	case LinkUsed:
		return "connections: the connect link was already used"
	case LinkDeclined:
		return "connections: the connect request was declined"
	case LinkProviderGone:
		return "connections: the connect link's provider is not configured"
	case LinkScopeNotAllowed:
		return "connections: the connect link asks for a scope that is not allowed"
	case LinkTooManyAttempts:
		return "connections: too many keys were checked with this connect link"
	case LinkNotConsented:
		return "connections: this browser's consent is not for this connect link"
	}
	return "connections: no such connect link"
}

// linkErr is a *LinkError with problem pr.
func linkErr(pr LinkProblem, p *provider.Provider) error { return &LinkError{Problem: pr, Provider: p} }

// ConnectRequest is an open connect link: its grant and its provider.
type ConnectRequest struct {
	Grant    vault.Grant
	Provider *provider.Provider
}

// ValidLinkID reports whether id has the shape of a connect link's id (a
// page can refuse others before anyone signs in).
func ValidLinkID(id string) bool { return binding.ValidID(id) }

// Ref is the short, non-reversible reference of connect link id that logs,
// audit events and error pages carry instead of the id.
func Ref(id string) string { return binding.Ref(id) }

// Open returns connect link id as the signed-in person pr may use it: the
// request when it is open, theirs, and for a configured provider that
// still allows its scopes; otherwise a *LinkError. A link of another
// person is audited (identity_mismatch, refused at stage: the page that
// asked).
func (s *Service) Open(ctx context.Context, pr vault.Principal, id, stage string) (ConnectRequest, error) {
	g, err := s.opts.Grants.Authorize(ctx, id, pr)
	switch {
	case errors.Is(err, binding.ErrWrongPrincipal):
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventIdentityMismatch, Principal: pr,
			Provider: g.Provider, Grant: id, Via: "browser", Outcome: "refused_at_" + stage})
		return ConnectRequest{}, linkErr(LinkNotYours, nil)
	case errors.Is(err, binding.ErrNotFound):
		return ConnectRequest{}, linkErr(LinkUnknown, nil)
	case errors.Is(err, binding.ErrExpired):
		return ConnectRequest{}, linkErr(LinkExpired, nil)
	case err != nil:
		return ConnectRequest{}, fmt.Errorf("connections: open %s: %w", binding.Ref(id), err)
	}
	switch g.State {
	case vault.GrantCompleted:
		return ConnectRequest{}, linkErr(LinkUsed, nil)
	case vault.GrantDenied:
		return ConnectRequest{}, linkErr(LinkDeclined, nil)
	}
	p, ok := s.providers.Lookup(g.Provider)
	if !ok {
		return ConnectRequest{}, linkErr(LinkProviderGone, nil)
	}
	for _, sc := range g.Scopes {
		if !p.ScopeAllowed(sc) {
			return ConnectRequest{}, linkErr(LinkScopeNotAllowed, p)
		}
	}
	return ConnectRequest{Grant: g, Provider: p}, nil
}

// The connections page's Connect button: a connect request the signed-in
// person starts themselves, for a provider they have no usable connection
// to, which then goes through the same link (consent or form, provider,
// callback) as one an app started.

// NoBrowserStepError: the provider has nothing a person could connect in
// the browser (an MCP server that takes no token). Nothing was started.
type NoBrowserStepError struct{ Provider *provider.Provider }

func (e *NoBrowserStepError) Error() string {
	return fmt.Sprintf("%s needs no connection: the broker uses it without an account.", e.Provider.DisplayName)
}

// browserStep reports whether p connects through a browser step (a
// redirect to the provider or a form).
func browserStep(p *provider.Provider) bool {
	switch p.Kind.(type) {
	case provider.RedirectStep, provider.FormStep:
		return true
	}
	return false
}

// Offered returns the providers the connections page offers to connect,
// given conns (the person's connections, as List returns them): every
// configured provider with a browser step that none of conns serves with
// its default scopes (none yet, or only ones needing reconnection), in
// catalogue order. Connect starts a request for exactly these.
func (s *Service) Offered(conns []vault.Connection) []*provider.Provider {
	var out []*provider.Provider
	for _, name := range s.providers.Names() {
		p, ok := s.providers.Lookup(name)
		if !ok || !browserStep(p) {
			continue
		}
		var mine []vault.Connection
		for _, c := range conns {
			if c.Provider == p.Name {
				mine = append(mine, c)
			}
		}
		if c, _ := best(p, mine, p.DefaultScopes); c == nil {
			out = append(out, p)
		}
	}
	return out
}

// Connect starts the connect request signed-in person pr asked for on the
// connections page for provider name, with its default scopes (plus what a
// connection needing reconnection held): NeedsUser with the link, or
// Connected when pr already has a usable connection there (nothing is
// started). The limits of every connect request apply (ErrTooManyPending,
// ErrRateLimited), and an open request of pr for the same provider and
// scopes that no app named is handed out again instead of a new one.
// Refusals (also *UnknownProviderError, *NoBrowserStepError, an MCP
// server's *provider.UpstreamError) store nothing.
func (s *Service) Connect(ctx context.Context, pr vault.Principal, name string) (Outcome, error) {
	p, err := s.provider(name)
	if err != nil {
		return nil, err
	}
	if !browserStep(p) {
		return nil, &NoBrowserStepError{Provider: p}
	}
	return s.Ensure(ctx, Request{Principal: pr, Provider: p.Name, Via: "browser", CanAsk: true, ReuseOpen: true})
}

// Added returns those of scopes that pr's connections to cr's provider do
// not hold yet, when pr has one: what a consent page for more access (a
// step-up, missing scopes) names as new. Nil when pr has no connection
// there (everything is new) or cannot be listed.
func (s *Service) Added(ctx context.Context, pr vault.Principal, cr ConnectRequest, scopes []string) []string {
	conns, err := s.providerConnections(ctx, pr, cr.Provider.Name)
	if err != nil || len(conns) == 0 {
		return nil
	}
	var held []string
	for _, c := range conns {
		held = append(held, c.Scopes...)
	}
	return cr.Provider.MissingScopes(held, scopes)
}

// AuthRequest is the authorization request of open request cr (a
// redirect step) back to the broker's redirectURL: what the consent page
// shows (the provider's endpoint, the scopes) and where Approve sends the
// browser. Nothing is written; the door carries the result to Complete.
func (s *Service) AuthRequest(ctx context.Context, cr ConnectRequest, redirectURL string) (provider.AuthRequest, error) {
	scopes := slices.Clone(cr.Grant.Scopes)
	if len(scopes) == 0 {
		scopes = slices.Clone(cr.Provider.DefaultScopes)
	}
	ar, err := s.opts.Client.AuthRequest(ctx, cr.Provider, s.opts.Client.Scopes(cr.Provider, scopes), redirectURL)
	return ar, s.upstreamFailed(ctx, cr.Grant.Principal, cr.Provider, "browser", err)
}

// Decline closes connect request id of pr without a connection: the person
// said no, wherever they said it (the consent page, a form's Deny, the
// provider's access_denied, or their client's answer: via says which).
// This is the one place a decline is recorded: the declined metric and the
// connect_declined audit event. A request that is no longer open is a
// *LinkError.
func (s *Service) Decline(ctx context.Context, pr vault.Principal, id, via string) error {
	g, err := s.opts.Grants.Deny(ctx, id, pr)
	if err != nil {
		return s.transitionErr(ctx, id, pr, nil, err)
	}
	s.log.Info("connections: connect declined", "grant_ref", binding.Ref(id), "provider", g.Provider, "via", via)
	s.opts.Telemetry.Elicitation(telemetry.ElicitationDeclined)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventConnectDeclined, Principal: pr, Provider: g.Provider,
		Grant: id, Via: via, Server: g.Server})
	return nil
}

// transitionErr turns a refused transition of grant id into a *LinkError.
// p is the request's provider, when known.
func (s *Service) transitionErr(ctx context.Context, id string, pr vault.Principal, p *provider.Provider, err error) error {
	switch {
	case errors.Is(err, binding.ErrNotFound):
		return linkErr(LinkUnknown, p)
	case errors.Is(err, binding.ErrWrongPrincipal):
		return linkErr(LinkNotYours, p)
	case errors.Is(err, binding.ErrExpired):
		return linkErr(LinkExpired, p)
	case errors.Is(err, binding.ErrTooManyAttempts):
		return linkErr(LinkTooManyAttempts, p)
	case errors.Is(err, binding.ErrClosed):
		if g, lerr := s.opts.Grants.Authorize(ctx, id, pr); lerr == nil && g.State == vault.GrantDenied {
			return linkErr(LinkDeclined, p)
		}
		return linkErr(LinkUsed, p)
	}
	return fmt.Errorf("connections: connect request %s: %w", binding.Ref(id), err)
}

// EnterKey verifies what pr entered on the form of open request cr (a
// form step) and stores it, completing the request: each check sends the
// key to the provider, so a link allows only a few (LinkTooManyAttempts).
// Refusals are the provider's (*provider.KeyFormatError: nothing was sent;
// *provider.KeyRefusedError, provider.ErrAccountUnknown,
// provider.ErrProviderUnavailable), a *LinkError, or ErrRequestExpired
// (used or expired meanwhile). The result is metadata only.
func (s *Service) EnterKey(ctx context.Context, pr vault.Principal, cr ConnectRequest, values map[string]string) (vault.Connection, error) {
	if _, err := s.opts.Grants.Attempt(ctx, cr.Grant.ID, pr); err != nil {
		return vault.Connection{}, s.transitionErr(ctx, cr.Grant.ID, pr, cr.Provider, err)
	}
	ex, err := s.opts.Client.VerifyKey(ctx, cr.Provider, values)
	if err != nil {
		return vault.Connection{}, err
	}
	// Entering the key is the consent: Save approves and completes the
	// request in the transaction that stores it.
	return s.Save(ctx, pr, cr.Grant, cr.Provider, ex)
}

// Callback is the provider's answer at the broker's redirect URI, with
// what the browser carried there from the consent (the door checked the
// answer's state against it).
type Callback struct {
	// Principal is the person signed in to the broker now.
	Principal vault.Principal
	// Grant is the connect link the consent was for; Consent the person
	// who gave it (zero for a consent carried by an earlier release, which
	// recorded it in the store instead: the request is then approved).
	Grant   string
	Consent vault.Principal
	// Provider is the provider the answer came back for (its redirect
	// URI); RedirectURL that URI.
	Provider    string
	RedirectURL string
	// Request is the authorization request the consent sent the browser
	// with (its verifier, nonce and scopes).
	Request provider.AuthRequest
	// Code, or Error and ErrorDescription; Iss is RFC 9207's issuer of the
	// answer ("" when absent).
	Code, Error, ErrorDescription, Iss string
}

// IssuerError: the answer did not come from the provider the browser was
// sent to (RFC 9207: its iss was missing where required, or another
// issuer). Nothing was used.
type IssuerError struct {
	Provider *provider.Provider
	// Present says whether the answer carried an iss at all.
	Present bool
}

func (e *IssuerError) Error() string {
	return fmt.Sprintf("connections: the answer's issuer is not %s's (present: %v)", e.Provider.Name, e.Present)
}

// ProviderError: the provider answered the authorization request with an
// error. Denied (access_denied) means the person refused: the request was
// declined.
type ProviderError struct {
	Provider *provider.Provider
	// Code is the provider's error code (checked printable ASCII);
	// Description its own words (untrusted, clipped).
	Code, Description string
	Denied            bool
}

func (e *ProviderError) Error() string {
	return fmt.Sprintf("connections: %s answered error %q", e.Provider.Name, e.Code)
}

// Complete finishes a redirect step at the provider's callback: the link
// must still be open and pr's, the consent carried to the callback must be
// pr's for this link and provider, the answer must come from the provider
// the browser was sent to; then the code is exchanged, the account
// established and the connection stored, completing the request (single
// use). Errors: *LinkError, *IssuerError, *ProviderError (after declining
// on access_denied), provider.ErrCodeRejected, *provider.WrongDomainError,
// provider.ErrAccountUnknown, provider.ErrProviderUnavailable,
// ErrRequestExpired. The result is metadata only; the provider is returned
// once the link is known to be open.
func (s *Service) Complete(ctx context.Context, cb Callback) (vault.Connection, *provider.Provider, error) {
	cr, err := s.Open(ctx, cb.Principal, cb.Grant, "callback")
	if err != nil {
		return vault.Connection{}, nil, err
	}
	p, g := cr.Provider, cr.Grant
	// The consent travelled in the browser, naming the person; an earlier
	// release's consent names no one and recorded it in the store.
	consented := cb.Consent.Same(cb.Principal) || cb.Consent.IsZero() && g.State == vault.GrantApproved
	if !consented || p.Name != cb.Provider {
		return vault.Connection{}, p, linkErr(LinkNotConsented, p)
	}
	// RFC 9207: the answer must come from the provider the browser was
	// sent to (mix-up defence), checked before a code or an error is
	// believed.
	issuer, required, err := s.opts.Client.ResponseIssuer(ctx, p)
	switch {
	case err != nil:
		return vault.Connection{}, p, fmt.Errorf("%w: %v", provider.ErrProviderUnavailable, err)
	case cb.Iss == "" && required, cb.Iss != "" && issuer != "" && cb.Iss != issuer:
		return vault.Connection{}, p, &IssuerError{Provider: p, Present: cb.Iss != ""}
	}
	if cb.Error != "" {
		pe := &ProviderError{Provider: p, Code: cb.Error, Description: cb.ErrorDescription, Denied: cb.Error == "access_denied"}
		if pe.Denied {
			if err := s.Decline(ctx, cb.Principal, g.ID, "browser"); err != nil {
				s.log.Warn("connections: declining after access_denied", "grant_ref", binding.Ref(g.ID), "err", err)
			}
		}
		return vault.Connection{}, p, pe
	}
	ex, err := s.opts.Client.Exchange(ctx, p, cb.Principal, cb.RedirectURL, cb.Code, cb.Request)
	if err != nil {
		return vault.Connection{}, p, err
	}
	conn, err := s.Save(ctx, cb.Principal, g, p, ex)
	return conn, p, err
}
