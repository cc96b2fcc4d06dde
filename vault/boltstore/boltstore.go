// Package boltstore is the embedded vault.Store: one bbolt file, mode 0600,
// opened with a lock timeout so a second broker fails fast instead of
// waiting forever.
//
// Layout (all buckets are created at open):
//
//	connections         id → sealed connection record (record.EncodeConnection)
//	conn_by_principal   len(iss)|iss|len(sub)|sub|id → ""   (lengths are 4-byte big endian)
//	grants              id → grant record (record.EncodeGrant)
//	grant_by_principal  len(iss)|iss|len(sub)|sub|created|id → ""
//	grant_by_expiry     expires|id → ""
//	meta                "schema" → "1"; "canary/<key id>" → canary sealed with that key;
//	                    "sealed_all" → id of the key that seals every connection (after a rotation)
//	oauth_clients       client id → registered client record (record.EncodeOAuthClient)
//	oauth_codes         vault.SecretKey(code) → authorization code record (record.EncodeAuthCode)
//	oauth_apps          id → app access record (record.EncodeAppAccess)
//	oauth_app_by_client len(iss)|iss|len(sub)|sub|client id → app access id (one per person and client)
//	outbox              len(id)|id|endpoint → webhook delivery (record.EncodeDelivery)
//	outbox_due          due|len(id)|id|endpoint → ""
//	retired             id → sealed connection record kept to retry its revocation
//	retired_by_principal len(iss)|iss|len(sub)|sub|id → ""
//	spent_assertions    vault.AssertionKey → expiry (Unix nanoseconds, 8 bytes big endian)
//	idp_sessions        hex SHA-256 of the principal key → sealed IdP session (record.EncodeIdPSession)
//
// Times in keys are 12 bytes that sort like the times: the Unix second with
// its sign bit flipped, then the nanosecond, both big endian. Listing a
// principal's records is a prefix seek; the length prefixes keep principals
// whose issuer or subject are prefixes of each other apart.
//
// Creates and updates go through a group commit (groupcommit.go), so
// concurrent writers share one durable commit. A closure may run more than
// once, as with bolt's DB.Batch, so every
// closure resets its results before it starts; expected failures (not found,
// exists, an error from the caller's update function) are reported through
// those results rather than by failing the shared transaction.
package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
	"credbroker/vault/internal/gate"
	"credbroker/vault/internal/locallock"
	"credbroker/vault/internal/record"
)

// Errors of Open, matched with errors.Is.
var (
	// ErrLocked: another process holds the database file.
	ErrLocked = errors.New("is another broker running?")
	// ErrCorrupt: the file is not a readable credbroker database.
	ErrCorrupt = errors.New("database file is corrupt or not a credbroker database")
	// ErrWrongKey: a configured key differs from the key of the same id that
	// wrote the database, or no configured key was ever used with it.
	ErrWrongKey = errors.New("wrong encryption key")
)

const schemaVersion = "1"

var (
	bConns       = []byte("connections")
	bConnByPrinc = []byte("conn_by_principal")
	bGrants      = []byte("grants")
	bGrantByPrin = []byte("grant_by_principal")
	bGrantByExp  = []byte("grant_by_expiry")
	bMeta        = []byte("meta")

	allBuckets = [][]byte{bConns, bConnByPrinc, bGrants, bGrantByPrin, bGrantByExp, bMeta,
		bOAuthClients, bOAuthCodes, bOAuthApps, bOAuthAppByClient,
		bOutbox, bOutboxDue, bRetired, bRetiredByPrinc, bSpent, bUpstream, bSessions}

	keySchema       = []byte("schema")
	keySealedAll    = []byte("sealed_all")
	canaryPrefix    = []byte("canary/")
	canaryPlaintext = []byte("credbroker key canary v1")
)

// Options tunes Open. The zero value is the production setting.
type Options struct {
	// Timeout bounds the wait for the file lock; 0 means one second.
	Timeout time.Duration
	// NoSync skips fsync on commit. Only for building benchmark fixtures:
	// acknowledged writes are not durable.
	NoSync bool
	// Changes, when set, turns changes of connections into outbox
	// deliveries written in the change's transaction.
	Changes vault.ChangeHook[vault.Connection]
	// AppChanges, when set, does the same for app access records.
	AppChanges vault.ChangeHook[vault.AppAccess]
}

