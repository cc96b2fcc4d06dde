// Package pgstore is the shared vault.Store: PostgreSQL through pgx, so
// several broker replicas behind a load balancer serve one deployment.
//
// Records are stored exactly as boltstore stores them: the record column
// holds record.EncodeConnection's output (the token set sealed with the key
// ring, AAD bound to the record's identity), and the metadata the broker
// queries (principal, provider, account, status, times, sealing key,
// version) is projected into indexed columns next to it. The database never
// sees a plaintext token, and `broker migrate` copies records byte for byte.
//
// Open migrates the schema (versioned steps in schema_migrations, each in a
// transaction, under an advisory lock so replicas starting together migrate
// once) and checks the key ring against per-key canaries, like boltstore:
// a configured key that differs from the one of the same id that wrote the
// database, or a ring sharing no key with it, refuses to open.
//
// Updates are compare-and-swap on the version column
// (UPDATE … WHERE id = $1 AND version = $2), re-running the caller's
// function on the fresh record when another writer won; single-use grants
// are consumed by exactly one such update. A grant created under limits
// (CreateGrantLimited) is counted and inserted in one transaction holding a
// per-person advisory transaction lock. LockConnection (vault.Locker)
// takes a PostgreSQL advisory lock on a dedicated connection so one replica
// at a time refreshes a connection's tokens.
package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
	"credbroker/vault/internal/gate"
	"credbroker/vault/internal/locallock"
	"credbroker/vault/internal/record"
)

// ErrWrongKey: a configured key differs from the key of the same id that
// wrote the database, or no configured key was ever used with it.
var ErrWrongKey = errors.New("wrong encryption key")

// Options tunes Open. The zero value is the production setting.
type Options struct {
	// MaxConns caps the data pool; 0 means the URL's pool_max_conns or 16.
	MaxConns int32
	// LockConns caps the connections that hold refresh locks; 0 means 16.
	LockConns int32
	// MaxAttempts bounds compare-and-swap retries of one update; 0 means 1000.
	MaxAttempts int
	// Changes, when set, turns changes of connections into outbox
	// deliveries written in the change's transaction.
	Changes vault.ChangeHook[vault.Connection]
	// AppChanges, when set, does the same for app access records.
	AppChanges vault.ChangeHook[vault.AppAccess]
	// Tracer, when set, observes the data pool's statements (a
	// pgx.BatchTracer too: each statement of a batch).
	Tracer pgx.QueryTracer
}

// Store is a vault.Store on PostgreSQL.
type Store struct {
	pool     *pgxpool.Pool // data
	lockPool *pgxpool.Pool // sessions holding advisory locks, apart so they never starve writes
	kr       *vault.Keyring
	local    *locallock.Locker // queues this process's LockConnection callers
	// grantLocal queues this process's limited grant creates per principal.
	grantLocal *locallock.Locker
	locksMu    sync.Mutex // guards locks
	locks      map[*heldLock]struct{}
	attempts   int
	changes    vault.ChangeHook[vault.Connection]
	appChanges vault.ChangeHook[vault.AppAccess]
	open       gate.Gate
}

