package vault

import (
	"context"
	"time"
)

// IdPSession is a person's session at the organisation's identity
// provider as the broker keeps it: the refresh token its sign-in
// obtained (offline_access) and the latest ID token, so that the broker
// can present a fresh ID token to the IdP later (RFC 8693 token exchange
// for an ID-JAG, enterprise-managed authorization) without the person.
// One per person. The tokens are sealed like a connection's token set,
// the additional data binding them to the person.
type IdPSession struct {
	Principal Principal
	// RefreshToken is the IdP's refresh token ("" when the IdP issued
	// none: the ID token is then usable until it expires, no longer).
	RefreshToken Secret
	// IDToken is the latest ID token the IdP issued for the person, and
	// IDTokenExpires its exp.
	IDToken        Secret
	IDTokenExpires time.Time
	Created        time.Time
	Updated        time.Time
	// Version increases by one on every write; the store sets it.
	Version uint64
}

// IdPSessionStore keeps people's IdP sessions: the Store feature that
// Store.IdPSessions returns; vaulttest.RunIdPSessions is its conformance
// suite.
type IdPSessionStore interface {
	// GetIdPSession returns p's session with its tokens opened
	// (ErrNotFound when there is none). A record that fails to open (a
	// retired key, tampering) is an error wrapping ErrDecrypt or
	// ErrUnknownKey.
	GetIdPSession(ctx context.Context, p Principal) (IdPSession, error)
	// PutIdPSession stores s as its person's session, replacing any
	// (a sign-in): Created is kept from the replaced one, Version is one
	// more than its (1 for a new one).
	PutIdPSession(ctx context.Context, s IdPSession) (IdPSession, error)
	// UpdateIdPSession is the compare-and-swap of p's session, with the
	// rules of UpdateConnection: fn may run more than once and must have
	// no side effects; Principal is immutable; a result of another
	// Version is ErrConflict; fn's error aborts and is returned as is.
	UpdateIdPSession(ctx context.Context, p Principal, fn func(IdPSession) (IdPSession, error)) (IdPSession, error)
	// DeleteIdPSession removes p's session (ErrNotFound when none).
	DeleteIdPSession(ctx context.Context, p Principal) error
	// ResealIdPSessions seals again with the primary key every session
	// sealed with another (key rotation: Rekey) and returns how many; a
	// session that does not open is left as it is (it counts as none).
	ResealIdPSessions(ctx context.Context) (int, error)
}

// observedIdPSessions is Observe's IdP session store.
type observedIdPSessions struct {
	next IdPSessionStore
	o    observer
}

func (x observedIdPSessions) GetIdPSession(ctx context.Context, p Principal) (IdPSession, error) {
	return observed(x.o, ctx, "get_idp_session", func(ctx context.Context) (IdPSession, error) { return x.next.GetIdPSession(ctx, p) })
}

func (x observedIdPSessions) PutIdPSession(ctx context.Context, s IdPSession) (IdPSession, error) {
	return observed(x.o, ctx, "put_idp_session", func(ctx context.Context) (IdPSession, error) { return x.next.PutIdPSession(ctx, s) })
}

func (x observedIdPSessions) UpdateIdPSession(ctx context.Context, p Principal, fn func(IdPSession) (IdPSession, error)) (IdPSession, error) {
	return observed(x.o, ctx, "update_idp_session", func(ctx context.Context) (IdPSession, error) { return x.next.UpdateIdPSession(ctx, p, fn) })
}

func (x observedIdPSessions) DeleteIdPSession(ctx context.Context, p Principal) error {
	return observedErr(x.o, ctx, "delete_idp_session", func(ctx context.Context) error { return x.next.DeleteIdPSession(ctx, p) })
}

func (x observedIdPSessions) ResealIdPSessions(ctx context.Context) (int, error) {
	return observed(x.o, ctx, "reseal_idp_sessions", func(ctx context.Context) (int, error) { return x.next.ResealIdPSessions(ctx) })
}

// Clone returns a copy of s (it has nothing shared).
func (s IdPSession) Clone() IdPSession { return s }