// Store is a vault.Store on a bbolt file.
type Store struct {
	db         *bolt.DB
	kr         *vault.Keyring
	changes    vault.ChangeHook[vault.Connection]
	appChanges vault.ChangeHook[vault.AppAccess]
	path       string
	open       gate.Gate
	group      *groupCommit
	locker     *locallock.Locker // a bolt file belongs to one process
}

// Open opens (creating if needed) the database at path. It verifies kr
// against the per-key canaries stored in the file, adding canaries for keys
// that have none yet.
func Open(path string, kr *vault.Keyring, opts Options) (s *Store, err error) {
	if kr == nil {
		return nil, vault.ErrNoKeys
	}
	if opts.Timeout <= 0 {
		opts.Timeout = time.Second
	}
	var db *bolt.DB
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				closeQuietly(db)
			}
			s, err = nil, fmt.Errorf("database %s: %w (%v)", path, ErrCorrupt, r)
		}
	}()
	db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout, NoSync: opts.NoSync, FreelistType: bolt.FreelistMapType})
	if err != nil {
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, fmt.Errorf("database %s is locked: %w", path, ErrLocked)
		case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
			errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
			return nil, fmt.Errorf("database %s: %w (%v)", path, ErrCorrupt, err)
		}
		if _, statErr := os.Stat(path); statErr == nil && !errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("database %s: %w (%v)", path, ErrCorrupt, err)
		}
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(path, 0o600); err != nil {
			closeQuietly(db)
			return nil, fmt.Errorf("database %s: restrict mode to 0600: %w", path, err)
		}
	}
	s = &Store{db: db, kr: kr, path: path, changes: opts.Changes, appChanges: opts.AppChanges, group: newGroupCommit(db, true),
		locker: locallock.New()}
	if err := s.prepare(); err != nil {
		closeQuietly(db)
		return nil, err
	}
	return s, nil
}

func closeQuietly(db *bolt.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// prepare checks the schema and key canaries, then creates what is missing
// in one write transaction (skipped when nothing is missing).
func (s *Store) prepare() error {
	need := false
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		need, err = s.checkLayout(tx, false)
		return err
	})
	if err != nil || !need {
		return err
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		_, err := s.checkLayout(tx, true)
		return err
	})
}

func (s *Store) checkLayout(tx *bolt.Tx, write bool) (need bool, err error) {
	meta := tx.Bucket(bMeta)
	if meta == nil {
		hasAny := false
		_ = tx.ForEach(func([]byte, *bolt.Bucket) error { hasAny = true; return nil })
		if hasAny {
			return false, fmt.Errorf("database %s: %w (no meta bucket)", s.path, ErrCorrupt)
		}
	} else if v := meta.Get(keySchema); v != nil && string(v) != schemaVersion {
		return false, fmt.Errorf("database %s has schema version %q; this broker understands %q", s.path, v, schemaVersion)
	}
	for _, name := range allBuckets {
		b := tx.Bucket(name)
		if b != nil {
			continue
		}
		if !write {
			return true, nil
		}
		if b, err = tx.CreateBucket(name); err != nil {
			return false, fmt.Errorf("database %s: create bucket %s: %w", s.path, name, err)
		}
		if bytes.Equal(name, bMeta) {
			meta = b
		}
	}
	if meta.Get(keySchema) == nil {
		if !write {
			return true, nil
		}
		if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
			return false, err
		}
	}
	if v := meta.Get(keySealedAll); v != nil && string(v) != s.kr.Primary() {
		if !write {
			return true, nil
		}
		if err := meta.Delete(keySealedAll); err != nil {
			return false, err
		}
	}
	// Verify every canary whose key we hold; remember which ids exist.
	seen := map[string]bool{}
	c := meta.Cursor()
	for k, v := c.Seek(canaryPrefix); k != nil && bytes.HasPrefix(k, canaryPrefix); k, v = c.Next() {
		id := string(k[len(canaryPrefix):])
		seen[id] = true
		if !s.kr.Has(id) {
			continue
		}
		kid, err := envelope.KeyID(v)
		if err != nil || kid != id {
			return false, fmt.Errorf("database %s: %w (canary of key %s is malformed)", s.path, ErrCorrupt, id)
		}
		if _, _, err := s.kr.Open(v, canaryAAD(id)); err != nil {
			return false, fmt.Errorf("key %s does not match the one this database was written with: %w", id, ErrWrongKey)
		}
	}
	if len(seen) > 0 {
		shared := false
		for _, id := range s.kr.IDs() {
			shared = shared || seen[id]
		}
		if !shared {
			var had []string
			for id := range seen {
				had = append(had, id)
			}
			return false, fmt.Errorf("none of the configured keys (%s) was used with database %s, which was written with %s: %w",
				strings.Join(s.kr.IDs(), ", "), s.path, strings.Join(slices.Sorted(slices.Values(had)), ", "), ErrWrongKey)
		}
	}
	for _, id := range s.kr.IDs() {
		if seen[id] {
			continue
		}
		if !write {
			return true, nil
		}
		ct, err := s.kr.SealWith(id, canaryPlaintext, canaryAAD(id))
		if err != nil {
			return false, err
		}
		if err := meta.Put(append(append([]byte(nil), canaryPrefix...), id...), ct); err != nil {
			return false, err
		}
	}
	return false, nil
}