// Open connects to the database at url (postgres://… or a libpq key=value
// string), migrates the schema and checks kr against the key canaries.
func Open(ctx context.Context, url string, kr *vault.Keyring, opts Options) (*Store, error) {
	if kr == nil {
		return nil, vault.ErrNoKeys
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres: bad connection string: %w", err)
	}
	if opts.MaxConns > 0 {
		cfg.MaxConns = opts.MaxConns
	} else if !strings.Contains(url, "pool_max_conns") {
		cfg.MaxConns = 16
	}
	cfg.ConnConfig.Tracer = opts.Tracer
	lockCfg := cfg.Copy()
	lockCfg.MaxConns = opts.LockConns
	if lockCfg.MaxConns <= 0 {
		lockCfg.MaxConns = 16
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 1000
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	lockPool, err := pgxpool.NewWithConfig(ctx, lockCfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &Store{pool: pool, lockPool: lockPool, kr: kr, local: locallock.New(), grantLocal: locallock.New(), locks: map[*heldLock]struct{}{}, attempts: opts.MaxAttempts, changes: opts.Changes, appChanges: opts.AppChanges}
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) prepare(ctx context.Context) error {
	if _, err := migrate(ctx, s.pool); err != nil {
		return fmt.Errorf("postgres %s: %w", s.where(), err)
	}
	// Check, add the canaries this ring lacks, check again: when two
	// replicas with different keys of one id race, the loser notices.
	for range 2 {
		missing, err := s.checkCanaries(ctx)
		if err != nil {
			return err
		}
		if len(missing) == 0 {
			return nil
		}
		for _, id := range missing {
			ct, err := s.kr.SealWith(id, canaryPlaintext, canaryAAD(id))
			if err != nil {
				return err
			}
			if _, err := s.pool.Exec(ctx, "INSERT INTO key_canaries (key_id, canary) VALUES ($1, $2) ON CONFLICT (key_id) DO NOTHING", id, ct); err != nil {
				return fmt.Errorf("postgres %s: store key canary: %w", s.where(), err)
			}
		}
	}
	return nil
}

var canaryPlaintext = []byte("credbroker key canary v1")

// canaryAAD is boltstore's, so `broker migrate` can copy canaries as they are.
func canaryAAD(id string) []byte { return []byte("credbroker/canary/v1/" + id) }

// checkCanaries verifies every canary whose key kr holds and returns the
// ids of kr's keys that have none yet.
func (s *Store) checkCanaries(ctx context.Context) (missing []string, err error) {
	rows, err := s.pool.Query(ctx, "SELECT key_id, canary FROM key_canaries")
	if err != nil {
		return nil, fmt.Errorf("postgres %s: read key canaries: %w", s.where(), err)
	}
	seen := map[string]bool{}
	var id string
	var ct []byte
	_, err = pgx.ForEachRow(rows, []any{&id, &ct}, func() error {
		seen[id] = true
		if !s.kr.Has(id) {
			return nil
		}
		if kid, err := envelope.KeyID(ct); err != nil || kid != id {
			return fmt.Errorf("postgres %s: canary of key %s is malformed", s.where(), id)
		}
		if _, _, err := s.kr.Open(ct, canaryAAD(id)); err != nil {
			return fmt.Errorf("key %s does not match the one this database was written with: %w", id, ErrWrongKey)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(seen) > 0 && !slices.ContainsFunc(s.kr.IDs(), func(id string) bool { return seen[id] }) {
		had := slices.Sorted(func(yield func(string) bool) {
			for id := range seen {
				if !yield(id) {
					return
				}
			}
		})
		return nil, fmt.Errorf("none of the configured keys (%s) was used with database %s, which was written with %s: %w",
			strings.Join(s.kr.IDs(), ", "), s.where(), strings.Join(had, ", "), ErrWrongKey)
	}
	for _, id := range s.kr.IDs() {
		if !seen[id] {
			missing = append(missing, id)
		}
	}
	return missing, nil
}

// where names the database for messages, without credentials.
func (s *Store) where() string {
	c := s.pool.Config().ConnConfig
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

// Pool exposes the data pool for tools and tests.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// dbErr is every database error's way out: a pool closed under a
// running call is ErrClosed, a database that cannot be reached or cannot
// serve now is vault.ErrUnavailable (the cause kept for the log).
func (s *Store) dbErr(err error) error {
	switch {
	case err == nil:
		return nil
	case s.open.Closed():
		return fmt.Errorf("%w (%v)", vault.ErrClosed, err)
	case unreachable(err):
		return vault.UnavailableError("postgres "+s.where(), err)
	}
	return err
}

// unreachable reports whether err is the database failing as a service
// rather than refusing a statement: a connection that could not be made
// or broke (the server down, restarting or out of reach), or the server
// saying it cannot serve now (SQLSTATE classes 08 connection exception,
// 53 insufficient resources, 58 system error, and 57P01 to 57P03:
// shutting down, crashed, not accepting connections yet). A cancelled or
// timed-out caller is not an outage.
func unreachable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch c := pe.Code; {
		case strings.HasPrefix(c, "08"), strings.HasPrefix(c, "53"), strings.HasPrefix(c, "58"),
			c == "57P01", c == "57P02", c == "57P03":
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, pgconn.ErrConnClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || pgconn.SafeToRetry(err)
}

// nanos renders t as Unix nanoseconds, saturating outside 1678-2262.
func nanos(t time.Time) int64 {
	switch {
	case t.Before(minNanoTime):
		return math.MinInt64
	case t.After(maxNanoTime):
		return math.MaxInt64
	}
	return t.UnixNano()
}

var (
	minNanoTime = time.Unix(0, math.MinInt64)
	maxNanoTime = time.Unix(0, math.MaxInt64)
)

func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// checkID rejects a NUL byte in an id: PostgreSQL text cannot hold it.
func checkID(kind, id string) error {
	if strings.IndexByte(id, 0) >= 0 {
		return fmt.Errorf("pgstore: %s id %q contains a NUL byte, which PostgreSQL cannot store", kind, id)
	}
	return nil
}

// storable reports whether id could name a row: text columns hold only
// valid UTF-8 without NUL, so any other id is simply not there.
func storable(id string) bool { return utf8.ValidString(id) && strings.IndexByte(id, 0) < 0 }

// shown renders a metadata value for a text column. PostgreSQL text cannot
// hold NUL, so it becomes U+FFFD there; the record column keeps the exact
// value, and nothing reads these columns back into a record.
func shown(v string) string { return strings.ReplaceAll(v, "\x00", "\uFFFD") }

// connRow is what one connection contributes to its row.
type connRow struct {
	meta vault.Connection // metadata as decoded from rec
	rec  []byte
}

func (r connRow) args() []any {
	m := r.meta
	return []any{m.ID, []byte(m.Principal.Issuer), []byte(m.Principal.Subject), shown(m.Provider), shown(m.AccountID),
		shown(m.AccountLogin), shown(string(m.Status)), m.Created, m.Updated, nullTime(m.LastUsed), nullTime(m.LastRefreshed),
		m.SealedWith, int64(m.Version), r.rec}
}

const insertConn = `INSERT INTO ` + connColumns + `
	VALUES (` + connValues + `)
	ON CONFLICT (id) DO NOTHING`

// connColumns and connValues are the columns of a connection's row and the
// parameters of connRow.args in their order.
const (
	connColumns = `connections (id, iss, sub, provider, account_id, account_login, status,
	created, updated, last_used, last_refreshed, sealed_with, version, record)`
	connValues = `$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14`
)

// updateConn rewrites a connection's row if its version is still the one
// read; updateConnArgs gives its arguments but that version, the last.
const updateConn = `UPDATE connections SET account_login = $2, status = $3, created = $4,
	updated = $5, last_used = $6, last_refreshed = $7, sealed_with = $8, version = $9, record = $10
	WHERE id = $1 AND version = $11`

func updateConnArgs(r connRow) []any {
	a := r.args()
	return append([]any{a[0]}, a[5:]...)
}

// updateGrant rewrites a grant's row if its version is still the one read;
// updateGrantArgs gives its arguments from grantArgs', but that version,
// the last.
const updateGrant = `UPDATE grants SET provider = $2, state = $3, created_ns = $4,
	expires_ns = $5, version = $6, record = $7
	WHERE id = $1 AND version = $8`

func updateGrantArgs(args []any) []any {
	return append([]any{args[0]}, args[3:]...)
}

// rowFromRecord projects a stored record into its columns.
func rowFromRecord(rec []byte) (connRow, error) {
	m, err := record.ConnectionMeta(rec)
	if err != nil {
		return connRow{}, err
	}
	if err := checkID("connection", m.ID); err != nil {
		return connRow{}, err
	}
	return connRow{meta: m, rec: rec}, nil
}

// CreateConnection implements vault.Store.
func (s *Store) CreateConnection(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	c, rec, err := s.open.NewConnection(ctx, s.kr, c)
	if err != nil {
		return vault.Connection{}, err
	}
	row, err := rowFromRecord(rec)
	if err != nil {
		return vault.Connection{}, err
	}
	ds, err := record.ChangeDeliveries(s.changes, nil, rec)
	if err != nil {
		return vault.Connection{}, err
	}
	if err := s.insertRow(ctx, "connection "+c.ID, insertConn, row.args(), ds, nil); err != nil {
		return vault.Connection{}, err
	}
	c.SealedWith = s.kr.Primary()
	return c, nil
}

// GetConnection implements vault.Store.
func (s *Store) GetConnection(ctx context.Context, id string) (vault.Connection, error) {
	rec, version, err := s.connectionRecord(ctx, id)
	if err != nil {
		return vault.Connection{}, err
	}
	c, err := record.DecodeConnection(s.kr, rec)
	if err == nil && c.ID != id {
		err = fmt.Errorf("pgstore: connection %s: stored record names id %s: %w", id, c.ID, vault.ErrMalformed)
	}
	if err == nil && int64(c.Version) != version {
		err = fmt.Errorf("pgstore: connection %s: record version %d, column says %d: %w", id, c.Version, version, vault.ErrMalformed)
	}
	if err != nil {
		return vault.Connection{}, err
	}
	return c, nil
}

// connectionRecord reads connection id's stored record and its version
// column.
func (s *Store) connectionRecord(ctx context.Context, id string) ([]byte, int64, error) {
	return s.readRecord(ctx, "connection", "SELECT record, version FROM connections WHERE id = $1", id)
}

// insertRow stores a new row: insert is an INSERT … ON CONFLICT DO NOTHING
// with args, and ErrExists answers a taken key. ds, the deliveries of the
// change, are written in the insert's transaction, and only when it
// inserted the row. With a cap, insert is a capped insert (capRule).
// name names the row in errors ("grant g1").
func (s *Store) insertRow(ctx context.Context, name, insert string, args []any, ds []vault.Delivery, capped *capRule) error {
	var refused error
	run := func(db interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}) error {
		tag, err := db.Exec(ctx, insert, args...)
		if err == nil && tag.RowsAffected() == 0 {
			refused = vault.ErrExists
		}
		return err
	}
	var err error
	switch {
	case capped != nil && len(ds) > 0:
		return fmt.Errorf("pgstore: create %s: a capped create cannot carry deliveries", name)
	case capped != nil:
		b := &pgx.Batch{}
		b.Queue("SELECT pg_advisory_xact_lock($1)", capped.lock)
		b.Queue(insert, args...).QueryRow(func(row pgx.Row) error {
			var n, m int
			var inserted bool
			if err := row.Scan(&n, &m, &inserted); err != nil {
				return err
			}
			if refused = capped.refuse(n, m); refused == nil && !inserted {
				refused = vault.ErrExists
			}
			return nil
		})
		err = s.pool.SendBatch(ctx, b).Close()
	case len(ds) == 0:
		err = run(s.pool)
	default:
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			refused = nil
			if err := run(tx); err != nil || refused != nil {
				return err
			}
			b := &pgx.Batch{}
			queueDeliveries(b, ds)
			return tx.SendBatch(ctx, b).Close()
		})
	}
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: create %s: %w", name, err))
	}
	if refused != nil {
		return fmt.Errorf("pgstore: %s: %w", name, refused)
	}
	return nil
}

// capRule is a create under a cap. Its insert is one statement that
// counts the rows the cap is on, inserts only under the cap, and returns
// one row: two counts and whether it inserted; refuse judges the counts
// as the statement did (its refusal is the answer, and nothing was
// inserted then). The statement runs after the transaction-level advisory
// lock lock is taken, in one implicit transaction sent as one batch (one
// Sync, one round trip): its snapshot, taken after the lock, sees every
// create committed by the lock's earlier holders on any replica.
type capRule struct {
	lock   int64
	refuse func(n, m int) error
}

// readRecord reads the record and the version column of the row query
// (SELECT record, version … WHERE id = $1) finds for id. what names the
// kind of record in errors.
func (s *Store) readRecord(ctx context.Context, what, query, id string) ([]byte, int64, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, 0, err
	}
	if !storable(id) {
		return nil, 0, fmt.Errorf("pgstore: %s %q: %w", what, id, vault.ErrNotFound)
	}
	return s.scanRecord(s.pool.QueryRow(ctx, query, id), what, id)
}

// scanRecord scans a row of a record and its version; ErrNotFound when
// there is none. what and name name the row in errors.
func (s *Store) scanRecord(row pgx.Row, what, name string) ([]byte, int64, error) {
	var rec []byte
	var version int64
	err := row.Scan(&rec, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, fmt.Errorf("pgstore: %s %s: %w", what, name, vault.ErrNotFound)
	}
	if err != nil {
		return nil, 0, s.dbErr(fmt.Errorf("pgstore: get %s %s: %w", what, name, err))
	}
	return rec, version, nil
}

// fresh is the value a create stores on a ready store (Kind.Fresh) and
// the arguments of its INSERT.
func fresh[T any](ctx context.Context, s *Store, k record.Kind[T], v T, args func(T) ([]any, error)) (T, []any, error) {
	if err := s.open.Ready(ctx); err != nil {
		return *new(T), nil, err
	}
	v = k.Fresh(v)
	a, err := args(v)
	return v, a, err
}

// queryColumn runs query (a SELECT of one column) and collects the
// column of every row; what names the query in errors.
func queryColumn[T any](ctx context.Context, s *Store, what, query string, args ...any) ([]T, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, s.dbErr(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[T])
	if err != nil {
		return nil, s.dbErr(fmt.Errorf("pgstore: %s: %w", what, err))
	}
	return out, nil
}

// limitArg is a LIMIT parameter: NULL (no limit) for a limit of 0 or less.
func limitArg(limit int) *int64 {
	if limit <= 0 {
		return nil
	}
	l := int64(limit)
	return &l
}

// getRecord is readRecord decoded as a record of kind k; a record naming
// another id than the one it is stored under is malformed.
func getRecord[T any](ctx context.Context, s *Store, k record.Kind[T], query, id string) (T, int64, error) {
	var zero T
	rec, version, err := s.readRecord(ctx, k.Name, query, id)
	if err != nil {
		return zero, 0, err
	}
	v, err := k.Decode(rec)
	if named, _ := k.Owner(v); err == nil && named != id {
		err = fmt.Errorf("pgstore: %s %s: stored record names id %s: %w", k.Name, id, named, vault.ErrMalformed)
	}
	if err != nil {
		return zero, 0, err
	}
	return v, version, nil
}

// ListConnections implements vault.Store: an index scan on (iss, sub, id).
func (s *Store) ListConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	recs, err := queryColumn[[]byte](ctx, s, "list connections", "SELECT record FROM connections WHERE iss = $1 AND sub = $2 ORDER BY id",
		[]byte(p.Issuer), []byte(p.Subject))
	if err != nil {
		return nil, err
	}
	return record.DecodePrincipalConnections(p, recs)
}

