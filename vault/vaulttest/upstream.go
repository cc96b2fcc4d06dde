package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// upstreamClient is a confidential registration at the authorization
// server issuer (a public one without secret).
func upstreamClient(issuer, clientID string, secret vault.Secret) vault.UpstreamClient {
	method := "client_secret_basic"
	if secret == "" {
		method = "none"
	}
	return vault.UpstreamClient{Key: issuer + " https://broker.example/oauth/linear/callback", ClientID: clientID,
		ClientSecret: secret, AuthMethod: method, Created: base}
}

// RunUpstreamClients is the conformance suite of vault.UpstreamClientStore
// (Store.UpstreamClients): a registration and its secret come back as
// put, the first put of a key wins also under concurrency, a deleted one
// is gone, a refused put stores nothing, a closed store refuses.
// newStore returns a fresh, empty store for each subtest; the suite
// closes it.
func RunUpstreamClients(t *testing.T, newStore func(t *testing.T) vault.Store) {
	runSuite(t, newStore, func(s vault.Store) upstreamBackend { return upstreamBackend{s, s.UpstreamClients()} }, []subtest[upstreamBackend]{
		{"PutGet", testUpstreamPutGet},
		{"FirstPutWins", testUpstreamFirstPutWins},
		{"ConcurrentPutsOneRegistration", testUpstreamConcurrentPuts},
		{"Delete", testUpstreamDelete},
		{"CompareAndDelete", testUpstreamCompareAndDelete},
		{"RefusedPutStoresNothing", testUpstreamRefusals},
		{"Closed", testUpstreamClosed},
	})
}

// upstreamBackend is what RunUpstreamClients tests: a store and its
// vault.UpstreamClientStore.
type upstreamBackend struct {
	vault.Store
	vault.UpstreamClientStore
}

// sameUpstream fails unless got is want as a store returns it: the secret
// sealed with the primary key sealedWith (none without a secret).
func sameUpstream(t *testing.T, what string, got, want vault.UpstreamClient, sealedWith string) {
	t.Helper()
	if want.ClientSecret != "" {
		want.SealedWith = sealedWith
	}
	if got.ClientSecret.Reveal() != want.ClientSecret.Reveal() {
		t.Fatalf("%s: the client secret did not come back as put", what)
	}
	sameJSON(t, what, got, want)
}

func testUpstreamPutGet(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	primary := sealingKey(t, u)
	for _, c := range []vault.UpstreamClient{
		upstreamClient("https://as.example", "dcr-1", "dcr-secret-1"),
		upstreamClient("https://public.example", "dcr-2", ""),
		// Bytes some databases mangle, in every clear field.
		{Key: "https://as.example/t\x01x ü https://broker.example/cb?x='\"", ClientID: "o'dd \"id\" ü", ClientSecret: "s\x01ü", AuthMethod: "client_secret_post", Created: base},
	} {
		put, err := u.PutUpstreamClient(ctx, c)
		if err != nil {
			t.Fatalf("put %q: %v", c.Key, err)
		}
		sameUpstream(t, "put", put, c, primary)
		got, err := u.GetUpstreamClient(ctx, c.Key)
		if err != nil {
			t.Fatalf("get %q: %v", c.Key, err)
		}
		sameUpstream(t, "get", got, c, primary)
	}
	_, err := u.GetUpstreamClient(ctx, "https://unknown.example https://broker.example/cb")
	wantErr(t, "get of an unknown key", err, vault.ErrNotFound)
	_, err = u.GetUpstreamClient(ctx, "a\x00b")
	wantErr(t, "get of a key no store keeps", err, vault.ErrNotFound)
	if n, err := u.ResealUpstreamClients(ctx); n != 0 || err != nil {
		t.Fatalf("reseal with every secret on the primary key: %d, %v; want 0", n, err)
	}
}

// sealingKey is the primary key of s, learned from a registration it
// seals (and deletes again).
func sealingKey(t *testing.T, u upstreamBackend) string {
	t.Helper()
	c, err := u.PutUpstreamClient(t.Context(), upstreamClient("https://probe.example", "probe", "probe-secret"))
	if err != nil || c.SealedWith == "" {
		t.Fatalf("a put of a confidential client: %+v, %v; want a sealing key named", c, err)
	}
	if err := u.DeleteUpstreamClient(t.Context(), c.Key, c.ClientID); err != nil {
		t.Fatal(err)
	}
	return c.SealedWith
}

