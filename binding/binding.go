package binding

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"credbroker/vault"
)

// Errors returned by Service. Callers branch with errors.Is.
var (
	// ErrNotFound: no such grant (or a malformed id).
	ErrNotFound = errors.New("binding: no such connect request")
	// ErrExpired: the grant's TTL has passed.
	ErrExpired = errors.New("binding: connect request expired")
	// ErrClosed: the grant is completed or denied; it cannot be used again.
	ErrClosed = errors.New("binding: connect request already used or closed")
	// ErrWrongPrincipal: the acting principal is not the one that started the grant.
	ErrWrongPrincipal = errors.New("binding: connect request belongs to a different principal")
	// ErrBadState: the transition is not allowed from the grant's state.
	ErrBadState = errors.New("binding: transition not allowed in this state")
	// ErrTooManyPending: the principal has too many open connect requests.
	ErrTooManyPending = errors.New("binding: too many open connect requests")
	// ErrRateLimited: the principal started too many connect requests recently.
	ErrRateLimited = errors.New("binding: too many connect requests this hour")
	// ErrTooManyRounds: the client retried this grant too often.
	ErrTooManyRounds = errors.New("binding: too many retries for this connect request")
	// ErrTooManyAttempts: too many keys were checked for this connect request.
	ErrTooManyAttempts = errors.New("binding: too many key entries for this connect request")
)

