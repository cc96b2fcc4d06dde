// Package memstore is an in-memory vault.Store for tests and ephemeral runs.
// It stores records in their encoded (sealed) form, exactly as a persistent
// backend would, so encryption is exercised on every read and write.
package memstore

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/locallock"
	"credbroker/vault/internal/record"
)

// Store is an in-memory vault.Store with every feature but the batch
// re-seal and the feed of app changes: it is its own sub-stores.
type Store struct {
	kr         *vault.Keyring
	changes    vault.ChangeHook[vault.Connection]
	appChanges vault.ChangeHook[vault.AppAccess]
	locker     *locallock.Locker // one process holds the store

	mu          sync.RWMutex // guards the fields below
	closed      bool
	conns       map[string][]byte
	byPrincipal map[vault.Principal]map[string]struct{}
	grants      map[string][]byte
	auth        authMaps
	outbox      map[string]vault.Delivery // by Delivery.Key
	retired     map[string][]byte         // connection id -> sealed record
	spent       map[string]time.Time      // vault.AssertionKey -> expiry (assertions.go)
	upstream    map[string][]byte         // upstream client key -> record (upstream.go)
	sessions    map[string][]byte         // sessionKey(person) -> sealed IdP session (idpsessions.go)
}

// New returns an empty store sealing tokens with kr.
func New(kr *vault.Keyring) *Store { return NewWith(kr, Options{}) }

// Options configures NewWith.
type Options struct {
	// Changes, when set, turns changes of connections into outbox
	// deliveries, atomically with the change.
	Changes vault.ChangeHook[vault.Connection]
	// AppChanges, when set, does the same for app access records.
	AppChanges vault.ChangeHook[vault.AppAccess]
}

// NewWith returns an empty store sealing tokens with kr, with opts.
func NewWith(kr *vault.Keyring, opts Options) *Store {
	return &Store{
		kr:          kr,
		changes:     opts.Changes,
		locker:      locallock.New(),
		appChanges:  opts.AppChanges,
		conns:       map[string][]byte{},
		byPrincipal: map[vault.Principal]map[string]struct{}{},
		grants:      map[string][]byte{},
		auth:        newAuthMaps(),
		outbox:      map[string]vault.Delivery{},
		retired:     map[string][]byte{},
		spent:       map[string]time.Time{},
		upstream:    map[string][]byte{},
		sessions:    map[string][]byte{},
	}
}

// enqueue stores ds unless stored; s.mu must be held.
func (s *Store) enqueue(ds []vault.Delivery) {
	for _, d := range ds {
		if _, ok := s.outbox[d.Key()]; !ok {
			s.outbox[d.Key()] = d.Clone()
		}
	}
}

func (s *Store) check() error {
	if s.closed {
		return vault.ErrClosed
	}
	return nil
}

// CreateConnection implements vault.Store.
func (s *Store) CreateConnection(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	c, b, err := record.NewConnection(s.kr, c)
	if err != nil {
		return vault.Connection{}, err
	}
	return write(s, func() (vault.Connection, error) {
		if err := taken(s.conns, c.ID, "connection "+c.ID); err != nil {
			return vault.Connection{}, err
		}
		ds, err := record.ChangeDeliveries(s.changes, nil, b)
		if err != nil {
			return vault.Connection{}, err
		}
		s.conns[c.ID] = b
		s.enqueue(ds)
		s.index(c.Principal, c.ID)
		c.SealedWith = s.kr.Primary()
		return c, nil
	})
}

// index adds connection id to p's; s.mu must be held.
func (s *Store) index(p vault.Principal, id string) {
	idx := s.byPrincipal[p]
	if idx == nil {
		idx = map[string]struct{}{}
		s.byPrincipal[p] = idx
	}
	idx[id] = struct{}{}
}

// taken is ErrExists, naming the record as name, when m (one of s's
// maps) holds key; s.mu must be held.
func taken[V any](m map[string]V, key, name string) error {
	if _, ok := m[key]; ok {
		return fmt.Errorf("memstore: %s: %w", name, vault.ErrExists)
	}
	return nil
}

// GetConnection implements vault.Store.
func (s *Store) GetConnection(ctx context.Context, id string) (vault.Connection, error) {
	return get(s, s.conns, id, "connection", func(b []byte) (vault.Connection, error) {
		return record.DecodeConnection(s.kr, b)
	})
}

// ListConnections implements vault.Store.
func (s *Store) ListConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	recs, err := read(s, func() ([][]byte, error) { return inOrder(s.conns, maps.Keys(s.byPrincipal[p])), nil })
	if err != nil {
		return nil, err
	}
	return record.DecodePrincipalConnections(p, recs)
}

// inOrder returns the records of ids in recs (one of s's maps), ordered
// by id; s.mu must be held.
func inOrder(recs map[string][]byte, ids iter.Seq[string]) [][]byte {
	sorted := slices.Sorted(ids)
	out := make([][]byte, 0, len(sorted))
	for _, id := range sorted {
		out = append(out, recs[id])
	}
	return out
}