func canaryAAD(id string) []byte { return []byte("credbroker/canary/v1/" + id) }

// Path returns the database file's path.
func (s *Store) Path() string { return s.path }

// DB exposes the underlying bbolt handle for consistency checks and tools.
func (s *Store) DB() *bolt.DB { return s.db }

// tx runs fn in a transaction through run (a bolt method or the group
// commit) and sorts out what went wrong: fn's own error is returned as it
// is; bbolt's "not open" is vault.ErrClosed (a Close raced the call); a
// failed commit, one that could not write, grow or sync the file (a full
// disk, an I/O error), is vault.ErrUnavailable naming the file and the
// cause (the group commit's ErrCorrupt, a panic while committing, stays
// ErrCorrupt).
func (s *Store) tx(run func(func(*bolt.Tx) error) error, fn func(*bolt.Tx) error) (err error) {
	defer s.recoverCorrupt(&err)
	var own error // what fn returned the last time it ran
	err = run(func(tx *bolt.Tx) error {
		own = fn(tx)
		return own
	})
	switch {
	case err == nil, own != nil:
		return err
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return vault.ErrClosed
	case errors.Is(err, ErrCorrupt):
		return err
	}
	return vault.UnavailableError("database "+s.path, err)
}

func (s *Store) view(fn func(*bolt.Tx) error) error { return s.tx(s.db.View, fn) }

func (s *Store) batch(fn func(*bolt.Tx) error) error { return s.tx(s.group.do, fn) }

// decide runs fn in a batched write transaction, as batch does, where fn
// may refuse: a refuse(err) it returns is decide's answer, and the
// transaction ends as if fn had returned nil (fn refuses before it
// writes). Any other error fails the transaction.
func (s *Store) decide(fn func(*bolt.Tx) error) error {
	var refused error
	err := s.batch(func(tx *bolt.Tx) error {
		refused = nil
		err := fn(tx)
		if r := (refusal{}); errors.As(err, &r) {
			refused = r.err
			return nil
		}
		return err
	})
	if err == nil {
		err = refused
	}
	return err
}

// refusal is an answer of a decide closure that is not a failure.
type refusal struct{ err error }

func (r refusal) Error() string { return r.err.Error() }

// refuse makes err a decide closure's answer (see decide).
func refuse(err error) error { return refusal{err} }

func (s *Store) update(fn func(*bolt.Tx) error) error { return s.tx(s.db.Update, fn) }

func (s *Store) recoverCorrupt(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("database %s: %w (%v)", s.path, ErrCorrupt, r)
	}
}