// Options configures a Service. Zero values take the defaults.
type Options struct {
	// TTL is how long a grant stays usable (default 10 minutes).
	TTL time.Duration
	// MaxRounds bounds MRTR retries per grant (default 10).
	MaxRounds int
	// MaxAttempts bounds key entries checked at the provider per grant
	// (default 5).
	MaxAttempts int
	// MaxPending bounds open grants per principal (default 10; <0 disables).
	MaxPending int
	// MaxPerHour bounds grants created per principal per hour (default 30; <0 disables).
	MaxPerHour int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Service creates and advances grants.
type Service struct {
	store vault.Store
	opts  Options
}

// New returns a Service over store.
func New(store vault.Store, opts Options) *Service {
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Minute
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 5
	}
	if opts.MaxRounds == 0 {
		opts.MaxRounds = 10
	}
	if opts.MaxPending == 0 {
		opts.MaxPending = 10
	}
	if opts.MaxPerHour == 0 {
		opts.MaxPerHour = 30
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Service{store: store, opts: opts}
}

const idBytes = 16

// NewID returns a fresh opaque grant id: 128 random bits, base64url, 22 characters.
func NewID() string {
	var b [idBytes]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("binding: crypto/rand failed: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// ValidID reports whether id has the shape of a grant id. Untrusted ids are
// checked with it before any lookup.
func ValidID(id string) bool {
	if len(id) != base64.RawURLEncoding.EncodedLen(idBytes) {
		return false
	}
	b, err := base64.RawURLEncoding.DecodeString(id)
	return err == nil && len(b) == idBytes
}

// Ref returns a short, non-reversible reference to grant id for logs,
// audit events and error pages. A grant id is its owner's connect link, so
// it is never logged as is; the reference lets a support request be
// matched with the log.
func Ref(id string) string {
	sum := sha256.Sum256([]byte("credbroker/ref/" + id))
	return hex.EncodeToString(sum[:6])
}

// Create starts a grant for p, asked by the MCP client that calls itself
// clientName (untrusted). Limits on open and recent grants apply; the
// store checks them atomically with the insert, so concurrent calls (on
// any number of replicas sharing the store) never pass them together.
func (s *Service) Create(ctx context.Context, p vault.Principal, provider string, scopes []string, clientName string) (vault.Grant, error) {
	return s.create(ctx, vault.Grant{Principal: p, Provider: provider, Scopes: slices.Clone(scopes), ClientName: clientName})
}

// CreateForServer is Create for a grant asked by the co-located MCP server
// configured under the name server (trusted: the broker knows it from the
// server's secret), on behalf of a host that calls itself clientName
// (untrusted, may be empty).
func (s *Service) CreateForServer(ctx context.Context, p vault.Principal, provider string, scopes []string, server, clientName string) (vault.Grant, error) {
	if server == "" {
		return vault.Grant{}, errors.New("binding: create: empty server name")
	}
	return s.create(ctx, vault.Grant{Principal: p, Provider: provider, Scopes: slices.Clone(scopes), ClientName: clientName, Server: server})
}

// CreateFrom is Create (CreateForServer when g.Server is set) from a
// template: g's Principal, Provider, Scopes, ClientName, Server and Why
// are kept, everything else is the new request's.
func (s *Service) CreateFrom(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	return s.create(ctx, vault.Grant{Principal: g.Principal, Provider: g.Provider, Scopes: slices.Clone(g.Scopes),
		ClientName: g.ClientName, Server: g.Server, Why: g.Why})
}

func (s *Service) create(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	p := g.Principal
	if p.IsZero() || p.Issuer == "" || p.Subject == "" {
		return vault.Grant{}, errors.New("binding: create: empty principal")
	}
	now := s.opts.Now()
	g.ID, g.Created, g.Expires, g.State = NewID(), now, now.Add(s.opts.TTL), vault.GrantPending
	g, err := s.store.CreateGrantLimited(ctx, g, vault.GrantLimits{
		Since: now.Add(-time.Hour), Now: now, MaxOpen: s.opts.MaxPending, MaxCreated: s.opts.MaxPerHour,
	})
	switch {
	case errors.Is(err, vault.ErrTooManyOpenGrants):
		return vault.Grant{}, ErrTooManyPending
	case errors.Is(err, vault.ErrTooManyRecentGrants):
		return vault.Grant{}, ErrRateLimited
	case err != nil:
		return vault.Grant{}, fmt.Errorf("binding: create: %w", err)
	}
	return g, nil
}

// minReuseLeft is how much of its life a pending grant must have left to
// be handed out again by Pending: enough to sign in, approve and finish at
// the provider.
const minReuseLeft = 2 * time.Minute

// Pending returns p's newest grant that is still pending (not final, with
// at least minReuseLeft before it expires) for the same provider, the same
// set of scopes and the same client, so a caller that cannot carry a grant
// id between retries (a 2025-11-25 client) hands out the link the person
// may already be looking at instead of a new one. That includes a link the
// person has approved and is finishing at the provider: the consent form
// writes nothing, and the callback completes the grant either way. A grant
// an earlier version left approved, and one asked by a co-located server
// (Server set), are never handed out.
func (s *Service) Pending(ctx context.Context, p vault.Principal, provider string, scopes []string, clientName string) (vault.Grant, bool, error) {
	now := s.opts.Now()
	list, err := s.store.ListGrants(ctx, p, now.Add(-s.opts.TTL))
	if err != nil {
		return vault.Grant{}, false, fmt.Errorf("binding: pending: %w", err)
	}
	want := slices.Clone(scopes)
	slices.Sort(want)
	for _, g := range slices.Backward(list) {
		have := slices.Clone(g.Scopes)
		slices.Sort(have)
		if g.State == vault.GrantPending && g.Provider == provider && g.ClientName == clientName && g.Server == "" &&
			slices.Equal(slices.Compact(have), slices.Compact(want)) && g.Principal.Same(p) &&
			now.Add(minReuseLeft).Before(g.Expires) {
			return g, true, nil
		}
	}
	return vault.Grant{}, false, nil
}

// Lookup returns the grant by id without checking who asks. Expired grants
// report ErrExpired (along with the grant). Use Authorize for anything that
// acts on the grant.
func (s *Service) Lookup(ctx context.Context, id string) (vault.Grant, error) {
	if !ValidID(id) {
		return vault.Grant{}, ErrNotFound
	}
	g, err := s.store.GetGrant(ctx, id)
	if errors.Is(err, vault.ErrNotFound) {
		return vault.Grant{}, ErrNotFound
	}
	if err != nil {
		return vault.Grant{}, fmt.Errorf("binding: lookup: %w", err)
	}
	if g.State == vault.GrantExpired || !g.State.Final() && !s.opts.Now().Before(g.Expires) {
		g.State = vault.GrantExpired
		return g, ErrExpired
	}
	return g, nil
}

// Authorize returns the grant when p is its principal. A different principal
// gets ErrWrongPrincipal (and the grant, so the caller can log it) and
// changes nothing.
func (s *Service) Authorize(ctx context.Context, id string, p vault.Principal) (vault.Grant, error) {
	g, err := s.Lookup(ctx, id)
	if err != nil && !errors.Is(err, ErrExpired) {
		return g, err
	}
	if !g.Principal.Same(p) {
		return g, ErrWrongPrincipal
	}
	return g, err
}

// transition applies fn to the grant after checking principal and expiry,
// inside the store's compare-and-swap.
func (s *Service) transition(ctx context.Context, id string, p vault.Principal, fn func(*vault.Grant) error) (vault.Grant, error) {
	if !ValidID(id) {
		return vault.Grant{}, ErrNotFound
	}
	g, err := s.store.UpdateGrant(ctx, id, s.check(s.opts.Now(), p, fn))
	if errors.Is(err, vault.ErrNotFound) {
		return vault.Grant{}, ErrNotFound
	}
	return g, err
}

// check is the update function of a transition at now: p's grant, not
// expired, then fn.
func (s *Service) check(now time.Time, p vault.Principal, fn func(*vault.Grant) error) func(vault.Grant) (vault.Grant, error) {
	return func(g vault.Grant) (vault.Grant, error) {
		if !g.Principal.Same(p) {
			return g, ErrWrongPrincipal
		}
		if !g.State.Final() && !now.Before(g.Expires) {
			return g, ErrExpired
		}
		if err := fn(&g); err != nil {
			return g, err
		}
		return g, nil
	}
}

func closedErr(st vault.GrantState) error {
	switch st {
	case vault.GrantExpired:
		return ErrExpired
	case vault.GrantCompleted, vault.GrantDenied:
		return ErrClosed
	}
	return ErrBadState
}

// Approve records the user's consent as a write of its own: pending →
// approved. Approving an approved grant again is allowed (the user
// restarted the provider step). The browser flow does not call it: its
// consent travels to the completing step, which records it with the
// connection (ApproveAndCompleteWith); approved grants also come from
// stores written by earlier versions, which approved at the consent form.
func (s *Service) Approve(ctx context.Context, id string, p vault.Principal) (vault.Grant, error) {
	return s.advanceOpen(ctx, id, p, vault.GrantApproved)
}

// Deny closes the grant without a connection: pending/approved → denied.
// It serves both the browser's Deny button and an MCP client's "decline".
func (s *Service) Deny(ctx context.Context, id string, p vault.Principal) (vault.Grant, error) {
	return s.advanceOpen(ctx, id, p, vault.GrantDenied)
}

// advanceOpen moves a grant that is still open (pending or approved) to
// state; a grant already closed gets closedErr.
func (s *Service) advanceOpen(ctx context.Context, id string, p vault.Principal, state vault.GrantState) (vault.Grant, error) {
	return s.transition(ctx, id, p, func(g *vault.Grant) error {
		switch g.State {
		case vault.GrantPending, vault.GrantApproved:
			g.State = state
			return nil
		}
		return closedErr(g.State)
	})
}

// Complete closes an approved grant with the connection it produced. It
// succeeds once; a second call gets ErrClosed.
func (s *Service) Complete(ctx context.Context, id string, p vault.Principal, connectionID string) (vault.Grant, error) {
	if connectionID == "" {
		return vault.Grant{}, errors.New("binding: complete without a connection id")
	}
	return s.transition(ctx, id, p, completeRule(connectionID, false))
}

// CompleteWith closes approved grant id with the connection written in the
// same store transaction (vault.GrantConnector): the rules of Complete
// (p's grant, not expired, approved, once), checked inside the transaction.
// On failure nothing is stored, and the errors are Complete's.
func (s *Service) CompleteWith(ctx context.Context, gc vault.GrantConnector, id string, p vault.Principal, w vault.ConnectionWrite) (vault.Connection, vault.Grant, error) {
	return s.completeWith(ctx, gc, id, p, w, false)
}

// ApproveAndCompleteWith is Approve and CompleteWith in one store
// transaction: pending (or approved) → approved → completed. It is for a
// consent that the browser carries to the step that completes the grant
// (oauthflow's sealed flow cookie, set by the consent form and checked at
// the provider's callback; or the key form, whose POST is the consent and
// the completion at once), so the consent is recorded with the connection
// it produced instead of in a durable commit of its own. The rules are
// both methods': p's grant, not expired, not final, once. On failure
// nothing is stored, and the errors are Complete's.
func (s *Service) ApproveAndCompleteWith(ctx context.Context, gc vault.GrantConnector, id string, p vault.Principal, w vault.ConnectionWrite) (vault.Connection, vault.Grant, error) {
	return s.completeWith(ctx, gc, id, p, w, true)
}

func (s *Service) completeWith(ctx context.Context, gc vault.GrantConnector, id string, p vault.Principal, w vault.ConnectionWrite, approve bool) (vault.Connection, vault.Grant, error) {
	var connectionID string
	switch {
	case w.Create != nil:
		connectionID = w.Create.ID
	case w.Update != nil:
		connectionID = w.UpdateID
	}
	if connectionID == "" {
		return vault.Connection{}, vault.Grant{}, errors.New("binding: complete without a connection id")
	}
	if !ValidID(id) {
		return vault.Connection{}, vault.Grant{}, ErrNotFound
	}
	now := s.opts.Now()
	c, g, err := gc.Connect(ctx, w, id, s.check(now, p, completeRule(connectionID, approve)))
	if errors.Is(err, vault.ErrNotFound) {
		// The grant (or the connection to update) went away.
		err = fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return c, g, err
}

// completeRule completes an approved grant with connectionID; with approve,
// a pending grant is approved first (the rules of Approve).
func completeRule(connectionID string, approve bool) func(*vault.Grant) error {
	return func(g *vault.Grant) error {
		if approve && g.State == vault.GrantPending {
			g.State = vault.GrantApproved
		}
		if g.State != vault.GrantApproved {
			return closedErr(g.State)
		}
		g.State = vault.GrantCompleted
		g.ConnectionID = connectionID
		return nil
	}
}

// Round counts one MRTR retry on an open grant; past MaxRounds it returns
// ErrTooManyRounds. A final grant is returned unchanged (no error), so the
// caller can read its outcome.
func (s *Service) Round(ctx context.Context, id string, p vault.Principal) (vault.Grant, error) {
	g, err := s.transition(ctx, id, p, func(g *vault.Grant) error {
		if g.State.Final() {
			return errUnchanged
		}
		if g.Rounds >= s.opts.MaxRounds {
			return ErrTooManyRounds
		}
		g.Rounds++
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return s.Lookup(ctx, id)
	}
	return g, err
}

var errUnchanged = errors.New("binding: unchanged")

// Attempt counts one key entry about to be checked at the provider for
// an open grant of p; past MaxAttempts it returns ErrTooManyAttempts and
// the key must not be sent anywhere.
func (s *Service) Attempt(ctx context.Context, id string, p vault.Principal) (vault.Grant, error) {
	return s.transition(ctx, id, p, func(g *vault.Grant) error {
		if g.State.Final() {
			return closedErr(g.State)
		}
		return s.countAttempt(g)
	})
}

// countAttempt is the one rule of key checks: a grant counts at most
// MaxAttempts of them.
func (s *Service) countAttempt(g *vault.Grant) error {
	if g.Attempts >= s.opts.MaxAttempts {
		return ErrTooManyAttempts
	}
	g.Attempts++
	return nil
}

// ReplaceAttempt counts one key about to be checked at provider to replace
// the key of p's connection connID ("Replace key"), under the limit of a
// connect link's key entry: MaxAttempts per connection in each TTL-long
// window, and, per person, the grants they may create in an hour
// (MaxPerHour; ErrRateLimited beyond). Past the limit it returns
// ErrTooManyAttempts and the key must not be sent anywhere.
//
// The count lives in the store, so it holds across replicas and however
// many attempts run at once: on a grant of its own for the connection and
// the window (its id derived from both and the person), created closed
// (denied), so it is never anyone's open connect request, and expiring
// with the window.
func (s *Service) ReplaceAttempt(ctx context.Context, p vault.Principal, provider, connID string) error {
	if p.Issuer == "" || p.Subject == "" {
		return errors.New("binding: replace attempt: empty principal")
	}
	now := s.opts.Now()
	start := now.Truncate(s.opts.TTL)
	sum := sha256.Sum256(fmt.Appendf(nil, "credbroker/key-replace/%d:%s/%d:%s/%d:%s/%d",
		len(p.Issuer), p.Issuer, len(p.Subject), p.Subject, len(connID), connID, start.UnixNano()))
	id := base64.RawURLEncoding.EncodeToString(sum[:idBytes])
	_, err := s.store.CreateGrantLimited(ctx, vault.Grant{ID: id, Principal: p, Provider: provider, Created: now,
		Expires: start.Add(s.opts.TTL), State: vault.GrantDenied},
		vault.GrantLimits{Since: now.Add(-time.Hour), Now: now, MaxCreated: s.opts.MaxPerHour})
	switch {
	case errors.Is(err, vault.ErrExists): // this window's count exists already
	case errors.Is(err, vault.ErrTooManyRecentGrants):
		return ErrRateLimited
	case err != nil:
		return fmt.Errorf("binding: replace attempt: %w", err)
	}
	_, err = s.transition(ctx, id, p, s.countAttempt)
	return err
}

// GC removes grants that expired before now minus grace (so that a client
// retrying just after expiry still gets a precise answer).
func (s *Service) GC(ctx context.Context, grace time.Duration) (int, error) {
	return s.store.DeleteExpiredGrants(ctx, s.opts.Now().Add(-grace))
}
