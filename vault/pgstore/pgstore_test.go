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

	"github.com/jackc/pgx/v5"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/internal/record"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func newKeyring(t testing.TB) *vault.Keyring {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func open(t testing.TB, url string, kr *vault.Keyring) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url, kr, pgstore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.Run(t, func(t *testing.T) vault.Store {
		return open(t, srv.Schema(t), kr)
	})
}

func TestAuthConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunAuth(t, func(t *testing.T) vault.Store {
		return open(t, srv.Schema(t), kr)
	})
}

func TestUpstreamClientConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunUpstreamClients(t, func(t *testing.T) vault.Store {
		return open(t, srv.Schema(t), kr)
	})
}

// TestUpstreamClientRotation: key rotation re-seals upstream client
// secrets too, and keys status counts them.
func TestUpstreamClientRotation(t *testing.T) {
	url := pgtest.Shared(t).Schema(t)
	vaulttest.RunUpstreamClientRotation(t, func(t *testing.T, kr *vault.Keyring) vaulttest.KeyUser {
		return open(t, url, kr)
	})
}

// TestSecretsSealedAtRest: no record in the database holds a token, an
// API key or an upstream client secret in the clear.
func TestSecretsSealedAtRest(t *testing.T) {
	s := open(t, pgtest.Shared(t).Schema(t), newKeyring(t))
	vaulttest.FillEveryKind(t, s)
	vaulttest.NothingInTheClear(t, s)
}

// TestAssertionConformance runs the ledger suite with two stores (two
// pools, as two replicas) on one database.
func TestAssertionConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunAssertions(t, func(t *testing.T) (vault.AssertionLedger, vault.AssertionLedger) {
		url := srv.Schema(t)
		return open(t, url, kr).Assertions(), open(t, url, kr).Assertions()
	})
}

var alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

func TestMigrationsIdempotentAndConcurrent(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	// Eight replicas start at once against an empty database.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			s, err := pgstore.Open(t.Context(), url, kr, pgstore.Options{})
			if err == nil {
				s.Close()
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s := open(t, url, kr)
	var versions []int
	rows, err := s.Pool().Query(t.Context(), "SELECT version FROM schema_migrations ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	versions, err = pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	if len(versions) != pgstore.SchemaVersion() || versions[len(versions)-1] != pgstore.SchemaVersion() {
		t.Fatalf("schema_migrations = %v, want each of 1..%d once", versions, pgstore.SchemaVersion())
	}
	// A database from a newer broker is refused, not downgraded.
	if _, err := s.Pool().Exec(t.Context(), "INSERT INTO schema_migrations (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatal(err)
	}
	_, err = pgstore.Open(t.Context(), url, kr, pgstore.Options{})
	if err == nil || !strings.Contains(err.Error(), "newer than this broker") {
		t.Fatalf("open of a newer schema: %v", err)
	}
}

func TestWrongKey(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	s := open(t, url, kr)
	if _, err := s.CreateConnection(t.Context(), vaulttest.Conn("c1", alice, "github", "1")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	sameID, err := vault.NewKeyring([]string{kr.Primary()}, [][]byte{make([]byte, 32)})
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := kr.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		kr      *vault.Keyring
		wantErr error
	}{
		{"same id, other bytes", sameID, pgstore.ErrWrongKey},
		{"unrelated key", newKeyring(t), pgstore.ErrWrongKey},
		{"rotated ring keeps the old key", rotated, nil},
		{"original", kr, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := pgstore.Open(t.Context(), url, tt.kr, pgstore.Options{})
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Open = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c, err := s.GetConnection(t.Context(), "c1")
			if err != nil || c.Token.AccessToken.Reveal() != "at-c1-secret" {
				t.Fatalf("get after reopen: %v", err)
			}
		})
	}
}

// TestDatabaseNeverHoldsPlaintextTokens reads every byte PostgreSQL holds
// for the tables and looks for the token values.
func TestDatabaseNeverHoldsPlaintextTokens(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	s := open(t, url, newKeyring(t))
	c := vaulttest.Conn("plain", alice, "github", "1")
	if _, err := s.CreateConnection(t.Context(), c); err != nil {
		t.Fatal(err)
	}
	var dump string
	if err := s.Pool().QueryRow(t.Context(), "SELECT string_agg(t::text, ' ') FROM connections t").Scan(&dump); err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := s.Pool().QueryRow(t.Context(), "SELECT record FROM connections").Scan(&raw); err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(), c.Token.IDToken.Reveal()} {
		if strings.Contains(dump, secret) || strings.Contains(string(raw), secret) {
			t.Fatalf("the connections table holds %q in the clear", secret)
		}
	}
	// The metadata is queryable.
	var provider, sealed string
	var version int64
	if err := s.Pool().QueryRow(t.Context(), "SELECT provider, sealed_with, version FROM connections WHERE sub = $1", []byte("alice")).Scan(&provider, &sealed, &version); err != nil {
		t.Fatal(err)
	}
	if provider != "github" || sealed == "" || version != 1 {
		t.Fatalf("columns: %s %s %d", provider, sealed, version)
	}
}