// principalKey is the length-prefixed principal prefix of the index keys.
func principalKey(p vault.Principal, extra int) []byte {
	b := make([]byte, 0, 8+len(p.Issuer)+len(p.Subject)+extra)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.Issuer)))
	b = append(b, p.Issuer...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(p.Subject)))
	return append(b, p.Subject...)
}

func connIndexKey(p vault.Principal, id string) []byte {
	return append(principalKey(p, len(id)), id...)
}

// timeKey renders t as 12 bytes that sort like t.
func timeKey(b []byte, t time.Time) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(t.Unix())^(1<<63))
	return binary.BigEndian.AppendUint32(b, uint32(t.Nanosecond()))
}

const timeKeyLen = 12

func grantPrincipalKey(g vault.Grant) []byte {
	return append(timeKey(principalKey(g.Principal, timeKeyLen+len(g.ID)), g.Created), g.ID...)
}

func grantExpiryKey(g vault.Grant) []byte {
	return append(timeKey(make([]byte, 0, timeKeyLen+len(g.ID)), g.Expires), g.ID...)
}

// CreateConnection implements vault.Store.
func (s *Store) CreateConnection(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	c, rec, err := s.open.NewConnection(ctx, s.kr, c)
	if err != nil {
		return vault.Connection{}, err
	}
	err = s.decide(func(tx *bolt.Tx) error {
		if tx.Bucket(bConns).Get([]byte(c.ID)) != nil {
			return refuse(fmt.Errorf("boltstore: connection %s: %w", c.ID, vault.ErrExists))
		}
		return s.writeConnection(tx, c.ID, c.Principal, nil, rec)
	})
	if err != nil {
		return vault.Connection{}, err
	}
	c.SealedWith = s.kr.Primary()
	return c, nil
}

// writeConnection stores rec as connection id's record in tx, over old
// (nil for a new connection of p's, whose index entry it adds), with the
// outbox deliveries of the change; a refusal of the deliveries is the
// call's answer, and nothing is written.
func (s *Store) writeConnection(tx *bolt.Tx, id string, p vault.Principal, old, rec []byte) error {
	ds, err := record.ChangeDeliveries(s.changes, old, rec)
	if err != nil {
		return refuse(err)
	}
	if err := tx.Bucket(bConns).Put([]byte(id), rec); err != nil {
		return err
	}
	if err := putDeliveries(tx, ds); err != nil {
		return err
	}
	if old != nil {
		return nil
	}
	return tx.Bucket(bConnByPrinc).Put(connIndexKey(p, id), nil)
}