// AccountConnections implements vault.Store through the (provider,
// account_id) index; the records decide.
func (s *Store) AccountConnections(ctx context.Context, provider, accountID string) ([]vault.Connection, error) {
	recs, err := queryColumn[[]byte](ctx, s, "account connections", "SELECT record FROM connections WHERE provider = $1 AND account_id = $2 ORDER BY id",
		shown(provider), shown(accountID))
	if err != nil {
		return nil, err
	}
	return record.DecodeAccountConnections(provider, accountID, recs)
}

// UpdateConnection implements vault.Store: read, fn, then a write that only
// succeeds if the version is still the one read; on a lost race fn runs
// again on the fresh record.
func (s *Store) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(ctx, id, record.UpdateRewrite(s.kr, id, fn))
}

// UpdateConnectionMeta implements vault.Store: the same compare-and-swap
// as UpdateConnection, copying the sealed tokens instead of opening them.
func (s *Store) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return s.rewriteConnection(ctx, id, record.MetaRewrite(id, fn))
}

// rewriteConnection replaces connection id's record with what rewrite
// makes of it, writing the deliveries the change causes in the same
// transaction.
func (s *Store) rewriteConnection(ctx context.Context, id string, rewrite record.Rewrite) (vault.Connection, error) {
	return cas(ctx, s, "connection", id, updateConn, s.connectionRecord, func(rec []byte, version int64) (vault.Connection, casWrite, error) {
		nrec, nc, err := rewrite(rec)
		if err != nil {
			return vault.Connection{}, casWrite{}, err
		}
		if int64(nc.Version) != version+1 {
			return vault.Connection{}, casWrite{}, fmt.Errorf("pgstore: connection %s: record version %d, column says %d: %w", id, nc.Version-1, version, vault.ErrMalformed)
		}
		row, err := rowFromRecord(nrec)
		if err != nil {
			return vault.Connection{}, casWrite{}, err
		}
		ds, err := record.ChangeDeliveries(s.changes, rec, nrec)
		if err != nil {
			return vault.Connection{}, casWrite{}, err
		}
		return nc, casWrite{args: updateConnArgs(row), ds: ds}, nil
	})
}