// putFirst stores the registration dcr-1 at https://as.example and
// returns it with the primary key of u.
func putFirst(t *testing.T, u upstreamBackend) (first vault.UpstreamClient, primary string) {
	t.Helper()
	primary = sealingKey(t, u)
	first = upstreamClient("https://as.example", "dcr-1", "dcr-secret-1")
	if _, err := u.PutUpstreamClient(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	return first, primary
}

func testUpstreamFirstPutWins(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	first, primary := putFirst(t, u)
	second := upstreamClient("https://as.example", "dcr-2", "")
	got, err := u.PutUpstreamClient(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	sameUpstream(t, "the second put", got, first, primary)
	got, err = u.GetUpstreamClient(ctx, first.Key)
	if err != nil {
		t.Fatal(err)
	}
	sameUpstream(t, "get after the second put", got, first, primary)
}

func testUpstreamConcurrentPuts(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	const n = 16
	got := make([]vault.UpstreamClient, n)
	concurrently(t, n, nil, func(i int) error {
		var err error
		got[i], err = u.PutUpstreamClient(ctx, upstreamClient("https://as.example", fmt.Sprint("dcr-", i), vault.Secret(fmt.Sprint("secret-", i))))
		return err
	})
	stored, err := u.GetUpstreamClient(ctx, got[0].Key)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range got {
		if c.ClientID != stored.ClientID || c.ClientSecret.Reveal() != stored.ClientSecret.Reveal() {
			t.Fatalf("put %d answered client %s, the store holds %s: concurrent registrations disagree", i, c.ClientID, stored.ClientID)
		}
	}
	if want := "secret-" + strings.TrimPrefix(stored.ClientID, "dcr-"); stored.ClientSecret.Reveal() != want {
		t.Fatalf("the stored client %s holds another put's secret", stored.ClientID)
	}
}

func testUpstreamDelete(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	c := upstreamClient("https://as.example", "dcr-1", "dcr-secret-1")
	other := upstreamClient("https://other.example", "dcr-9", "dcr-secret-9")
	for _, x := range []vault.UpstreamClient{c, other} {
		if _, err := u.PutUpstreamClient(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	if err := u.DeleteUpstreamClient(ctx, c.Key, ""); err != nil {
		t.Fatal(err)
	}
	_, err := u.GetUpstreamClient(ctx, c.Key)
	wantErr(t, "get after delete", err, vault.ErrNotFound)
	wantErr(t, "delete twice", u.DeleteUpstreamClient(ctx, c.Key, ""), vault.ErrNotFound)
	wantErr(t, "delete twice, naming the client", u.DeleteUpstreamClient(ctx, c.Key, c.ClientID), vault.ErrNotFound)
	wantErr(t, "delete of a key no store keeps", u.DeleteUpstreamClient(ctx, "a\x00b", ""), vault.ErrNotFound)
	if got, err := u.GetUpstreamClient(ctx, other.Key); err != nil || got.ClientID != other.ClientID {
		t.Fatalf("another registration after a delete: %+v, %v", got, err)
	}
	// The key is free again: the next registration is stored.
	again := upstreamClient("https://as.example", "dcr-2", "dcr-secret-2")
	if got, err := u.PutUpstreamClient(ctx, again); err != nil || got.ClientID != "dcr-2" {
		t.Fatalf("put after delete: %+v, %v", got, err)
	}
}

// testUpstreamCompareAndDelete: a delete naming a client deletes that
// client only. One replica saw dcr-1 refused and deletes it, another
// registered dcr-2 meanwhile: a late delete of dcr-1 leaves dcr-2.
func testUpstreamCompareAndDelete(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	first, primary := putFirst(t, u)
	if err := u.DeleteUpstreamClient(ctx, first.Key, "dcr-1"); err != nil {
		t.Fatalf("delete of the stored client: %v", err)
	}
	second := upstreamClient("https://as.example", "dcr-2", "dcr-secret-2")
	if _, err := u.PutUpstreamClient(ctx, second); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "a late delete of the client replaced since", u.DeleteUpstreamClient(ctx, first.Key, "dcr-1"), vault.ErrConflict)
	got, err := u.GetUpstreamClient(ctx, second.Key)
	if err != nil {
		t.Fatalf("the registration made since, after a late delete of another: %v", err)
	}
	sameUpstream(t, "the registration made since", got, second, primary)
	// Concurrent deletes of one client: one deletes it, the others find
	// nothing.
	const n = 8
	if deleted := concurrently(t, n, vault.ErrNotFound, func(int) error { return u.DeleteUpstreamClient(ctx, second.Key, "dcr-2") }); deleted != 1 {
		t.Fatalf("%d of %d concurrent deletes of one client succeeded, want 1", deleted, n)
	}
	_, err = u.GetUpstreamClient(ctx, second.Key)
	wantErr(t, "get after the concurrent deletes", err, vault.ErrNotFound)
}

func testUpstreamRefusals(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	long := upstreamClient(strings.Repeat("x", record.MaxUpstreamClientKey), "dcr-1", "s")
	nul := upstreamClient("https://as.example/\x00", "dcr-1", "s")
	noID := upstreamClient("https://as.example", "", "s")
	for name, c := range map[string]vault.UpstreamClient{"a key too long": long, "a NUL in the key": nul, "no client id": noID} {
		if _, err := u.PutUpstreamClient(ctx, c); err == nil {
			t.Errorf("put of %s was accepted", name)
		}
		if _, err := u.GetUpstreamClient(ctx, c.Key); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("after a refused put of %s: %v, want ErrNotFound", name, err)
		}
	}
}

func testUpstreamClosed(t *testing.T, u upstreamBackend) {
	ctx := t.Context()
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	c := upstreamClient("https://as.example", "dcr-1", "s")
	for name, call := range map[string]func() error{
		"GetUpstreamClient":     func() error { _, err := u.GetUpstreamClient(ctx, c.Key); return err },
		"PutUpstreamClient":     func() error { _, err := u.PutUpstreamClient(ctx, c); return err },
		"DeleteUpstreamClient":  func() error { return u.DeleteUpstreamClient(ctx, c.Key, c.ClientID) },
		"ResealUpstreamClients": func() error { _, err := u.ResealUpstreamClients(ctx); return err },
	} {
		t.Run(name, func(t *testing.T) { wantErr(t, name, call(), vault.ErrClosed) })
	}
}

// KeyUser is a store that counts records by the key that sealed them
// (boltstore, pgstore: what `broker keys status` shows).
type KeyUser interface {
	vault.Store
	KeyUsage(ctx context.Context) (map[string]int, error)
}

// RunUpstreamClientRotation checks that key rotation covers the client
// secrets of upstream registrations (runRotation): the one with a secret
// is re-sealed, the public one needs nothing. open opens the one store of
// the test (a file, a database) with kr, each time anew.
func RunUpstreamClientRotation(t *testing.T, open func(t *testing.T, kr *vault.Keyring) KeyUser) {
	secret := upstreamClient("https://as.example", "dcr-1", "dcr-secret-1")
	public := upstreamClient("https://public.example", "dcr-2", "")
	runRotation(t, open, func(s KeyUser) {
		for _, c := range []vault.UpstreamClient{secret, public} {
			if _, err := s.UpstreamClients().PutUpstreamClient(t.Context(), c); err != nil {
				t.Fatal(err)
			}
		}
	}, func(s KeyUser, oldKey string) {
		got, err := s.UpstreamClients().GetUpstreamClient(t.Context(), secret.Key)
		if err != nil || got.SealedWith != oldKey || got.ClientSecret != secret.ClientSecret {
			t.Fatalf("before the rotation: %+v, %v; want the secret sealed with %s", got, err, oldKey)
		}
	}, func(s KeyUser, newKey string) {
		for _, c := range []vault.UpstreamClient{secret, public} {
			got, err := s.UpstreamClients().GetUpstreamClient(t.Context(), c.Key)
			if err != nil {
				t.Fatalf("with the old key gone: %v", err)
			}
			sameUpstream(t, "with the old key gone", got, c, newKey)
		}
	})
}

// runRotation checks that key rotation covers one sealed record that put
// stores: sealed with a key that is no longer primary it still opens
// (before) and is counted against it, vault.Rekey seals it again with the
// primary (once: a second run rewrites nothing), and then it opens with
// the primary key alone (after).
func runRotation(t *testing.T, open func(t *testing.T, kr *vault.Keyring) KeyUser, put func(s KeyUser),
	before func(s KeyUser, oldKey string), after func(s KeyUser, newKey string)) {
	ctx := t.Context()
	oldKR, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, oldKR)
	put(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	newKR, err := oldKR.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, newKR)
	before(s, oldKR.Primary())
	if usage, err := s.KeyUsage(ctx); err != nil || usage[oldKR.Primary()] != 1 {
		t.Fatalf("key usage before the rotation: %v, %v; want the old key counted once", usage, err)
	}
	if n, err := vault.Rekey(ctx, s, newKR, 10); n != 1 || err != nil {
		t.Fatalf("rekey rewrote %d records, %v; want 1", n, err)
	}
	if n, err := vault.Rekey(ctx, s, newKR, 10); n != 0 || err != nil {
		t.Fatalf("a second rekey rewrote %d, %v; want 0", n, err)
	}
	if usage, err := s.KeyUsage(ctx); err != nil || len(usage) != 1 || usage[newKR.Primary()] != 1 {
		t.Fatalf("key usage after the rotation: %v, %v; want the new key alone, once", usage, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	primaryOnly, err := vault.NewKeyring([]string{newKR.Primary()}, newKR.AllBytes()[:1])
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, primaryOnly)
	defer s.Close()
	after(s, newKR.Primary())
}