// UpdateConnection implements vault.Store.
func (s *Store) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(id, record.UpdateRewrite(s.kr, id, fn))
}

// UpdateConnectionMeta implements vault.Store.
func (s *Store) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(id, record.MetaRewrite(id, fn))
}

// rewriteConnection replaces connection id's record with what rewrite
// makes of it, with the deliveries the change causes.
func (s *Store) rewriteConnection(id string, rewrite record.Rewrite) (vault.Connection, error) {
	return cas(s, s.conns, id, "connection", func(rec []byte) (edit[vault.Connection], error) {
		nrec, nc, ds, err := rewrite.WithDeliveries(s.changes, rec)
		return edit[vault.Connection]{rec: nrec, out: nc, ds: ds}, err
	})
}

// edit is what a compare-and-swap makes of a stored record.
type edit[T any] struct {
	rec []byte           // the record to store
	out T                // the call's answer
	ds  []vault.Delivery // the outbox deliveries the change causes
}

// cas is every compare-and-swap update of a stored record, under the
// write lock: it reads id's record in recs (one of s's maps), lets change
// make the new one, and stores it with the change's deliveries. change's
// error, or ErrNotFound when there is no record, is the call's answer,
// and nothing is written.
func cas[T any](s *Store, recs map[string][]byte, id, what string, change func(rec []byte) (edit[T], error)) (T, error) {
	return write(s, func() (T, error) {
		b, ok := recs[id]
		if !ok {
			return *new(T), fmt.Errorf("memstore: %s %s: %w", what, id, vault.ErrNotFound)
		}
		e, err := change(b)
		if err != nil {
			return *new(T), err
		}
		recs[id] = e.rec
		s.enqueue(e.ds)
		return e.out, nil
	})
}

// casKind is cas for a kind of record stored whole: fn applied with k's
// update rules (record.Kind.Update).
func casKind[T any](s *Store, recs map[string][]byte, k record.Kind[T], id string, fn func(T) (T, error)) (T, error) {
	return cas(s, recs, id, k.Name, func(rec []byte) (edit[T], error) {
		nrec, _, nv, err := k.Update(rec, fn)
		return edit[T]{rec: nrec, out: nv}, err
	})
}

// DeleteConnection implements vault.Store.
func (s *Store) DeleteConnection(ctx context.Context, id string) error {
	return s.deleteConnection(id, false)
}

// deleteConnection removes connection id, keeping its record among the
// retired ones when retire is set.
func (s *Store) deleteConnection(id string, retire bool) error {
	return update(s, func() error {
		b, ok := s.conns[id]
		if !ok {
			return fmt.Errorf("memstore: connection %s: %w", id, vault.ErrNotFound)
		}
		meta, err := record.ConnectionMeta(b)
		if err != nil {
			return err
		}
		ds, err := record.ChangeDeliveries(s.changes, b, nil)
		if err != nil {
			return err
		}
		s.enqueue(ds)
		if retire {
			s.retired[id] = b
		}
		delete(s.conns, id)
		delete(s.byPrincipal[meta.Principal], id)
		if len(s.byPrincipal[meta.Principal]) == 0 {
			delete(s.byPrincipal, meta.Principal)
		}
		return nil
	})
}

// AccountConnections implements vault.Store: a scan of every record's
// metadata.
func (s *Store) AccountConnections(ctx context.Context, provider, accountID string) ([]vault.Connection, error) {
	recs, err := read(s, func() ([][]byte, error) { return inOrder(s.conns, maps.Keys(s.conns)), nil })
	if err != nil {
		return nil, err
	}
	return record.DecodeAccountConnections(provider, accountID, recs)
}

// ConnectionIDs implements vault.Store.
func (s *Store) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	return read(s, func() ([]string, error) {
		var ids []string
		for id := range s.conns {
			if id > after {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		if limit > 0 && len(ids) > limit {
			ids = ids[:limit]
		}
		return ids, nil
	})
}

// CreateGrant implements vault.Store.
func (s *Store) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	return s.CreateGrantLimited(ctx, g, vault.GrantLimits{})
}

// CreateGrantLimited implements vault.Store: the count and the insert
// happen under one hold of the write lock.
func (s *Store) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	g, b, err := record.Grants.New(g)
	if err != nil {
		return vault.Grant{}, err
	}
	return write(s, func() (vault.Grant, error) {
		if err := taken(s.grants, g.ID, "grant "+g.ID); err != nil {
			return vault.Grant{}, err
		}
		if lim.Enforced() {
			created, open, err := s.countGrants(g.Principal, lim)
			if err != nil {
				return vault.Grant{}, err
			}
			if err := lim.Check(created, open); err != nil {
				return vault.Grant{}, fmt.Errorf("memstore: grant %s: %w", g.ID, err)
			}
		}
		s.grants[g.ID] = b
		return g, nil
	})
}

