package vaulttest

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"credbroker/vault"
)

// authBackend is what RunAuth tests: a store and its vault.AuthStore.
type authBackend struct {
	vault.Store
	vault.AuthStore
}

// RunAuth runs the conformance suite of vault.AuthStore (Store.Auth), the
// authorization server's storage. newStore returns a fresh, empty store
// for each subtest; RunAuth closes it.
func RunAuth(t *testing.T, newStore func(t *testing.T) vault.Store) {
	runSuite(t, newStore, func(s vault.Store) authBackend { return authBackend{s, s.Auth()} }, []subtest[authBackend]{
		{"OAuthClientCRUD", testOAuthClientCRUD},
		{"OAuthClientLimit", testOAuthClientLimit},
		{"ConcurrentOAuthClientLimit", testConcurrentOAuthClientLimit},
		{"DeleteUnusedOAuthClients", testDeleteUnusedOAuthClients},
		{"AuthCodeRedeem", testAuthCodeRedeem},
		{"ConcurrentAuthCodeRedeem", testConcurrentAuthCodeRedeem},
		{"DeleteExpiredAuthCodes", testDeleteExpiredAuthCodes},
		{"AppAccessCRUD", testAppAccessCRUD},
		{"AppAccessUniquePerClient", testAppAccessUnique},
		{"AppAccessListIsolation", testAppAccessList},
		{"ConcurrentAppAccessUpdates", testConcurrentAppAccessUpdates},
		{"AppLiveness", testAppLiveness},
		{"AuthClosed", testAuthClosed},
	})
}

// odd is a principal whose issuer and subject hold bytes some databases
// mangle (NUL, quotes, non-ASCII): stores must keep them byte for byte.
var odd = vault.Principal{Issuer: "https://idp.example/t\x00x", Subject: "o'dd \"sub\" ü"}

func oauthClient(id string, created time.Time) vault.OAuthClient {
	return vault.OAuthClient{
		ID: id, SecretHash: []byte{1, 2, 3, 4}, AuthMethod: "client_secret_basic", Name: "Cursor <b>",
		URI: "https://cursor.example", RedirectURIs: []string{"http://127.0.0.1/callback", "https://app.example/cb"},
		GrantTypes: []string{"authorization_code", "refresh_token"}, ApplicationType: "native", Created: created,
	}
}

func sameJSON(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(normalise(got), normalise(want)) {
		t.Fatalf("%s differs:\n got  %+v\n want %+v", what, got, want)
	}
}

// normalise drops monotonic clock readings and locations, which no store
// keeps, so records compare by value.
func normalise(v any) any {
	switch x := v.(type) {
	case vault.OAuthClient:
		x.Created, x.Used = x.Created.UTC().Round(0), x.Used.UTC().Round(0)
		return x
	case vault.AuthCode:
		x.Created, x.Expires = x.Created.UTC().Round(0), x.Expires.UTC().Round(0)
		return x
	case vault.UpstreamClient:
		x.Created = x.Created.UTC().Round(0)
		return x
	case vault.AppAccess:
		x.Created, x.Updated, x.LastUsed = x.Created.UTC().Round(0), x.Updated.UTC().Round(0), x.LastUsed.UTC().Round(0)
		for i := range x.Families {
			f := &x.Families[i]
			f.Created, f.Expires, f.Refreshed = f.Created.UTC().Round(0), f.Expires.UTC().Round(0), f.Refreshed.UTC().Round(0)
		}
		return x
	}
	return v
}

