package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
	"credbroker/webhook"
)

// storeSpec is a parsed --store value: exactly one field is set.
type storeSpec struct {
	BoltPath string // bolt:PATH or a plain path
	Postgres string // a postgres:// URL or a libpq key=value string
}

// isPostgresStore reports whether a --store value names PostgreSQL.
func isPostgresStore(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") || strings.HasPrefix(s, "postgres:")
}

// parseStore checks a --store value without connecting anywhere:
// bolt:PATH or a plain path (the default, embedded store), or
// postgres://user@host/db?… / postgres:host=… dbname=… (a libpq key=value
// string) for several replicas sharing one database. A database on a
// non-loopback host must be reached over TLS (sslmode=require or verify-*):
// grants and connection metadata travel in the clear otherwise.
func parseStore(s string) (storeSpec, error) {
	if !isPostgresStore(s) {
		p, err := storePath(s)
		return storeSpec{BoltPath: p}, err
	}
	conn := s
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		conn = strings.TrimPrefix(s, "postgres:")
	}
	if strings.TrimSpace(conn) == "" {
		return storeSpec{}, errors.New("postgres: needs a connection string (postgres://user@host:5432/db or postgres:host=… dbname=…)")
	}
	cfg, err := pgconn.ParseConfig(conn)
	if err != nil {
		return storeSpec{}, fmt.Errorf("bad PostgreSQL connection string %s: %v", redactStore(s), err)
	}
	hosts := []*pgconn.FallbackConfig{{Host: cfg.Host, Port: cfg.Port, TLSConfig: cfg.TLSConfig}}
	hosts = append(hosts, cfg.Fallbacks...)
	for _, h := range hosts {
		local := strings.HasPrefix(h.Host, "/") || isLoopbackHost(h.Host)
		if !local && h.TLSConfig == nil {
			return storeSpec{}, fmt.Errorf("PostgreSQL host %s is not on loopback: use sslmode=verify-full (or require); without TLS, grants and connection metadata cross the network in the clear", h.Host)
		}
	}
	return storeSpec{Postgres: conn}, nil
}

// redactStore renders a --store value without its password.
func redactStore(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		return u.Redacted()
	}
	if i := strings.Index(s, "password="); i >= 0 {
		end := strings.IndexByte(s[i:], ' ')
		if end < 0 {
			return s[:i] + "password=xxxxx"
		}
		return s[:i] + "password=xxxxx" + s[i+end:]
	}
	return s
}

// backend is a store as opened: bolt or PostgreSQL, with what only the
// backend itself offers.
type backend interface {
	vault.Store
	sealMarker
}

// openStore opens the store a --store value names, with kr: a bolt file
// (creating its directory, mode 0700, when missing) or a PostgreSQL
// database (migrating its schema). Errors are one line naming the cause
// (locked by another broker, corrupt file, wrong key, unreachable database).
func openStore(spec string, kr *vault.Keyring) (backend, error) {
	return openStoreHooked(spec, kr, nil)
}

// openStoreHooked is openStore with events' change hooks, which write the
// webhook deliveries of connection and app changes in the change's
// transaction (nil: none).
func openStoreHooked(spec string, kr *vault.Keyring, events *webhook.Publisher) (backend, error) {
	ss, err := parseStore(spec)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	if ss.Postgres == "" {
		return openBoltWith(ss.BoltPath, kr, boltstore.Options{Changes: events.Hook(), AppChanges: events.AppHook()})
	}
	return openPostgresWith(ss.Postgres, kr, pgstore.Options{Changes: events.Hook(), AppChanges: events.AppHook()})
}

// soleWriter reports whether this process is the only one writing s, a
// store as opened: a bolt file is locked to one process.
func soleWriter(s vault.Store) bool {
	_, ok := s.(*boltstore.Store)
	return ok
}

// keyedStore is a store as opened by a command that works on existing
// data: both backends count records by sealing key.
type keyedStore interface {
	vault.Store
	KeyUsage(ctx context.Context) (map[string]int, error)
}

