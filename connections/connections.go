package connections

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"credbroker/binding"
	"credbroker/internal/replicache"
	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
)

// Options configures a Service.
type Options struct {
	Store vault.Store
	// Grants keeps the connect requests (nil: binding's defaults on Store,
	// with Now as its clock).
	Grants *binding.Service
	// Client talks to providers (catalogue, refresh, API calls, revocation).
	Client *provider.Client
	// PublicURL is the broker's external base URL: connect links are
	// PublicURL + "/connect/" + grant id.
	PublicURL string
	// Telemetry receives elicitation metrics and audit events (nil: none).
	Telemetry *telemetry.Recorder
	Logger    *slog.Logger
	Now       func() time.Time
	// Offboard are the further kinds of a person's data Offboard removes
	// (offboard.go); empty: connections and connect requests only.
	Offboard []OffboardStep
	// Watch, for a store replicas share, reports every replica's changes
	// of connections (Follow reads it): Ensure then answers from a
	// per-replica listing cache (listcache.go). Nil: every listing reads
	// the store.
	Watch vault.AppWatch
	// SoleWriter says this process is the only one writing Store (a bolt
	// file, a memory store) and reports every write of a connection to the
	// Service (vault.Announced with the Service as its ConnectionWrites):
	// the listing cache then trusts itself.
	SoleWriter bool
	// ListCacheSize bounds the listing cache (default 50000 people).
	ListCacheSize int
}

// Service makes the product's decisions about connections.
type Service struct {
	opts      Options
	log       *slog.Logger
	providers *provider.Registry
	stepUps   stepUpCounter
	listing   *listing // nil: no Watch and not a sole writer
	// locker excludes other replicas from connecting one person to one
	// provider by assertion at the same time (assertion.go).
	locker   vault.Locker
	refusals refusalMemo
}

