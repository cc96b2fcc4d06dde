package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// statementLog is a pgx tracer of the data pool: each statement sent, and
// each trip to the server (a statement alone, or a whole batch).
type statementLog struct {
	mu         sync.Mutex
	statements []string
	trips      int
}

func (l *statementLog) add(sql string, trip bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if sql != "" {
		l.statements = append(l.statements, strings.Join(strings.Fields(sql), " "))
	}
	if trip {
		l.trips++
	}
}

// take returns what was logged since the last take, and forgets it.
func (l *statementLog) take() (statements []string, trips int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	statements, trips = l.statements, l.trips
	l.statements, l.trips = nil, 0
	return statements, trips
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL, true)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	l.add("", true)
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL, false)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// TestMRTRWriteStatements: the two writes of an MRTR round trip cost what
// they must on PostgreSQL. A limited grant creation is the per-person
// lock and one statement that counts and inserts, sent together in one
// trip (an implicit transaction: no begin, no commit); the callback's
// Connect of a new connection is the grant's read and one statement that
// swaps the grant and inserts the connection, or that statement alone
// when the caller passes the grant it read (ConnectionWrite.Known).
func TestMRTRWriteStatements(t *testing.T) {
	srv := pgtest.Shared(t)
	log := &statementLog{}
	s, err := pgstore.Open(t.Context(), srv.Schema(t), newKeyring(t), pgstore.Options{Tracer: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	now := time.Now()
	check := func(what string, wantStatements, wantTrips int) {
		t.Helper()
		got, trips := log.take()
		if len(got) != wantStatements || trips != wantTrips {
			t.Errorf("%s: %d statements in %d trips, want %d in %d:\n%s", what, len(got), trips, wantStatements, wantTrips, strings.Join(got, "\n"))
		}
		for _, sql := range got {
			if kw := strings.ToLower(sql); slices.Contains([]string{"begin", "commit"}, kw) {
				t.Errorf("%s: sent %q", what, sql)
			}
		}
	}
	log.take()
	lim := vault.GrantLimits{Since: now.Add(-time.Hour), Now: now, MaxOpen: 10, MaxCreated: 30}
	if _, err := s.CreateGrantLimited(ctx, vault.Grant{ID: "g1", Principal: alice, Provider: "github",
		Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending}, lim); err != nil {
		t.Fatal(err)
	}
	check("CreateGrantLimited", 2, 1)
	complete := func(id string) func(vault.Grant) (vault.Grant, error) {
		return func(g vault.Grant) (vault.Grant, error) {
			g.State, g.ConnectionID = vault.GrantCompleted, id
			return g, nil
		}
	}
	c := vaulttest.Conn("c1", alice, "github", "1")
	if _, _, err := s.Connect(ctx, vault.ConnectionWrite{Create: &c}, "g1", complete("c1")); err != nil {
		t.Fatal(err)
	}
	check("Connect", 2, 2)

	// With the grant as the callback read it, Connect does not read it again.
	g2, err := s.CreateGrant(ctx, vault.Grant{ID: "g2", Principal: alice, Provider: "github",
		Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending})
	if err != nil {
		t.Fatal(err)
	}
	log.take()
	c = vaulttest.Conn("c2", alice, "github", "2")
	if _, _, err := s.Connect(ctx, vault.ConnectionWrite{Create: &c, Known: &g2}, "g2", complete("c2")); err != nil {
		t.Fatal(err)
	}
	check("Connect with the known grant", 1, 1)
}

// TestConnectOnceAcrossReplicas: callbacks racing on several replicas to
// complete one grant with a new connection each: exactly one completes
// it, and exactly its connection is stored.
func TestConnectOnceAcrossReplicas(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	stores := []*pgstore.Store{open(t, url, kr), open(t, url, kr), open(t, url, kr)}
	ctx := t.Context()
	now := time.Now()
	if _, err := stores[0].CreateGrant(ctx, vault.Grant{ID: "g", Principal: alice, Provider: "github", Created: now,
		Expires: now.Add(time.Minute), State: vault.GrantApproved}); err != nil {
		t.Fatal(err)
	}
	errUsed := errors.New("grant already used")
	var wins atomic.Int32
	var winner atomic.Value
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 24 {
		wg.Go(func() {
			<-start
			c := vaulttest.Conn(fmt.Sprint("race-", i), alice, "github", fmt.Sprint(i))
			_, g, err := stores[i%len(stores)].Connect(ctx, vault.ConnectionWrite{Create: &c}, "g", func(g vault.Grant) (vault.Grant, error) {
				if g.State != vault.GrantApproved {
					return g, errUsed
				}
				g.State, g.ConnectionID = vault.GrantCompleted, c.ID
				return g, nil
			})
			switch {
			case err == nil:
				wins.Add(1)
				winner.Store(g.ConnectionID)
			case !errors.Is(err, errUsed):
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	list, err := stores[0].ListConnections(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	if wins.Load() != 1 || len(list) != 1 || list[0].ID != winner.Load() {
		t.Fatalf("%d completions, connections stored %v; want 1, the winner's (%v)", wins.Load(), list, winner.Load())
	}
	if g, err := stores[1].GetGrant(ctx, "g"); err != nil || g.State != vault.GrantCompleted || g.ConnectionID != list[0].ID || g.Version != 2 {
		t.Fatalf("grant %+v, %v; want completed once with %s", g, err, list[0].ID)
	}
}
