package vault

import (
	"context"
	"time"
)

// Observer watches store operations (metrics, traces). Observe calls Begin
// as an operation starts and End once it has ended, on the goroutine
// that called the operation.
//
// op names the operation: its method's name in snake case
// ("get_connection", "enqueue_deliveries", "connect"). Begin returns the
// context the operation runs with (a span rides on it); End gets that
// context, how long the operation took and its error. Neither may keep
// or log an argument of the operation: observers see names only.
type Observer interface {
	Begin(ctx context.Context, op string) context.Context
	End(ctx context.Context, op string, took time.Duration, err error)
}

// Observe returns s with every operation of every feature reported to the
// observers: the store's own methods and those of each sub-store its
// accessors return (Auth, Outbox, Admin, Assertions, Connector, Locker,
// Resealer, AppWatch, UpstreamClients, IdPSessions). Close is not an operation. The
// first observer's Begin runs first and its End last. Nil observers are left out; with none left, s
// is returned as is.
//
// Observe is the one instrumentation point of the store: it wraps each
// feature of Store, and vault's TestObserveEveryOperation enumerates them,
// so a feature added to Store without an observed wrapper here fails it.
func Observe(s Store, observers ...Observer) Store {
	var o observer
	for _, x := range observers {
		if x != nil {
			o = append(o, x)
		}
	}
	if len(o) == 0 {
		return s
	}
	return &observedStore{next: s, o: o,
		connector:  feature(s.Connector(), func(f GrantConnector) GrantConnector { return observedConnector{f, o} }),
		auth:       feature(s.Auth(), func(f AuthStore) AuthStore { return observedAuth{f, o} }),
		outbox:     feature(s.Outbox(), func(f Outbox) Outbox { return observedOutbox{f, o} }),
		admin:      feature(s.Admin(), func(f AdminStore) AdminStore { return observedAdmin{f, o} }),
		assertions: feature(s.Assertions(), func(f AssertionLedger) AssertionLedger { return observedLedger{f, o} }),
		locker:     feature(s.Locker(), func(f Locker) Locker { return observedLocker{f, o} }),
		resealer:   feature(s.Resealer(), func(f Resealer) Resealer { return observedResealer{f, o} }),
		appWatch:   feature(s.AppWatch(), func(f AppWatch) AppWatch { return observedAppWatch{f, o} }),
		upstream:   feature(s.UpstreamClients(), func(f UpstreamClientStore) UpstreamClientStore { return observedUpstream{f, o} }),
		sessions:   feature(s.IdPSessions(), func(f IdPSessionStore) IdPSessionStore { return observedIdPSessions{f, o} }),
	}
}

// feature wraps f, or keeps nil where the store has no such feature.
func feature[F comparable](f F, wrap func(F) F) F {
	var none F
	if f == none {
		return none
	}
	return wrap(f)
}

// observer is Observe's observers, in order.
type observer []Observer

// observed runs f as operation op, reported to o.
func observed[T any](o observer, ctx context.Context, op string, f func(context.Context) (T, error)) (T, error) {
	for _, x := range o {
		ctx = x.Begin(ctx, op)
	}
	start := time.Now()
	v, err := f(ctx)
	took := time.Since(start)
	for i := len(o) - 1; i >= 0; i-- {
		o[i].End(ctx, op, took, err)
	}
	return v, err
}

// observedErr is observed for an operation that returns only an error.
func observedErr(o observer, ctx context.Context, op string, f func(context.Context) error) error {
	_, err := observed(o, ctx, op, func(ctx context.Context) (struct{}, error) { return struct{}{}, f(ctx) })
	return err
}

// observedStore is Observe's store: connections and grants here, each
// other feature in a wrapper of its own.
type observedStore struct {
	next       Store
	o          observer
	connector  GrantConnector
	auth       AuthStore
	outbox     Outbox
	admin      AdminStore
	assertions AssertionLedger
	locker     Locker
	resealer   Resealer
	appWatch   AppWatch
	upstream   UpstreamClientStore
	sessions   IdPSessionStore
}

var _ Store = (*observedStore)(nil)

func (s *observedStore) Connector() GrantConnector            { return s.connector }
func (s *observedStore) Auth() AuthStore                      { return s.auth }
func (s *observedStore) Outbox() Outbox                       { return s.outbox }
func (s *observedStore) Admin() AdminStore                    { return s.admin }
func (s *observedStore) Assertions() AssertionLedger          { return s.assertions }
func (s *observedStore) Locker() Locker                       { return s.locker }
func (s *observedStore) Resealer() Resealer                   { return s.resealer }
func (s *observedStore) AppWatch() AppWatch                   { return s.appWatch }
func (s *observedStore) UpstreamClients() UpstreamClientStore { return s.upstream }
func (s *observedStore) IdPSessions() IdPSessionStore         { return s.sessions }
func (s *observedStore) Close() error                         { return s.next.Close() }