// Import stores many new connections in one write transaction (one fsync),
// for migrations and fixtures. It fails with vault.ErrExists, storing
// nothing, when any id is taken.
func (s *Store) Import(ctx context.Context, conns []vault.Connection) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	type item struct{ id, rec, idx []byte }
	items := make([]item, len(conns))
	for i, c := range conns {
		c, rec, err := record.NewConnection(s.kr, c)
		if err != nil {
			return err
		}
		items[i] = item{[]byte(c.ID), rec, connIndexKey(c.Principal, c.ID)}
	}
	return s.update(func(tx *bolt.Tx) error {
		b, ib := tx.Bucket(bConns), tx.Bucket(bConnByPrinc)
		b.FillPercent, ib.FillPercent = 0.9, 0.9 // imports are mostly appends
		for _, it := range items {
			if b.Get(it.id) != nil {
				return fmt.Errorf("boltstore: import connection %s: %w", it.id, vault.ErrExists)
			}
			if err := b.Put(it.id, it.rec); err != nil {
				return err
			}
			if err := ib.Put(it.idx, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// GetConnection implements vault.Store.
func (s *Store) GetConnection(ctx context.Context, id string) (vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.Connection{}, err
	}
	var c vault.Connection
	err := s.view(func(tx *bolt.Tx) error {
		rec := tx.Bucket(bConns).Get([]byte(id))
		if rec == nil {
			return fmt.Errorf("boltstore: connection %s: %w", id, vault.ErrNotFound)
		}
		// Decoded in place: the result copies what it keeps, so the
		// record needs no copy out of the transaction.
		var err error
		c, err = record.DecodeConnection(s.kr, rec)
		return err
	})
	if err == nil && c.ID != id {
		err = fmt.Errorf("boltstore: connection %s: stored record names id %s: %w", id, c.ID, vault.ErrMalformed)
	}
	if err != nil {
		return vault.Connection{}, err
	}
	return c, nil
}

// ListConnections implements vault.Store: a prefix seek on the principal index.
func (s *Store) ListConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	prefix := principalKey(p, 0)
	var (
		recs [][]byte
		out  []vault.Connection
	)
	err := s.view(func(tx *bolt.Tx) error {
		conns := tx.Bucket(bConns)
		c := tx.Bucket(bConnByPrinc).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if rec := conns.Get(k[len(prefix):]); rec != nil {
				recs = append(recs, rec)
			}
		}
		// Decoded inside the transaction: the metadata is copied out.
		var err error
		out, err = record.DecodePrincipalConnections(p, recs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateConnection implements vault.Store: read, fn, write in one transaction.
func (s *Store) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(ctx, id, record.UpdateRewrite(s.kr, id, fn))
}

// UpdateConnectionMeta implements vault.Store: the sealed tokens are
// copied, never opened.
func (s *Store) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(ctx, id, record.MetaRewrite(id, fn))
}

// rewriteConnection replaces connection id's record with what rewrite
// makes of it, writing the deliveries the change causes in the same
// transaction.
func (s *Store) rewriteConnection(ctx context.Context, id string, rewrite record.Rewrite) (vault.Connection, error) {
	return cas(ctx, s, bConns, id, "connection", func(rec []byte) (edit[vault.Connection], error) {
		nrec, nc, ds, err := rewrite.WithDeliveries(s.changes, rec)
		return edit[vault.Connection]{rec: nrec, out: nc, ds: ds}, err
	}, nil)
}

// edit is what a compare-and-swap makes of a stored record.
type edit[T any] struct {
	rec      []byte           // the record to store
	old, out T                // the value it held (when an index needs it) and the call's answer
	ds       []vault.Delivery // the outbox deliveries the change causes
}

// cas is every compare-and-swap update of a stored record: in one batched
// write transaction it reads key's record in bucket, lets change make the
// new one, stores it with the change's deliveries, and lets index (when
// not nil) move the record's index entries. change sees the record as
// stored (valid only during the call) and must have no side effects: a
// batch may run it more than once. Its error, or ErrNotFound when there
// is no record, is the call's answer, and nothing is written.
func cas[T any](ctx context.Context, s *Store, bucket []byte, key, what string,
	change func(rec []byte) (edit[T], error), index func(tx *bolt.Tx, old, new T) error) (T, error) {
	if err := s.open.Ready(ctx); err != nil {
		return *new(T), err
	}
	var out T
	err := s.decide(func(tx *bolt.Tx) error {
		out = *new(T)
		b := tx.Bucket(bucket)
		rec := b.Get([]byte(key))
		if rec == nil {
			return refuse(fmt.Errorf("boltstore: %s %s: %w", what, key, vault.ErrNotFound))
		}
		e, err := change(rec)
		if err != nil {
			return refuse(err)
		}
		if err := b.Put([]byte(key), e.rec); err != nil {
			return err
		}
		if len(e.ds) > 0 {
			if err := putDeliveries(tx, e.ds); err != nil {
				return err
			}
		}
		if index != nil {
			if err := index(tx, e.old, e.out); err != nil {
				return err
			}
		}
		out = e.out
		return nil
	})
	if err != nil {
		return *new(T), err
	}
	return out, nil
}

// casKind is cas for a kind of record stored whole: fn applied with k's
// update rules (record.Kind.Update).
func casKind[T any](ctx context.Context, s *Store, bucket []byte, k record.Kind[T], key string,
	fn func(T) (T, error), index func(tx *bolt.Tx, old, new T) error) (T, error) {
	return cas(ctx, s, bucket, key, k.Name, func(rec []byte) (edit[T], error) {
		nrec, old, nv, err := k.Update(rec, fn)
		return edit[T]{rec: nrec, old: old, out: nv}, err
	}, index)
}

// DeleteConnection implements vault.Store.
func (s *Store) DeleteConnection(ctx context.Context, id string) error {
	return s.deleteConnection(ctx, id, false)
}

// deleteConnection removes connection id, keeping its record among the
// retired ones when retire is set.
func (s *Store) deleteConnection(ctx context.Context, id string, retire bool) error {
	return s.dropConnection(ctx, bConns, bConnByPrinc, "connection", id, func(tx *bolt.Tx, rec []byte, meta vault.Connection) error {
		ds, err := record.ChangeDeliveries(s.changes, rec, nil)
		if err != nil {
			return refuse(err)
		}
		if err := putDeliveries(tx, ds); err != nil {
			return err
		}
		if retire {
			if err := tx.Bucket(bRetired).Put([]byte(id), bytes.Clone(rec)); err != nil {
				return err
			}
			if err := tx.Bucket(bRetiredByPrinc).Put(connIndexKey(meta.Principal, id), nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// dropConnection removes connection id from bucket (bConns or bRetired)
// and its entry from that bucket's principal index, in one write
// transaction that first runs also (when set) on the record and its
// metadata; the record is valid only during tx. ErrNotFound, naming the
// record as what, when there is none, and a record that does not decode,
// are refusals.
func (s *Store) dropConnection(ctx context.Context, bucket, index []byte, what, id string, also func(tx *bolt.Tx, rec []byte, meta vault.Connection) error) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	return s.decide(func(tx *bolt.Tx) error {
		rec := tx.Bucket(bucket).Get([]byte(id))
		if rec == nil {
			return refuse(fmt.Errorf("boltstore: %s %s: %w", what, id, vault.ErrNotFound))
		}
		meta, err := record.ConnectionMeta(rec)
		if err != nil {
			return refuse(err)
		}
		if also != nil {
			if err := also(tx, rec, meta); err != nil {
				return err
			}
		}
		if err := tx.Bucket(index).Delete(connIndexKey(meta.Principal, id)); err != nil {
			return err
		}
		return tx.Bucket(bucket).Delete([]byte(id))
	})
}

// AccountConnections implements vault.Store: a scan of every record's
// metadata in one read transaction (it runs on a disconnect, not on the
// hot path, so the file keeps no index for it).
func (s *Store) AccountConnections(ctx context.Context, provider, accountID string) ([]vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var out []vault.Connection
	err := s.view(func(tx *bolt.Tx) error {
		var recs [][]byte
		err := tx.Bucket(bConns).ForEach(func(_, rec []byte) error {
			recs = append(recs, rec)
			return nil
		})
		if err != nil {
			return err
		}
		// Decoded inside the transaction: the metadata is copied out.
		out, err = record.DecodeAccountConnections(provider, accountID, recs)
		return err
	})
	return out, err
}

// ConnectionIDs implements vault.Store.
func (s *Store) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var ids []string
	err := s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(bConns).Cursor()
		k, _ := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, _ = c.Next()
		}
		for ; k != nil && (limit <= 0 || len(ids) < limit); k, _ = c.Next() {
			ids = append(ids, string(k))
		}
		return nil
	})
	return ids, err
}

// Reseal implements vault.Resealer: one transaction for the whole batch.
func (s *Store) Reseal(ctx context.Context, ids []string) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	primary := s.kr.Primary()
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bConns)
		for _, id := range ids {
			rec := b.Get([]byte(id))
			if rec == nil {
				continue
			}
			meta, err := record.ConnectionMeta(rec)
			if err != nil {
				return err
			}
			if meta.SealedWith == primary {
				continue
			}
			nrec, _, err := record.Reseal(s.kr, rec)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(id), nrec); err != nil {
				return err
			}
			n++
		}
		if n == 0 {
			return errNothingToDo // roll back: no commit, no fsync
		}
		return nil
	})
	if err != nil && !errors.Is(err, errNothingToDo) {
		return 0, err
	}
	return n, nil
}

