package vaulttest

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

// completeFn is binding's Complete as a grant update: approved → completed
// with connection id, once.
func completeFn(id string) func(vault.Grant) (vault.Grant, error) {
	return func(g vault.Grant) (vault.Grant, error) {
		if g.State != vault.GrantApproved {
			return g, errClosed
		}
		g.State, g.ConnectionID = vault.GrantCompleted, id
		return g, nil
	}
}

var errClosed = errors.New("vaulttest: grant not approved")

// connectorOf returns s's GrantConnector (nil, logged, when it has none)
// and a maker of approved grants of alice, each as stored.
func connectorOf(t *testing.T, s vault.Store) (vault.GrantConnector, func(id string) vault.Grant) {
	gc := s.Connector()
	if gc == nil {
		t.Log("the store has no vault.GrantConnector")
	}
	return gc, func(id string) vault.Grant {
		t.Helper()
		g := grant(id, alice, base, base.Add(10*time.Minute))
		g.State = vault.GrantApproved
		g, err := s.CreateGrant(t.Context(), g)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
}

// testGrantConnector: vault.GrantConnector.Connect writes the connection
// and the grant together or not at all, and a grant completes once however
// many callbacks race. Stores without it (callers then write twice) pass.
func testGrantConnector(t *testing.T, s vault.Store) {
	gc, approved := connectorOf(t, s)
	if gc == nil {
		return
	}
	ctx := t.Context()
	unchanged := func(id string, version uint64) {
		t.Helper()
		g, err := s.GetGrant(ctx, id)
		if err != nil || g.Version != version || g.State != vault.GrantApproved {
			t.Fatalf("grant %s: %+v, %v; want approved at version %d", id, g, err, version)
		}
	}
	absent := func(id string) {
		t.Helper()
		_, err := s.GetConnection(ctx, id)
		wantErr(t, "connection "+id, err, vault.ErrNotFound)
		list, err := s.ListConnections(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if c.ID == id {
				t.Fatalf("connection %s listed", id)
			}
		}
	}

	// Create and complete.
	approved("g1")
	c1 := Conn("c1", alice, "github", "1")
	conn, g, err := gc.Connect(ctx, vault.ConnectionWrite{Create: &c1}, "g1", completeFn("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if conn.Version != 1 || conn.Token.AccessToken != c1.Token.AccessToken || conn.SealedWith == "" {
		t.Fatalf("connection: %+v", conn)
	}
	if g.State != vault.GrantCompleted || g.ConnectionID != "c1" || g.Version != 2 {
		t.Fatalf("grant: %+v", g)
	}
	sameConnection(t, mustGet(t, s, "c1"), c1)
	if got, _ := s.GetGrant(ctx, "g1"); got.State != vault.GrantCompleted || got.ConnectionID != "c1" || got.Version != 2 {
		t.Fatalf("stored grant: %+v", got)
	}
	if list, _ := s.ListConnections(ctx, alice); len(list) != 1 || list[0].ID != "c1" {
		t.Fatalf("listed: %+v", list)
	}

	// Completing again (a replayed callback) stores nothing.
	c2 := Conn("c2", alice, "github", "2")
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{Create: &c2}, "g1", completeFn("c2"))
	wantErr(t, "second completion", err, errClosed)
	absent("c2")

	// A taken id, a missing grant: nothing stored.
	approved("g2")
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{Create: &c1}, "g2", completeFn("c1"))
	wantErr(t, "taken connection id", err, vault.ErrExists)
	unchanged("g2", 1)
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{Create: &c2}, "nope", completeFn("c2"))
	wantErr(t, "missing grant", err, vault.ErrNotFound)
	absent("c2")

	// Update an existing connection and complete.
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{UpdateID: "nope", Update: func(c vault.Connection) (vault.Connection, error) { return c, nil }}, "g2", completeFn("nope"))
	wantErr(t, "update missing connection", err, vault.ErrNotFound)
	unchanged("g2", 1)
	boom := errors.New("boom")
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{UpdateID: "c1", Update: func(c vault.Connection) (vault.Connection, error) { return c, boom }}, "g2", completeFn("c1"))
	wantErr(t, "update aborted", err, boom)
	unchanged("g2", 1)
	conn, g, err = gc.Connect(ctx, vault.ConnectionWrite{UpdateID: "c1", Update: func(c vault.Connection) (vault.Connection, error) {
		c.Token.AccessToken = "at-new-secret"
		return c, nil
	}}, "g2", completeFn("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if conn.Version != 2 || conn.Token.AccessToken != "at-new-secret" || g.State != vault.GrantCompleted || g.ConnectionID != "c1" {
		t.Fatalf("update: %+v %+v", conn, g)
	}
	if got := mustGet(t, s, "c1"); got.Version != 2 || got.Token.AccessToken != "at-new-secret" {
		t.Fatalf("stored after update: %+v", got)
	}

	// The grant update refusing leaves the new connection unstored.
	approved("g3")
	_, _, err = gc.Connect(ctx, vault.ConnectionWrite{Create: &c2}, "g3", func(g vault.Grant) (vault.Grant, error) { return g, boom })
	wantErr(t, "grant update aborted", err, boom)
	absent("c2")
	unchanged("g3", 1)

	// Racing callbacks for one grant: one completes it, one connection.
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			c := Conn("race"+string(rune('a'+i)), alice, "google", string(rune('a'+i)))
			_, _, errs[i] = gc.Connect(ctx, vault.ConnectionWrite{Create: &c}, "g3", completeFn(c.ID))
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, errClosed) && !errors.Is(err, vault.ErrConflict):
			t.Fatalf("racing completion: %v", err)
		}
	}
	list, err := s.ListConnections(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	google := 0
	for _, c := range list {
		if c.Provider == "google" {
			google++
		}
	}
	if won != 1 || google != 1 {
		t.Fatalf("%d completions, %d connections stored; want 1 and 1", won, google)
	}
}