// casWrite is the write of one compare-and-swap attempt: the arguments of
// its UPDATE but the last (the version read), and the deliveries to write
// in the same transaction.
type casWrite struct {
	args []any
	ds   []vault.Delivery
}

// cas is every compare-and-swap update of a row: read gets the current
// value of row id and its version column, next makes the new value and
// its write, and update (an UPDATE whose last parameter is the version)
// stores it only if the version column still holds the one read. When
// another writer won (or the row went away), it reads again and next
// runs again on the fresh value, up to s.attempts times. An error of read
// or next is the call's answer, and nothing is written.
func cas[O, N any](ctx context.Context, s *Store, what, id, update string,
	read func(ctx context.Context, id string) (O, int64, error),
	next func(old O, version int64) (N, casWrite, error)) (N, error) {
	var zero N
	for range s.attempts {
		old, version, err := read(ctx, id)
		if err != nil {
			return zero, err
		}
		nv, w, err := next(old, version)
		if err != nil {
			return zero, err
		}
		tag, err := s.execWithDeliveries(ctx, w.ds, update, append(w.args, version)...)
		if err != nil {
			return zero, s.dbErr(fmt.Errorf("pgstore: update %s %s: %w", what, id, err))
		}
		if tag.RowsAffected() == 1 {
			return nv, nil
		}
	}
	return zero, fmt.Errorf("pgstore: update %s %s: still contended after %d attempts: %w", what, id, s.attempts, vault.ErrConflict)
}

