package connections

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// The gateway's decisions (the MCP door relays; what a relayed call runs
// as, and what the person must do when the upstream refuses, is decided
// here): Upstream answers Ready (the connection to relay with, none for a
// server that takes no token) or what the person must do first, like
// Ensure and Resume; UpstreamRefused turns the upstream's refusal into a
// reconnect (a 401 after the forced refresh) or a step-up (403
// insufficient_scope: a new connect request for the union of the held and
// the challenged scopes, at most maxStepUps an hour per person, provider
// and scope set, so a server that always asks for more cannot loop).

// Ready is the connection a relayed call runs with.
type Ready struct {
	Provider *provider.Provider
	// Conn is the connection (metadata only; zero for an open server).
	Conn   vault.Connection
	Target mcpup.Target
}

func (Ready) outcome() {}

// NotAGatewayError: the provider is not a remote MCP server.
type NotAGatewayError struct{ Name string }

func (e *NotAGatewayError) Error() string {
	return fmt.Sprintf("%s is not an MCP provider", untrusted.Quote(e.Name))
}

// GatewayOnlyError: provider_request or the sidecar proxy named an MCP
// provider, whose server the broker relays at its endpoint instead.
type GatewayOnlyError struct {
	Provider *provider.Provider
	Endpoint string
}

func (e *GatewayOnlyError) Error() string {
	return fmt.Sprintf("%s is an MCP provider: use %s", e.Provider.Name, e.Endpoint)
}

// GatewayEndpoint is the broker's MCP endpoint that relays to provider
// name's upstream server.
func (s *Service) GatewayEndpoint(name string) string { return s.opts.PublicURL + "/mcp/u/" + name }

// gatewayOnly refuses an HTTP API call to an MCP provider.
func (s *Service) gatewayOnly(p *provider.Provider) error {
	if _, ok := p.Kind.(provider.Gateway); ok {
		return &GatewayOnlyError{Provider: p, Endpoint: s.GatewayEndpoint(p.Name)}
	}
	return nil
}

// Gateway returns MCP provider name and its upstream (a *NotAGatewayError
// for any other name).
func (s *Service) Gateway(name string) (*provider.Provider, provider.Upstream, error) {
	p, ok := s.providers.Lookup(name)
	if !ok {
		return nil, provider.Upstream{}, &NotAGatewayError{Name: name}
	}
	gw, ok := p.Kind.(provider.Gateway)
	if !ok {
		return nil, provider.Upstream{}, &NotAGatewayError{Name: name}
	}
	return p, gw.Upstream(), nil
}

// Upstream decides what a call relayed to req's provider runs with:
// Ready, or (for a server that takes tokens) what Ensure answers when
// nothing usable is connected; with a connect request to continue (grant,
// from a sealed continuation the door opened), what Resume answers.
func (s *Service) Upstream(ctx context.Context, req Request, grant string, answer Answer) (Outcome, error) {
	p, up, err := s.Gateway(req.Provider)
	if err != nil {
		return nil, err
	}
	if _, tokens := p.Kind.(provider.RedirectStep); !tokens {
		return Ready{Provider: p, Target: mcpup.Target{Provider: p.Name, URL: up.URL, Person: req.Principal}}, nil
	}
	var o Outcome
	if grant != "" {
		o, err = s.Resume(ctx, req, grant, answer)
	} else {
		o, err = s.Ensure(ctx, req)
	}
	if err != nil {
		return nil, err
	}
	return readyIfConnected(o, up), nil
}

// readyIfConnected is o as a relayed call runs with it when it is
// Connected (Ready), else o.
func readyIfConnected(o Outcome, up provider.Upstream) Outcome {
	c, ok := o.(Connected)
	if !ok {
		return o
	}
	// The listing's version of the connection lets the session use the
	// token it last read at that version again (mcpup.Target.Version).
	return Ready{Provider: c.Provider, Conn: c.Conn, Target: mcpup.Target{Provider: c.Provider.Name, URL: up.URL, Conn: c.Conn.ID, Version: c.Conn.Version}}
}

// upstreamUsable refuses to start a connect request for an MCP server
// whose authorization the broker cannot use (its metadata names another
// resource or issuer, its authorization server is on a host not allowed or
// a private address, lacks S256, answers with a redirect, offers no way to
// register, or registering there failed: a *provider.UpstreamError naming
// the fix, and an upstream_error audit event), so the person is not sent
// to a link that can only fail. Discovery is cached; a dynamic
// registration is made here (once, and not again within a minute of a
// failure) rather than when the link is opened.
func (s *Service) upstreamUsable(ctx context.Context, req Request, p *provider.Provider) error {
	if _, ok := p.Kind.(provider.Gateway); !ok {
		return nil
	}
	if _, tokens := p.Kind.(provider.RedirectStep); !tokens {
		return nil
	}
	return s.upstreamFailed(ctx, req.Principal, p, req.Via, s.opts.Client.PrepareUpstream(ctx, p.Name))
}

// upstreamFailed records err when it says that p's server cannot be used
// (a *provider.UpstreamError): an upstream_error audit event whose outcome
// is the kind, for person pr. err is returned as it is.
func (s *Service) upstreamFailed(ctx context.Context, pr vault.Principal, p *provider.Provider, via string, err error) error {
	var ue *provider.UpstreamError
	if errors.As(err, &ue) {
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventUpstreamError, Principal: pr, Provider: p.Name,
			Via: via, Outcome: ue.Kind, Err: ue})
	}
	return err
}