func (s *observedStore) CreateConnection(ctx context.Context, c Connection) (Connection, error) {
	return observed(s.o, ctx, "create_connection", func(ctx context.Context) (Connection, error) { return s.next.CreateConnection(ctx, c) })
}

func (s *observedStore) GetConnection(ctx context.Context, id string) (Connection, error) {
	return observed(s.o, ctx, "get_connection", func(ctx context.Context) (Connection, error) { return s.next.GetConnection(ctx, id) })
}

func (s *observedStore) ListConnections(ctx context.Context, p Principal) ([]Connection, error) {
	return observed(s.o, ctx, "list_connections", func(ctx context.Context) ([]Connection, error) { return s.next.ListConnections(ctx, p) })
}

func (s *observedStore) UpdateConnection(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error) {
	return observed(s.o, ctx, "update_connection", func(ctx context.Context) (Connection, error) { return s.next.UpdateConnection(ctx, id, fn) })
}

func (s *observedStore) UpdateConnectionMeta(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error) {
	return observed(s.o, ctx, "update_connection_meta", func(ctx context.Context) (Connection, error) { return s.next.UpdateConnectionMeta(ctx, id, fn) })
}

func (s *observedStore) DeleteConnection(ctx context.Context, id string) error {
	return observedErr(s.o, ctx, "delete_connection", func(ctx context.Context) error { return s.next.DeleteConnection(ctx, id) })
}

func (s *observedStore) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	return observed(s.o, ctx, "connection_ids", func(ctx context.Context) ([]string, error) { return s.next.ConnectionIDs(ctx, after, limit) })
}

func (s *observedStore) AccountConnections(ctx context.Context, provider, accountID string) ([]Connection, error) {
	return observed(s.o, ctx, "account_connections", func(ctx context.Context) ([]Connection, error) {
		return s.next.AccountConnections(ctx, provider, accountID)
	})
}

func (s *observedStore) CreateGrant(ctx context.Context, g Grant) (Grant, error) {
	return observed(s.o, ctx, "create_grant", func(ctx context.Context) (Grant, error) { return s.next.CreateGrant(ctx, g) })
}

func (s *observedStore) GetGrant(ctx context.Context, id string) (Grant, error) {
	return observed(s.o, ctx, "get_grant", func(ctx context.Context) (Grant, error) { return s.next.GetGrant(ctx, id) })
}

func (s *observedStore) UpdateGrant(ctx context.Context, id string, fn func(Grant) (Grant, error)) (Grant, error) {
	return observed(s.o, ctx, "update_grant", func(ctx context.Context) (Grant, error) { return s.next.UpdateGrant(ctx, id, fn) })
}

func (s *observedStore) CreateGrantLimited(ctx context.Context, g Grant, lim GrantLimits) (Grant, error) {
	return observed(s.o, ctx, "create_grant_limited", func(ctx context.Context) (Grant, error) { return s.next.CreateGrantLimited(ctx, g, lim) })
}

func (s *observedStore) ListGrants(ctx context.Context, p Principal, since time.Time) ([]Grant, error) {
	return observed(s.o, ctx, "list_grants", func(ctx context.Context) ([]Grant, error) { return s.next.ListGrants(ctx, p, since) })
}

func (s *observedStore) CountGrants(ctx context.Context, p Principal, since, now time.Time) (created, open int, err error) {
	n, err := observed(s.o, ctx, "count_grants", func(ctx context.Context) ([2]int, error) {
		created, open, err := s.next.CountGrants(ctx, p, since, now)
		return [2]int{created, open}, err
	})
	return n[0], n[1], err
}

func (s *observedStore) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	return observed(s.o, ctx, "delete_expired_grants", func(ctx context.Context) (int, error) { return s.next.DeleteExpiredGrants(ctx, now) })
}

type observedConnector struct {
	next GrantConnector
	o    observer
}

func (c observedConnector) Connect(ctx context.Context, w ConnectionWrite, grantID string, grant func(Grant) (Grant, error)) (Connection, Grant, error) {
	type result struct {
		c Connection
		g Grant
	}
	r, err := observed(c.o, ctx, "connect", func(ctx context.Context) (result, error) {
		conn, g, err := c.next.Connect(ctx, w, grantID, grant)
		return result{conn, g}, err
	})
	return r.c, r.g, err
}

type observedAuth struct {
	next AuthStore
	o    observer
}

func (a observedAuth) CreateOAuthClient(ctx context.Context, c OAuthClient, max int) (OAuthClient, error) {
	return observed(a.o, ctx, "create_oauth_client", func(ctx context.Context) (OAuthClient, error) { return a.next.CreateOAuthClient(ctx, c, max) })
}