// New validates opts and builds a Service.
func New(opts Options) (*Service, error) {
	var missing []string
	for _, m := range []struct {
		ok   bool
		name string
	}{{opts.Store != nil, "Store"}, {opts.Client != nil, "Client"}, {opts.PublicURL != "", "PublicURL"}} {
		if !m.ok {
			missing = append(missing, m.name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("connections: missing options: %s", strings.Join(missing, ", "))
	}
	opts.PublicURL = strings.TrimRight(opts.PublicURL, "/")
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Grants == nil {
		opts.Grants = binding.New(opts.Store, binding.Options{Now: opts.Now})
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Service{opts: opts, log: log, providers: opts.Client.Providers(), locker: opts.Store.Locker()}
	if opts.Watch != nil || opts.SoleWriter {
		s.listing = replicache.New[[]vault.Connection](opts.ListCacheSize, 50000, opts.SoleWriter)
	}
	return s, nil
}

// Providers returns the catalogue.
func (s *Service) Providers() *provider.Registry { return s.providers }

// Request is what a front door asks on a person's behalf.
type Request struct {
	// Principal is the person, from a validated credential.
	Principal vault.Principal
	// Provider is the catalogue name ("github").
	Provider string
	// Scopes the connection must cover (empty: the provider's defaults).
	Scopes []string
	// Account names one of several accounts (login or provider id).
	Account string
	// ClientName is the asking client's self-asserted name (untrusted),
	// shown on the consent page.
	ClientName string
	// Via names the front door for audit events: "mcp", "sidecar", "browser".
	Via string
	// Server is the configured name of the co-located MCP server asking
	// through the sidecar (vault.UnnamedServer for the unnamed secret):
	// trusted, the front door knows it from the server's secret. Empty for
	// MCP clients. Grants, audit events and the consent page carry it.
	Server string
	// CanAsk: the caller can send the person to a connect link. Without
	// it, NeedsUser carries no connect request.
	CanAsk bool
	// ReuseOpen: hand out the person's pending connect request for the
	// same provider, scopes and client when there is one, instead of a new
	// one. For callers that cannot carry a request between retries (2025-11-25
	// clients retry the whole call), so the link the person is looking at
	// stays valid.
	ReuseOpen bool
}

// Outcome is the answer to Ensure, Resume and Pick: Connected, NeedsUser,
// Declined, Cancelled or Ambiguous.
type Outcome interface{ outcome() }

// Connected: the connection to use. Conn is metadata only (no tokens).
type Connected struct {
	Conn     vault.Connection
	Provider *provider.Provider
}

// NeedsUser: the person must act in the browser. Grant and URL are set
// when the request could ask (Request.CanAsk) and a connect request was
// started or is still open.
type NeedsUser struct {
	Provider *provider.Provider
	Scopes   []string
	Why      Reason
	Grant    *vault.Grant
	URL      string
}

// Declined: the person explicitly refused; do not ask again unprompted.
type Declined struct{ Provider *provider.Provider }

// Cancelled: the person dismissed the request without deciding; the link
// stays usable until Until.
type Cancelled struct {
	Provider *provider.Provider
	Until    time.Time
}

// Ambiguous: several active accounts qualify and none was named.
type Ambiguous struct {
	Provider *provider.Provider
	// Accounts are the qualifying accounts' display names, sorted.
	Accounts []string
}

func (Connected) outcome() {}
func (NeedsUser) outcome() {}
func (Declined) outcome()  {}
func (Cancelled) outcome() {}
func (Ambiguous) outcome() {}

// ReasonKind says why the person must act.
type ReasonKind int

const (
	// NotConnected: no connection to the provider yet.
	NotConnected ReasonKind = iota
	// Reconnect: the stored access was revoked or has expired.
	Reconnect
	// MissingScopes: the connection lacks some requested scopes.
	MissingScopes
	// Pending: a connect request is open and not finished yet.
	Pending
	// Reregister: an upstream MCP server's authorization server no
	// longer knows the broker's registration, so the connection's tokens
	// are dead; the broker registers anew.
	Reregister
)

// Reason is why the person must act.
type Reason struct {
	Kind ReasonKind
	// Missing lists the scopes lacking (MissingScopes).
	Missing []string
	// Accepted: the person said they would open the link (Pending).
	Accepted bool
	// Assertion is why connecting without the browser was refused (an
	// upstream ID-JAG outcome code, assertion.go), when it was tried.
	Assertion string
}

// String is the reason in words, fit for a sentence after a colon.
func (r Reason) String() string {
	if words := AssertionRefusal(r.Assertion); words != "" {
		return "connecting it for you through your organisation's sign-in did not work: " + words
	}
	switch r.Kind {
	case Reconnect:
		return "the broker's access was revoked or has expired, so the account must be reconnected"
	case MissingScopes:
		return "the existing connection lacks the scopes " + strings.Join(r.Missing, " ")
	case Pending:
		return "the connect request is not finished yet"
	case Reregister:
		return "its authorization server no longer knows the broker's registration, so the account must be connected again (the broker registers anew)"
	}
	return "it is not connected yet"
}

// Message is what the person is told with the connect link.
func (n NeedsUser) Message() string {
	name := n.Provider.DisplayName
	if _, form := n.Provider.Kind.(provider.FormStep); form {
		return keyMessage(n)
	}
	switch {
	case n.Why.Kind == Pending && n.Why.Accepted:
		return fmt.Sprintf("Finish connecting your %s account in the browser, then retry.", name)
	case n.Why.Kind == Pending:
		return fmt.Sprintf("Connect your %s account to continue: open the link, sign in to the broker and approve access.", name)
	}
	if len(n.Scopes) == 0 {
		// The server's own defaults (an MCP server that names none).
		return fmt.Sprintf("Connect your %s account to continue: %s. Open the link, sign in to the broker and approve access.", name, n.Why)
	}
	return fmt.Sprintf("Connect your %s account to continue: %s. Open the link, sign in to the broker and approve access for scopes %s.",
		name, n.Why, strings.Join(n.Scopes, " "))
}

// NoLinkMessage is what a client that cannot open connect links (it did
// not declare elicitation.url, so n carries no request) tells the person:
// where to connect instead, on the broker's connections page at pageURL,
// whose Connect button asks for the provider's default scopes (Offered,
// Connect). Scopes beyond those need a client that can open links.
func (n NeedsUser) NoLinkMessage(pageURL string) string {
	name := n.Provider.DisplayName
	msg := fmt.Sprintf("A %s connection is needed (%s), but this client cannot open connect links (it did not declare the elicitation.url capability).", name, n.Why)
	if n.Why.Kind == MissingScopes {
		return msg + fmt.Sprintf(" The broker's connections page at %s connects %s with its default scopes only; granting %s needs a client that can open connect links.",
			pageURL, name, strings.Join(n.Why.Missing, " "))
	}
	return msg + fmt.Sprintf(" Open the broker's connections page at %s, choose Connect next to %s, then call again.", pageURL, name)
}

// Until is when a continuation handed out with n (a sealed requestState
// valid for ttl from now) stops being accepted: ttl from now, or the
// connect request's expiry when that comes first.
func (n NeedsUser) Until(now time.Time, ttl time.Duration) time.Time {
	exp := now.Add(ttl)
	if n.Grant != nil && n.Grant.Expires.Before(exp) {
		exp = n.Grant.Expires
	}
	return exp
}

// Message is what the model is told: the person declined.
func (d Declined) Message() string {
	return fmt.Sprintf("The user declined to connect %s. Do not ask again unless the user asks for it.", d.Provider.DisplayName)
}

// Message is what the model is told: the person dismissed the request.
// retry names what to call again to continue ("" when the caller says it
// otherwise).
func (c Cancelled) Message(retry string) string {
	msg := fmt.Sprintf("Nothing was connected: the user dismissed the request to connect %s. The link stays usable until %s",
		c.Provider.DisplayName, c.Until.UTC().Format(time.RFC3339))
	if retry != "" {
		return msg + "; call " + retry + " again to continue."
	}
	return msg + "."
}

// Resolve checks a provider name and the requested scopes (empty: the
// provider's defaults; each must be allowed by the catalogue entry) and
// returns them deduplicated.
func (s *Service) Resolve(name string, scopes []string) (*provider.Provider, []string, error) {
	p, err := s.provider(name)
	if err != nil {
		return nil, nil, err
	}
	if _, form := p.Kind.(provider.FormStep); form && len(scopes) > 0 {
		// What a person enters has no scopes: asking for one could never
		// be satisfied.
		return nil, nil, &ScopeError{Provider: p, Scope: scopes[0]}
	}
	if len(scopes) == 0 {
		scopes = p.DefaultScopes
	}
	var out []string
	for _, sc := range scopes {
		if !p.ScopeAllowed(sc) {
			return nil, nil, &ScopeError{Provider: p, Scope: sc}
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	return p, out, nil
}

func (s *Service) provider(name string) (*provider.Provider, error) {
	p, ok := s.providers.Lookup(name)
	if name == "" || !ok {
		return nil, &UnknownProviderError{Name: name, Known: s.providers.Names()}
	}
	return p, nil
}

// List returns p's connections, metadata only, ordered by id.
func (s *Service) List(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	all, err := s.opts.Store.ListConnections(ctx, p)
	if err != nil {
		return nil, err
	}
	return mine(p, all), nil
}

// connectionsTo returns req's provider and req's person's connections to
// it, ordered by account name.
func (s *Service) connectionsTo(ctx context.Context, req Request) (*provider.Provider, []vault.Connection, error) {
	p, err := s.provider(req.Provider)
	if err != nil {
		return nil, nil, err
	}
	conns, err := s.providerConnections(ctx, req.Principal, p.Name)
	if err != nil {
		return nil, nil, err
	}
	return p, conns, nil
}

// providerConnections returns p's connections to provider, ordered by
// account name.
func (s *Service) providerConnections(ctx context.Context, p vault.Principal, provider string) ([]vault.Connection, error) {
	all, err := s.List(ctx, p)
	if err != nil {
		return nil, err
	}
	return ofPersonTo(nil, all, p, provider), nil
}

// ofPersonTo appends to out those of all that are p's and to provider,
// ordered by account name (all may be the listing cache's: it is only
// read).
func ofPersonTo(out, all []vault.Connection, p vault.Principal, provider string) []vault.Connection {
	for _, c := range all {
		if c.Provider == provider && c.Principal.Same(p) {
			out = append(out, c)
		}
	}
	slices.SortStableFunc(out, func(a, b vault.Connection) int { return cmp.Compare(AccountName(a), AccountName(b)) })
	return out
}

// AccountName is how a connection's account is shown: its login, or its
// provider id when there is none.
func AccountName(c vault.Connection) string {
	if c.AccountLogin != "" {
		return c.AccountLogin
	}
	return c.AccountID
}

// accountMatches reports whether c is the account a caller named.
func accountMatches(c vault.Connection, account string) bool {
	return account != "" && (account == c.AccountLogin || account == c.AccountID)
}

// best picks the connection to use among conns (one provider) for
// scopes: active, covering the scopes, most recently used (then created).
// Without one it says why.
func best(p *provider.Provider, conns []vault.Connection, scopes []string) (*vault.Connection, Reason) {
	why := Reason{Kind: NotConnected}
	var out *vault.Connection
	for i := range conns {
		c := &conns[i]
		switch {
		case c.Status == vault.StatusNeedsReconnect:
			why = Reason{Kind: Reconnect}
		case len(p.MissingScopes(c.Scopes, scopes)) > 0:
			why = Reason{Kind: MissingScopes, Missing: p.MissingScopes(c.Scopes, scopes)}
		default:
			if out == nil || c.LastUsed.After(out.LastUsed) || c.LastUsed.Equal(out.LastUsed) && c.Created.After(out.Created) {
				out = c
			}
		}
	}
	return out, why
}

// Ensure answers whether req's person has a connection to req.Provider
// covering req.Scopes: Connected, or NeedsUser with a new connect request
// (when req.CanAsk).
func (s *Service) Ensure(ctx context.Context, req Request) (Outcome, error) {
	p, scopes, err := s.Resolve(req.Provider, req.Scopes)
	if err != nil {
		return nil, err
	}
	all, err := s.listed(ctx, req.Principal) // the hot path: the listing cache (read only)
	if err != nil {
		return nil, err
	}
	var few [2]vault.Connection // most people have one or two connections to a provider: no allocation
	conns := ofPersonTo(few[:0], all, req.Principal, p.Name)
	if c, why := best(p, conns, scopes); c == nil {
		return s.start(ctx, req, p, s.keepGranted(p, conns, req.Account, scopes), why)
	} else {
		return Connected{Conn: c.Clone(), Provider: p}, nil
	}
}

// keepGranted returns the scopes to ask for when the person must connect
// again: scopes plus what the connection being upgraded or reconnected
// (the named account's, else the most recently used) already holds, so a
// new grant does not drop earlier scopes. Scopes the catalogue no longer
// allows are not asked for again.
func (s *Service) keepGranted(p *provider.Provider, conns []vault.Connection, account string, scopes []string) []string {
	var base *vault.Connection
	for i := range conns {
		c := &conns[i]
		if account != "" && !accountMatches(*c, account) {
			continue
		}
		if base == nil || c.LastUsed.After(base.LastUsed) || c.LastUsed.Equal(base.LastUsed) && c.Created.After(base.Created) {
			base = c
		}
	}
	if base == nil {
		return scopes
	}
	var held []string
	for _, sc := range base.Scopes {
		if p.ScopeAllowed(sc) {
			held = append(held, sc)
		}
	}
	return p.UnionScopes(held, scopes)
}

// start opens a connect request for req (when it can ask).
func (s *Service) start(ctx context.Context, req Request, p *provider.Provider, scopes []string, why Reason) (Outcome, error) {
	if s.opts.Client.ConnectsByAssertion(p) {
		o, refused, err := s.connectByAssertion(ctx, req, p, scopes)
		if o != nil || err != nil {
			return o, err
		}
		why.Assertion = refused
	}
	need := NeedsUser{Provider: p, Scopes: slices.Clone(scopes), Why: why}
	if !req.CanAsk {
		return need, nil
	}
	if err := s.upstreamUsable(ctx, req, p); err != nil {
		return nil, err
	}
	if req.ReuseOpen && req.Server == "" {
		g, ok, err := s.opts.Grants.Pending(ctx, req.Principal, p.Name, scopes, req.ClientName)
		if err != nil {
			return nil, fmt.Errorf("connections: find an open connect request: %w", err)
		}
		if ok {
			s.log.Info("connections: open connect request handed out again", "grant_ref", binding.Ref(g.ID), "provider", p.Name, "via", req.Via)
			need.Grant, need.URL = &g, s.ConnectURL(g.ID)
			return need, nil
		}
	}
	g, err := s.opts.Grants.CreateFrom(ctx, vault.Grant{Principal: req.Principal, Provider: p.Name, Scopes: scopes,
		ClientName: req.ClientName, Server: req.Server, Why: why.Assertion})
	switch {
	case errors.Is(err, ErrTooManyPending), errors.Is(err, ErrRateLimited):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("connections: start connect request: %w", err)
	}
	s.log.Info("connections: connect requested", "grant_ref", binding.Ref(g.ID), "provider", p.Name, "via", req.Via, "server", req.Server)
	s.opts.Telemetry.Elicitation(telemetry.ElicitationIssued)
	need.Grant, need.URL = &g, s.ConnectURL(g.ID)
	return need, nil
}

// Reconnect starts a connect request because the provider refused the
// stored access (a Call failed with provider.ErrNeedsReconnect). It asks
// for the scopes the connection held (and the defaults).
func (s *Service) Reconnect(ctx context.Context, req Request) (Outcome, error) {
	return s.reconnect(ctx, req, Reason{Kind: Reconnect})
}

// reconnect is Reconnect, saying why.
func (s *Service) reconnect(ctx context.Context, req Request, why Reason) (Outcome, error) {
	p, conns, err := s.connectionsTo(ctx, req)
	if err != nil {
		return nil, err
	}
	var dead []vault.Connection
	for _, c := range conns {
		if c.Status == vault.StatusNeedsReconnect {
			dead = append(dead, c)
		}
	}
	return s.start(ctx, req, p, s.keepGranted(p, dead, req.Account, p.DefaultScopes), why)
}

// ConnectURL is the browser link of connect request id.
func (s *Service) ConnectURL(id string) string {
	return s.opts.PublicURL + "/connect/" + id
}

// PageURL is the broker's connections page, where a person connects and
// disconnects providers themselves (NeedsUser.NoLinkMessage names it).
func (s *Service) PageURL() string { return s.opts.PublicURL + "/connections" }

// Answer is the person's reply to a relayed connect request, as the
// client reports it on a retry.
type Answer string

const (
	// NoAnswer: the client retried without relaying an answer.
	NoAnswer Answer = ""
	// Accept: the person agreed to open the link (not that they finished).
	Accept Answer = "accept"
	// Decline: the person explicitly refused.
	Decline Answer = "decline"
	// Cancel: the person dismissed the request without deciding.
	Cancel Answer = "cancel"
)

// ParseAnswer checks an untrusted elicitation action.
func ParseAnswer(action string) (Answer, bool) {
	switch a := Answer(action); a {
	case Accept, Decline, Cancel:
		return a, true
	}
	return NoAnswer, false
}

// Resume continues connect request grantID (from a sealed continuation the
// front door opened and bound to req's person and arguments) with the
// person's answer: Connected once it completed (or the person connected by
// another route), Declined, Cancelled, or NeedsUser with the same request
// while it is open. When req.Account is set, the connection must be that
// account.
func (s *Service) Resume(ctx context.Context, req Request, grantID string, answer Answer) (Outcome, error) {
	p, scopes, err := s.Resolve(req.Provider, req.Scopes)
	if err != nil {
		return nil, err
	}
	g, err := s.opts.Grants.Authorize(ctx, grantID, req.Principal)
	switch {
	case errors.Is(err, binding.ErrExpired):
		s.opts.Telemetry.Elicitation(telemetry.ElicitationExpired)
		return nil, ErrRequestExpired
	case errors.Is(err, binding.ErrNotFound), errors.Is(err, binding.ErrWrongPrincipal):
		return nil, ErrUnknownRequest
	case err != nil:
		return nil, fmt.Errorf("connections: resume %s: %w", binding.Ref(grantID), err)
	}
	if g.Provider != p.Name {
		return nil, ErrUnknownRequest
	}
	if o, done, err := s.settled(ctx, req, p, g); done {
		return o, err
	}
	switch answer {
	case Decline:
		var le *LinkError
		if err := s.Decline(ctx, req.Principal, g.ID, req.Via); err != nil && !errors.As(err, &le) {
			return nil, err
		}
		return Declined{Provider: p}, nil
	case Cancel:
		s.opts.Telemetry.Elicitation(telemetry.ElicitationCancelled)
		return Cancelled{Provider: p, Until: g.Expires}, nil
	}
	// Connected meanwhile by another route (the connections page)?
	conns, err := s.providerConnections(ctx, req.Principal, p.Name)
	if err != nil {
		return nil, err
	}
	if c, _ := best(p, conns, scopes); c != nil {
		s.opts.Telemetry.Elicitation(telemetry.ElicitationCompleted)
		return s.named(ctx, req, p, *c)
	}
	if g.Why != "" && s.opts.Client.ConnectsByAssertion(p) {
		// Asked because connecting without the browser was refused: the
		// person may have signed in through the link meanwhile (the
		// refusals that ask the IdP are held a minute), so try again.
		if o, _, err := s.connectByAssertion(ctx, req, p, scopes); o != nil || err != nil {
			return o, err
		}
	}
	g, err = s.opts.Grants.Round(ctx, g.ID, req.Principal)
	switch {
	case errors.Is(err, ErrTooManyRounds):
		return nil, err
	case errors.Is(err, binding.ErrExpired):
		s.opts.Telemetry.Elicitation(telemetry.ElicitationExpired)
		return nil, ErrRequestExpired
	case err != nil:
		return nil, fmt.Errorf("connections: count round of %s: %w", binding.Ref(g.ID), err)
	}
	if o, done, err := s.settled(ctx, req, p, g); done {
		return o, err
	}
	return NeedsUser{Provider: p, Scopes: g.Scopes, Why: Reason{Kind: Pending, Accepted: answer == Accept},
		Grant: &g, URL: s.ConnectURL(g.ID)}, nil
}

// settled answers a connect request that is final: Connected when it
// completed, Declined when it was refused.
func (s *Service) settled(ctx context.Context, req Request, p *provider.Provider, g vault.Grant) (Outcome, bool, error) {
	switch g.State {
	case vault.GrantCompleted:
		s.opts.Telemetry.Elicitation(telemetry.ElicitationCompleted)
		// From the listing cache (a miss fills it for the person's next
		// call); a connection made on another replica that the cache has
		// not seen yet is looked for in the store.
		for _, list := range []func(context.Context, vault.Principal, string) ([]vault.Connection, error){s.listedTo, s.providerConnections} {
			conns, err := list(ctx, req.Principal, p.Name)
			if err != nil {
				return nil, true, err
			}
			for _, c := range conns {
				if c.ID == g.ConnectionID {
					o, err := s.named(ctx, req, p, c)
					return o, true, err
				}
			}
		}
		return nil, true, ErrConnectionGone
	case vault.GrantDenied:
		// Recorded when it was declined (Decline).
		return Declined{Provider: p}, true, nil
	}
	return nil, false, nil
}

// named returns c, or, when req names another account, that account if it
// is connected and active: a retry never runs as another account than the
// one named.
func (s *Service) named(ctx context.Context, req Request, p *provider.Provider, c vault.Connection) (Outcome, error) {
	if req.Account == "" || accountMatches(c, req.Account) {
		return Connected{Conn: c, Provider: p}, nil
	}
	conns, err := s.providerConnections(ctx, req.Principal, p.Name)
	if err != nil {
		return nil, err
	}
	for _, other := range conns {
		if accountMatches(other, req.Account) && other.Status != vault.StatusNeedsReconnect {
			return Connected{Conn: other, Provider: p}, nil
		}
	}
	return nil, &AccountError{Provider: p, Named: req.Account, Accounts: names(conns), OtherConnected: true}
}

// Pick chooses the connection a provider call runs as: Connected; NeedsUser
// when nothing usable is connected (a connect request is started when
// req.CanAsk); Ambiguous when several accounts qualify and none is named;
// *AccountError when the named account is not connected. Like Ensure it
// is the hot path and reads the listing cache (listed): a change made on
// another replica is seen within ListBound, and until then the call
// that uses the connection reads it afresh (Call: a connection deleted
// meanwhile is vault.ErrNotFound, one marked needs_reconnect
// provider.ErrNeedsReconnect).
func (s *Service) Pick(ctx context.Context, req Request) (Outcome, error) {
	p, err := s.provider(req.Provider)
	if err != nil {
		return nil, err
	}
	if err := s.gatewayOnly(p); err != nil {
		return nil, err
	}
	conns, err := s.listedTo(ctx, req.Principal, p.Name)
	if err != nil {
		return nil, err
	}
	var match, active []vault.Connection
	for _, c := range conns {
		if req.Account == "" || accountMatches(c, req.Account) {
			match = append(match, c)
			if c.Status != vault.StatusNeedsReconnect {
				active = append(active, c)
			}
		}
	}
	switch {
	case len(conns) == 0:
		return s.start(ctx, req, p, p.DefaultScopes, Reason{Kind: NotConnected})
	case len(match) == 0:
		return nil, &AccountError{Provider: p, Named: req.Account, Accounts: names(conns)}
	case len(active) == 0:
		return s.start(ctx, req, p, p.DefaultScopes, Reason{Kind: Reconnect})
	case len(active) > 1:
		return Ambiguous{Provider: p, Accounts: names(active)}, nil
	}
	return Connected{Conn: active[0], Provider: p}, nil
}

func names(conns []vault.Connection) []string {
	out := make([]string, 0, len(conns))
	for _, c := range conns {
		out = append(out, AccountName(c))
	}
	return out
}

// Call performs an API request with connection c (metadata from Pick or
// Ensure) and records the use. Errors are the provider package's:
// *provider.RequestError (refused before sending), provider.ErrNeedsReconnect
// (then Reconnect), provider.ErrProviderUnavailable, vault.ErrNotFound
// (disconnected meanwhile), or the context's.
func (s *Service) Call(ctx context.Context, c vault.Connection, req provider.APIRequest) (provider.APIResponse, error) {
	if p, ok := s.providers.Lookup(c.Provider); ok {
		if err := s.gatewayOnly(p); err != nil {
			return provider.APIResponse{}, err
		}
	}
	resp, err := s.opts.Client.Do(ctx, c.ID, req)
	if err != nil {
		return provider.APIResponse{}, err
	}
	s.recordUse(ctx, c)
	return resp, nil
}

// Exported is an access token handed to a co-located server (never a
// refresh token).
type Exported struct {
	AccessToken vault.Secret
	TokenType   string
	Expiry      time.Time
}

// ExportAllowed says whether p's access tokens may be handed to a
// co-located server: its kind has tokens to hand out (a key a person
// entered never is) and its entry opts in (sidecar_token_export). A
// refusal is ErrExportDisabled.
func ExportAllowed(p *provider.Provider) error {
	if _, ok := p.Kind.(provider.TokenExporter); !ok || !p.SidecarTokenExport {
		return fmt.Errorf("%w: %s", ErrExportDisabled, p.Name)
	}
	return nil
}

// Export hands c's access token (refreshed when needed) to a co-located
// server, when ExportAllowed. Every export is an audit event.
func (s *Service) Export(ctx context.Context, req Request, c vault.Connection) (Exported, error) {
	p, err := s.provider(c.Provider)
	if err != nil {
		return Exported{}, err
	}
	if err := ExportAllowed(p); err != nil {
		return Exported{}, err
	}
	full, err := s.opts.Client.Token(ctx, c.ID)
	if err != nil {
		return Exported{}, err
	}
	out := Exported{AccessToken: full.Token.AccessToken, TokenType: full.Token.TokenType, Expiry: full.Token.Expiry}
	if out.TokenType == "" || strings.EqualFold(out.TokenType, "bearer") {
		out.TokenType = "Bearer"
	}
	s.log.Info("connections: access token exported", "event", telemetry.EventTokenExport, "provider", p.Name, "connection", c.ID, "via", req.Via, "server", req.Server)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventTokenExport, Principal: req.Principal,
		Provider: p.Name, Account: AccountName(c), Connection: c.ID, Via: req.Via, Server: req.Server})
	s.recordUse(ctx, c)
	return out, nil
}

// lastUsedEvery bounds LastUsed writes to one per connection per interval,
// so a busy connection does not pay a durable write per API call.
const lastUsedEvery = time.Minute

var errUnchanged = errors.New("connections: unchanged")

// recordUse notes that c was just used (LastUsed), at most once per
// lastUsedEvery, rewriting metadata only. A failure is logged, never
// returned: the call itself succeeded.
func (s *Service) recordUse(ctx context.Context, c vault.Connection) {
	now := s.opts.Now()
	if now.Sub(c.LastUsed) < lastUsedEvery {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, err := s.opts.Store.UpdateConnectionMeta(wctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
		if now.Sub(old.LastUsed) < lastUsedEvery {
			return old, errUnchanged
		}
		old.LastUsed = now
		return old, nil
	})
	if !errors.Is(err, errUnchanged) {
		s.changed(c.Principal)
	}
	if err != nil && !errors.Is(err, errUnchanged) && !errors.Is(err, vault.ErrNotFound) {
		s.log.Warn("connections: recording the connection's last use failed", "connection", c.ID, "err", err)
	}
}

// Disconnected reports a disconnect: which connection, and what revoking
// at the provider came to.
type Disconnected struct {
	Conn       vault.Connection
	Provider   *provider.Provider
	Revocation provider.Revocation
}

// Disconnect revokes and deletes req's person's connection to
// req.Provider (req.Account names one of several). *AccountError when
// none or several match.
func (s *Service) Disconnect(ctx context.Context, req Request) (Disconnected, error) {
	p, conns, err := s.connectionsTo(ctx, req)
	if err != nil {
		return Disconnected{}, err
	}
	var match []vault.Connection
	for _, c := range conns {
		if req.Account == "" || accountMatches(c, req.Account) {
			match = append(match, c)
		}
	}
	switch {
	case len(match) == 0:
		return Disconnected{}, &AccountError{Provider: p, Named: req.Account, Accounts: names(conns)}
	case len(match) > 1:
		return Disconnected{}, &AccountError{Provider: p, Accounts: names(conns), Several: true}
	}
	return s.disconnect(ctx, req, p, match[0].ID)
}

// DisconnectID revokes and deletes connection id of req's person (the
// connections page). Absent and "not yours" are both vault.ErrNotFound.
func (s *Service) DisconnectID(ctx context.Context, req Request, id string) (Disconnected, error) {
	conns, err := s.List(ctx, req.Principal)
	if err != nil {
		return Disconnected{}, err
	}
	for _, c := range conns {
		if c.ID == id {
			p, ok := s.providers.Lookup(c.Provider)
			if !ok {
				// A provider removed from the catalogue: nothing to revoke with.
				p = &provider.Provider{Name: c.Provider, DisplayName: c.Provider}
			}
			return s.disconnect(ctx, req, p, id)
		}
	}
	return Disconnected{}, fmt.Errorf("connections: connection %s: %w", id, vault.ErrNotFound)
}

// disconnect is the one disconnect: open the token set (revocation needs
// it), revoke, audit the revocation's outcome, delete, audit the deletion.
// The deletion happens whatever the revocation came to.
func (s *Service) disconnect(ctx context.Context, req Request, p *provider.Provider, id string) (Disconnected, error) {
	full, err := s.opts.Store.GetConnection(ctx, id)
	if err != nil {
		return Disconnected{}, fmt.Errorf("connections: connection %s: %w", id, err)
	}
	if !full.Principal.Same(req.Principal) {
		return Disconnected{}, fmt.Errorf("connections: connection %s: %w", id, vault.ErrNotFound)
	}
	meta := full
	meta.Token = vault.TokenSet{}
	out := Disconnected{Conn: meta, Provider: p, Revocation: provider.NotSupported}
	log := s.log.With("provider", p.Name, "connection", id, "via", req.Via)
	var rerr error
	out.Revocation, rerr = s.revoke(ctx, full)
	if rerr != nil {
		log.Warn("connections: revocation at the provider was not confirmed; deleting anyway", "err", rerr)
	}
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventRevoke, Principal: req.Principal, Provider: p.Name,
		Account: AccountName(meta), Connection: id, Via: req.Via, Outcome: string(out.Revocation), Err: rerr})
	err = s.opts.Store.DeleteConnection(context.WithoutCancel(ctx), id)
	s.changed(req.Principal)
	if err != nil && !errors.Is(err, vault.ErrNotFound) {
		return out, fmt.Errorf("connections: delete %s: %w", id, err)
	}
	log.Info("connections: connection deleted", "revocation", string(out.Revocation))
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventDisconnect, Principal: req.Principal, Provider: p.Name,
		Account: AccountName(meta), Connection: id, Via: req.Via})
	return out, nil
}