// testConnectKnownGrant: a ConnectionWrite's Known grant is only a
// hint. A current copy completes the grant; a stale one never overwrites
// what changed since (the grant function runs on the stored grant), never
// completes a grant closed meanwhile, and its refusal by the grant
// function is not the answer when the stored grant is accepted.
func testConnectKnownGrant(t *testing.T, s vault.Store) {
	gc, approved := connectorOf(t, s)
	if gc == nil {
		return
	}
	ctx := t.Context()
	round := func(id string) {
		t.Helper()
		if _, err := s.UpdateGrant(ctx, id, func(g vault.Grant) (vault.Grant, error) { g.Rounds++; return g, nil }); err != nil {
			t.Fatal(err)
		}
	}
	connect := func(id, grantID string, known vault.Grant, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
		c := Conn(id, alice, "github", id)
		_, g, err := gc.Connect(ctx, vault.ConnectionWrite{Create: &c, Known: &known}, grantID, fn)
		return g, err
	}

	// Current: completed, once.
	k1 := approved("k1")
	if g, err := connect("kc1", "k1", k1, completeFn("kc1")); err != nil || g.State != vault.GrantCompleted || g.Version != 2 {
		t.Fatalf("current copy: %+v, %v", g, err)
	}
	if _, err := connect("kc1b", "k1", k1, completeFn("kc1b")); !errors.Is(err, errClosed) {
		t.Fatalf("replay with the copy read before the completion: %v, want the grant closed", err)
	}

	// Stale (a retry counted since): what changed is kept.
	k2 := approved("k2")
	round("k2")
	g, err := connect("kc2", "k2", k2, completeFn("kc2"))
	if err != nil || g.State != vault.GrantCompleted || g.Rounds != 1 || g.Version != 3 {
		t.Fatalf("stale copy: %+v, %v; want completed at version 3 with the round counted", g, err)
	}
	if got, err := s.GetGrant(ctx, "k2"); err != nil || got.Rounds != 1 || got.ConnectionID != "kc2" {
		t.Fatalf("stored after a stale copy: %+v, %v", got, err)
	}

	// The grant function refuses the stale copy but accepts the stored grant.
	k3 := approved("k3")
	round("k3")
	g, err = connect("kc3", "k3", k3, func(g vault.Grant) (vault.Grant, error) {
		if g.Rounds == 0 {
			return g, errClosed
		}
		return completeFn("kc3")(g)
	})
	if err != nil || g.ConnectionID != "kc3" {
		t.Fatalf("refusal of a stale copy was the answer: %+v, %v", g, err)
	}

	// A copy of another grant is ignored.
	approved("k4")
	if g, err := connect("kc4", "k4", k3, completeFn("kc4")); err != nil || g.ID != "k4" || g.ConnectionID != "kc4" {
		t.Fatalf("copy of another grant: %+v, %v", g, err)
	}
	for _, id := range []string{"kc1", "kc2", "kc3", "kc4"} {
		mustGet(t, s, id)
	}
	_, err = s.GetConnection(ctx, "kc1b")
	wantErr(t, "connection of the replay", err, vault.ErrNotFound)
}

// testConnectWritesDeliveries: Connect writes the connection's outbox
// deliveries in its transaction, and none when it stores nothing.
func testConnectWritesDeliveries(t *testing.T, newStore NewHookedStore) {
	s := newStore(t, recordingHook)
	t.Cleanup(func() { _ = s.Close() })
	gc := s.Connector()
	if gc == nil {
		t.Log("the store has no vault.GrantConnector")
		return
	}
	o := s.Outbox()
	ctx := t.Context()
	for _, id := range []string{"g1", "g2"} {
		g := grant(id, alice, base, base.Add(10*time.Minute))
		g.State = vault.GrantApproved
		if _, err := s.CreateGrant(ctx, g); err != nil {
			t.Fatal(err)
		}
	}
	c1 := Conn("c1", alice, "github", "1")
	if _, _, err := gc.Connect(ctx, vault.ConnectionWrite{Create: &c1}, "g1", completeFn("c1")); err != nil {
		t.Fatal(err)
	}
	c2 := Conn("c2", alice, "github", "2")
	if _, _, err := gc.Connect(ctx, vault.ConnectionWrite{Create: &c2}, "g1", completeFn("c2")); !errors.Is(err, errClosed) {
		t.Fatalf("replayed completion: %v", err)
	}
	if _, _, err := gc.Connect(ctx, vault.ConnectionWrite{UpdateID: "c1", Update: func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	}}, "g2", completeFn("c1")); err != nil {
		t.Fatal(err)
	}
	got := types(t, o)
	want := []string{"a:created", "a:status.needs_reconnect", "b:created", "b:status.needs_reconnect"}
	if !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
}
