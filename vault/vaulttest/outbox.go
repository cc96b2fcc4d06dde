package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

// NewHookedStore returns a fresh, empty store that calls hook (which may
// be nil) inside the transaction of every change of a connection.
type NewHookedStore func(t *testing.T, hook vault.ChangeHook[vault.Connection]) vault.Store

// hooked is newStore's store with hook, closed when the test ends.
func hooked[H any](t *testing.T, newStore func(*testing.T, H) vault.Store, hook H) vault.Store {
	s := newStore(t, hook)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// RunOutbox is the conformance suite of the optional features every
// backend of this repository has: the webhook outbox (vault.Outbox, with
// deliveries written atomically with the change of a connection) and the
// operators' bulk operations (vault.AdminStore).
func RunOutbox(t *testing.T, newStore NewHookedStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newStore NewHookedStore)
	}{
		{"ChangesWriteDeliveries", testChangesWriteDeliveries},
		{"ClaimLeaseFinishRetry", testClaimLease},
		{"ConcurrentClaimsDeliverOnce", testConcurrentClaims},
		{"ProviderConnections", testProviderConnections},
		{"DeleteGrants", testDeleteGrants},
		{"RetireConnection", testRetire},
		{"ConnectWritesDeliveries", testConnectWritesDeliveries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore) })
	}
}

// recordingHook names every change it sees: created, deleted or
// updated, with the status after it; a change of LastUsed alone gives
// nothing, as the broker's own hook does.
func recordingHook(before, after *vault.Connection) []vault.Delivery {
	var kind string
	var c *vault.Connection
	switch {
	case before == nil:
		kind, c = "created", after
	case after == nil:
		kind, c = "deleted", before
	case before.Status != after.Status:
		kind, c = "status."+string(after.Status), after
	default:
		return nil
	}
	if c.Token.AccessToken != "" || c.Token.RefreshToken != "" {
		panic("vaulttest: the change hook was given token material")
	}
	id := fmt.Sprintf("%s-v%d-%s", c.ID, c.Version, kind)
	return []vault.Delivery{
		{ID: id, Endpoint: "a", Type: kind, Created: base, Due: base, Payload: []byte(`{"id":"` + c.ID + `"}`)},
		{ID: id, Endpoint: "b", Type: kind, Created: base, Due: base, Payload: []byte(`{"id":"` + c.ID + `"}`)},
	}
}

