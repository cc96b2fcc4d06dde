// Package vaulttest is the storage conformance suite: every vault.Store
// backend runs Run from its own tests, so all backends keep one contract
// (sentinel errors, compare-and-swap updates, index-backed listing, grant
// counting and garbage collection, closed-store behaviour, concurrency).
package vaulttest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

// Run runs the conformance suite. newStore returns a fresh, empty store for
// each subtest; Run closes it (Close must tolerate being called twice, as
// the backend's own cleanup may close it again).
func Run(t *testing.T, newStore func(t *testing.T) vault.Store) {
	runSuite(t, newStore, func(s vault.Store) vault.Store { return s }, []subtest[vault.Store]{
		{"ConnectionCRUD", testConnectionCRUD},
		{"ConnectionRoundTrip", testConnectionRoundTrip},
		{"ConnectionVersions", testConnectionVersions},
		{"ConnectionImmutableFields", testConnectionImmutable},
		{"ConnectionUpdateAbort", testConnectionUpdateAbort},
		{"ConnectionStaleVersion", testConnectionStaleVersion},
		{"ConnectionMetaUpdate", testConnectionMetaUpdate},
		{"KeyConnection", testKeyConnection},
		{"SeveralAccountsOneProvider", testSeveralAccounts},
		{"ListIsolation", testListIsolation},
		{"ConnectionIDs", testConnectionIDs},
		{"AccountConnections", testAccountConnections},
		{"RefreshTokenMetadata", testRefreshTokenMetadata},
		{"GrantCRUD", testGrantCRUD},
		{"GrantImmutableAndAbort", testGrantImmutable},
		{"CountGrants", testCountGrants},
		{"GrantLimits", testGrantLimits},
		{"ConcurrentGrantLimits", testConcurrentGrantLimits},
		{"DeleteExpiredGrants", testDeleteExpired},
		{"Closed", testClosed},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"ConcurrentCreateSameID", testConcurrentCreateSameID},
		{"ConcurrentCreateAndList", testConcurrentCreateAndList},
		{"GrantConnector", testGrantConnector},
		{"ConnectKnownGrant", testConnectKnownGrant},
		{"Locker", testLocker},
	})
}

// NewHandles returns two handles of type S (an assertion ledger, a store
// of IdP sessions) on one fresh, empty store: two processes sharing it
// where the backend can have them (PostgreSQL: two pools), else the same
// store twice.
type NewHandles[S any] func(t *testing.T) (a, b S)

// subtest is one test of a conformance suite on S, a store as the suite
// sees it.
type subtest[S any] struct {
	name string
	fn   func(t *testing.T, s S)
}

// runSuite runs each of tests on a fresh store of newStore, as as makes
// it, and closes the store after.
func runSuite[S any](t *testing.T, newStore func(t *testing.T) vault.Store, as func(vault.Store) S, tests []subtest[S]) {
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newStore(t)
			t.Cleanup(func() { _ = s.Close() })
			tt.fn(t, as(s))
		})
	}
}

// concurrently makes n calls of do at once (do(i), i from 0 to n-1) and
// returns how many succeeded; an error other than refusal (nil: any
// error) fails the test.
func concurrently(t *testing.T, n int, refusal error, do func(i int) error) int {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() { errs <- do(i) })
	}
	wg.Wait()
	close(errs)
	ok := 0
	for err := range errs {
		switch {
		case err == nil:
			ok++
		case refusal == nil || !errors.Is(err, refusal):
			t.Fatalf("unexpected error: %v", err)
		}
	}
	return ok
}

var base = time.Date(2026, 7, 28, 12, 0, 0, 123456789, time.UTC)

var alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

// Conn returns a connection for tests with distinct token values derived
// from id.
func Conn(id string, p vault.Principal, provider, account string) vault.Connection {
	return vault.Connection{
		ID: id, Principal: p, Provider: provider, AccountID: account,
		AccountLogin: account + "@example.com",
		Scopes:       []string{"repo", "read:user"},
		Token: vault.TokenSet{
			AccessToken:  vault.Secret("at-" + id + "-secret"),
			RefreshToken: vault.Secret("rt-" + id + "-secret"),
			TokenType:    "Bearer",
			Expiry:       base.Add(time.Hour),
			IDToken:      vault.Secret("idt-" + id),
		},
		Status:  vault.StatusActive,
		Created: base, Updated: base,
	}
}

// KeyConn returns an API-key connection for tests: no OAuth tokens, only
// the entered fields (distinct values derived from id), no scopes.
func KeyConn(id string, p vault.Principal, provider, account string) vault.Connection {
	return vault.Connection{
		ID: id, Principal: p, Provider: provider, AccountID: account, AccountLogin: account + "@example.com",
		Token: vault.TokenSet{Fields: map[string]vault.Secret{
			"email":     vault.Secret(account + "@example.com"),
			"api_token": vault.Secret("key-" + id + "-secret"),
		}},
		Status:  vault.StatusActive,
		Created: base, Updated: base,
	}
}

func grant(id string, p vault.Principal, created, expires time.Time) vault.Grant {
	return vault.Grant{
		ID: id, Principal: p, Provider: "github", Scopes: []string{"repo"},
		ClientName: "Claude <script>", Server: "demorepos", Created: created, Expires: expires, State: vault.GrantPending,
	}
}

func mustCreate(t *testing.T, s vault.Store, c vault.Connection) vault.Connection {
	t.Helper()
	got, err := s.CreateConnection(t.Context(), c)
	if err != nil {
		t.Fatalf("CreateConnection(%s): %v", c.ID, err)
	}
	return got
}

func mustGet(t *testing.T, s vault.Store, id string) vault.Connection {
	t.Helper()
	got, err := s.GetConnection(t.Context(), id)
	if err != nil {
		t.Fatalf("GetConnection(%s): %v", id, err)
	}
	return got
}

// listedIDs returns the ids of cs, the answer of a listing (what, in
// errors), and reports each that carries token material: a listing is
// metadata only, nothing is decrypted for it, and each record's tokens
// open where they are used.
func listedIDs(t *testing.T, what string, cs []vault.Connection) []string {
	t.Helper()
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
		if !c.Token.IsZero() {
			t.Errorf("%s %s: tokens were decrypted for a listing", what, c.ID)
		}
	}
	return ids
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

