package connections

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/oauth2"

	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// Connecting without the browser (enterprise-managed authorization, the
// provider's AssertionStep: an mcp entry with auth: enterprise): when a
// person must connect, start first asks the provider layer to connect
// them with an ID-JAG of the organisation's IdP. Connected, the call goes
// on with no link at all; refused (no IdP session, the IdP's policy, the
// server's authorization server), the person gets the usual connect link,
// and the request, the message and the page say why (Reason.Assertion,
// vault.Grant.Why), in words naming no secret. The person's IdP session
// that this needs comes from the broker's browser sign-in
// (KeepIdPSession) and ends with sign-out and offboarding.

// assertionLockTTL bounds how long one person's connect by assertion to
// one provider may hold its lock.
const assertionLockTTL = time.Minute

// refusalHold is how long a refusal by the IdP or the server (policy,
// not supported, unreachable) is taken as the answer for the same person
// and provider on this replica, so that listing tools and retries do not
// ask the IdP again and again; a change of the IdP's policy is seen
// within it. A missing or ended IdP session is not held: signing in
// again works at once.
const refusalHold = time.Minute

// refusalMemo remembers recent refusals per person and provider, bounded
// in size.
type refusalMemo struct {
	mu sync.Mutex // guards m
	m  map[[32]byte]heldRefusal
}

type heldRefusal struct {
	code  string
	until time.Time
}

func (r *refusalMemo) get(key [32]byte, now time.Time) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.m[key]
	if !ok || !now.Before(h.until) {
		delete(r.m, key)
		return "", false
	}
	return h.code, true
}

func (r *refusalMemo) put(key [32]byte, code string, until time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil || len(r.m) > 10000 {
		r.m = map[[32]byte]heldRefusal{}
	}
	r.m[key] = heldRefusal{code: code, until: until}
}

// connectByAssertion tries to connect req's person to p with scopes
// without the browser: Connected (stored like any connection), or the
// outcome code of the refusal (and a nil Outcome) for the person to be
// asked; neither when the server's metadata is unusable (the connect
// link's checks report that).
func (s *Service) connectByAssertion(ctx context.Context, req Request, p *provider.Provider, scopes []string) (Outcome, string, error) {
	// One at a time per person and provider (across replicas): the
	// concurrent first calls of a host would otherwise each store a
	// connection for the same account.
	sum := sha256.Sum256([]byte(req.Principal.Issuer + "\x00" + req.Principal.Subject + "\x00" + p.Name))
	if code, held := s.refusals.get(sum, s.opts.Now()); held {
		return nil, code, nil
	}
	lctx, cancel := context.WithTimeout(ctx, assertionLockTTL)
	defer cancel()
	unlock, err := s.locker.LockConnection(lctx, "assert/"+hex.EncodeToString(sum[:16]))
	if err != nil {
		return nil, "", fmt.Errorf("connections: lock: %w", err)
	}
	defer unlock()
	conns, err := s.providerConnections(ctx, req.Principal, p.Name)
	if err != nil {
		return nil, "", err
	}
	if c, _ := best(p, conns, scopes); c != nil {
		return Connected{Conn: *c, Provider: p}, "", nil // connected meanwhile
	}
	ex, err := s.opts.Client.ConnectByAssertion(ctx, p, req.Principal, scopes, req.Via)
	var ar *provider.AssertionRefusedError
	var ue *provider.UpstreamError
	switch {
	case errors.As(err, &ar):
		if ar.Outcome != telemetry.UpstreamIDJAGNoSession && ar.Outcome != telemetry.UpstreamIDJAGSessionEnded {
			s.refusals.put(sum, ar.Outcome, s.opts.Now().Add(refusalHold))
		}
		return nil, ar.Outcome, nil
	case errors.As(err, &ue):
		// The server's metadata is unusable: the connect link's path
		// (upstreamUsable) says so and records it, as for auth: oauth.
		return nil, "", nil
	case errors.Is(err, vault.ErrUnavailable):
		return nil, "", err // the door answers a storage outage
	case err != nil:
		s.log.Warn("connections: connecting by ID-JAG failed; asking the person", "provider", p.Name, "err", err)
		s.refusals.put(sum, telemetry.UpstreamIDJAGUnavailable, s.opts.Now().Add(refusalHold))
		return nil, telemetry.UpstreamIDJAGUnavailable, nil
	}
	conn, err := s.storeDirect(ctx, req.Principal, p, ex, scopes)
	if err != nil {
		return nil, "", err
	}
	s.log.Info("connections: connected by ID-JAG", "provider", p.Name, "connection", conn.ID, "via", req.Via)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventConnect, Principal: req.Principal, Provider: p.Name,
		Account: AccountName(conn), Connection: conn.ID, Via: req.Via, Server: req.Server, Outcome: "id-jag"})
	return Connected{Conn: conn, Provider: p}, "", nil
}