// ErrTooManyStepUps: the upstream keeps asking for more scopes.
var ErrTooManyStepUps = errors.New("connections: the server asked for more scopes too often")

// ErrScopesHeld: the upstream refused a call (403) naming scopes the
// connection already holds, so connecting again would ask for the same
// ones; the refusal is the server's, not a step-up.
var ErrScopesHeld = errors.New("connections: the server refused the call though the connection holds the scopes it named")

// UpstreamRefused answers the upstream's refusal of a call Ready r ran
// (Ready again when the entry connects by ID-JAG and the IdP made the
// new connection, with no step in the browser):
// after a second 401 (mcpup.ErrUnauthorized) or a token that could not be
// had, the connection is marked needs_reconnect and a connect request
// started (NeedsUser; its reason Reregister when the token could not be had
// because the server forgot the broker's registration); after a 403 insufficient_scope (*mcpup.NeedScope),
// a connect request for the union of the held and the challenged scopes,
// for the same connection to be upgraded. Any other error is returned as
// it is.
func (s *Service) UpstreamRefused(ctx context.Context, req Request, r Ready, err error) (Outcome, error) {
	o, err := s.upstreamRefused(ctx, req, r, err)
	if err != nil {
		return nil, err
	}
	if g, ok := r.Provider.Kind.(provider.Gateway); ok {
		o = readyIfConnected(o, g.Upstream())
	}
	return o, nil
}

func (s *Service) upstreamRefused(ctx context.Context, req Request, r Ready, err error) (Outcome, error) {
	var ns *mcpup.NeedScope
	switch {
	case errors.As(err, &ns):
		return s.StepUp(ctx, req, r, ns.Scopes)
	case errors.Is(err, mcpup.ErrUnauthorized):
		if merr := s.opts.Client.Unauthorized(ctx, r.Conn.ID); merr != nil && !errors.Is(merr, provider.ErrNeedsReconnect) {
			return nil, merr
		}
		fallthrough
	case errors.Is(err, mcpup.ErrNoToken):
		again := req
		again.Account = ""
		why := Reason{Kind: Reconnect}
		if errors.Is(err, provider.ErrRegistrationDropped) {
			why.Kind = Reregister
		}
		return s.reconnect(ctx, again, why)
	}
	return nil, err
}

// maxStepUps bounds step-up requests per person, provider and scope set
// an hour, on each replica.
const maxStepUps = 3

// StepUp starts a connect request for the union of the scopes Ready r's
// connection holds and those the upstream challenged (always a new
// request: the consent page names the added scopes); ErrScopesHeld when
// the challenge names no scope the connection lacks.
func (s *Service) StepUp(ctx context.Context, req Request, r Ready, challenged []string) (Outcome, error) {
	p := r.Provider
	scopes := p.UnionScopes(r.Conn.Scopes, challenged)
	// A scope the entry never asks for (offline_access under
	// mcp.offline_access: never) is not missing: a grant would leave it
	// out again, and the next 403 would ask again.
	asked := s.opts.Client.Scopes(p, scopes)
	missing := slices.DeleteFunc(p.MissingScopes(r.Conn.Scopes, scopes), func(m string) bool { return !slices.Contains(asked, m) })
	if len(missing) == 0 {
		return nil, ErrScopesHeld
	}
	why := Reason{Kind: MissingScopes, Missing: missing}
	if !req.CanAsk && !s.opts.Client.ConnectsByAssertion(p) {
		// Nobody can be sent to a link (a host without url
		// elicitation): nothing is started, so nothing is counted.
		return NeedsUser{Provider: p, Scopes: scopes, Why: why}, nil
	}
	ev := telemetry.Event{Kind: telemetry.EventStepUp, Principal: req.Principal, Provider: p.Name,
		Account: AccountName(r.Conn), Connection: r.Conn.ID, Via: req.Via, Outcome: strings.Join(why.Missing, " ")}
	if !s.stepUps.allow(req.Principal, p.Name, scopes, s.opts.Now()) {
		ev.Kind = telemetry.EventStepUpRefused
		s.opts.Telemetry.Audit(ctx, ev)
		return nil, ErrTooManyStepUps
	}
	s.opts.Telemetry.Audit(ctx, ev)
	up := req
	up.ReuseOpen = false
	return s.start(ctx, up, p, scopes, why)
}

// stepUpCounter counts step-ups per (person, provider, scope set), in a
// sliding hour, bounded in size.
type stepUpCounter struct {
	mu   sync.Mutex
	seen map[[32]byte][]time.Time
}

func (c *stepUpCounter) allow(pr vault.Principal, provider string, scopes []string, now time.Time) bool {
	sorted := slices.Clone(scopes)
	slices.Sort(sorted)
	key := sha256.Sum256([]byte(pr.Issuer + "\x00" + pr.Subject + "\x00" + provider + "\x00" + strings.Join(sorted, " ")))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil || len(c.seen) > 10000 {
		c.seen = map[[32]byte][]time.Time{}
	}
	var recent []time.Time
	for _, t := range c.seen[key] {
		if now.Sub(t) < time.Hour {
			recent = append(recent, t)
		}
	}
	if len(recent) >= maxStepUps {
		c.seen[key] = recent
		return false
	}
	c.seen[key] = append(recent, now)
	return true
}