// revoke asks c's provider (c carries its tokens) to revoke them, unless
// another connection uses the same account and revoking would end it
// too: NotSupported for a provider no longer in the catalogue.
func (s *Service) revoke(ctx context.Context, c vault.Connection) (provider.Revocation, error) {
	if _, ok := s.providers.Lookup(c.Provider); !ok {
		return provider.NotSupported, nil
	}
	// Revoking may end every token of the provider account, another
	// person's connection to it included: look for one first.
	shared, err := s.sharedAccount(ctx, c)
	if err != nil {
		return provider.NotConfirmed, err
	}
	return s.opts.Client.Revoke(ctx, c, shared)
}

// sharedAccount reports whether another connection uses c's provider
// account.
func (s *Service) sharedAccount(ctx context.Context, c vault.Connection) (bool, error) {
	all, err := s.opts.Store.AccountConnections(ctx, c.Provider, c.AccountID)
	if err != nil {
		return false, fmt.Errorf("connections: connections to the same account: %w", err)
	}
	for _, o := range all {
		if o.ID != c.ID {
			return true, nil
		}
	}
	return false, nil
}

// MissingRefreshToken reports whether c was stored without a refresh token
// although p's entry expects one (offline_access requested, or offline
// access asked in extra_auth_params): its access ends when the access
// token expires, and the person should know before it surprises them.
func MissingRefreshToken(p *provider.Provider, c vault.Connection) bool {
	return p != nil && c.NoRefreshToken && p.ExpectsRefreshToken(c.Scopes)
}