// openExistingStore opens the store a --store value names for a command
// that never creates one: a bolt file must exist.
func openExistingStore(spec string, kr *vault.Keyring) (keyedStore, error) {
	if isPostgresStore(spec) {
		ss, err := parseStore(spec)
		if err != nil {
			return nil, fmt.Errorf("--store: %w", err)
		}
		ps, err := openPostgres(ss.Postgres, kr)
		if err != nil {
			return nil, err
		}
		return ps, nil
	}
	path, err := existingStore(spec)
	if err != nil {
		return nil, err
	}
	bs, err := openBolt(path, kr)
	if err != nil {
		return nil, err
	}
	return bs, nil
}

func openPostgres(conn string, kr *vault.Keyring) (*pgstore.Store, error) {
	return openPostgresWith(conn, kr, pgstore.Options{})
}

func openPostgresWith(conn string, kr *vault.Keyring, opts pgstore.Options) (*pgstore.Store, error) {
	if kr == nil {
		return nil, errNoKeys
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return pgstore.Open(ctx, conn, kr, opts)
}

func openBolt(path string, kr *vault.Keyring) (*boltstore.Store, error) {
	return openBoltWith(path, kr, boltstore.Options{})
}

func openBoltWith(path string, kr *vault.Keyring, opts boltstore.Options) (*boltstore.Store, error) {
	if kr == nil {
		return nil, errNoKeys
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
	}
	return boltstore.Open(path, kr, opts)
}

// observeStore is the one place the broker's store is instrumented: every
// operation of every feature (connections, grants, the authorization
// server's records, the outbox, admin actions, the assertion ledger,
// locks, re-sealing) is timed into
// credbroker_vault_operation_duration_seconds and traced as a
// vault.<operation> span, each when on.
func observeStore(s vault.Store, rec *telemetry.Recorder, tp trace.TracerProvider) vault.Store {
	return vault.Observe(s, tracing.StoreObserver(tp), rec.StoreObserver())
}

// sealMarker is a store that can tell cheaply that every record is sealed
// with the primary key (boltstore records it; pgstore asks its index).
type sealMarker interface {
	FullySealed() bool
	MarkFullySealed() error
}

// rekeyBatch is how many records one rotation transaction re-seals.
const rekeyBatch = 500

// startBackgroundRekey re-seals, in the background, every record not yet
// sealed with kr's primary key (after `broker keys rotate` ran while this
// broker held the database, or after a new primary was put in the key
// file). It skips the scan when the store records that a rotation to this
// primary already finished. The returned channel closes when it is done;
// cancelling ctx stops it, and the next start resumes.
// A finished or failed rotation is an audit event (key_rotation) on rec
// when given; progress otherwise goes to log. bs, when not nil, records
// a finished rotation.
func startBackgroundRekey(ctx context.Context, store vault.Store, bs sealMarker, kr *vault.Keyring, log *slog.Logger, rec *telemetry.Recorder) <-chan struct{} {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	done := make(chan struct{})
	if bs != nil && bs.FullySealed() {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		start := time.Now()
		n, err := vault.Rekey(ctx, store, kr, rekeyBatch)
		switch {
		case err != nil && ctx.Err() != nil:
			log.Info("key rotation paused; it resumes on the next start", "rewritten", n, "key_id", kr.Primary())
		case err != nil:
			log.Error("key rotation failed", "rewritten", n, "key_id", kr.Primary(), "err", err)
			rec.Audit(ctx, telemetry.Event{Kind: telemetry.EventKeyRotation, KeyID: kr.Primary(), Count: n, Via: "background", Err: err})
		default:
			if bs != nil {
				if err := bs.MarkFullySealed(); err != nil {
					log.Warn("key rotation finished but could not be recorded", "err", err)
				}
			}
			if n > 0 {
				log.Info("key rotation finished", "rewritten", n, "key_id", kr.Primary(), "took", time.Since(start).Round(time.Millisecond))
				rec.Audit(ctx, telemetry.Event{Kind: telemetry.EventKeyRotation, KeyID: kr.Primary(), Count: n, Via: "background"})
			}
		}
	}()
	return done
}