// applyWhole is cas's next for a kind stored whole: fn applied with k's
// rules, and the UPDATE's arguments args makes of the result (picked from
// by pick, when not nil).
func applyWhole[T any](k record.Kind[T], fn func(T) (T, error), args func(T) ([]any, error), pick func([]any) []any) func(T, int64) (T, casWrite, error) {
	return func(old T, _ int64) (T, casWrite, error) {
		nv, err := k.Apply(old, fn)
		if err != nil {
			return *new(T), casWrite{}, err
		}
		a, err := args(nv)
		if err != nil {
			return *new(T), casWrite{}, err
		}
		if pick != nil {
			a = pick(a)
		}
		return nv, casWrite{args: a}, nil
	}
}

// DeleteConnection implements vault.Store.
func (s *Store) DeleteConnection(ctx context.Context, id string) error {
	if s.changes != nil {
		return s.deleteConnection(ctx, id, false)
	}
	return s.deleteRow(ctx, "connections", "id", id, "connection")
}

// ConnectionIDs implements vault.Store.
func (s *Store) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	if !storable(after) {
		return nil, fmt.Errorf("pgstore: connection ids after %q: not a storable id", after)
	}
	return queryColumn[string](ctx, s, "connection ids", "SELECT id FROM connections WHERE id > $1 ORDER BY id LIMIT $2", after, limitArg(limit))
}

