package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
)

// appsChannel is where the oauth_apps trigger (schema step 5) announces
// every committed update or delete of an app access record, and where
// WatchApps sends its heartbeats; connectionsChannel is where the
// connections trigger (step 8) announces every committed write of a
// connection, by person, and where WatchConnections sends its heartbeats.
const (
	appsChannel        = "credbroker_apps"
	connectionsChannel = "credbroker_connections"
)

// heartbeatEvery is how often WatchApps proves its feed is current;
// after maxWaiting heartbeats without one coming back (ten seconds) it
// takes the listening session for dead and reconnects.
const (
	heartbeatEvery = 200 * time.Millisecond
	maxWaiting     = 50
)

// AppWatch implements vault.Store: the store is its own feed (WatchApps).
func (s *Store) AppWatch() vault.AppWatch { return s }

// WatchApps implements vault.AppWatch with LISTEN/NOTIFY on a connection
// of its own. PostgreSQL delivers notifications in the order their
// transactions committed, from one queue for every session, so when a
// heartbeat this watcher sent at time t comes back, every change
// committed before t has come back before it: that is Fresh(t). A
// heartbeat goes out every 200 ms on a second connection. When either
// connection fails, or ten seconds of heartbeats do not come back, it
// calls Lost, reconnects (backing off up to five
// seconds) and, listening again, calls Lost once more (what changed
// meanwhile was missed; the caller reads afresh), then Fresh with the
// next heartbeat. It returns when ctx ends or the store is closed.
func (s *Store) WatchApps(ctx context.Context, w vault.AppWatcher) error {
	return s.watch(ctx, appsChannel, w)
}

// WatchConnections implements vault.AppWatch as WatchApps does, on
// connections' channel: Changed gets the vault.Principal.Key of the person
// whose connection changed.
func (s *Store) WatchConnections(ctx context.Context, w vault.AppWatcher) error {
	return s.watch(ctx, connectionsChannel, w)
}

// watch follows channel for WatchApps and WatchConnections.
func (s *Store) watch(ctx context.Context, channel string, w vault.AppWatcher) error {
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		err := s.watchOnce(ctx, channel, w)
		w.Lost()
		if ctx.Err() != nil || s.open.Closed() {
			return nil
		}
		if time.Since(start) > time.Minute {
			backoff = 100 * time.Millisecond // it ran a while: a new failure
		}
		_ = err // the next attempt says whether it lasts
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// watchOnce is one connection's life of watch.
func (s *Store) watchOnce(ctx context.Context, channel string, w vault.AppWatcher) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := s.pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = "credbroker-watch"
	listen, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeConn(listen)
	beat, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeConn(beat)
	var schema string
	if err := listen.QueryRow(ctx, "SELECT current_schema()").Scan(&schema); err != nil {
		return err
	}
	if _, err := listen.Exec(ctx, "LISTEN "+channel); err != nil {
		return err
	}
	w.Lost() // anything may have changed while nobody listened

	var nonce [12]byte
	rand.Read(nonce[:])
	mine := "hb:" + base64.RawURLEncoding.EncodeToString(nonce[:]) + ":"
	var mu sync.Mutex // guards sent
	sent := map[uint64]time.Time{}
	beatErr := make(chan error, 1)
	var wg sync.WaitGroup
	defer wg.Wait() // before the connections close
	defer cancel()
	wg.Go(func() {
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for seq := uint64(1); ; seq++ {
			mu.Lock()
			sent[seq] = time.Now() // before the NOTIFY can commit
			waiting := len(sent)
			mu.Unlock()
			if waiting > maxWaiting {
				// The listening session hears nothing (a dead connection
				// TCP has not noticed yet): start afresh.
				beatErr <- fmt.Errorf("no heartbeat came back in %v", maxWaiting*heartbeatEvery)
				cancel()
				return
			}
			if _, err := beat.Exec(ctx, "SELECT pg_notify($1, $2)", channel, mine+strconv.FormatUint(seq, 10)); err != nil {
				beatErr <- err
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	prefix := strconv.Itoa(len(schema)) + ":" + schema
	for {
		n, err := listen.WaitForNotification(ctx)
		if err != nil {
			select {
			case berr := <-beatErr:
				return fmt.Errorf("pgstore: heartbeat: %w", berr)
			default:
				return err
			}
		}
		switch p := n.Payload; {
		case strings.HasPrefix(p, mine):
			seq, err := strconv.ParseUint(p[len(mine):], 10, 64)
			if err != nil {
				continue
			}
			mu.Lock()
			at, ok := sent[seq]
			for k := range sent {
				if k <= seq {
					delete(sent, k)
				}
			}
			mu.Unlock()
			if ok {
				w.Fresh(at)
			}
		case strings.HasPrefix(p, prefix):
			if id := p[len(prefix):]; id != "" {
				w.Changed(id)
			} else {
				w.Lost() // an id too long to announce: forget everything
			}
		}
	}
}

func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Close(ctx)
}
