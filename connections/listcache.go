package connections

import (
	"context"
	"sync/atomic"

	"credbroker/internal/replicache"
	"credbroker/vault"
)

// ListBound is the longest a change of a person's connections committed
// on another replica (a new connection, a disconnect, a token refreshed,
// needs_reconnect) takes to be seen by Ensure here: the listing cache is
// trusted only while its feed has been current within it. In this process
// a change made through the Service is seen at once.
const ListBound = replicache.Bound

// listing is the per-replica cache of each person's connection listing
// (ListConnections: metadata and nothing decrypted, never a token), keyed
// and grouped by vault.Principal.Key.
type listing = replicache.Cache[[]vault.Connection]

// Follow keeps the listing cache in step with the changes every replica
// makes, through Options.Watch, until ctx ends. Without a Watch it returns
// at once: a sole writer's store reports its writes (Changed, ChangedAll),
// and with neither every listing reads the store. While it does not run (or
// the feed is down longer than ListBound) the cache is not trusted and
// Ensure reads the store.
func (s *Service) Follow(ctx context.Context) error {
	if s.listing == nil || s.opts.Watch == nil {
		return nil
	}
	return s.opts.Watch.WatchConnections(ctx, s.listing.Watcher())
}

// listedTo is p's connections to provider, ordered by account name, from
// listed: each a clone the caller owns (Pick and the retry of a completed
// connect request hand them on; Ensure filters the cache's slice in place
// instead, and clones only the connection it answers).
func (s *Service) listedTo(ctx context.Context, p vault.Principal, provider string) ([]vault.Connection, error) {
	all, err := s.listed(ctx, p)
	if err != nil {
		return nil, err
	}
	out := ofPersonTo(nil, all, p, provider)
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out, nil
}

// listed is p's connections for the hot path (Ensure, Pick for a provider
// call, and the retry of a completed connect request): from the listing
// cache when it can be trusted, else from the store (List). The slice and
// the connections' slices are the cache's: the caller only reads them
// (listedTo clones what it hands on). Every path that writes (disconnect,
// offboarding, saving a connection, a reconnect) reads the store through
// List instead.
func (s *Service) listed(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	if s.listing == nil {
		return s.List(ctx, p)
	}
	key := p.Key()
	cached, _, epoch, ok := s.listing.Get(key)
	if ok {
		return cached, nil
	}
	all, err := s.List(ctx, p)
	if err != nil {
		return nil, err
	}
	if epoch != 0 {
		s.listing.Put(epoch, key, key, all)
	}
	return all, nil
}

// Changed implements vault.ConnectionWrites for a sole writer's store
// (vault.Announced): one of p's connections was written.
func (s *Service) Changed(p vault.Principal) { s.changed(p) }

// ChangedAll implements vault.ConnectionWrites: some connection was
// written, whose person the store did not say.
func (s *Service) ChangedAll() {
	if s.listing != nil {
		s.listing.Reset()
	}
}

// changed forgets p's cached listing after this process wrote one of p's
// connections (the other replicas learn it through their feeds).
func (s *Service) changed(p vault.Principal) {
	if s.listing != nil {
		s.listing.Drop(p.Key())
	}
}

// mine keeps those of conns that are p's.
func mine(p vault.Principal, conns []vault.Connection) []vault.Connection {
	out := conns[:0]
	for _, c := range conns {
		if c.Principal.Same(p) {
			out = append(out, c)
		}
	}
	return out
}

// LateWrites is the vault.ConnectionWrites of a sole writer's store
// (vault.Announced) built before its Service: it passes each write on
// once Set names the Service, and drops it before (no cache to tell yet).
type LateWrites struct{ to atomic.Pointer[Service] }

// Set names the Service the writes go to.
func (l *LateWrites) Set(s *Service) { l.to.Store(s) }

// Changed implements vault.ConnectionWrites.
func (l *LateWrites) Changed(p vault.Principal) {
	if s := l.to.Load(); s != nil {
		s.Changed(p)
	}
}

// ChangedAll implements vault.ConnectionWrites.
func (l *LateWrites) ChangedAll() {
	if s := l.to.Load(); s != nil {
		s.ChangedAll()
	}
}