// NotGranted returns the scopes c's last connect request asked for that
// the provider p did not grant (the person unchecked them on a granular
// consent screen, as Google's), nil when it granted them all or the ask
// is unknown. Each door names them with NotGrantedWords and says, in its
// own terms, how to ask again.
func NotGranted(p *provider.Provider, c vault.Connection) []string {
	if p == nil || len(c.Requested) == 0 {
		return nil
	}
	return p.MissingScopes(c.Scopes, c.Requested)
}

// NotGrantedWords says that the scopes missing (NotGranted's) were asked
// for and not granted ("" when none).
func NotGrantedWords(p *provider.Provider, missing []string) string {
	if len(missing) == 0 {
		return ""
	}
	was, it := "were", "them"
	if len(missing) == 1 {
		was, it = "was", "it"
	}
	return fmt.Sprintf("The user did not grant every scope asked for: %s %s not granted, so %s refuses requests that need %s.",
		strings.Join(quoteAll(missing), ", "), was, p.DisplayName, it)
}

// quoteAll quotes each of ss (untrusted text: a provider's scope names).
func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = untrusted.Quote(s)
	}
	return out
}

// Save stores what a completed browser step produced for grant g (already
// checked to be the signed-in person's, consented to in this browser, for
// provider p), and approves and completes g. A connection to the same
// provider account of the same person is updated in place, never
// duplicated. When g can no longer be completed (used, declined or expired
// meanwhile), a connection created just now is removed again and
// ErrRequestExpired is returned.
//
// A store with a vault.GrantConnector (Store.Connector) writes the
// connection, approves and completes g in one transaction
// (binding.ApproveAndCompleteWith: one durable commit, nothing to undo).
func (s *Service) Save(ctx context.Context, pr vault.Principal, g vault.Grant, p *provider.Provider, ex provider.Exchanged) (vault.Connection, error) {
	asked := g.Scopes
	if len(asked) == 0 {
		asked = p.DefaultScopes
	}
	w, err := s.connectionWrite(ctx, pr, p, ex, p.NormalizeScopes(asked))
	if err != nil {
		return vault.Connection{}, err
	}
	w.Known = &g // read by the caller: the store may complete it without reading it again
	var conn vault.Connection
	defer s.changed(pr) // whatever came of it, read afresh
	gc := s.opts.Store.Connector()
	atomic := gc != nil
	if atomic {
		conn, _, err = s.opts.Grants.ApproveAndCompleteWith(ctx, gc, g.ID, pr, w)
		atomic = !errors.Is(err, errors.ErrUnsupported)
	}
	if !atomic {
		if _, err := s.opts.Grants.Approve(ctx, g.ID, pr); err != nil {
			if errors.Is(err, binding.ErrClosed) || errors.Is(err, binding.ErrExpired) {
				return vault.Connection{}, ErrRequestExpired
			}
			return vault.Connection{}, fmt.Errorf("connections: approve %s: %w", binding.Ref(g.ID), err)
		}
		if w.Create != nil {
			conn, err = s.opts.Store.CreateConnection(ctx, *w.Create)
		} else {
			conn, err = s.opts.Store.UpdateConnection(ctx, w.UpdateID, w.Update)
		}
		if err != nil {
			return vault.Connection{}, err
		}
		if _, err = s.opts.Grants.Complete(ctx, g.ID, pr, conn.ID); err != nil && conn.Version == 1 {
			// Nothing else can reference a connection created a moment ago.
			_ = s.opts.Store.DeleteConnection(context.WithoutCancel(ctx), conn.ID)
		}
	}
	if err != nil {
		if errors.Is(err, binding.ErrClosed) || errors.Is(err, binding.ErrExpired) {
			return vault.Connection{}, ErrRequestExpired
		}
		return vault.Connection{}, fmt.Errorf("connections: complete %s: %w", binding.Ref(g.ID), err)
	}
	s.log.Info("connections: connection stored", "provider", p.Name, "connection", conn.ID, "grant_ref", binding.Ref(g.ID), "updated", conn.Version > 1)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventConnect, Principal: pr, Provider: p.Name,
		Account: AccountName(conn), Grant: g.ID, Connection: conn.ID, Via: "browser", Server: g.Server})
	conn.NoRefreshToken = conn.Token.RefreshToken == ""
	conn.Token = vault.TokenSet{}
	return conn, nil
}