// sameConnection compares everything but Version and SealedWith.
func sameConnection(t *testing.T, got, want vault.Connection) {
	t.Helper()
	type flat struct {
		ID, Iss, Sub, Provider, Account, Login string
		Scopes, Requested                      []string
		AT, RT, TT, IDT                        string
		Fields                                 map[string]string
		Expiry, Created, Updated, Used, Refr   time.Time
		Status                                 vault.ConnectionStatus
	}
	f := func(c vault.Connection) flat {
		var fields map[string]string
		if len(c.Token.Fields) > 0 {
			fields = map[string]string{}
			for k, v := range c.Token.Fields {
				fields[k] = v.Reveal()
			}
		}
		return flat{c.ID, c.Principal.Issuer, c.Principal.Subject, c.Provider, c.AccountID, c.AccountLogin,
			c.Scopes, c.Requested, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(), c.Token.TokenType, c.Token.IDToken.Reveal(),
			fields, c.Token.Expiry.UTC(), c.Created.UTC(), c.Updated.UTC(), c.LastUsed.UTC(), c.LastRefreshed.UTC(), c.Status}
	}
	g, w := f(got), f(want)
	if fmt.Sprintf("%#v", g) != fmt.Sprintf("%#v", w) {
		t.Fatalf("connection differs:\n got  %#v\n want %#v", g, w)
	}
}

func testConnectionCRUD(t *testing.T, s vault.Store) {
	ctx := t.Context()
	c := Conn("c1", alice, "github", "1001")
	created := mustCreate(t, s, c)
	if created.Version != 1 {
		t.Errorf("created Version = %d, want 1", created.Version)
	}
	got := mustGet(t, s, "c1")
	sameConnection(t, got, c)
	if got.Version != 1 || got.SealedWith == "" {
		t.Errorf("Version = %d, SealedWith = %q; want 1 and the primary key id", got.Version, got.SealedWith)
	}
	_, err := s.CreateConnection(ctx, Conn("c1", alice, "google", "x"))
	wantErr(t, "create duplicate", err, vault.ErrExists)
	sameConnection(t, mustGet(t, s, "c1"), c)

	_, err = s.GetConnection(ctx, "missing")
	wantErr(t, "get missing", err, vault.ErrNotFound)
	_, err = s.UpdateConnection(ctx, "missing", func(c vault.Connection) (vault.Connection, error) { return c, nil })
	wantErr(t, "update missing", err, vault.ErrNotFound)
	wantErr(t, "delete missing", s.DeleteConnection(ctx, "missing"), vault.ErrNotFound)

	bad := map[string]vault.Connection{
		"no id": Conn("", alice, "github", "1"),
		"invalid UTF-8 token": func() vault.Connection {
			c := Conn("bad1", alice, "github", "1")
			c.Token.AccessToken = "\xff"
			return c
		}(),
		"invalid UTF-8 subject": Conn("bad2", vault.Principal{Issuer: "i", Subject: "\xfe"}, "github", "1"),
		"invalid UTF-8 id":      Conn("bad\xff", alice, "github", "1"),
		"invalid UTF-8 in scope": func() vault.Connection {
			c := Conn("bad3", alice, "github", "1")
			c.Scopes = []string{"\xc0"}
			return c
		}(),
	}
	for name, c := range bad {
		if _, err := s.CreateConnection(ctx, c); err == nil {
			t.Errorf("create with %s succeeded", name)
		}
		if _, err := s.GetConnection(ctx, c.ID); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("after rejected create with %s: get = %v, want ErrNotFound", name, err)
		}
	}
	if _, err := s.CreateGrant(ctx, grant("bad\xff", alice, base, base)); err == nil {
		t.Error("grant with invalid UTF-8 id accepted")
	}

	if err := s.DeleteConnection(ctx, "c1"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err = s.GetConnection(ctx, "c1")
	wantErr(t, "get deleted", err, vault.ErrNotFound)
	wantErr(t, "delete twice", s.DeleteConnection(ctx, "c1"), vault.ErrNotFound)
	list, err := s.ListConnections(ctx, alice)
	if err != nil || len(list) != 0 {
		t.Fatalf("list after delete = %d records, %v; want none", len(list), err)
	}
	// The id is free again.
	mustCreate(t, s, c)
}

func testConnectionRoundTrip(t *testing.T, s vault.Store) {
	tests := []struct {
		name string
		mod  func(*vault.Connection)
	}{
		{"full", func(*vault.Connection) {}},
		{"no refresh or id token", func(c *vault.Connection) { c.Token.RefreshToken, c.Token.IDToken = "", "" }},
		{"needs reconnect", func(c *vault.Connection) { c.Status = vault.StatusNeedsReconnect }},
		{"used and refreshed", func(c *vault.Connection) {
			c.LastUsed, c.LastRefreshed = base.Add(time.Minute), base.Add(2*time.Minute)
		}},
		{"odd bytes", func(c *vault.Connection) {
			c.AccountLogin = "zoë\x00\"<>&\u2028"
			c.Token.AccessToken = "tok\x00\"\\<\u2029"
			c.Scopes = []string{"", "a b", "\x00"}
		}},
		{"requested scopes", func(c *vault.Connection) {
			c.Requested = []string{"repo", "read:user", "admin:org", "\x00 <\u2028>"}
		}},
		{"key fields beside tokens", func(c *vault.Connection) {
			c.Token.Fields = map[string]vault.Secret{"api_key": "k\x00\"<\u2028-secret", "email": "zoë@example.com"}
		}},
		{"other zone", func(c *vault.Connection) {
			c.Created = base.In(time.FixedZone("x", 3600))
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Conn(fmt.Sprintf("rt%d", i), alice, "github", fmt.Sprint(i))
			tt.mod(&c)
			mustCreate(t, s, c)
			sameConnection(t, mustGet(t, s, c.ID), c)
		})
	}
}