// Reseal implements vault.Resealer: one transaction per batch, locking only
// the rows not yet sealed with the primary key.
func (s *Store) Reseal(ctx context.Context, ids []string) (int, error) {
	primary := s.kr.Primary()
	return s.resealRows(ctx, "connections", "SELECT record FROM connections WHERE id = ANY($1) AND sealed_with <> $2 ORDER BY id FOR UPDATE",
		[]any{ids, primary}, func(b *pgx.Batch, rec []byte) (bool, error) {
			nrec, c, err := record.Reseal(s.kr, rec)
			if err == nil {
				b.Queue("UPDATE connections SET sealed_with = $2, version = $3, record = $4 WHERE id = $1", c.ID, primary, int64(c.Version), nrec)
			}
			return err == nil, err
		})
}

// resealRows seals again, in one transaction, the records query selects
// (with args, FOR UPDATE: those sealed with another key than the
// primary): reseal queues each one's rewrite on the batch, or says there
// was none to make. It returns how many it queued; what names the records
// in errors.
func (s *Store) resealRows(ctx context.Context, what, query string, args []any, reseal func(b *pgx.Batch, rec []byte) (bool, error)) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		n = 0
		rows, err := tx.Query(ctx, query, args...)
		if err != nil {
			return err
		}
		recs, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
		if err != nil {
			return err
		}
		batch := &pgx.Batch{}
		for _, rec := range recs {
			queued, err := reseal(batch, rec)
			if err != nil {
				return err
			}
			if queued {
				n++
			}
		}
		if n == 0 {
			return nil
		}
		return tx.SendBatch(ctx, batch).Close()
	})
	if err != nil {
		return 0, s.dbErr(fmt.Errorf("pgstore: reseal %s: %w", what, err))
	}
	return n, nil
}

// KeyUsage counts connections by the id of the key that sealed their
// tokens, and upstream client secrets and IdP sessions by theirs.
func (s *Store) KeyUsage(ctx context.Context) (map[string]int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, `SELECT sealed_with, count(*) FROM
		(SELECT sealed_with FROM connections UNION ALL SELECT sealed_with FROM upstream_clients WHERE sealed_with <> ''
		 UNION ALL SELECT sealed_with FROM idp_sessions) k
		GROUP BY sealed_with`)
	if err != nil {
		return nil, s.dbErr(fmt.Errorf("pgstore: key usage: %w", err))
	}
	usage := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { usage[id] = n; return nil })
	return usage, s.dbErr(err)
}

func (s *Store) grantArgs(g vault.Grant) ([]any, error) {
	return wholeArgs(record.Grants, g, g.ID, []byte(g.Principal.Issuer), []byte(g.Principal.Subject), shown(g.Provider), shown(string(g.State)),
		nanos(g.Created), nanos(g.Expires), int64(g.Version))
}

// wholeArgs is the arguments of a row holding a record of kind k whole:
// cols, then v's record. The id v names must hold no NUL (checkID).
func wholeArgs[T any](k record.Kind[T], v T, cols ...any) ([]any, error) {
	rec, err := k.Encode(v)
	if err != nil {
		return nil, err
	}
	id, _ := k.Owner(v)
	if err := checkID(k.Name, id); err != nil {
		return nil, err
	}
	return append(cols, rec), nil
}

const insertGrant = `INSERT INTO grants (id, iss, sub, provider, state, created_ns, expires_ns, version, record)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (id) DO NOTHING`

// CreateGrant implements vault.Store.
func (s *Store) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	return s.CreateGrantLimited(ctx, g, vault.GrantLimits{})
}