var errNothingToDo = errors.New("boltstore: nothing to do")

// FullySealed reports whether a completed rotation recorded that every
// connection, upstream client secret and IdP session is sealed with the
// current primary key. Open clears that mark whenever it sees a different
// primary, and an import that adds records clears it too (they travel
// sealed with whatever key sealed them), so a true answer stays true for as
// long as this process (whose writes all use the primary) holds the file.
func (s *Store) FullySealed() bool {
	mark := false
	_ = s.view(func(tx *bolt.Tx) error {
		mark = string(tx.Bucket(bMeta).Get(keySealedAll)) == s.kr.Primary()
		return nil
	})
	return mark
}

// MarkFullySealed records that every connection and upstream client
// secret is sealed with the primary key; call it after vault.Rekey
// finished without error.
func (s *Store) MarkFullySealed() error {
	if s.open.Closed() {
		return vault.ErrClosed
	}
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bMeta).Put(keySealedAll, []byte(s.kr.Primary()))
	})
}

// KeyUsage counts connections by the id of the key that sealed their
// tokens, and upstream client secrets and IdP sessions by theirs, so
// operators know when an old key seals nothing and can go.
func (s *Store) KeyUsage(ctx context.Context) (map[string]int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	usage := map[string]int{}
	err := s.view(func(tx *bolt.Tx) error {
		err := tx.Bucket(bConns).ForEach(func(k, v []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			meta, err := record.ConnectionMeta(v)
			if err != nil {
				return fmt.Errorf("boltstore: connection %s: %w", k, err)
			}
			usage[meta.SealedWith]++
			return nil
		})
		if err != nil {
			return err
		}
		if err := upstreamKeyUsage(tx, usage); err != nil {
			return err
		}
		return sessionKeyUsage(tx, usage)
	})
	return usage, err
}