func testConnectionVersions(t *testing.T, s vault.Store) {
	ctx := t.Context()
	mustCreate(t, s, Conn("v", alice, "github", "1"))
	for want := uint64(2); want <= 4; want++ {
		got, err := s.UpdateConnection(ctx, "v", func(c vault.Connection) (vault.Connection, error) {
			c.AccountLogin = fmt.Sprintf("login%d", want)
			c.Token.AccessToken = vault.Secret(fmt.Sprintf("at-%d", want))
			return c, nil
		})
		if err != nil {
			t.Fatalf("update: %v", err)
		}
		if got.Version != want {
			t.Fatalf("returned Version = %d, want %d", got.Version, want)
		}
		stored := mustGet(t, s, "v")
		if stored.Version != want || stored.AccountLogin != fmt.Sprintf("login%d", want) ||
			stored.Token.AccessToken.Reveal() != fmt.Sprintf("at-%d", want) {
			t.Fatalf("stored = v%d %q; want v%d", stored.Version, stored.AccountLogin, want)
		}
	}
}

func testConnectionImmutable(t *testing.T, s vault.Store) {
	ctx := t.Context()
	orig := mustCreate(t, s, Conn("im", alice, "github", "1"))
	tests := []struct {
		name string
		mod  func(*vault.Connection)
	}{
		{"id", func(c *vault.Connection) { c.ID = "other" }},
		{"issuer", func(c *vault.Connection) { c.Principal.Issuer = "https://evil" }},
		{"subject", func(c *vault.Connection) { c.Principal.Subject = "mallory" }},
		{"provider", func(c *vault.Connection) { c.Provider = "google" }},
		{"account", func(c *vault.Connection) { c.AccountID = "2" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.UpdateConnection(ctx, "im", func(c vault.Connection) (vault.Connection, error) {
				tt.mod(&c)
				c.AccountLogin = "changed"
				return c, nil
			})
			if err == nil {
				t.Fatal("update changing an immutable field succeeded")
			}
			got := mustGet(t, s, "im")
			if got.Version != orig.Version || got.AccountLogin != orig.AccountLogin {
				t.Fatalf("record changed: v%d %q", got.Version, got.AccountLogin)
			}
		})
	}
	if _, err := s.GetConnection(ctx, "other"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("get other: %v, want ErrNotFound", err)
	}
}

func testConnectionUpdateAbort(t *testing.T, s vault.Store) {
	ctx := t.Context()
	mustCreate(t, s, Conn("ab", alice, "github", "1"))
	boom := errors.New("boom")
	_, err := s.UpdateConnection(ctx, "ab", func(c vault.Connection) (vault.Connection, error) {
		c.AccountLogin = "changed"
		return c, fmt.Errorf("wrapped: %w", boom)
	})
	wantErr(t, "aborted update", err, boom)
	// A caller-side CAS check surfaces as ErrConflict.
	_, err = s.UpdateConnection(ctx, "ab", func(c vault.Connection) (vault.Connection, error) {
		return c, vault.ErrConflict
	})
	wantErr(t, "caller conflict", err, vault.ErrConflict)
	got := mustGet(t, s, "ab")
	if got.Version != 1 || got.AccountLogin != "1@example.com" {
		t.Fatalf("aborted update changed the record: v%d %q", got.Version, got.AccountLogin)
	}
}