// types claims everything due and returns "endpoint:type" sorted.
func types(t *testing.T, o vault.Outbox) []string {
	t.Helper()
	ds, err := o.ClaimDeliveries(t.Context(), base.Add(time.Hour), 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ds {
		out = append(out, d.Endpoint+":"+d.Type)
	}
	slices.Sort(out)
	return out
}

func testChangesWriteDeliveries(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, recordingHook)
	o := s.Outbox()
	ctx := t.Context()
	mustCreate(t, s, Conn("c1", alice, "github", "1"))
	if _, err := s.CreateConnection(ctx, Conn("c1", alice, "github", "1")); !errors.Is(err, vault.ErrExists) {
		t.Fatalf("second create: %v", err)
	}
	// A change the hook ignores, an aborted update, a status change by
	// a full update and one by a metadata update.
	if _, err := s.UpdateConnectionMeta(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
		c.LastUsed = base.Add(time.Minute)
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateConnection(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("aborted update: %v", err)
	}
	if _, err := s.UpdateConnection(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateConnectionMeta(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusActive
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteConnection(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteConnection(ctx, "c1"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	n, oldest, err := o.OutboxDepth(ctx)
	if err != nil || n != 8 || !oldest.Equal(base) {
		t.Fatalf("depth = %d, oldest %v, %v; want 8 deliveries of events at %v", n, oldest, err, base)
	}
	got := types(t, o)
	want := []string{"a:created", "a:deleted", "a:status.active", "a:status.needs_reconnect",
		"b:created", "b:deleted", "b:status.active", "b:status.needs_reconnect"}
	if !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
	// Without a hook nothing is written.
	plain := hooked(t, newStore, nil)
	mustCreate(t, plain, Conn("c2", alice, "github", "2"))
	if err := plain.DeleteConnection(ctx, "c2"); err != nil {
		t.Fatal(err)
	}
	if n, _, err := plain.Outbox().OutboxDepth(ctx); err != nil || n != 0 {
		t.Fatalf("a store without a hook holds %d deliveries (%v)", n, err)
	}
}

func testClaimLease(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, nil)
	o := s.Outbox()
	ctx := t.Context()
	var ds []vault.Delivery
	for i := range 5 {
		ds = append(ds, vault.Delivery{ID: fmt.Sprintf("msg_%d", i), Endpoint: "ops", Type: "connection.created",
			Created: base, Due: base.Add(time.Duration(i) * time.Second), Payload: []byte(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if err := o.EnqueueDeliveries(ctx, ds); err != nil {
		t.Fatal(err)
	}
	// Enqueueing again changes nothing.
	again := ds[0].Clone()
	again.Payload = []byte(`{"changed":true}`)
	if err := o.EnqueueDeliveries(ctx, []vault.Delivery{again}); err != nil {
		t.Fatal(err)
	}
	if err := o.EnqueueDeliveries(ctx, []vault.Delivery{{ID: "", Endpoint: "ops", Type: "x"}}); !errors.Is(err, vault.ErrMalformed) {
		t.Fatalf("a delivery without id: %v", err)
	}
	// At base+2s three are due; limit 2 takes the two due first.
	got, err := o.ClaimDeliveries(ctx, base.Add(2*time.Second), 2, time.Minute)
	if err != nil || len(got) != 2 || got[0].ID != "msg_0" || got[1].ID != "msg_1" {
		t.Fatalf("claim = %+v, %v", got, err)
	}
	if string(got[0].Payload) != `{"n":0}` || got[0].Type != "connection.created" || !got[0].Created.Equal(base) {
		t.Fatalf("claimed delivery came back as %+v", got[0])
	}
	if !got[0].Due.Equal(base.Add(2*time.Second + time.Minute)) {
		t.Fatalf("claimed Due = %v, want the end of the lease", got[0].Due)
	}
	// Claimed ones are not handed out again while the lease runs.
	got2, err := o.ClaimDeliveries(ctx, base.Add(10*time.Second), 0, time.Minute)
	if err != nil || len(got2) != 3 || got2[0].ID != "msg_2" {
		t.Fatalf("second claim = %+v, %v", got2, err)
	}
	if err := o.FinishDelivery(ctx, "msg_0", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := o.FinishDelivery(ctx, "msg_0", "ops"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("second finish: %v", err)
	}
	retry := got[1]
	retry.Attempts, retry.Due, retry.LastError = 1, base.Add(5*time.Minute), "HTTP 500"
	if err := o.RetryDelivery(ctx, retry); err != nil {
		t.Fatal(err)
	}
	if err := o.RetryDelivery(ctx, vault.Delivery{ID: "nope", Endpoint: "ops", Type: "x"}); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("retry of an absent delivery: %v", err)
	}
	// After the lease the other claims end; msg_1 waits for its retry time.
	got3, err := o.ClaimDeliveries(ctx, base.Add(2*time.Minute), 0, time.Hour)
	if err != nil || len(got3) != 3 {
		t.Fatalf("claim after the lease = %+v, %v", got3, err)
	}
	got4, err := o.ClaimDeliveries(ctx, base.Add(5*time.Minute), 0, time.Minute)
	if err != nil || len(got4) != 1 || got4[0].ID != "msg_1" || got4[0].Attempts != 1 || got4[0].LastError != "HTTP 500" {
		t.Fatalf("claim at the retry time = %+v, %v", got4, err)
	}
	if n, oldest, err := o.OutboxDepth(ctx); err != nil || n != 4 || !oldest.Equal(base) {
		t.Fatalf("depth = %d, %v, %v", n, oldest, err)
	}
}

func testConcurrentClaims(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, nil)
	o := s.Outbox()
	ctx := t.Context()
	const n = 200
	var ds []vault.Delivery
	for i := range n {
		ds = append(ds, vault.Delivery{ID: fmt.Sprintf("msg_%03d", i), Endpoint: "ops", Type: "t", Created: base, Due: base, Payload: []byte("{}")})
	}
	if err := o.EnqueueDeliveries(ctx, ds); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				got, err := o.ClaimDeliveries(ctx, base, 7, time.Hour)
				if err != nil {
					t.Error(err)
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, d := range got {
					seen[d.ID]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Fatalf("%d of %d deliveries were claimed", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Fatalf("%s was claimed %d times", id, c)
		}
	}
}

func testProviderConnections(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, nil)
	a := s.Admin()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	for i := range 7 {
		p := alice
		if i%2 == 1 {
			p = bob
		}
		mustCreate(t, s, Conn(fmt.Sprintf("g%d", i), p, "github", fmt.Sprint(i)))
	}
	mustCreate(t, s, Conn("x1", alice, "google", "1"))
	var ids []string
	after := ""
	for {
		page, err := a.ProviderConnections(t.Context(), "github", after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		for _, c := range page {
			if c.Provider != "github" || c.Token.AccessToken != "" || c.Token.RefreshToken != "" {
				t.Fatalf("listed %+v: wrong provider or tokens opened", c)
			}
			ids = append(ids, c.ID)
		}
		after = page[len(page)-1].ID
	}
	if want := []string{"g0", "g1", "g2", "g3", "g4", "g5", "g6"}; !slices.Equal(ids, want) {
		t.Fatalf("pages gave %v, want %v", ids, want)
	}
	all, err := a.ProviderConnections(t.Context(), "google", "", 0)
	if err != nil || len(all) != 1 || all[0].ID != "x1" || all[0].Principal != alice {
		t.Fatalf("google: %+v, %v", all, err)
	}
}

func testDeleteGrants(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, nil)
	a := s.Admin()
	ctx := t.Context()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	for i, p := range []vault.Principal{alice, alice, bob, alice} {
		if _, err := s.CreateGrant(ctx, grant(fmt.Sprintf("gr%d", i), p, base.Add(time.Duration(i)*time.Second), base.Add(time.Hour))); err != nil {
			t.Fatal(err)
		}
	}
	n, err := a.DeleteGrants(ctx, alice)
	if err != nil || n != 3 {
		t.Fatalf("DeleteGrants = %d, %v; want 3", n, err)
	}
	if left, err := s.ListGrants(ctx, alice, time.Time{}); err != nil || len(left) != 0 {
		t.Fatalf("alice still has %d grants (%v)", len(left), err)
	}
	if created, _, err := s.CountGrants(ctx, alice, time.Time{}, base); err != nil || created != 0 {
		t.Fatalf("alice's grants still counted: %d (%v)", created, err)
	}
	if _, err := s.GetGrant(ctx, "gr2"); err != nil {
		t.Fatalf("bob's grant: %v", err)
	}
	if n, err := a.DeleteGrants(ctx, alice); err != nil || n != 0 {
		t.Fatalf("second DeleteGrants = %d, %v", n, err)
	}
	// Deleted grants no longer expire from the expiry index.
	if n, err := s.DeleteExpiredGrants(ctx, base.Add(2*time.Hour)); err != nil || n != 1 {
		t.Fatalf("DeleteExpiredGrants after DeleteGrants = %d, %v; want bob's one", n, err)
	}
}

func testRetire(t *testing.T, newStore NewHookedStore) {
	s := hooked(t, newStore, recordingHook)
	a := s.Admin()
	o := s.Outbox()
	ctx := t.Context()
	want := mustCreate(t, s, Conn("r1", alice, "github", "1"))
	mustCreate(t, s, Conn("r2", alice, "google", "2"))
	if err := a.RetireConnection(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := a.RetireConnection(ctx, "r1"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("second retire: %v", err)
	}
	if _, err := s.GetConnection(ctx, "r1"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("a retired connection is still stored: %v", err)
	}
	if list, _ := s.ListConnections(ctx, alice); len(list) != 1 || list[0].ID != "r2" {
		t.Fatalf("alice's connections after retiring r1: %+v", list)
	}
	if acc, _ := s.AccountConnections(ctx, "github", "1"); len(acc) != 0 {
		t.Fatalf("a retired connection still counts as a connection to its account: %+v", acc)
	}
	got := types(t, o)
	if !slices.Contains(got, "a:deleted") {
		t.Fatalf("retiring gave deliveries %v, want a deletion", got)
	}
	ret, err := a.RetiredConnections(ctx, alice)
	if err != nil || len(ret) != 1 {
		t.Fatalf("RetiredConnections = %+v, %v", ret, err)
	}
	sameConnection(t, ret[0], want)
	if other, err := a.RetiredConnections(ctx, vault.Principal{Issuer: alice.Issuer, Subject: "bob"}); err != nil || len(other) != 0 {
		t.Fatalf("bob's retired connections: %+v, %v", other, err)
	}
	if err := a.ForgetRetired(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if err := a.ForgetRetired(ctx, "r1"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("second forget: %v", err)
	}
	if ret, err := a.RetiredConnections(ctx, alice); err != nil || len(ret) != 0 {
		t.Fatalf("after forgetting: %+v, %v", ret, err)
	}
}

// NewAppHookedStore returns a fresh, empty store that calls hook (which
// may be nil) inside the transaction of every change of an app access
// record.
type NewAppHookedStore func(t *testing.T, hook vault.ChangeHook[vault.AppAccess]) vault.Store

// RunAppOutbox is the conformance suite of the app access records'
// deliveries: written with the change in its transaction, and a change
// whose deliveries cannot be written is not applied.
func RunAppOutbox(t *testing.T, newStore NewAppHookedStore) {
	t.Run("AppChangesWriteDeliveries", func(t *testing.T) { testAppChangesWriteDeliveries(t, newStore) })
	t.Run("AppChangeWithoutItsDeliveryIsNotApplied", func(t *testing.T) { testAppChangeNeedsDelivery(t, newStore) })
}

// appHook names every change of an app access record it sees: created,
// deleted, or updated with the consent's time moved on; other updates
// give nothing. With fail set it returns a delivery no outbox stores.
func appHook(fail *bool) vault.ChangeHook[vault.AppAccess] {
	return func(before, after *vault.AppAccess) []vault.Delivery {
		a, kind := after, "app.created"
		if after == nil {
			a, kind = before, "app.deleted"
		} else if before != nil {
			if after.Updated.Equal(before.Updated) {
				return nil
			}
			kind = "app.consented"
		}
		id := fmt.Sprintf("%s-v%d-%s", a.ID, a.Version, kind)
		if fail != nil && *fail {
			id = "" // the outbox refuses a delivery without an id
		}
		return []vault.Delivery{{ID: id, Endpoint: "a", Type: kind, Created: base, Due: base, Payload: []byte(`{"app":"` + a.ID + `"}`)}}
	}
}

// setApp updates app id of s with change, and returns the error.
func setApp(s vault.AuthStore, ctx context.Context, id string, change func(*vault.AppAccess)) error {
	_, err := s.UpdateAppAccess(ctx, id, func(a vault.AppAccess) (vault.AppAccess, error) {
		change(&a)
		return a, nil
	})
	return err
}

func testAppChangesWriteDeliveries(t *testing.T, newStore NewAppHookedStore) {
	st := hooked(t, newStore, appHook(nil))
	s := st.Auth()
	ctx := t.Context()
	if _, err := s.CreateAppAccess(ctx, appAccess("a1", alice, "c1")); err != nil {
		t.Fatal(err)
	}
	if err := setApp(s, ctx, "a1", func(a *vault.AppAccess) { a.LastUsed = base.Add(time.Minute) }); err != nil { // no event
		t.Fatal(err)
	}
	if err := setApp(s, ctx, "a1", func(a *vault.AppAccess) { a.Updated = base.Add(time.Hour) }); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAppAccess(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	got := types(t, st.Outbox())
	want := []string{"a:app.consented", "a:app.created", "a:app.deleted"}
	if !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
}

func testAppChangeNeedsDelivery(t *testing.T, newStore NewAppHookedStore) {
	fail := false
	st := hooked(t, newStore, appHook(&fail))
	s := st.Auth()
	ctx := t.Context()
	if _, err := s.CreateAppAccess(ctx, appAccess("a1", alice, "c1")); err != nil {
		t.Fatal(err)
	}
	fail = true
	if _, err := s.CreateAppAccess(ctx, appAccess("a2", alice, "c2")); err == nil {
		t.Fatal("a create whose delivery cannot be written succeeded")
	}
	if _, err := s.GetAppAccess(ctx, "a2"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("the refused create stored its record: %v", err)
	}
	if err := setApp(s, ctx, "a1", func(a *vault.AppAccess) { a.Updated = base.Add(time.Hour) }); err == nil {
		t.Fatal("an update whose delivery cannot be written succeeded")
	}
	if a, err := s.GetAppAccess(ctx, "a1"); err != nil || !a.Updated.Equal(base) || a.Version != 1 {
		t.Fatalf("after the refused update: %+v, %v; want the record unchanged", a, err)
	}
	if err := s.DeleteAppAccess(ctx, "a1"); err == nil {
		t.Fatal("a delete whose delivery cannot be written succeeded")
	}
	if _, err := s.GetAppAccess(ctx, "a1"); err != nil {
		t.Fatalf("the refused delete removed the record: %v", err)
	}
	if got := types(t, st.Outbox()); !slices.Equal(got, []string{"a:app.created"}) {
		t.Fatalf("outbox holds %v, want only the first create's event", got)
	}
	fail = false
	if err := s.DeleteAppAccess(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
}
