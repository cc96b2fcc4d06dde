package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

// outageOps are store calls of every kind (reads, writes, a limited
// create, a compare-and-swap, the authorization server's records and a
// token's liveness check, the ledger, a refresh lock): each must fail as vault.ErrUnavailable while
// the server is down and succeed again once it is back.
func outageOps(s *pgstore.Store, p vault.Principal, connID, grantID string) map[string]func(context.Context) error {
	n := atomic.Int64{}
	return map[string]func(context.Context) error{
		"get connection": func(ctx context.Context) error { _, err := s.GetConnection(ctx, connID); return err },
		"list connections": func(ctx context.Context) error {
			_, err := s.ListConnections(ctx, p)
			return err
		},
		"update connection meta": func(ctx context.Context) error {
			_, err := s.UpdateConnectionMeta(ctx, connID, func(c vault.Connection) (vault.Connection, error) {
				c.LastUsed = time.Now()
				return c, nil
			})
			return err
		},
		"create grant limited": func(ctx context.Context) error {
			now := time.Now()
			_, err := s.CreateGrantLimited(ctx, vault.Grant{ID: fmt.Sprintf("op-grant-%d", n.Add(1)), Principal: p, Provider: "demo",
				Created: now, Expires: now.Add(time.Minute), State: vault.GrantPending}, vault.GrantLimits{Since: now.Add(-time.Hour), Now: now, MaxOpen: 1 << 20})
			return err
		},
		"update grant": func(ctx context.Context) error {
			_, err := s.UpdateGrant(ctx, grantID, func(g vault.Grant) (vault.Grant, error) { g.Rounds++; return g, nil })
			return err
		},
		"get app access": func(ctx context.Context) error {
			_, err := s.GetAppAccess(ctx, "no-such-app")
			if errors.Is(err, vault.ErrNotFound) {
				return nil
			}
			return err
		},
		"get app liveness": func(ctx context.Context) error { // every token check the liveness cache cannot answer
			_, err := s.GetAppLiveness(ctx, "no-such-app")
			if errors.Is(err, vault.ErrNotFound) {
				return nil
			}
			return err
		},
		"spend assertion": func(ctx context.Context) error {
			return s.SpendAssertion(ctx, vault.AssertionKey("https://idp.example", fmt.Sprintf("jti-%d", n.Add(1))), time.Now().Add(time.Minute))
		},
		"lock connection": func(ctx context.Context) error {
			unlock, err := s.LockConnection(ctx, connID)
			if err == nil {
				unlock()
			}
			return err
		},
	}
}

// TestUnavailableWhileDown: while PostgreSQL is down (SIGKILL, under a
// load of writers) every kind of store call fails as vault.ErrUnavailable,
// naming the database and the cause for the log, and never as anything
// else; once it is back, every call succeeds within 5 s on the same Store
// (its pool drops the broken sessions), and no acknowledged write is lost.
func TestUnavailableWhileDown(t *testing.T) {
	srv := pgtest.StartT(t)
	kr := newKeyring(t)
	s := open(t, srv.Schema(t), kr)
	ctx := t.Context()
	p := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	now := time.Now()
	conn, err := s.CreateConnection(ctx, vault.Connection{ID: "conn-1", Principal: p, Provider: "demo", AccountID: "1",
		AccountLogin: "alice", Token: vault.TokenSet{AccessToken: "at"}, Status: vault.StatusActive, Created: now, Updated: now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateGrant(ctx, vault.Grant{ID: "grant-1", Principal: p, Provider: "demo", Created: now,
		Expires: now.Add(time.Hour), State: vault.GrantPending}); err != nil {
		t.Fatal(err)
	}
	ops := outageOps(s, p, conn.ID, "grant-1")

	var (
		mu    sync.Mutex // guards acked
		acked []string
		wrong atomic.Value // the first failure that was not an outage
	)
	enough, down, back, stop := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var enoughOnce, downOnce sync.Once
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("load-%d-%d", w, i)
				t0 := time.Now()
				_, err := s.CreateGrant(ctx, vault.Grant{ID: id, Principal: p, Provider: "demo", Created: t0,
					Expires: t0.Add(time.Hour), State: vault.GrantPending})
				switch {
				case err == nil:
					mu.Lock()
					if acked = append(acked, id); len(acked) == 40 {
						enoughOnce.Do(func() { close(enough) })
					}
					mu.Unlock()
				case errors.Is(err, vault.ErrUnavailable):
					downOnce.Do(func() { close(down) })
					select { // the database is down: this writer waits for it
					case <-back:
					case <-stop:
						return
					}
				default:
					wrong.CompareAndSwap(nil, fmt.Errorf("writer: %w", err))
				}
			}
		})
	}
	select {
	case <-enough: // writes are flowing
	case <-time.After(60 * time.Second):
		t.Fatalf("fewer than 40 writes in 60s (%v)", wrong.Load())
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-down:
	case <-time.After(30 * time.Second):
		t.Fatal("no writer saw the outage within 30s of the kill")
	}
	for name, op := range ops {
		err := op(ctx)
		if !errors.Is(err, vault.ErrUnavailable) {
			t.Errorf("%s while PostgreSQL is down: %v, want vault.ErrUnavailable", name, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "postgres 127.0.0.1:") || !strings.Contains(msg, "storage unavailable") {
			t.Errorf("%s: the error names neither the database nor the outage: %s", name, msg)
		}
	}
	if err := srv.Restart(); err != nil {
		t.Fatalf("restart: %v\n%s", err, srv.Log())
	}
	restarted := time.Now()
	close(back)
	// Rounds of every call until one round succeeds whole, then three
	// more that must succeed too.
	var recovered time.Duration
	for round, clean := 0, 0; clean < 4; round++ {
		failed := ""
		for name, op := range ops {
			if err := op(ctx); err != nil {
				if !errors.Is(err, vault.ErrUnavailable) {
					t.Fatalf("%s after the restart: %v", name, err)
				}
				failed = name + ": " + err.Error()
			}
		}
		switch {
		case failed == "" && clean == 0:
			recovered = time.Since(restarted)
			clean++
		case failed == "":
			clean++
		case clean > 0:
			t.Fatalf("a call failed after a round had succeeded whole: %s", failed)
		case time.Since(restarted) > 5*time.Second:
			t.Fatalf("calls still fail %v after PostgreSQL came back (round %d): %s", time.Since(restarted), round, failed)
		}
	}
	close(stop)
	wg.Wait()
	if w := wrong.Load(); w != nil {
		t.Fatal(w)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range acked {
		if _, err := s.GetGrant(ctx, id); err != nil {
			t.Fatalf("acknowledged grant %s after the crash: %v", id, err)
		}
	}
	t.Logf("every call succeeded %v after PostgreSQL came back; %d acknowledged writes survived the crash", recovered, len(acked))
}