func testConnectionStaleVersion(t *testing.T, s vault.Store) {
	ctx := t.Context()
	stale := mustCreate(t, s, Conn("st", alice, "github", "1"))
	if _, err := s.UpdateConnection(ctx, "st", func(c vault.Connection) (vault.Connection, error) {
		c.AccountLogin = "fresh"
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	// Writing back a copy read before that update loses the race.
	_, err := s.UpdateConnection(ctx, "st", func(vault.Connection) (vault.Connection, error) {
		stale.AccountLogin = "stale"
		return stale, nil
	})
	wantErr(t, "stale write", err, vault.ErrConflict)
	if got := mustGet(t, s, "st"); got.AccountLogin != "fresh" || got.Version != 2 {
		t.Fatalf("after stale write: v%d %q, want v2 fresh", got.Version, got.AccountLogin)
	}
}

// testConnectionMetaUpdate: metadata updates see no tokens, keep the
// sealed tokens byte for byte (same key, still opening), follow the
// compare-and-swap rules, and refuse to set token material.
func testConnectionMetaUpdate(t *testing.T, s vault.Store) {
	ctx := t.Context()
	orig := mustCreate(t, s, Conn("mu", alice, "github", "1"))
	used := base.Add(time.Hour)
	got, err := s.UpdateConnectionMeta(ctx, "mu", func(c vault.Connection) (vault.Connection, error) {
		if !c.Token.IsZero() {
			t.Error("metadata update saw token material")
		}
		if c.Version != 1 || c.AccountID != "1" || c.Provider != "github" || c.Principal != alice {
			t.Errorf("metadata update saw v%d %s/%s", c.Version, c.Provider, c.AccountID)
		}
		c.LastUsed, c.Status, c.Scopes, c.Requested = used, vault.StatusNeedsReconnect, []string{"repo"}, []string{"repo", "admin:org"}
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 2 || !got.Token.IsZero() || got.SealedWith != orig.SealedWith {
		t.Fatalf("meta update returned v%d, sealed with %q (want v2, %q, no tokens)", got.Version, got.SealedWith, orig.SealedWith)
	}
	full := mustGet(t, s, "mu")
	if full.Version != 2 || !full.LastUsed.Equal(used) || full.Status != vault.StatusNeedsReconnect ||
		!slices.Equal(full.Scopes, []string{"repo"}) || !slices.Equal(full.Requested, []string{"repo", "admin:org"}) ||
		!full.Token.Equal(orig.Token) || full.AccountLogin != orig.AccountLogin {
		t.Fatalf("after meta update: v%d last used %v status %s scopes %v requested %v, tokens kept %v",
			full.Version, full.LastUsed, full.Status, full.Scopes, full.Requested, full.Token.Equal(orig.Token))
	}
	tests := []struct {
		name string
		fn   func(vault.Connection) (vault.Connection, error)
		want error
	}{
		{"token set", func(c vault.Connection) (vault.Connection, error) {
			c.Token.AccessToken = "new-at"
			return c, nil
		}, nil},
		{"account id", func(c vault.Connection) (vault.Connection, error) { c.AccountID = "2"; return c, nil }, nil},
		{"stale version", func(c vault.Connection) (vault.Connection, error) { c.Version = 1; return c, nil }, vault.ErrConflict},
		{"aborted", func(c vault.Connection) (vault.Connection, error) { return c, vault.ErrExists }, vault.ErrExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.UpdateConnectionMeta(ctx, "mu", tt.fn)
			if err == nil || tt.want != nil && !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want a refusal (%v)", err, tt.want)
			}
			if now := mustGet(t, s, "mu"); now.Version != 2 || !now.Token.Equal(orig.Token) {
				t.Fatalf("refused meta update changed the record: v%d", now.Version)
			}
		})
	}
	_, err = s.UpdateConnectionMeta(ctx, "absent", func(c vault.Connection) (vault.Connection, error) { return c, nil })
	wantErr(t, "meta update of an absent record", err, vault.ErrNotFound)
}

// testAccountConnections: every principal's connections to one provider
// account, metadata only, ordered by id; nothing of other accounts or
// providers.
func testAccountConnections(t *testing.T, s vault.Store) {
	ctx := t.Context()
	bob := vault.Principal{Issuer: "https://idp.example", Subject: "bob"}
	mustCreate(t, s, Conn("ac2", bob, "github", "42"))
	mustCreate(t, s, Conn("ac1", alice, "github", "42"))
	mustCreate(t, s, Conn("ac3", alice, "github", "43"))
	mustCreate(t, s, Conn("ac4", bob, "google", "42"))
	got, err := s.AccountConnections(ctx, "github", "42")
	if err != nil {
		t.Fatal(err)
	}
	ids := listedIDs(t, "AccountConnections", got)
	if !slices.Equal(ids, []string{"ac1", "ac2"}) {
		t.Fatalf("AccountConnections(github, 42) = %v, want [ac1 ac2]", ids)
	}
	if got[1].Principal != bob || got[1].AccountLogin != "42@example.com" {
		t.Errorf("metadata = %+v", got[1])
	}
	if none, err := s.AccountConnections(ctx, "github", "nobody"); err != nil || len(none) != 0 {
		t.Fatalf("AccountConnections of an unknown account = %v, %v; want none", none, err)
	}
}

// testRefreshTokenMetadata: RefreshExpires round-trips as metadata, and
// NoRefreshToken tells from a listing (no token opened) whether the sealed
// set has a refresh token, through every kind of write.
func testRefreshTokenMetadata(t *testing.T, s vault.Store) {
	ctx := t.Context()
	exp := base.Add(180 * 24 * time.Hour)
	with := Conn("rtm1", alice, "github", "1")
	with.RefreshExpires = exp
	without := Conn("rtm2", alice, "google", "2")
	without.Token.RefreshToken = ""
	without.NoRefreshToken = false // ignored on write: the store derives it
	mustCreate(t, s, with)
	mustCreate(t, s, without)
	check := func(when string, wantNo map[string]bool) {
		t.Helper()
		list, err := s.ListConnections(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range list {
			if c.NoRefreshToken != wantNo[c.ID] {
				t.Errorf("%s: listed %s NoRefreshToken = %v, want %v", when, c.ID, c.NoRefreshToken, wantNo[c.ID])
			}
			if full := mustGet(t, s, c.ID); full.NoRefreshToken != wantNo[c.ID] || !full.RefreshExpires.Equal(c.RefreshExpires) {
				t.Errorf("%s: opened %s NoRefreshToken = %v, RefreshExpires %v", when, c.ID, full.NoRefreshToken, full.RefreshExpires)
			}
		}
	}
	check("created", map[string]bool{"rtm2": true})
	if got := mustGet(t, s, "rtm1"); !got.RefreshExpires.Equal(exp) {
		t.Fatalf("RefreshExpires = %v, want %v", got.RefreshExpires, exp)
	}
	if _, err := s.UpdateConnection(ctx, "rtm2", func(c vault.Connection) (vault.Connection, error) {
		c.Token.RefreshToken = "rt-now"
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	later := exp.Add(time.Hour)
	got, err := s.UpdateConnectionMeta(ctx, "rtm1", func(c vault.Connection) (vault.Connection, error) {
		c.RefreshExpires = later
		c.NoRefreshToken = true // ignored: the sealed set did not change
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got.NoRefreshToken || !got.RefreshExpires.Equal(later) {
		t.Fatalf("meta update returned NoRefreshToken %v, RefreshExpires %v", got.NoRefreshToken, got.RefreshExpires)
	}
	check("updated", map[string]bool{})
}

// testKeyConnection: an API-key connection (entered fields, no OAuth
// tokens) round-trips, is listed without its fields, keeps them through
// metadata updates, and a replaced key is stored in place.
func testKeyConnection(t *testing.T, s vault.Store) {
	ctx := t.Context()
	c := KeyConn("key1", alice, "jira", "5b10a")
	mustCreate(t, s, c)
	sameConnection(t, mustGet(t, s, "key1"), c)
	list, err := s.ListConnections(ctx, alice)
	if err != nil || len(list) != 1 || !list[0].Token.IsZero() {
		t.Fatalf("list = %d records, %v; want one without its fields", len(list), err)
	}
	// The caller's map is not the store's: changing it changes nothing.
	got := mustGet(t, s, "key1")
	got.Token.Fields["api_token"] = "changed"
	sameConnection(t, mustGet(t, s, "key1"), c)

	if _, err := s.UpdateConnectionMeta(ctx, "key1", func(old vault.Connection) (vault.Connection, error) {
		old.Status = vault.StatusNeedsReconnect
		return old, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, "key1"); got.Token.Fields["api_token"].Reveal() != "key-key1-secret" || got.Status != vault.StatusNeedsReconnect {
		t.Fatalf("after a metadata update: status %s, fields kept %v", got.Status, got.Token.Equal(c.Token))
	}
	if _, err := s.UpdateConnectionMeta(ctx, "key1", func(old vault.Connection) (vault.Connection, error) {
		old.Token.Fields = map[string]vault.Secret{"api_token": "sneaked-in"}
		return old, nil
	}); err == nil {
		t.Fatal("a metadata update set key fields")
	}
	replaced, err := s.UpdateConnection(ctx, "key1", func(old vault.Connection) (vault.Connection, error) {
		old.Token.Fields = map[string]vault.Secret{"email": old.Token.Fields["email"], "api_token": "key-key1-replaced"}
		old.Status = vault.StatusActive
		return old, nil
	})
	if err != nil || replaced.Version != 3 {
		t.Fatalf("replace key: v%d, %v", replaced.Version, err)
	}
	want := c
	want.Token.Fields = map[string]vault.Secret{"email": "5b10a@example.com", "api_token": "key-key1-replaced"}
	sameConnection(t, mustGet(t, s, "key1"), want)

	bad := KeyConn("key2", alice, "jira", "x")
	bad.Token.Fields["\xff"] = "v"
	if _, err := s.CreateConnection(ctx, bad); err == nil {
		t.Error("a field name that is not UTF-8 was accepted")
	}
	bad = KeyConn("key3", alice, "jira", "x")
	bad.Token.Fields["api_token"] = "\xfe"
	if _, err := s.CreateConnection(ctx, bad); err == nil {
		t.Error("a field value that is not UTF-8 was accepted")
	}
}

func testSeveralAccounts(t *testing.T, s vault.Store) {
	ctx := t.Context()
	for _, id := range []string{"gh-c", "gh-a", "gh-b"} {
		mustCreate(t, s, Conn(id, alice, "github", "acct-"+id))
	}
	mustCreate(t, s, Conn("go-a", alice, "google", "acct-go"))
	list, err := s.ListConnections(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	ids := listedIDs(t, "list", list)
	for _, c := range list {
		if c.SealedWith == "" || c.Version != 1 || c.AccountID != "acct-"+c.ID && c.AccountID != "acct-go" {
			t.Errorf("list %s: metadata incomplete: sealed with %q, v%d, account %q", c.ID, c.SealedWith, c.Version, c.AccountID)
		}
		if got := mustGet(t, s, c.ID); got.Token.AccessToken.Reveal() != "at-"+c.ID+"-secret" {
			t.Errorf("get %s: tokens not decrypted", c.ID)
		}
	}
	if want := []string{"gh-a", "gh-b", "gh-c", "go-a"}; !slices.Equal(ids, want) {
		t.Fatalf("list = %v, want %v (ordered by id)", ids, want)
	}
}

func testListIsolation(t *testing.T, s vault.Store) {
	ctx := t.Context()
	principals := []vault.Principal{
		{Issuer: "a", Subject: "bc"},
		{Issuer: "ab", Subject: "c"},
		{Issuer: "a", Subject: "b"},
		{Issuer: "a", Subject: "b\x00c"},
		{Issuer: "a\x00", Subject: "b"},
		{Issuer: "a", Subject: "b\x00\x00\x00\x01c"},
		{Issuer: "", Subject: "ab"},
		{Issuer: "ab", Subject: ""},
		{Issuer: "https://idp.example", Subject: "ünïcode/ü"},
		{Issuer: "https://idp.example", Subject: string(make([]byte, 300))},
	}
	for i, p := range principals {
		for j := range i%3 + 1 {
			mustCreate(t, s, Conn(fmt.Sprintf("p%02d-%d", i, j), p, "github", fmt.Sprint(j)))
		}
	}
	for i, p := range principals {
		t.Run(fmt.Sprintf("%q/%q", p.Issuer, p.Subject), func(t *testing.T) {
			list, err := s.ListConnections(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != i%3+1 {
				t.Fatalf("got %d connections, want %d", len(list), i%3+1)
			}
			for _, c := range list {
				if c.Principal != p {
					t.Fatalf("listed %s of principal %q/%q", c.ID, c.Principal.Issuer, c.Principal.Subject)
				}
			}
		})
	}
	for _, p := range []vault.Principal{{Issuer: "a", Subject: ""}, {Issuer: "", Subject: ""}, {Issuer: "a", Subject: "b\x00"}} {
		list, err := s.ListConnections(ctx, p)
		if err != nil || len(list) != 0 {
			t.Errorf("list %q/%q = %d records, %v; want none", p.Issuer, p.Subject, len(list), err)
		}
	}
}

func testConnectionIDs(t *testing.T, s vault.Store) {
	ctx := t.Context()
	var want []string
	for i := range 7 {
		id := fmt.Sprintf("id%d", 6-i)
		mustCreate(t, s, Conn(id, vault.Principal{Issuer: "i", Subject: id}, "github", "1"))
		want = append(want, id)
	}
	slices.Sort(want)
	var got []string
	after := ""
	for {
		ids, err := s.ConnectionIDs(ctx, after, 3)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 3 {
			t.Fatalf("page of %d ids, limit 3", len(ids))
		}
		if len(ids) == 0 {
			break
		}
		got = append(got, ids...)
		after = ids[len(ids)-1]
	}
	if !slices.Equal(got, want) {
		t.Fatalf("paged ids = %v, want %v", got, want)
	}
}

func testGrantCRUD(t *testing.T, s vault.Store) {
	ctx := t.Context()
	g := grant("g1", alice, base, base.Add(10*time.Minute))
	created, err := s.CreateGrant(ctx, g)
	if err != nil {
		t.Fatal(err)
	}
	if created.Version != 1 {
		t.Errorf("Version = %d, want 1", created.Version)
	}
	_, err = s.CreateGrant(ctx, g)
	wantErr(t, "duplicate grant", err, vault.ErrExists)
	got, err := s.GetGrant(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if got.ClientName != g.ClientName || got.Server != g.Server || !got.Expires.Equal(g.Expires) || got.State != vault.GrantPending || got.Version != 1 {
		t.Fatalf("got %+v", got)
	}
	_, err = s.GetGrant(ctx, "nope")
	wantErr(t, "get missing grant", err, vault.ErrNotFound)
	_, err = s.UpdateGrant(ctx, "nope", func(g vault.Grant) (vault.Grant, error) { return g, nil })
	wantErr(t, "update missing grant", err, vault.ErrNotFound)
	for want := uint64(2); want <= 3; want++ {
		up, err := s.UpdateGrant(ctx, "g1", func(g vault.Grant) (vault.Grant, error) {
			g.Rounds++
			g.State = vault.GrantApproved
			return g, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if up.Version != want || up.Rounds != int(want-1) {
			t.Fatalf("update: v%d rounds %d", up.Version, up.Rounds)
		}
	}
	got, _ = s.GetGrant(ctx, "g1")
	if got.Version != 3 || got.Rounds != 2 || got.State != vault.GrantApproved {
		t.Fatalf("stored %+v", got)
	}
}

func testGrantImmutable(t *testing.T, s vault.Store) {
	ctx := t.Context()
	if _, err := s.CreateGrant(ctx, grant("gi", alice, base, base.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	tests := []struct {
		name string
		fn   func(vault.Grant) (vault.Grant, error)
		want error
	}{
		{"id", func(g vault.Grant) (vault.Grant, error) { g.ID = "x"; return g, nil }, nil},
		{"principal", func(g vault.Grant) (vault.Grant, error) { g.Principal.Subject = "bob"; return g, nil }, nil},
		{"stale version", func(g vault.Grant) (vault.Grant, error) { g.Version = 0; return g, nil }, vault.ErrConflict},
		{"fn error", func(g vault.Grant) (vault.Grant, error) { g.Rounds = 9; return g, boom }, boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.UpdateGrant(ctx, "gi", tt.fn)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			got, _ := s.GetGrant(ctx, "gi")
			if got.Version != 1 || got.Rounds != 0 || got.Principal != alice {
				t.Fatalf("grant changed: %+v", got)
			}
		})
	}
}

func testCountGrants(t *testing.T, s vault.Store) {
	ctx := t.Context()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "alice2"} // subject extends alice's
	now := base.Add(time.Hour)
	since := now.Add(-time.Hour)
	type gs struct {
		id      string
		p       vault.Principal
		created time.Duration // relative to now
		ttl     time.Duration
		state   vault.GrantState
	}
	for _, g := range []gs{
		{"old", alice, -2 * time.Hour, 10 * time.Minute, vault.GrantPending},     // before since
		{"edge", alice, -time.Hour, 2 * time.Hour, vault.GrantPending},           // exactly since: counted, open
		{"open1", alice, -5 * time.Minute, 10 * time.Minute, vault.GrantPending}, // open
		{"open2", alice, -1 * time.Minute, 10 * time.Minute, vault.GrantApproved},
		{"expired", alice, -30 * time.Minute, 10 * time.Minute, vault.GrantPending},
		{"done", alice, -2 * time.Minute, 10 * time.Minute, vault.GrantCompleted},
		{"bob", bob, -time.Minute, 10 * time.Minute, vault.GrantPending},
	} {
		gr := grant(g.id, g.p, now.Add(g.created), now.Add(g.created+g.ttl))
		gr.State = g.state
		if _, err := s.CreateGrant(ctx, gr); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		p             vault.Principal
		created, open int
	}{
		{alice, 5, 3},
		{bob, 1, 1},
		{vault.Principal{Issuer: alice.Issuer, Subject: "ali"}, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.p.Subject, func(t *testing.T) {
			created, open, err := s.CountGrants(ctx, tt.p, since, now)
			if err != nil {
				t.Fatal(err)
			}
			if created != tt.created || open != tt.open {
				t.Fatalf("CountGrants = %d created, %d open; want %d, %d", created, open, tt.created, tt.open)
			}
		})
	}
	// ListGrants: the same window, oldest first, the principal's own only.
	for _, tt := range []struct {
		p    vault.Principal
		want []string
	}{
		{alice, []string{"edge", "expired", "open1", "done", "open2"}},
		{bob, []string{"bob"}},
		{vault.Principal{Issuer: alice.Issuer, Subject: "ali"}, nil},
	} {
		list, err := s.ListGrants(ctx, tt.p, since)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, g := range list {
			ids = append(ids, g.ID)
			if g.Principal != tt.p || g.Provider != "github" || g.ClientName != "Claude <script>" {
				t.Fatalf("ListGrants(%s) returned %+v", tt.p.Subject, g)
			}
		}
		if !slices.Equal(ids, tt.want) {
			t.Fatalf("ListGrants(%s) = %v, want %v", tt.p.Subject, ids, tt.want)
		}
	}
	if all, err := s.ListGrants(ctx, alice, time.Time{}); err != nil || len(all) != 6 || all[0].ID != "old" {
		t.Fatalf("ListGrants since the zero time: %d grants, %v; want 6 starting with old", len(all), err)
	}
	// Completing a grant closes it.
	if _, err := s.UpdateGrant(ctx, "open1", func(g vault.Grant) (vault.Grant, error) {
		g.State = vault.GrantDenied
		return g, nil
	}); err != nil {
		t.Fatal(err)
	}
	if c, o, _ := s.CountGrants(ctx, alice, since, now); c != 5 || o != 2 {
		t.Fatalf("after deny: %d created, %d open; want 5, 2", c, o)
	}
}

// testGrantLimits: what CreateGrantLimited counts, which limit it reports,
// and that a refusal stores nothing.
func testGrantLimits(t *testing.T, s vault.Store) {
	ctx := t.Context()
	now := base.Add(time.Hour)
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "alice2"} // subject extends alice's
	for _, g := range []struct {
		id      string
		created time.Duration // relative to now
		ttl     time.Duration
		state   vault.GrantState
	}{
		{"old", -2 * time.Hour, 3 * time.Hour, vault.GrantPending},       // before the window: not counted
		{"open", -5 * time.Minute, 10 * time.Minute, vault.GrantPending}, // created and open
		{"expired", -30 * time.Minute, 10 * time.Minute, vault.GrantApproved},
		{"done", -2 * time.Minute, 10 * time.Minute, vault.GrantCompleted},
	} {
		gr := grant(g.id, alice, now.Add(g.created), now.Add(g.created+g.ttl))
		gr.State = g.state
		if _, err := s.CreateGrant(ctx, gr); err != nil {
			t.Fatal(err)
		}
	}
	// In the window: 3 created, 1 open.
	lim := func(maxOpen, maxCreated int) vault.GrantLimits {
		return vault.GrantLimits{Since: now.Add(-time.Hour), Now: now, MaxOpen: maxOpen, MaxCreated: maxCreated}
	}
	tests := []struct {
		name string
		id   string
		p    vault.Principal
		lim  vault.GrantLimits
		want error
	}{
		{"open limit reached", "n1", alice, lim(1, 0), vault.ErrTooManyOpenGrants},
		{"open limit reported first", "n2", alice, lim(1, 3), vault.ErrTooManyOpenGrants},
		{"created limit reached", "n3", alice, lim(2, 3), vault.ErrTooManyRecentGrants},
		{"limits of another principal", "n4", bob, lim(1, 1), nil},
		{"taken id", "open", alice, lim(10, 10), vault.ErrExists},
		{"no limits", "n5", alice, vault.GrantLimits{Since: now.Add(-time.Hour), Now: now}, nil},
		// n5 is now a second open grant, the 4th created.
		{"under both limits", "n6", alice, lim(3, 5), nil},
		{"created limit counts n5 and n6", "n7", alice, lim(10, 5), vault.ErrTooManyRecentGrants},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := grant(tt.id, tt.p, now, now.Add(10*time.Minute))
			got, err := s.CreateGrantLimited(ctx, g, tt.lim)
			wantErr(t, "CreateGrantLimited", err, tt.want)
			if tt.want == nil && (got.Version != 1 || got.ID != tt.id) {
				t.Fatalf("created %+v", got)
			}
			_, err = s.GetGrant(ctx, tt.id)
			switch {
			case tt.want == nil || errors.Is(tt.want, vault.ErrExists):
				if err != nil {
					t.Fatalf("GetGrant: %v", err)
				}
			default:
				wantErr(t, "refused grant was stored", err, vault.ErrNotFound)
			}
		})
	}
	if c, o, err := s.CountGrants(ctx, alice, now.Add(-time.Hour), now); err != nil || c != 5 || o != 3 {
		t.Fatalf("CountGrants = %d created, %d open, %v; want 5, 3", c, o, err)
	}
}

// testConcurrentGrantLimits: 100 concurrent creates for one person store
// exactly the limit, for the open-grants limit and for the per-hour limit,
// while another person's creates race with them unaffected.
func testConcurrentGrantLimits(t *testing.T, s vault.Store) {
	now := base.Add(time.Hour)
	tests := []struct {
		name     string
		lim      vault.GrantLimits
		prepare  func(t *testing.T, prefix string, p vault.Principal) // grants that exist before the race
		want     int
		refusal  error
		open     int // open grants of each person afterwards
		inWindow int // grants created in the window afterwards
	}{
		{
			name: "open", lim: vault.GrantLimits{MaxOpen: 10}, want: 10, refusal: vault.ErrTooManyOpenGrants,
			// A closed grant in the window counts as created, not as open.
			prepare: func(t *testing.T, prefix string, p vault.Principal) {
				g := grant(prefix+"closed", p, now.Add(-time.Minute), now.Add(time.Minute))
				g.State = vault.GrantDenied
				if _, err := s.CreateGrant(t.Context(), g); err != nil {
					t.Fatal(err)
				}
			},
			open: 10, inWindow: 11,
		},
		{
			name: "per hour", lim: vault.GrantLimits{MaxCreated: 30}, refusal: vault.ErrTooManyRecentGrants,
			// One grant created in the window and already expired counts
			// as created; one older than the window does not count.
			prepare: func(t *testing.T, prefix string, p vault.Principal) {
				for id, created := range map[string]time.Duration{"inside": -50 * time.Minute, "before": -61 * time.Minute} {
					if _, err := s.CreateGrant(t.Context(), grant(prefix+id, p, now.Add(created), now.Add(created+10*time.Minute))); err != nil {
						t.Fatal(err)
					}
				}
			},
			want: 29, open: 29, inWindow: 30,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			prefix := strings.ReplaceAll(tt.name, " ", "-") + "-"
			lim := tt.lim
			lim.Since, lim.Now = now.Add(-time.Hour), now
			people := []vault.Principal{{Issuer: alice.Issuer, Subject: prefix + "alice"}, {Issuer: alice.Issuer, Subject: prefix + "bob"}}
			for _, p := range people {
				tt.prepare(t, p.Subject+"-", p)
			}
			const calls = 100
			var (
				wg    sync.WaitGroup
				start = make(chan struct{})
				mu    sync.Mutex
				ok    = map[vault.Principal]int{}
			)
			errs := make(chan error, calls*len(people))
			for i := range calls {
				for _, p := range people {
					wg.Go(func() {
						<-start
						g := grant(fmt.Sprintf("%s-%03d", p.Subject, i), p, now, now.Add(10*time.Minute))
						_, err := s.CreateGrantLimited(ctx, g, lim)
						switch {
						case err == nil:
							mu.Lock()
							ok[p]++
							mu.Unlock()
						case !errors.Is(err, tt.refusal):
							errs <- fmt.Errorf("%s: %w", g.ID, err)
						}
					})
				}
			}
			close(start)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("unexpected error: %v", err)
			}
			for _, p := range people {
				if ok[p] != tt.want {
					t.Errorf("%s: %d of %d concurrent creates succeeded, want exactly %d", p.Subject, ok[p], calls, tt.want)
				}
				c, o, err := s.CountGrants(ctx, p, lim.Since, now)
				if err != nil || c != tt.inWindow || o != tt.open {
					t.Errorf("%s: stored %d created, %d open, %v; want %d, %d", p.Subject, c, o, err, tt.inWindow, tt.open)
				}
			}
		})
	}
}

func testDeleteExpired(t *testing.T, s vault.Store) {
	ctx := t.Context()
	now := base.Add(time.Hour)
	for i, exp := range []time.Duration{-time.Hour, -time.Minute, -time.Nanosecond, 0, time.Minute} {
		if _, err := s.CreateGrant(ctx, grant(fmt.Sprintf("e%d", i), alice, now.Add(-2*time.Hour), now.Add(exp))); err != nil {
			t.Fatal(err)
		}
	}
	// e0 is extended past now: the update must move it in any expiry index.
	if _, err := s.UpdateGrant(ctx, "e0", func(g vault.Grant) (vault.Grant, error) {
		g.Expires = now.Add(time.Hour)
		return g, nil
	}); err != nil {
		t.Fatal(err)
	}
	// e4 is shortened into the past.
	if _, err := s.UpdateGrant(ctx, "e4", func(g vault.Grant) (vault.Grant, error) {
		g.Expires = now.Add(-time.Second)
		return g, nil
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.DeleteExpiredGrants(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("deleted %d, want 3 (e1, e2, e4)", n)
	}
	for id, want := range map[string]error{"e0": nil, "e1": vault.ErrNotFound, "e2": vault.ErrNotFound, "e3": nil, "e4": vault.ErrNotFound} {
		_, err := s.GetGrant(ctx, id)
		if want == nil && err != nil || want != nil && !errors.Is(err, want) {
			t.Errorf("GetGrant(%s) = %v, want %v", id, err, want)
		}
	}
	if n, err := s.DeleteExpiredGrants(ctx, now); n != 0 || err != nil {
		t.Fatalf("second sweep = %d, %v; want 0", n, err)
	}
	if c, _, _ := s.CountGrants(ctx, alice, time.Time{}, now); c != 2 {
		t.Fatalf("CountGrants after sweep = %d, want 2", c)
	}
	// A deleted grant id can be used again.
	if _, err := s.CreateGrant(ctx, grant("e1", alice, now, now.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
}

func testClosed(t *testing.T, s vault.Store) {
	ctx := t.Context()
	mustCreate(t, s, Conn("cl", alice, "github", "1"))
	if _, err := s.CreateGrant(ctx, grant("gcl", alice, base, base.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	id := func(c vault.Connection) (vault.Connection, error) { return c, nil }
	gid := func(g vault.Grant) (vault.Grant, error) { return g, nil }
	calls := map[string]func() error{
		"CreateConnection":     func() error { _, err := s.CreateConnection(ctx, Conn("x", alice, "g", "1")); return err },
		"GetConnection":        func() error { _, err := s.GetConnection(ctx, "cl"); return err },
		"ListConnections":      func() error { _, err := s.ListConnections(ctx, alice); return err },
		"UpdateConnection":     func() error { _, err := s.UpdateConnection(ctx, "cl", id); return err },
		"UpdateConnectionMeta": func() error { _, err := s.UpdateConnectionMeta(ctx, "cl", id); return err },
		"DeleteConnection":     func() error { return s.DeleteConnection(ctx, "cl") },
		"ConnectionIDs":        func() error { _, err := s.ConnectionIDs(ctx, "", 10); return err },
		"CreateGrant":          func() error { _, err := s.CreateGrant(ctx, grant("y", alice, base, base)); return err },
		"GetGrant":             func() error { _, err := s.GetGrant(ctx, "gcl"); return err },
		"UpdateGrant":          func() error { _, err := s.UpdateGrant(ctx, "gcl", gid); return err },
		"CountGrants":          func() error { _, _, err := s.CountGrants(ctx, alice, base, base); return err },
		"CreateGrantLimited": func() error {
			_, err := s.CreateGrantLimited(ctx, grant("z", alice, base, base), vault.GrantLimits{MaxOpen: 1})
			return err
		},
		"DeleteExpiredGrants": func() error { _, err := s.DeleteExpiredGrants(ctx, base.Add(time.Hour)); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) { wantErr(t, name, call(), vault.ErrClosed) })
	}
}

func testConcurrentUpdates(t *testing.T, s vault.Store) {
	ctx := t.Context()
	const workers, each = 25, 2
	mustCreate(t, s, Conn("cc", alice, "github", "1"))
	if _, err := s.CreateGrant(ctx, grant("cg", alice, base, base.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	concurrently(t, workers, nil, func(w int) error {
		for i := range each {
			_, err := s.UpdateConnection(ctx, "cc", func(c vault.Connection) (vault.Connection, error) {
				c.Scopes = append(c.Scopes, fmt.Sprintf("w%d-%d", w, i))
				return c, nil
			})
			if err != nil {
				return err
			}
			if _, err = s.UpdateGrant(ctx, "cg", func(g vault.Grant) (vault.Grant, error) {
				g.Rounds++
				return g, nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
	c := mustGet(t, s, "cc")
	if c.Version != 1+workers*each || len(c.Scopes) != 2+workers*each {
		t.Fatalf("connection v%d with %d scopes; want v%d, %d scopes (lost update)", c.Version, len(c.Scopes), 1+workers*each, 2+workers*each)
	}
	g, err := s.GetGrant(ctx, "cg")
	if err != nil || g.Rounds != workers*each || g.Version != 1+workers*each {
		t.Fatalf("grant rounds %d v%d, %v; want %d (lost update)", g.Rounds, g.Version, err, workers*each)
	}
}

func testConcurrentCreateSameID(t *testing.T, s vault.Store) {
	ctx := t.Context()
	const n = 16
	ok := concurrently(t, 2*n, vault.ErrExists, func(i int) error {
		if i%2 == 0 {
			_, err := s.CreateConnection(ctx, Conn("same", alice, "github", fmt.Sprint(i)))
			return err
		}
		_, err := s.CreateGrant(ctx, grant("same", alice, base, base.Add(time.Minute)))
		return err
	})
	if ok != 2 {
		t.Fatalf("%d creates succeeded, want exactly one connection and one grant", ok)
	}
	list, err := s.ListConnections(ctx, alice)
	if err != nil || len(list) != 1 {
		t.Fatalf("list = %d, %v; want exactly 1 (index must match the winner)", len(list), err)
	}
	if got := mustGet(t, s, "same"); got.AccountID != list[0].AccountID {
		t.Fatalf("index and record disagree: %s vs %s", got.AccountID, list[0].AccountID)
	}
}

func testConcurrentCreateAndList(t *testing.T, s vault.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const workers, each = 8, 5
	var wg sync.WaitGroup
	errs := make(chan error, workers*each+1)
	wg.Go(func() {
		for ctx.Err() == nil {
			list, err := s.ListConnections(ctx, alice)
			if err != nil && ctx.Err() == nil {
				errs <- err
				return
			}
			for _, c := range list {
				if !c.Token.IsZero() {
					errs <- fmt.Errorf("listed %s with its tokens", c.ID)
					return
				}
				if got, err := s.GetConnection(ctx, c.ID); err != nil && ctx.Err() == nil || err == nil && got.Token.AccessToken.Reveal() != "at-"+c.ID+"-secret" {
					errs <- fmt.Errorf("listed %s: its tokens do not open (%v)", c.ID, err)
					return
				}
			}
		}
	})
	var writers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			for i := range each {
				_, err := s.CreateConnection(ctx, Conn(fmt.Sprintf("w%d-%d", w, i), alice, "github", fmt.Sprint(w)))
				if err != nil {
					errs <- err
				}
			}
		})
	}
	writers.Wait()
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	list, err := s.ListConnections(t.Context(), alice)
	if err != nil || len(list) != workers*each {
		t.Fatalf("list = %d, %v; want %d", len(list), err, workers*each)
	}
}