// CreateGrantLimited implements vault.Store. With limits, one statement
// counts the principal's grants and inserts the grant only under the
// limits, after a transaction-level advisory lock on the principal taken
// in the same implicit transaction and round trip (capRule), so creates
// for one person are serialised across every replica: each count sees
// every grant committed by the holders before it. Waiters in this
// process queue on an in-process lock first, so one person's burst holds
// at most one pooled connection per replica.
func (s *Store) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	g, args, err := fresh(ctx, s, record.Grants, g, s.grantArgs)
	if err != nil {
		return vault.Grant{}, err
	}
	insert, capped := insertGrant, (*capRule)(nil)
	if lim.Enforced() {
		name := grantLockName(g.Principal)
		unlock, err := s.grantLocal.LockConnection(ctx, name)
		if err != nil {
			return vault.Grant{}, err
		}
		defer unlock()
		insert = insertGrantCapped
		args = append([]any{[]byte(g.Principal.Issuer), []byte(g.Principal.Subject), nanos(lim.Since), nanos(lim.Now),
			int64(lim.MaxOpen), int64(lim.MaxCreated)}, args...)
		capped = &capRule{lock: lockKey(name), refuse: func(created, open int) error { return lim.Check(created, open) }}
	}
	if err := s.insertRow(ctx, "grant "+g.ID, insert, args, nil, capped); err != nil {
		return vault.Grant{}, err
	}
	return g, nil
}

// insertGrantCapped is CreateGrantLimited's capped insert: countGrantsSQL
// ($1 to $4), then insertGrant's row ($7 to $15) only while the open
// grants are fewer than $5 and the created ones fewer than $6 (a limit
// of 0 or less is none), as GrantLimits.Check rules.
const insertGrantCapped = `WITH n (created, open) AS (` + countGrantsSQL + `),
	ins AS (INSERT INTO grants (id, iss, sub, provider, state, created_ns, expires_ns, version, record)
		SELECT $7, $8, $9, $10, $11, $12, $13, $14, $15 FROM n
		WHERE ($5 <= 0 OR n.open < $5) AND ($6 <= 0 OR n.created < $6)
		ON CONFLICT (id) DO NOTHING RETURNING 1)
	SELECT created, open, EXISTS (SELECT 1 FROM ins) FROM n`

// grantLockName names the lock that serialises p's grant creation. The
// lengths keep principals whose issuer and subject split one string
// differently apart.
func grantLockName(p vault.Principal) string {
	return fmt.Sprintf("credbroker/grants/%d:%s/%d:%s", len(p.Issuer), p.Issuer, len(p.Subject), p.Subject)
}

// GetGrant implements vault.Store.
func (s *Store) GetGrant(ctx context.Context, id string) (vault.Grant, error) {
	g, _, err := s.getGrant(ctx, id)
	return g, err
}

func (s *Store) getGrant(ctx context.Context, id string) (vault.Grant, int64, error) {
	return getRecord(ctx, s, record.Grants, "SELECT record, version FROM grants WHERE id = $1", id)
}

// UpdateGrant implements vault.Store with the compare-and-swap of
// UpdateConnection: of two concurrent consumers of a single-use grant,
// exactly one write lands and the other re-runs fn on the consumed grant.
func (s *Store) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	return cas(ctx, s, "grant", id, updateGrant, s.getGrant, applyWhole(record.Grants, fn, s.grantArgs, updateGrantArgs))
}

// countGrantsSQL counts a principal's grants created at or after $3 and,
// of those, the ones open at $4: one range scan of grants_by_principal.
const countGrantsSQL = `SELECT count(*),
	count(*) FILTER (WHERE state NOT IN ('completed', 'denied', 'expired') AND expires_ns > $4)
	FROM grants WHERE iss = $1 AND sub = $2 AND created_ns >= $3`

// CountGrants implements vault.Store with one index range scan.
func (s *Store) CountGrants(ctx context.Context, p vault.Principal, since, now time.Time) (created, open int, err error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, 0, err
	}
	err = s.pool.QueryRow(ctx, countGrantsSQL,
		[]byte(p.Issuer), []byte(p.Subject), nanos(since), nanos(now)).Scan(&created, &open)
	if err != nil {
		return 0, 0, s.dbErr(fmt.Errorf("pgstore: count grants: %w", err))
	}
	return created, open, nil
}

// ListGrants implements vault.Store: an index scan on (iss, sub, created).
func (s *Store) ListGrants(ctx context.Context, p vault.Principal, since time.Time) ([]vault.Grant, error) {
	recs, err := queryColumn[[]byte](ctx, s, "list grants", "SELECT record FROM grants WHERE iss = $1 AND sub = $2 AND created_ns >= $3 ORDER BY created_ns, id",
		[]byte(p.Issuer), []byte(p.Subject), nanos(since))
	if err != nil {
		return nil, err
	}
	return record.Grants.DecodeOwned(p, recs)
}