func (a observedAuth) GetOAuthClient(ctx context.Context, id string) (OAuthClient, error) {
	return observed(a.o, ctx, "get_oauth_client", func(ctx context.Context) (OAuthClient, error) { return a.next.GetOAuthClient(ctx, id) })
}

func (a observedAuth) UpdateOAuthClient(ctx context.Context, id string, fn func(OAuthClient) (OAuthClient, error)) (OAuthClient, error) {
	return observed(a.o, ctx, "update_oauth_client", func(ctx context.Context) (OAuthClient, error) { return a.next.UpdateOAuthClient(ctx, id, fn) })
}

func (a observedAuth) DeleteOAuthClient(ctx context.Context, id string) error {
	return observedErr(a.o, ctx, "delete_oauth_client", func(ctx context.Context) error { return a.next.DeleteOAuthClient(ctx, id) })
}

func (a observedAuth) DeleteUnusedOAuthClients(ctx context.Context, createdBefore time.Time) (int, error) {
	return observed(a.o, ctx, "delete_unused_oauth_clients", func(ctx context.Context) (int, error) {
		return a.next.DeleteUnusedOAuthClients(ctx, createdBefore)
	})
}

func (a observedAuth) CreateAuthCode(ctx context.Context, c AuthCode) error {
	return observedErr(a.o, ctx, "create_auth_code", func(ctx context.Context) error { return a.next.CreateAuthCode(ctx, c) })
}

func (a observedAuth) RedeemAuthCode(ctx context.Context, key string) (AuthCode, error) {
	return observed(a.o, ctx, "redeem_auth_code", func(ctx context.Context) (AuthCode, error) { return a.next.RedeemAuthCode(ctx, key) })
}

func (a observedAuth) DeleteExpiredAuthCodes(ctx context.Context, before time.Time) (int, error) {
	return observed(a.o, ctx, "delete_expired_auth_codes", func(ctx context.Context) (int, error) { return a.next.DeleteExpiredAuthCodes(ctx, before) })
}

func (a observedAuth) CreateAppAccess(ctx context.Context, x AppAccess) (AppAccess, error) {
	return observed(a.o, ctx, "create_app_access", func(ctx context.Context) (AppAccess, error) { return a.next.CreateAppAccess(ctx, x) })
}

func (a observedAuth) GetAppAccess(ctx context.Context, id string) (AppAccess, error) {
	return observed(a.o, ctx, "get_app_access", func(ctx context.Context) (AppAccess, error) { return a.next.GetAppAccess(ctx, id) })
}

func (a observedAuth) GetAppLiveness(ctx context.Context, id string) (AppAccess, error) {
	return observed(a.o, ctx, "get_app_liveness", func(ctx context.Context) (AppAccess, error) { return a.next.GetAppLiveness(ctx, id) })
}

func (a observedAuth) FindAppAccess(ctx context.Context, p Principal, clientID string) (AppAccess, error) {
	return observed(a.o, ctx, "find_app_access", func(ctx context.Context) (AppAccess, error) { return a.next.FindAppAccess(ctx, p, clientID) })
}

func (a observedAuth) ListAppAccess(ctx context.Context, p Principal) ([]AppAccess, error) {
	return observed(a.o, ctx, "list_app_access", func(ctx context.Context) ([]AppAccess, error) { return a.next.ListAppAccess(ctx, p) })
}

func (a observedAuth) UpdateAppAccess(ctx context.Context, id string, fn func(AppAccess) (AppAccess, error)) (AppAccess, error) {
	return observed(a.o, ctx, "update_app_access", func(ctx context.Context) (AppAccess, error) { return a.next.UpdateAppAccess(ctx, id, fn) })
}

func (a observedAuth) DeleteAppAccess(ctx context.Context, id string) error {
	return observedErr(a.o, ctx, "delete_app_access", func(ctx context.Context) error { return a.next.DeleteAppAccess(ctx, id) })
}

type observedOutbox struct {
	next Outbox
	o    observer
}

func (b observedOutbox) EnqueueDeliveries(ctx context.Context, ds []Delivery) error {
	return observedErr(b.o, ctx, "enqueue_deliveries", func(ctx context.Context) error { return b.next.EnqueueDeliveries(ctx, ds) })
}

func (b observedOutbox) ClaimDeliveries(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]Delivery, error) {
	return observed(b.o, ctx, "claim_deliveries", func(ctx context.Context) ([]Delivery, error) {
		return b.next.ClaimDeliveries(ctx, now, limit, lease)
	})
}

func (b observedOutbox) FinishDelivery(ctx context.Context, id, endpoint string) error {
	return observedErr(b.o, ctx, "finish_delivery", func(ctx context.Context) error { return b.next.FinishDelivery(ctx, id, endpoint) })
}

func (b observedOutbox) RetryDelivery(ctx context.Context, d Delivery) error {
	return observedErr(b.o, ctx, "retry_delivery", func(ctx context.Context) error { return b.next.RetryDelivery(ctx, d) })
}