// storeDirect stores ex, the answer to asking for the scopes asked, for
// pr (no connect request involved): a new connection, or an update of
// pr's one to the same account. The result is metadata only.
func (s *Service) storeDirect(ctx context.Context, pr vault.Principal, p *provider.Provider, ex provider.Exchanged, asked []string) (vault.Connection, error) {
	w, err := s.connectionWrite(ctx, pr, p, ex, p.NormalizeScopes(asked))
	if err != nil {
		return vault.Connection{}, err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var conn vault.Connection
	if w.Create != nil {
		conn, err = s.opts.Store.CreateConnection(wctx, *w.Create)
	} else {
		conn, err = s.opts.Store.UpdateConnection(wctx, w.UpdateID, w.Update)
	}
	s.changed(pr)
	if err != nil {
		return vault.Connection{}, fmt.Errorf("connections: store the connection: %w", err)
	}
	conn.NoRefreshToken = conn.Token.RefreshToken == ""
	conn.Token = vault.TokenSet{}
	return conn, nil
}

// AssertionRefusal says in words why connecting without the browser was
// refused (a Reason.Assertion, a vault.Grant.Why), "" for none: for the
// message to the person and the connect page.
func AssertionRefusal(code string) string {
	switch code {
	case "":
		return ""
	case telemetry.UpstreamIDJAGNoSession:
		return "the broker held no current session of yours at your organisation's sign-in service. Signed in here now, you can go back to your app and retry: the broker tries again then"
	case telemetry.UpstreamIDJAGSessionEnded:
		return "your session at your organisation's sign-in service had ended. Signed in here again, you can go back to your app and retry: the broker tries again then"
	case telemetry.UpstreamIDJAGIdPRefused:
		return "your organisation's sign-in service did not allow it (its policy does not cover you, this app or this server)"
	case telemetry.UpstreamIDJAGServerRefused:
		return "the server's authorization server did not accept your organisation's assertion"
	case telemetry.UpstreamIDJAGNotSupported:
		return "the server's authorization server does not take assertions from your organisation's sign-in service"
	}
	return "your organisation's sign-in service or the server could not be reached"
}

// WhyAsked is what the connect page of g says about why the person is
// asked in the browser ("" when there is nothing to say).
func WhyAsked(g vault.Grant) string {
	if words := AssertionRefusal(g.Why); words != "" {
		return "The broker tried to connect this for you through your organisation's sign-in and could not: " + words + "."
	}
	return ""
}

// KeepIdPSession stores the IdP session the broker's browser sign-in of
// pr obtained (tok, its ID token verified, expiring at idExpiry), for
// connecting by assertion later; nothing without enterprise entries.
func (s *Service) KeepIdPSession(ctx context.Context, pr vault.Principal, tok *oauth2.Token, idExpiry time.Time) error {
	return s.opts.Client.KeepIdPSession(ctx, pr, tok, idExpiry)
}

// ForgetIdPSession removes pr's IdP session (the person signed out).
func (s *Service) ForgetIdPSession(ctx context.Context, pr vault.Principal) error {
	_, err := s.opts.Client.ForgetIdPSession(ctx, pr)
	return err
}

// IdPSessionStep is offboarding's step for the person's IdP session.
func IdPSessionStep(c *provider.Client) OffboardStep {
	return OffboardStep{Name: "IdP session", Remove: func(ctx context.Context, p vault.Principal, _ Admin) (int, error) {
		removed, err := c.ForgetIdPSession(ctx, p)
		if removed {
			return 1, err
		}
		return 0, err
	}}
}