// DeleteExpiredGrants implements vault.Store, a thousand grants per
// statement. Rows another replica is deleting at the same moment are
// skipped (FOR UPDATE SKIP LOCKED), so every replica can sweep at once
// without waiting on each other or counting a grant twice.
func (s *Store) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	const chunk = 1000
	total := 0
	for {
		if err := s.open.Ready(ctx); err != nil {
			return total, err
		}
		tag, err := s.pool.Exec(ctx, `DELETE FROM grants WHERE id IN (
			SELECT id FROM grants WHERE expires_ns < $1 ORDER BY expires_ns LIMIT $2 FOR UPDATE SKIP LOCKED)`,
			nanos(now), chunk)
		if err != nil {
			return total, s.dbErr(fmt.Errorf("pgstore: delete expired grants: %w", err))
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < chunk {
			return total, nil
		}
	}
}

// lockKey maps a name to an advisory lock key.
func lockKey(name string) int64 {
	h := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(h[:8]))
}

// Locker implements vault.Store: the store is its own Locker, whose
// advisory locks every replica sharing the database sees.
func (s *Store) Locker() vault.Locker { return s }

// LockConnection implements vault.Locker. Waiters in this process queue on
// an in-process lock first, so each connection id holds at most one
// database session per replica; the holder then takes a session-level
// advisory lock on a connection from a pool reserved for locks. If the
// replica dies, PostgreSQL ends the session and the lock with it.
func (s *Store) LockConnection(ctx context.Context, id string) (func(), error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	unlockLocal, err := s.local.LockConnection(ctx, id)
	if err != nil {
		return nil, err
	}
	conn, err := s.lockPool.Acquire(ctx)
	if err != nil {
		unlockLocal()
		return nil, s.dbErr(fmt.Errorf("pgstore: lock connection %s: %w", id, err))
	}
	key := lockKey("credbroker/connection/" + id)
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		discardConn(conn.Hijack())
		unlockLocal()
		return nil, s.dbErr(fmt.Errorf("pgstore: lock connection %s: %w", id, err))
	}
	h := &heldLock{conn: conn}
	s.locksMu.Lock()
	s.locks[h] = struct{}{}
	s.locksMu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.done {
			return
		}
		h.done = true
		defer unlockLocal()
		s.locksMu.Lock()
		delete(s.locks, h)
		s.locksMu.Unlock()
		if h.conn == nil {
			return // Close ended the session already
		}
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var ok bool
		if err := h.conn.QueryRow(cctx, "SELECT pg_advisory_unlock($1)", key).Scan(&ok); err != nil || !ok {
			discardConn(h.conn.Hijack())
			return
		}
		h.conn.Release()
	}, nil
}

// heldLock is a session holding a connection's advisory lock.
type heldLock struct {
	mu   sync.Mutex
	conn *pgxpool.Conn // nil once Close took it
	done bool
}

// discardConn ends a session: PostgreSQL drops its advisory locks.
func discardConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// Close implements vault.Store. It is safe to call more than once.
func (s *Store) Close() error {
	if s.open.Close() {
		return nil
	}
	// End the sessions of locks still held, so the pool does not wait for
	// their holders and the other replicas get the locks.
	s.locksMu.Lock()
	held := make([]*heldLock, 0, len(s.locks))
	for h := range s.locks {
		held = append(held, h)
	}
	s.locksMu.Unlock()
	for _, h := range held {
		h.mu.Lock()
		if h.conn != nil && !h.done {
			discardConn(h.conn.Hijack())
			h.conn = nil
		}
		h.mu.Unlock()
	}
	s.lockPool.Close()
	s.pool.Close()
	return nil
}

// Resealer implements vault.Store: the store is its own Resealer (Reseal),
// and FullySealed tells a starting replica whether to run it at all.
func (s *Store) Resealer() vault.Resealer { return s }

// FullySealed reports whether every connection and upstream client
// secret is sealed with the primary key (scans of the sealed_with
// columns), so a starting replica can skip the re-encryption pass. On error it answers false: the pass then runs.
func (s *Store) FullySealed() bool {
	if s.open.Closed() {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var other bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM connections WHERE sealed_with <> $1)
		OR EXISTS (SELECT 1 FROM upstream_clients WHERE sealed_with NOT IN ('', $1))
		OR EXISTS (SELECT 1 FROM idp_sessions WHERE sealed_with <> $1)`, s.kr.Primary()).Scan(&other)
	return err == nil && !other
}

// MarkFullySealed does nothing: FullySealed reads the records themselves,
// so there is no mark that other replicas could make stale.
func (s *Store) MarkFullySealed() error { return nil }