func testOAuthClientCRUD(t *testing.T, s authBackend) {
	ctx := t.Context()
	c := oauthClient("c1", base)
	got, err := s.CreateOAuthClient(ctx, c, 0)
	if err != nil || got.Version != 1 {
		t.Fatalf("CreateOAuthClient: v%d, %v", got.Version, err)
	}
	_, err = s.CreateOAuthClient(ctx, oauthClient("c1", base), 0)
	wantErr(t, "create twice", err, vault.ErrExists)
	read, err := s.GetOAuthClient(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	c.Version = 1
	sameJSON(t, "client read back", read, c)

	upd, err := s.UpdateOAuthClient(ctx, "c1", func(c vault.OAuthClient) (vault.OAuthClient, error) {
		c.Used = base.Add(time.Minute)
		return c, nil
	})
	if err != nil || upd.Version != 2 || !upd.Used.Equal(base.Add(time.Minute)) {
		t.Fatalf("update: %+v, %v", upd, err)
	}
	if read, _ := s.GetOAuthClient(ctx, "c1"); read.Version != 2 || !read.Used.Equal(base.Add(time.Minute)) {
		t.Fatalf("update not stored: %+v", read)
	}
	_, err = s.UpdateOAuthClient(ctx, "c1", func(c vault.OAuthClient) (vault.OAuthClient, error) {
		c.Version = 1
		return c, nil
	})
	wantErr(t, "stale version", err, vault.ErrConflict)
	if _, err := s.UpdateOAuthClient(ctx, "c1", func(c vault.OAuthClient) (vault.OAuthClient, error) {
		c.ID = "other"
		return c, nil
	}); err == nil {
		t.Fatal("changing the id was accepted")
	}
	abort := errors.New("abort")
	_, err = s.UpdateOAuthClient(ctx, "c1", func(vault.OAuthClient) (vault.OAuthClient, error) { return vault.OAuthClient{}, abort })
	wantErr(t, "aborted update", err, abort)
	_, err = s.UpdateOAuthClient(ctx, "none", func(c vault.OAuthClient) (vault.OAuthClient, error) { return c, nil })
	wantErr(t, "update missing", err, vault.ErrNotFound)
	if read, _ := s.GetOAuthClient(ctx, "c1"); read.Version != 2 {
		t.Fatalf("a refused update changed the record: v%d", read.Version)
	}

	if err := s.DeleteOAuthClient(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetOAuthClient(ctx, "c1")
	wantErr(t, "get deleted", err, vault.ErrNotFound)
	wantErr(t, "delete twice", s.DeleteOAuthClient(ctx, "c1"), vault.ErrNotFound)
}

func testOAuthClientLimit(t *testing.T, s authBackend) {
	ctx := t.Context()
	for i := range 3 {
		if _, err := s.CreateOAuthClient(ctx, oauthClient(fmt.Sprint("l", i), base), 3); err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.CreateOAuthClient(ctx, oauthClient("l3", base), 3)
	wantErr(t, "fourth client under a cap of three", err, vault.ErrTooManyClients)
	_, err = s.GetOAuthClient(ctx, "l3")
	wantErr(t, "refused client", err, vault.ErrNotFound)
	if _, err := s.CreateOAuthClient(ctx, oauthClient("l4", base), 0); err != nil {
		t.Fatalf("no cap: %v", err)
	}
}

func testConcurrentOAuthClientLimit(t *testing.T, s authBackend) {
	ctx := t.Context()
	const n, max = 24, 5
	ok := concurrently(t, n, vault.ErrTooManyClients, func(i int) error {
		_, err := s.CreateOAuthClient(ctx, oauthClient(fmt.Sprint("cc", i), base), max)
		return err
	})
	if ok != max {
		t.Fatalf("%d of %d concurrent registrations stored under a cap of %d", ok, n, max)
	}
}

func testDeleteUnusedOAuthClients(t *testing.T, s authBackend) {
	ctx := t.Context()
	old, used, fresh := oauthClient("old", base), oauthClient("used", base), oauthClient("fresh", base.Add(2*time.Hour))
	used.Used = base.Add(time.Minute)
	for _, c := range []vault.OAuthClient{old, used, fresh} {
		if _, err := s.CreateOAuthClient(ctx, c, 0); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DeleteUnusedOAuthClients(ctx, base.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("DeleteUnusedOAuthClients = %d, %v; want 1", n, err)
	}
	_, err = s.GetOAuthClient(ctx, "old")
	wantErr(t, "unused old client", err, vault.ErrNotFound)
	for _, id := range []string{"used", "fresh"} {
		if _, err := s.GetOAuthClient(ctx, id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}

func authCode(secret string, p vault.Principal, expires time.Time) vault.AuthCode {
	return vault.AuthCode{
		Key: vault.SecretKey(secret), ClientID: "https://app.example/client.json", RedirectURI: "http://127.0.0.1:9/cb",
		Principal: p, Scopes: []string{"mcp"}, Resource: "https://broker.example/mcp", Challenge: "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
		AppID: "app1", FamilyID: "fam1", Created: base, Expires: expires,
	}
}

func testAuthCodeRedeem(t *testing.T, s authBackend) {
	ctx := t.Context()
	c := authCode("code-1", odd, base.Add(time.Minute))
	if err := s.CreateAuthCode(ctx, c); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "create twice", s.CreateAuthCode(ctx, c), vault.ErrExists)
	got, err := s.RedeemAuthCode(ctx, c.Key)
	if err != nil {
		t.Fatal(err)
	}
	c.Redeemed = true
	sameJSON(t, "redeemed code", got, c)
	again, err := s.RedeemAuthCode(ctx, c.Key)
	wantErr(t, "second redemption", err, vault.ErrCodeRedeemed)
	sameJSON(t, "code returned with ErrCodeRedeemed", again, c)
	_, err = s.RedeemAuthCode(ctx, vault.SecretKey("never issued"))
	wantErr(t, "unknown code", err, vault.ErrNotFound)
}

func testConcurrentAuthCodeRedeem(t *testing.T, s authBackend) {
	ctx := t.Context()
	c := authCode("race", alice, base.Add(time.Minute))
	if err := s.CreateAuthCode(ctx, c); err != nil {
		t.Fatal(err)
	}
	const n = 20
	ok := concurrently(t, n, vault.ErrCodeRedeemed, func(int) error {
		_, err := s.RedeemAuthCode(ctx, c.Key)
		return err
	})
	if ok != 1 {
		t.Fatalf("%d of %d concurrent redemptions succeeded; want exactly 1", ok, n)
	}
}

func testDeleteExpiredAuthCodes(t *testing.T, s authBackend) {
	ctx := t.Context()
	for i, exp := range []time.Time{base, base.Add(time.Minute), base.Add(time.Hour)} {
		if err := s.CreateAuthCode(ctx, authCode(fmt.Sprint("gc", i), alice, exp)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.RedeemAuthCode(ctx, vault.SecretKey("gc0")); err != nil {
		t.Fatal(err)
	}
	n, err := s.DeleteExpiredAuthCodes(ctx, base.Add(30*time.Minute))
	if err != nil || n != 2 {
		t.Fatalf("DeleteExpiredAuthCodes = %d, %v; want 2", n, err)
	}
	for i, want := range []error{vault.ErrNotFound, vault.ErrNotFound, nil} {
		_, err := s.RedeemAuthCode(ctx, vault.SecretKey(fmt.Sprint("gc", i)))
		if !errors.Is(err, want) && !(want == nil && err == nil) {
			t.Fatalf("code gc%d after GC: %v, want %v", i, err, want)
		}
	}
}

func appAccess(id string, p vault.Principal, client string) vault.AppAccess {
	return vault.AppAccess{
		ID: id, Principal: p, ClientID: client, ClientName: "Claude <script>", RedirectURI: "https://claude.example/cb",
		Scopes: []string{"mcp"}, Created: base, Updated: base,
	}
}

func testAppAccessCRUD(t *testing.T, s authBackend) {
	ctx := t.Context()
	a := appAccess("a1", odd, "https://claude.example/client.json")
	got, err := s.CreateAppAccess(ctx, a)
	if err != nil || got.Version != 1 {
		t.Fatalf("CreateAppAccess: v%d, %v", got.Version, err)
	}
	a.Version = 1
	read, err := s.GetAppAccess(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "app access read back", read, a)
	found, err := s.FindAppAccess(ctx, odd, a.ClientID)
	if err != nil {
		t.Fatal(err)
	}
	sameJSON(t, "app access found", found, a)
	_, err = s.FindAppAccess(ctx, odd, "https://other.example/c.json")
	wantErr(t, "find another client", err, vault.ErrNotFound)
	_, err = s.FindAppAccess(ctx, alice, a.ClientID)
	wantErr(t, "find another person", err, vault.ErrNotFound)

	fam := vault.TokenFamily{
		ID: "f1", Scopes: []string{"mcp"}, Resource: "https://broker.example/mcp", Created: base, Expires: base.Add(24 * time.Hour),
		RefreshHash: vault.SecretKey("rt-2"), Refreshed: base.Add(time.Minute), Spent: []string{vault.SecretKey("rt-1")},
	}
	// A family granted by an ID-JAG keeps its mark.
	org := vault.TokenFamily{ID: "f2", Resource: "https://broker.example/mcp", Created: base, Expires: base.Add(time.Hour), Via: "id-jag"}
	upd, err := s.UpdateAppAccess(ctx, "a1", func(a vault.AppAccess) (vault.AppAccess, error) {
		a.Families = append(a.Families, fam, org)
		a.LastUsed = base.Add(time.Minute)
		return a, nil
	})
	if err != nil || upd.Version != 2 {
		t.Fatalf("update: v%d, %v", upd.Version, err)
	}
	read, _ = s.GetAppAccess(ctx, "a1")
	a.Families, a.LastUsed, a.Version = []vault.TokenFamily{fam, org}, base.Add(time.Minute), 2
	sameJSON(t, "app access with a family", read, a)
	if f, ok := read.Family("f1"); !ok || f.RefreshHash != fam.RefreshHash {
		t.Fatalf("Family(f1) = %+v, %v", f, ok)
	}
	if f, ok := read.Family("f2"); !ok || f.Via != "id-jag" {
		t.Fatalf("Family(f2) = %+v, %v: the ID-JAG mark was lost", f, ok)
	}

	for name, change := range map[string]func(*vault.AppAccess){
		"id":        func(a *vault.AppAccess) { a.ID = "a2" },
		"principal": func(a *vault.AppAccess) { a.Principal = alice },
		"client":    func(a *vault.AppAccess) { a.ClientID = "other" },
	} {
		if _, err := s.UpdateAppAccess(ctx, "a1", func(a vault.AppAccess) (vault.AppAccess, error) {
			change(&a)
			return a, nil
		}); err == nil {
			t.Fatalf("changing the %s was accepted", name)
		}
	}
	_, err = s.UpdateAppAccess(ctx, "a1", func(a vault.AppAccess) (vault.AppAccess, error) {
		a.Version--
		return a, nil
	})
	wantErr(t, "stale version", err, vault.ErrConflict)
	_, err = s.UpdateAppAccess(ctx, "none", func(a vault.AppAccess) (vault.AppAccess, error) { return a, nil })
	wantErr(t, "update missing", err, vault.ErrNotFound)

	if err := s.DeleteAppAccess(ctx, "a1"); err != nil {
		t.Fatal(err)
	}
	_, err = s.GetAppAccess(ctx, "a1")
	wantErr(t, "get deleted", err, vault.ErrNotFound)
	_, err = s.FindAppAccess(ctx, odd, a.ClientID)
	wantErr(t, "find deleted", err, vault.ErrNotFound)
	wantErr(t, "delete twice", s.DeleteAppAccess(ctx, "a1"), vault.ErrNotFound)
	// The person may authorize the app afresh.
	if _, err := s.CreateAppAccess(ctx, appAccess("a3", odd, a.ClientID)); err != nil {
		t.Fatalf("create after delete: %v", err)
	}
}

func testAppAccessUnique(t *testing.T, s authBackend) {
	ctx := t.Context()
	if _, err := s.CreateAppAccess(ctx, appAccess("u1", alice, "c")); err != nil {
		t.Fatal(err)
	}
	_, err := s.CreateAppAccess(ctx, appAccess("u1", alice, "d"))
	wantErr(t, "same id", err, vault.ErrExists)
	_, err = s.CreateAppAccess(ctx, appAccess("u2", alice, "c"))
	wantErr(t, "same person and client", err, vault.ErrExists)
	if _, err := s.GetAppAccess(ctx, "u2"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("refused record stored: %v", err)
	}
	// Concurrent first authorizations of one app by one person: one record.
	const n = 12
	ok := concurrently(t, n, vault.ErrExists, func(i int) error {
		_, err := s.CreateAppAccess(ctx, appAccess(fmt.Sprint("r", i), alice, "race"))
		return err
	})
	list, err := s.ListAppAccess(ctx, alice)
	if ok != 1 || err != nil || len(list) != 2 {
		t.Fatalf("%d concurrent creates succeeded and alice lists %d records (%v); want 1 and 2", ok, len(list), err)
	}
}

func testAppAccessList(t *testing.T, s authBackend) {
	ctx := t.Context()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	prefix := vault.Principal{Issuer: alice.Issuer, Subject: "ali"} // a prefix of alice's subject
	for _, a := range []vault.AppAccess{
		appAccess("b", alice, "c2"), appAccess("a", alice, "c1"), appAccess("c", bob, "c1"), appAccess("d", prefix, "c1"),
	} {
		if _, err := s.CreateAppAccess(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	list, err := s.ListAppAccess(ctx, alice)
	if err != nil || len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" {
		t.Fatalf("alice's list = %+v, %v; want a, b in order", list, err)
	}
	if list, err := s.ListAppAccess(ctx, vault.Principal{Issuer: "https://other", Subject: "alice"}); err != nil || len(list) != 0 {
		t.Fatalf("another issuer's alice lists %d records, %v", len(list), err)
	}
}

func testConcurrentAppAccessUpdates(t *testing.T, s authBackend) {
	ctx := t.Context()
	if _, err := s.CreateAppAccess(ctx, appAccess("cu", alice, "c")); err != nil {
		t.Fatal(err)
	}
	const workers, each = 10, 3
	concurrently(t, workers, nil, func(w int) error {
		for i := range each {
			_, err := s.UpdateAppAccess(ctx, "cu", func(a vault.AppAccess) (vault.AppAccess, error) {
				a.Families = append(a.Families, vault.TokenFamily{ID: fmt.Sprintf("f%d-%d", w, i), Created: base, Expires: base})
				return a, nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	a, err := s.GetAppAccess(ctx, "cu")
	if err != nil || a.Version != 1+workers*each || len(a.Families) != workers*each {
		t.Fatalf("record v%d with %d families, %v; want v%d with %d (lost update)", a.Version, len(a.Families), err, 1+workers*each, workers*each)
	}
}

func testAuthClosed(t *testing.T, s authBackend) {
	ctx := t.Context()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cid := func(c vault.OAuthClient) (vault.OAuthClient, error) { return c, nil }
	aid := func(a vault.AppAccess) (vault.AppAccess, error) { return a, nil }
	calls := map[string]func() error{
		"CreateOAuthClient": func() error { _, err := s.CreateOAuthClient(ctx, oauthClient("x", base), 0); return err },
		"GetOAuthClient":    func() error { _, err := s.GetOAuthClient(ctx, "x"); return err },
		"UpdateOAuthClient": func() error { _, err := s.UpdateOAuthClient(ctx, "x", cid); return err },
		"DeleteOAuthClient": func() error { return s.DeleteOAuthClient(ctx, "x") },
		"DeleteUnusedOAuthClients": func() error {
			_, err := s.DeleteUnusedOAuthClients(ctx, base)
			return err
		},
		"CreateAuthCode":         func() error { return s.CreateAuthCode(ctx, authCode("x", alice, base)) },
		"RedeemAuthCode":         func() error { _, err := s.RedeemAuthCode(ctx, "x"); return err },
		"DeleteExpiredAuthCodes": func() error { _, err := s.DeleteExpiredAuthCodes(ctx, base); return err },
		"CreateAppAccess":        func() error { _, err := s.CreateAppAccess(ctx, appAccess("x", alice, "c")); return err },
		"GetAppAccess":           func() error { _, err := s.GetAppAccess(ctx, "x"); return err },
		"FindAppAccess":          func() error { _, err := s.FindAppAccess(ctx, alice, "c"); return err },
		"ListAppAccess":          func() error { _, err := s.ListAppAccess(ctx, alice); return err },
		"UpdateAppAccess":        func() error { _, err := s.UpdateAppAccess(ctx, "x", aid); return err },
		"DeleteAppAccess":        func() error { return s.DeleteAppAccess(ctx, "x") },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) { wantErr(t, name, call(), vault.ErrClosed) })
	}
}

// testAppLiveness: GetAppLiveness gives the record's person, client and
// families with their ends, nothing else of it, and nothing of a missing
// record.
func testAppLiveness(t *testing.T, s authBackend) {
	ctx := t.Context()
	a := appAccess("a1", odd, "https://claude.example/client.json")
	a.Families = []vault.TokenFamily{
		{ID: "f1", Scopes: []string{"mcp"}, Resource: "https://broker/mcp", Created: base, Expires: base.Add(time.Hour),
			RefreshHash: "h3", Refreshed: base, Spent: []string{"h1", "h2"}},
		{ID: "f2", Created: base, Expires: base.Add(2 * time.Hour), Via: "id-jag"},
	}
	if _, err := s.CreateAppAccess(ctx, a); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetAppLiveness(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	want := vault.AppAccess{ID: "a1", Principal: odd, ClientID: a.ClientID,
		Families: []vault.TokenFamily{{ID: "f1", Expires: base.Add(time.Hour)}, {ID: "f2", Expires: base.Add(2 * time.Hour)}}}
	sameJSON(t, "liveness", got, want)
	if _, err := s.GetAppLiveness(ctx, "nope"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("liveness of a missing record: %v, want ErrNotFound", err)
	}
}