// TestTwoStoresOneDatabase: two replicas see each other's writes, and
// concurrent updates from both never lose one.
func TestTwoStoresOneDatabase(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	a, b := open(t, url, kr), open(t, url, kr)
	ctx := t.Context()
	if _, err := a.CreateConnection(ctx, vaulttest.Conn("shared", alice, "github", "1")); err != nil {
		t.Fatal(err)
	}
	got, err := b.GetConnection(ctx, "shared")
	if err != nil || got.Token.RefreshToken.Reveal() != "rt-shared-secret" {
		t.Fatalf("replica b reads %v", err)
	}
	if _, err := b.CreateConnection(ctx, vaulttest.Conn("shared", alice, "github", "2")); !errors.Is(err, vault.ErrExists) {
		t.Fatalf("duplicate create on b: %v", err)
	}
	const each = 40
	var wg sync.WaitGroup
	for i, s := range []*pgstore.Store{a, b} {
		for w := range 4 {
			wg.Go(func() {
				for j := range each / 4 {
					_, err := s.UpdateConnection(ctx, "shared", func(c vault.Connection) (vault.Connection, error) {
						c.Scopes = append(c.Scopes, fmt.Sprintf("r%d-w%d-%d", i, w, j))
						return c, nil
					})
					if err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
	wg.Wait()
	final, err := a.GetConnection(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	if final.Version != 1+2*each || len(final.Scopes) != 2+2*each {
		t.Fatalf("v%d with %d scopes, want v%d and %d scopes (lost update)", final.Version, len(final.Scopes), 1+2*each, 2+2*each)
	}
	if err := b.DeleteConnection(ctx, "shared"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.GetConnection(ctx, "shared"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("a sees a deleted record: %v", err)
	}
}

// TestGrantConsumedOnce: many replicas race to complete one pending grant;
// exactly one wins.
func TestGrantConsumedOnce(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	stores := []*pgstore.Store{open(t, url, kr), open(t, url, kr)}
	ctx := t.Context()
	now := time.Now()
	if _, err := stores[0].CreateGrant(ctx, vault.Grant{ID: "g", Principal: alice, Provider: "github", Created: now, Expires: now.Add(time.Minute), State: vault.GrantApproved}); err != nil {
		t.Fatal(err)
	}
	errUsed := errors.New("grant already used")
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			_, err := stores[i%2].UpdateGrant(ctx, "g", func(g vault.Grant) (vault.Grant, error) {
				if g.State != vault.GrantApproved {
					return g, errUsed
				}
				g.State = vault.GrantCompleted
				g.ConnectionID = fmt.Sprint("conn-", i)
				return g, nil
			})
			switch {
			case err == nil:
				wins.Add(1)
			case !errors.Is(err, errUsed):
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d consumers completed the grant, want exactly 1", wins.Load())
	}
}

// TestSweepOnEveryReplica: replicas sweeping at the same time remove each
// expired grant once in total.
func TestSweepOnEveryReplica(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	stores := []*pgstore.Store{open(t, url, kr), open(t, url, kr), open(t, url, kr)}
	ctx := t.Context()
	now := time.Now()
	const expired, live = 2500, 10
	var batch [][]byte
	for i := range expired + live {
		exp := now.Add(-time.Minute)
		if i >= expired {
			exp = now.Add(time.Minute)
		}
		rec, err := record.EncodeGrant(vault.Grant{ID: fmt.Sprintf("g%05d", i), Principal: alice, Provider: "github", Created: now.Add(-time.Hour), Expires: exp, State: vault.GrantPending, Version: 1})
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, rec)
	}
	if added, _, err := stores[0].ImportRecords(ctx, transfer.Records{Kind: transfer.KindGrant, Recs: batch}); err != nil || added != expired+live {
		t.Fatalf("import: %d, %v", added, err)
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			n, err := s.DeleteExpiredGrants(ctx, now)
			if err != nil {
				t.Error(err)
			}
			total.Add(int64(n))
		})
	}
	wg.Wait()
	if total.Load() != expired {
		t.Fatalf("sweeps removed %d in total, want %d", total.Load(), expired)
	}
	if c, o, err := stores[1].CountGrants(ctx, alice, time.Time{}, now); err != nil || c != live || o != live {
		t.Fatalf("after sweep: %d created, %d open, %v; want %d", c, o, err, live)
	}
}

// TestLockConnectionExcludesReplicas: holders on two stores (two replicas)
// never overlap, and a replica's death releases its lock.
func TestLockConnectionExcludesReplicas(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	a, b := open(t, url, kr), open(t, url, kr)
	ctx := t.Context()
	var inside, maxInside, total atomic.Int32
	var wg sync.WaitGroup
	for i := range 40 {
		s := []*pgstore.Store{a, b}[i%2]
		wg.Go(func() {
			unlock, err := s.LockConnection(ctx, "conn-1")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
			}
			time.Sleep(time.Millisecond)
			inside.Add(-1)
			total.Add(1)
			unlock()
			unlock() // idempotent
		})
	}
	wg.Wait()
	if maxInside.Load() != 1 || total.Load() != 40 {
		t.Fatalf("max holders at once = %d, total %d; want 1 and 40", maxInside.Load(), total.Load())
	}
	// Other ids are independent.
	u1, err := a.LockConnection(ctx, "conn-1")
	if err != nil {
		t.Fatal(err)
	}
	u2, err := b.LockConnection(ctx, "conn-2")
	if err != nil {
		t.Fatal(err)
	}
	u2()
	// A waiter gives up with its context.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.LockConnection(short, "conn-1"); err == nil {
		t.Fatal("b took a lock a holds")
	}
	// a dies: its sessions end, and b gets the lock.
	a.Close()
	u1() // after Close: must not hang or panic
	got, cancel2 := context.WithTimeout(ctx, 10*time.Second)
	defer cancel2()
	u3, err := b.LockConnection(got, "conn-1")
	if err != nil {
		t.Fatalf("lock after the holder closed: %v", err)
	}
	u3()
}

// TestGrantLimitsAcrossReplicas: 100 concurrent limited creates for one
// person spread over eight replicas (eight stores on one database, each
// serialising its own callers) store exactly the limit: the per-person
// lock must hold across processes, not only inside one.
func TestGrantLimitsAcrossReplicas(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr := newKeyring(t)
	const replicas, calls = 8, 100
	var stores []*pgstore.Store
	for range replicas {
		stores = append(stores, open(t, url, kr))
	}
	now := time.Now()
	for _, tt := range []struct {
		name    string
		lim     vault.GrantLimits
		want    int
		refusal error
	}{
		{"open", vault.GrantLimits{MaxOpen: 10}, 10, vault.ErrTooManyOpenGrants},
		{"per hour", vault.GrantLimits{MaxCreated: 30}, 30, vault.ErrTooManyRecentGrants},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := vault.Principal{Issuer: alice.Issuer, Subject: "replicas-" + tt.name}
			lim := tt.lim
			lim.Since, lim.Now = now.Add(-time.Hour), now
			var ok atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range calls {
				s := stores[i%replicas]
				wg.Go(func() {
					<-start
					g := vault.Grant{ID: fmt.Sprintf("%s-%03d", p.Subject, i), Principal: p, Provider: "github",
						Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending}
					_, err := s.CreateGrantLimited(t.Context(), g, lim)
					switch {
					case err == nil:
						ok.Add(1)
					case !errors.Is(err, tt.refusal):
						t.Errorf("%s: %v", g.ID, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if got := ok.Load(); got != int32(tt.want) {
				t.Fatalf("%d of %d creates on %d replicas succeeded, want exactly %d", got, calls, replicas, tt.want)
			}
		})
	}
}

func TestOutboxConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.Connection]) vault.Store {
		s, err := pgstore.Open(t.Context(), srv.Schema(t), kr, pgstore.Options{Changes: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestAppOutboxConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.AppAccess]) vault.Store {
		s, err := pgstore.Open(t.Context(), srv.Schema(t), kr, pgstore.Options{AppChanges: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestFullySealedCountsIdPSessions: a replica skips the start-up re-seal
// pass only when nothing is sealed with another key, IdP sessions included
// (they are sealed like connections, and broker migrate brings them over
// sealed with the key of the source).
func TestFullySealedCountsIdPSessions(t *testing.T) {
	url := pgtest.Shared(t).Schema(t)
	oldKR := newKeyring(t)
	s := open(t, url, oldKR)
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	if _, err := s.IdPSessions().PutIdPSession(t.Context(), vault.IdPSession{Principal: alice, RefreshToken: "rt", IDToken: "idt",
		Created: time.Now(), Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if !s.FullySealed() {
		t.Fatal("FullySealed false with everything on the primary")
	}
	newKR, err := oldKR.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	s2 := open(t, url, newKR)
	if s2.FullySealed() {
		t.Fatal("FullySealed with an IdP session sealed with the old key")
	}
	if _, err := vault.Rekey(t.Context(), s2, newKR, 10); err != nil {
		t.Fatal(err)
	}
	if !s2.FullySealed() {
		t.Fatal("FullySealed false after the re-seal")
	}
}