// connectionWrite is what storing ex, the answer to a connect request
// that asked for the scopes asked, comes to: a new connection, or an
// update of the person's existing one to the same provider account.
func (s *Service) connectionWrite(ctx context.Context, pr vault.Principal, p *provider.Provider, ex provider.Exchanged, asked []string) (vault.ConnectionWrite, error) {
	now := s.opts.Now()
	existing, err := s.providerConnections(ctx, pr, p.Name)
	if err != nil {
		return vault.ConnectionWrite{}, err
	}
	for _, c := range existing {
		if c.AccountID != ex.Account.ID {
			continue
		}
		return vault.ConnectionWrite{UpdateID: c.ID, Update: func(old vault.Connection) (vault.Connection, error) {
			keepRefresh, keepExpires := old.Token.RefreshToken, old.RefreshExpires
			old.Token, old.RefreshExpires = ex.Token, ex.RefreshExpiry
			if old.Token.RefreshToken == "" {
				// A provider issues the refresh token on first consent only
				// (Google without prompt=consent): the one held still works.
				old.Token.RefreshToken, old.RefreshExpires = keepRefresh, keepExpires
			}
			old.AccountLogin, old.Scopes, old.Status, old.Updated = ex.Account.Login, p.NormalizeScopes(ex.Scopes), vault.StatusActive, now
			old.Requested = asked
			return old, nil
		}}, nil
	}
	return vault.ConnectionWrite{Create: &vault.Connection{
		ID: "conn_" + binding.NewID(), Principal: pr, Provider: p.Name, AccountID: ex.Account.ID, AccountLogin: ex.Account.Login,
		Scopes: p.NormalizeScopes(ex.Scopes), Requested: asked, Token: ex.Token, RefreshExpires: ex.RefreshExpiry,
		Status: vault.StatusActive, Created: now, Updated: now,
	}}, nil
}