// CreateGrant implements vault.Store.
func (s *Store) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	return s.CreateGrantLimited(ctx, g, vault.GrantLimits{})
}

// CreateGrantLimited implements vault.Store: the principal's grants are
// counted inside the batched write transaction that inserts the grant.
// Batch runs its closures one after another in one transaction (and may
// run a closure again), so each closure's count sees every grant inserted
// before it, including those of the same batch.
func (s *Store) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	g, rec, err := fresh(ctx, s, record.Grants, g)
	if err != nil {
		return vault.Grant{}, err
	}
	id := []byte(g.ID)
	pk, ek := grantPrincipalKey(g), grantExpiryKey(g)
	err = s.decide(func(tx *bolt.Tx) error {
		b := tx.Bucket(bGrants)
		if b.Get(id) != nil {
			return refuse(fmt.Errorf("boltstore: grant %s: %w", g.ID, vault.ErrExists))
		}
		if lim.Enforced() {
			created, open, err := countGrants(tx, g.Principal, lim)
			if err == nil {
				err = lim.Check(created, open)
			}
			if err != nil {
				return refuse(fmt.Errorf("boltstore: grant %s: %w", g.ID, err))
			}
		}
		if err := b.Put(id, rec); err != nil {
			return err
		}
		if err := tx.Bucket(bGrantByPrin).Put(pk, nil); err != nil {
			return err
		}
		return tx.Bucket(bGrantByExp).Put(ek, nil)
	})
	if err != nil {
		return vault.Grant{}, err
	}
	return g, nil
}

// GetGrant implements vault.Store.
func (s *Store) GetGrant(ctx context.Context, id string) (vault.Grant, error) {
	return getKind(ctx, s, bGrants, record.Grants, id)
}

// UpdateGrant implements vault.Store, keeping the indexes in step when
// Created or Expires change.
func (s *Store) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	return casKind(ctx, s, bGrants, record.Grants, id, fn, reindexGrant)
}

// CountGrants implements vault.Store.
func (s *Store) CountGrants(ctx context.Context, p vault.Principal, since, now time.Time) (created, open int, err error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, 0, err
	}
	err = s.view(func(tx *bolt.Tx) error {
		created, open, err = countGrants(tx, p, vault.GrantLimits{Since: since, Now: now})
		return err
	})
	if err != nil {
		return 0, 0, err
	}
	return created, open, nil
}

