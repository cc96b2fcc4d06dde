package pgstore_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

// watchLog records what a watcher is told, in order.
type watchLog struct {
	mu     sync.Mutex
	events []string    // "changed ID", "lost", "fresh"
	fresh  []time.Time // the asOf of each "fresh", in order
	wake   chan struct{}
}

func newWatchLog() *watchLog { return &watchLog{wake: make(chan struct{}, 1)} }

func (l *watchLog) add(e string, at time.Time) {
	l.mu.Lock()
	l.events = append(l.events, e)
	if e == "fresh" {
		l.fresh = append(l.fresh, at)
	}
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *watchLog) watcher() vault.AppWatcher {
	return vault.AppWatcher{
		Changed: func(id string) { l.add("changed "+id, time.Time{}) },
		Fresh:   func(at time.Time) { l.add("fresh", at) },
		Lost:    func() { l.add("lost", time.Time{}) },
	}
}

// waitFresh waits until the watcher reports fresh as of a time after t
// and returns the events up to that report.
func (l *watchLog) waitFresh(t *testing.T, after time.Time) []string {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		n := 0
		for i, e := range l.events {
			if e == "fresh" {
				if l.fresh[n].After(after) {
					out := slices.Clone(l.events[:i+1])
					l.mu.Unlock()
					return out
				}
				n++
			}
		}
		l.mu.Unlock()
		select {
		case <-l.wake:
		case <-deadline:
			t.Fatalf("no fresh report after %v; events %v", after, l.events)
		}
	}
}

// TestWatchApps: a replica following the app access records learns every
// update and delete another replica commits before it learns that it is
// fresh as of a time after the commit; a lost connection is reported,
// and the watcher listens again on its own.
func TestWatchApps(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	a, b := open(t, url, kr), open(t, url, kr)
	other := open(t, srv.Schema(t), kr) // another deployment in the same database
	log := newWatchLog()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.WatchApps(ctx, log.watcher()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchApps: %v", err)
		}
	})
	log.waitFresh(t, time.Time{})

	app := vault.AppAccess{ID: "app-1", Principal: vault.Principal{Issuer: "https://idp", Subject: "alice"}, ClientID: "c1",
		RedirectURI: "https://c1.example/cb", Created: time.Now(), Updated: time.Now()}
	for _, s := range []*pgstore.Store{a, other} {
		if _, err := s.CreateAppAccess(ctx, app); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UpdateAppAccess(ctx, app.ID, func(x vault.AppAccess) (vault.AppAccess, error) {
			x.Families = append(x.Families, vault.TokenFamily{ID: "f1", Expires: time.Now().Add(time.Hour)})
			return x, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	updated := time.Now()
	if err := a.DeleteAppAccess(ctx, app.ID); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	evs := log.waitFresh(t, updated)
	if !slices.Contains(evs, "changed app-1") {
		t.Fatalf("fresh as of after the update before hearing of it: %v", evs)
	}
	evs = log.waitFresh(t, deleted)
	if n := strings.Count(strings.Join(evs, "|"), "changed app-1"); n != 2 {
		t.Fatalf("fresh as of after the delete having heard of %d changes, want the update and the delete (not the other schema's): %v", n, evs)
	}

	// The listening connection dies: lost, then fresh again, and changes
	// are heard again.
	log.mu.Lock()
	before := len(log.events)
	log.mu.Unlock()
	var killed int
	if err := a.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = 'credbroker-watch' AND datname = current_database()`).Scan(&killed); err != nil || killed == 0 {
		t.Fatalf("terminated %d watch sessions: %v", killed, err)
	}
	cut := time.Now()
	evs = log.waitFresh(t, cut)
	if !slices.Contains(evs[before:], "lost") {
		t.Fatalf("no loss reported: %v", evs[before:])
	}
	if _, err := a.CreateAppAccess(ctx, app); err != nil {
		t.Fatal(err)
	}
	if err := a.DeleteAppAccess(ctx, app.ID); err != nil {
		t.Fatal(err)
	}
	again := time.Now()
	evs = log.waitFresh(t, again)
	last := len(evs) - 1
	for last >= 0 && evs[last] != "lost" {
		last--
	}
	if last < 0 || !slices.Contains(evs[last:], "changed app-1") {
		t.Fatalf("after the reconnection the delete was not heard: %v", evs)
	}

	// The listening session stops answering without closing (its backend
	// frozen, as a connection TCP has not seen die): no report of
	// freshness covers the time after the freeze; the watcher gives up
	// on the session, reports the loss and listens afresh.
	var pid int
	if err := a.Pool().QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'credbroker-watch'
		AND datname = current_database() AND query LIKE 'LISTEN%'`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	frozen := time.Now()
	log.mu.Lock()
	before = len(log.events)
	log.mu.Unlock()
	evs = log.waitFresh(t, frozen)
	if !slices.Contains(evs[before:], "lost") { // evs ends with the first freshness covering the freeze
		t.Fatalf("after the freeze: %v, want the loss before freshness as of a time after it", evs[before:])
	}
	syscall.Kill(pid, syscall.SIGCONT)
}