func (b observedOutbox) OutboxDepth(ctx context.Context) (n int, oldest time.Time, err error) {
	type result struct {
		n      int
		oldest time.Time
	}
	r, err := observed(b.o, ctx, "outbox_depth", func(ctx context.Context) (result, error) {
		n, oldest, err := b.next.OutboxDepth(ctx)
		return result{n, oldest}, err
	})
	return r.n, r.oldest, err
}

type observedAdmin struct {
	next AdminStore
	o    observer
}

func (a observedAdmin) ProviderConnections(ctx context.Context, provider, after string, limit int) ([]Connection, error) {
	return observed(a.o, ctx, "provider_connections", func(ctx context.Context) ([]Connection, error) {
		return a.next.ProviderConnections(ctx, provider, after, limit)
	})
}

func (a observedAdmin) DeleteGrants(ctx context.Context, p Principal) (int, error) {
	return observed(a.o, ctx, "delete_grants", func(ctx context.Context) (int, error) { return a.next.DeleteGrants(ctx, p) })
}

func (a observedAdmin) RetireConnection(ctx context.Context, id string) error {
	return observedErr(a.o, ctx, "retire_connection", func(ctx context.Context) error { return a.next.RetireConnection(ctx, id) })
}

func (a observedAdmin) RetiredConnections(ctx context.Context, p Principal) ([]Connection, error) {
	return observed(a.o, ctx, "retired_connections", func(ctx context.Context) ([]Connection, error) { return a.next.RetiredConnections(ctx, p) })
}

func (a observedAdmin) ForgetRetired(ctx context.Context, id string) error {
	return observedErr(a.o, ctx, "forget_retired", func(ctx context.Context) error { return a.next.ForgetRetired(ctx, id) })
}

type observedLedger struct {
	next AssertionLedger
	o    observer
}

func (l observedLedger) SpendAssertion(ctx context.Context, key string, expires time.Time) error {
	return observedErr(l.o, ctx, "spend_assertion", func(ctx context.Context) error { return l.next.SpendAssertion(ctx, key, expires) })
}

func (l observedLedger) DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error) {
	return observed(l.o, ctx, "delete_spent_assertions", func(ctx context.Context) (int, error) { return l.next.DeleteSpentAssertions(ctx, before) })
}

// observedLocker reports the wait for a lock, not how long it is held.
type observedLocker struct {
	next Locker
	o    observer
}

func (l observedLocker) LockConnection(ctx context.Context, id string) (func(), error) {
	return observed(l.o, ctx, "lock_connection", func(ctx context.Context) (func(), error) { return l.next.LockConnection(ctx, id) })
}

type observedResealer struct {
	next Resealer
	o    observer
}

func (r observedResealer) Reseal(ctx context.Context, ids []string) (int, error) {
	return observed(r.o, ctx, "reseal", func(ctx context.Context) (int, error) { return r.next.Reseal(ctx, ids) })
}

// observedAppWatch reports the life of a feed, from the start of
// WatchApps until it returns (its context ended), not each change.
type observedAppWatch struct {
	next AppWatch
	o    observer
}

func (w observedAppWatch) WatchApps(ctx context.Context, x AppWatcher) error {
	return observedErr(w.o, ctx, "watch_apps", func(ctx context.Context) error { return w.next.WatchApps(ctx, x) })
}

func (w observedAppWatch) WatchConnections(ctx context.Context, x AppWatcher) error {
	return observedErr(w.o, ctx, "watch_connections", func(ctx context.Context) error { return w.next.WatchConnections(ctx, x) })
}

type observedUpstream struct {
	next UpstreamClientStore
	o    observer
}

func (u observedUpstream) GetUpstreamClient(ctx context.Context, key string) (UpstreamClient, error) {
	return observed(u.o, ctx, "get_upstream_client", func(ctx context.Context) (UpstreamClient, error) { return u.next.GetUpstreamClient(ctx, key) })
}

func (u observedUpstream) PutUpstreamClient(ctx context.Context, c UpstreamClient) (UpstreamClient, error) {
	return observed(u.o, ctx, "put_upstream_client", func(ctx context.Context) (UpstreamClient, error) { return u.next.PutUpstreamClient(ctx, c) })
}

func (u observedUpstream) DeleteUpstreamClient(ctx context.Context, key, clientID string) error {
	return observedErr(u.o, ctx, "delete_upstream_client", func(ctx context.Context) error { return u.next.DeleteUpstreamClient(ctx, key, clientID) })
}

func (u observedUpstream) ResealUpstreamClients(ctx context.Context) (int, error) {
	return observed(u.o, ctx, "reseal_upstream_clients", func(ctx context.Context) (int, error) { return u.next.ResealUpstreamClients(ctx) })
}
