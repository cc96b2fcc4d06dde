package binding_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// completeFixture is a binding service on a memory store with a settable
// clock, a maker of new connections (each to another account) and a count
// of alice's stored connections.
type completeFixture struct {
	store *memstore.Store
	clk   *clock
	s     *binding.Service
	n     int
	t     *testing.T
}

func newCompleteFixture(t *testing.T) *completeFixture {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	f := &completeFixture{store: memstore.New(kr), clk: &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}, t: t}
	f.s = binding.New(f.store, binding.Options{Now: f.clk.Now})
	return f
}

func (f *completeFixture) write(p vault.Principal) vault.ConnectionWrite {
	f.n++
	c := vault.Connection{ID: "conn_" + binding.NewID(), Principal: p, Provider: "github", AccountID: string(rune('a' + f.n)),
		Status: vault.StatusActive, Created: f.clk.Now(), Updated: f.clk.Now(), Token: vault.TokenSet{AccessToken: "at"}}
	return vault.ConnectionWrite{Create: &c}
}

func (f *completeFixture) stored() int {
	f.t.Helper()
	list, err := f.store.ListConnections(context.Background(), alice)
	if err != nil {
		f.t.Fatal(err)
	}
	return len(list)
}

// TestCompleteWithChecks: completing a grant together with its connection
// (one store transaction) keeps Complete's rules: only the grant's own
// person, only before it expires, only once it is approved, only once; and
// when any of them refuses, the connection is not stored either.
func TestCompleteWithChecks(t *testing.T) {
	ctx := context.Background()
	f := newCompleteFixture(t)
	store, clk, s, write, stored := f.store, f.clk, f.s, f.write, f.stored

	pending, _ := s.Create(ctx, alice, "github", nil, "")
	if _, _, err := s.CompleteWith(ctx, store, pending.ID, alice, write(alice)); !errors.Is(err, binding.ErrBadState) {
		t.Fatalf("pending grant: %v, want ErrBadState", err)
	}
	g, _ := s.Create(ctx, alice, "github", nil, "")
	s.Approve(ctx, g.ID, alice)
	if _, _, err := s.CompleteWith(ctx, store, g.ID, bob, write(alice)); !errors.Is(err, binding.ErrWrongPrincipal) {
		t.Fatalf("someone else's grant: %v, want ErrWrongPrincipal", err)
	}
	if _, _, err := s.CompleteWith(ctx, store, "nope", alice, write(alice)); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("unknown grant: %v, want ErrNotFound", err)
	}
	if got := stored(); got != 0 {
		t.Fatalf("%d connections stored by refused completions", got)
	}

	// Racing callbacks: one completes, one connection.
	var wins atomic.Int32
	var wg sync.WaitGroup
	ws := make([]vault.ConnectionWrite, 16)
	for i := range ws {
		ws[i] = write(alice)
	}
	for i := range ws {
		wg.Go(func() {
			conn, got, err := s.CompleteWith(ctx, store, g.ID, alice, ws[i])
			switch {
			case err == nil:
				wins.Add(1)
				if got.State != vault.GrantCompleted || got.ConnectionID != conn.ID || conn.ID != ws[i].Create.ID {
					t.Errorf("racer %d: grant %+v, connection %s", i, got, conn.ID)
				}
			case !errors.Is(err, binding.ErrClosed):
				t.Errorf("racer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || stored() != 1 {
		t.Fatalf("%d completions, %d connections; want 1 and 1", wins.Load(), stored())
	}

	// Expired: nothing stored.
	late, _ := s.Create(ctx, alice, "github", nil, "")
	s.Approve(ctx, late.ID, alice)
	clk.Advance(time.Hour)
	if _, _, err := s.CompleteWith(ctx, store, late.ID, alice, write(alice)); !errors.Is(err, binding.ErrExpired) {
		t.Fatalf("expired grant: %v, want ErrExpired", err)
	}
	if got := stored(); got != 1 {
		t.Fatalf("%d connections after an expired completion, want 1", got)
	}
}

// TestApproveAndCompleteWith: the browser's consent recorded with the
// connection it produced (one transaction) keeps the rules of Approve and
// Complete together: a pending grant, or one approved by an earlier
// version, of the same person, before it expires, once; a declined,
// completed, expired or someone else's grant is refused and nothing is
// stored, not the connection, not the grant.
func TestApproveAndCompleteWith(t *testing.T) {
	ctx := context.Background()
	f := newCompleteFixture(t)
	store, clk, s, stored := f.store, f.clk, f.s, f.stored
	write := func() vault.ConnectionWrite { return f.write(alice) }

	for _, approvedFirst := range []bool{false, true} {
		g, _ := s.Create(ctx, alice, "github", nil, "")
		if approvedFirst {
			s.Approve(ctx, g.ID, alice)
		}
		w := write()
		conn, got, err := s.ApproveAndCompleteWith(ctx, store, g.ID, alice, w)
		if err != nil || got.State != vault.GrantCompleted || got.ConnectionID != w.Create.ID || conn.ID != w.Create.ID {
			t.Fatalf("approved first %v: %+v %v", approvedFirst, got, err)
		}
		if want := map[bool]uint64{false: 2, true: 3}[approvedFirst]; got.Version != want {
			t.Fatalf("approved first %v: version %d, want %d (one write for consent and completion)", approvedFirst, got.Version, want)
		}
		// Once: the completed grant refuses a second connection.
		if _, _, err := s.ApproveAndCompleteWith(ctx, store, g.ID, alice, write()); !errors.Is(err, binding.ErrClosed) {
			t.Fatalf("again: %v, want ErrClosed", err)
		}
	}
	if got := stored(); got != 2 {
		t.Fatalf("%d connections, want 2", got)
	}

	refused := func(name string, id string, p vault.Principal, want error) {
		t.Helper()
		before, _ := store.GetGrant(ctx, id)
		if _, _, err := s.ApproveAndCompleteWith(ctx, store, id, p, write()); !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", name, err, want)
		}
		if after, _ := store.GetGrant(ctx, id); after.Version != before.Version || after.State != before.State {
			t.Fatalf("%s: grant changed from %s v%d to %s v%d", name, before.State, before.Version, after.State, after.Version)
		}
		if got := stored(); got != 2 {
			t.Fatalf("%s: %d connections, want still 2", name, got)
		}
	}
	g, _ := s.Create(ctx, alice, "github", nil, "")
	for _, p := range []vault.Principal{bob, aliceElsewhere, {}} {
		refused("someone else's", g.ID, p, binding.ErrWrongPrincipal)
	}
	refused("unknown", binding.NewID(), alice, binding.ErrNotFound)
	denied, _ := s.Create(ctx, alice, "github", nil, "")
	s.Deny(ctx, denied.ID, alice)
	refused("declined", denied.ID, alice, binding.ErrClosed)
	clk.Advance(time.Hour)
	refused("expired", g.ID, alice, binding.ErrExpired)
}