// ListGrants implements vault.Store: the same seek on the principal index
// as countGrants.
func (s *Store) ListGrants(ctx context.Context, p vault.Principal, since time.Time) ([]vault.Grant, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var out []vault.Grant
	err := s.view(func(tx *bolt.Tx) error {
		out = nil
		return grantsSince(tx, p, since, func(g vault.Grant) error {
			if g.Principal != p {
				return fmt.Errorf("boltstore: grant %s is indexed under another principal: %w", g.ID, vault.ErrMalformed)
			}
			out = append(out, g)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// countGrants counts p's grants in lim's window: a seek to (principal,
// since) on the principal index, then only that principal's recent grants
// are read.
func countGrants(tx *bolt.Tx, p vault.Principal, lim vault.GrantLimits) (created, open int, err error) {
	err = grantsSince(tx, p, lim.Since, func(g vault.Grant) error {
		cr, op := lim.Counts(g)
		if cr {
			created++
		}
		if op {
			open++
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return created, open, nil
}

// grantsSince calls fn with each of p's grants created at or after since,
// oldest first: a seek to (principal, since) on the principal index.
func grantsSince(tx *bolt.Tx, p vault.Principal, since time.Time, fn func(vault.Grant) error) error {
	prefix := principalKey(p, timeKeyLen)
	grants := tx.Bucket(bGrants)
	c := tx.Bucket(bGrantByPrin).Cursor()
	for k, _ := c.Seek(timeKey(bytes.Clone(prefix), since)); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if len(k) < len(prefix)+timeKeyLen {
			continue
		}
		rec := grants.Get(k[len(prefix)+timeKeyLen:])
		if rec == nil {
			continue
		}
		g, err := record.DecodeGrant(rec)
		if err != nil {
			return err
		}
		if err := fn(g); err != nil {
			return err
		}
	}
	return nil
}

// dropGrant removes grant id inside tx, with its entry in the index
// bucket idx (keyed by key): the one index its caller does not remove the
// entry from itself. It reports whether there was a grant; a record that
// does not decode leaves its entry.
func dropGrant(tx *bolt.Tx, id, idx []byte, key func(vault.Grant) []byte) (bool, error) {
	grants := tx.Bucket(bGrants)
	rec := grants.Get(id)
	if rec == nil {
		return false, nil
	}
	if g, err := record.DecodeGrant(rec); err == nil {
		if err := tx.Bucket(idx).Delete(key(g)); err != nil {
			return false, err
		}
	}
	return true, grants.Delete(id)
}

// DeleteExpiredGrants implements vault.Store: it walks the expiry index from
// the oldest entry, a thousand grants per transaction.
func (s *Store) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	const chunk = 1000
	end := timeKey(nil, now)
	total := 0
	for {
		if err := s.open.Ready(ctx); err != nil {
			return total, err
		}
		n, removed := 0, 0
		err := s.update(func(tx *bolt.Tx) error {
			n, removed = 0, 0
			c := tx.Bucket(bGrantByExp).Cursor()
			for k, _ := c.First(); k != nil && n < chunk; k, _ = c.First() {
				if len(k) < timeKeyLen || bytes.Compare(k[:timeKeyLen], end) >= 0 {
					break
				}
				dropped, err := dropGrant(tx, bytes.Clone(k[timeKeyLen:]), bGrantByPrin, grantPrincipalKey)
				if err != nil {
					return err
				}
				if dropped {
					removed++
				}
				if err := c.Delete(); err != nil {
					return err
				}
				n++
			}
			return nil
		})
		total += removed
		if err != nil {
			return total, err
		}
		if n < chunk {
			return total, nil
		}
	}
}

// Close implements vault.Store. It is safe to call more than once.
func (s *Store) Close() error {
	if s.open.Close() {
		return nil
	}
	return s.db.Close()
}

// Locker implements vault.Store: the file lock keeps every other process
// out, so an in-process lock excludes every caller.
func (s *Store) Locker() vault.Locker { return s.locker }

// Resealer implements vault.Store: the store is its own Resealer (Reseal).
func (s *Store) Resealer() vault.Resealer { return s }

// AppWatch implements vault.Store: nil. The file lock makes this process
// the only writer, so nobody else changes an app.
func (s *Store) AppWatch() vault.AppWatch { return nil }