// GetGrant implements vault.Store.
func (s *Store) GetGrant(ctx context.Context, id string) (vault.Grant, error) {
	return get(s, s.grants, id, "grant", record.DecodeGrant)
}

// get decodes id's record in recs (one of s's maps) with decode.
func get[T any](s *Store, recs map[string][]byte, id, what string, decode func([]byte) (T, error)) (T, error) {
	b, err := read(s, func() ([]byte, error) {
		b, ok := recs[id]
		if !ok {
			return nil, fmt.Errorf("memstore: %s %s: %w", what, id, vault.ErrNotFound)
		}
		return b, nil
	})
	if err != nil {
		return *new(T), err
	}
	return decode(b)
}

// UpdateGrant implements vault.Store.
func (s *Store) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	return casKind(s, s.grants, record.Grants, id, fn)
}

// CountGrants implements vault.Store.
func (s *Store) CountGrants(ctx context.Context, p vault.Principal, since, now time.Time) (created, open int, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if err := s.check(); err != nil {
		return 0, 0, err
	}
	return s.countGrants(p, vault.GrantLimits{Since: since, Now: now})
}

// ListGrants implements vault.Store.
func (s *Store) ListGrants(ctx context.Context, p vault.Principal, since time.Time) ([]vault.Grant, error) {
	return read(s, func() ([]vault.Grant, error) {
		var out []vault.Grant
		for _, b := range s.grants {
			g, err := record.DecodeGrant(b)
			if err != nil {
				return nil, err
			}
			if g.Principal == p && !g.Created.Before(since) {
				out = append(out, g)
			}
		}
		slices.SortFunc(out, func(a, b vault.Grant) int {
			if c := a.Created.Compare(b.Created); c != 0 {
				return c
			}
			return strings.Compare(a.ID, b.ID)
		})
		return out, nil
	})
}

// countGrants counts p's grants in lim's window; s.mu must be held.
func (s *Store) countGrants(p vault.Principal, lim vault.GrantLimits) (created, open int, err error) {
	for _, b := range s.grants {
		g, err := record.DecodeGrant(b)
		if err != nil {
			return 0, 0, err
		}
		if g.Principal != p {
			continue
		}
		c, o := lim.Counts(g)
		if c {
			created++
		}
		if o {
			open++
		}
	}
	return created, open, nil
}

// DeleteExpiredGrants implements vault.Store.
func (s *Store) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	return deleteWhere(s, s.grants, func(b []byte) (bool, error) {
		g, err := record.DecodeGrant(b)
		return err == nil && g.Expires.Before(now), err
	})
}

// write runs f under the write lock, on an open store.
func write[T any](s *Store, f func() (T, error)) (T, error) {
	return locked(s, s.mu.Lock, s.mu.Unlock, f)
}

// locked runs f between lock and unlock (of s.mu), on an open store.
func locked[T any](s *Store, lock, unlock func(), f func() (T, error)) (T, error) {
	lock()
	defer unlock()
	if err := s.check(); err != nil {
		return *new(T), err
	}
	return f()
}

// update is write for f that answers only an error.
func update(s *Store, f func() error) error {
	_, err := write(s, func() (struct{}, error) { return struct{}{}, f() })
	return err
}

// read runs f under the read lock, on an open store.
func read[T any](s *Store, f func() (T, error)) (T, error) {
	return locked(s, s.mu.RLock, s.mu.RUnlock, f)
}

// deleteKey removes key from m (one of the store's maps) under the write
// lock; ErrNotFound, naming the record as name, when it is absent.
func deleteKey[V any](s *Store, m map[string]V, key, name string) error {
	return update(s, func() error {
		if _, ok := m[key]; !ok {
			return fmt.Errorf("memstore: %s: %w", name, vault.ErrNotFound)
		}
		delete(m, key)
		return nil
	})
}

// deleteWhere removes, under the write lock, the entries of m (one of the
// store's maps) that drop says to, and returns how many.
func deleteWhere[V any](s *Store, m map[string]V, drop func(V) (bool, error)) (int, error) {
	return write(s, func() (int, error) {
		n := 0
		for k, v := range m {
			ok, err := drop(v)
			if err != nil {
				return n, err
			}
			if ok {
				delete(m, k)
				n++
			}
		}
		return n, nil
	})
}

// Locker implements vault.Store: one process holds a memory store, so an
// in-process lock excludes every caller.
func (s *Store) Locker() vault.Locker { return s.locker }

// Resealer implements vault.Store: nil. Re-sealing in memory costs no
// durable commit, so record by record is as good as a batch.
func (s *Store) Resealer() vault.Resealer { return nil }

// AppWatch implements vault.Store: nil. One process holds a memory
// store, so nobody else changes an app.
func (s *Store) AppWatch() vault.AppWatch { return nil }

// Close implements vault.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}
