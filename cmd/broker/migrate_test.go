package main

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// buildBolt writes n connections (four per principal) and a few grants
// into a new bolt store at path, fast, through Import.
func buildBolt(t *testing.T, path string, kr *vault.Keyring, n int) {
	t.Helper()
	s, err := boltstore.Open(path, kr, boltstore.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const chunk = 25_000
	batch := make([]vault.Connection, 0, chunk)
	for i := range n {
		p := vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("u%06d", i/4)}
		batch = append(batch, vaulttest.Conn(fmt.Sprintf("c%06d", i), p, "github", fmt.Sprint(i)))
		if len(batch) == chunk || i == n-1 {
			if err := s.Import(t.Context(), batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	now := time.Now()
	for i := range 3 {
		g := vault.Grant{ID: fmt.Sprintf("g%d", i), Principal: vault.Principal{Issuer: "https://idp.example", Subject: "u000000"},
			Provider: "github", Created: now, Expires: now.Add(10 * time.Minute), State: vault.GrantPending}
		if _, err := s.CreateGrant(t.Context(), g); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DB().Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestMigrate100k moves a 100,000-connection bolt file into PostgreSQL,
// checks every record decrypts there with the same keys, and that a second
// run changes nothing.
//
// It runs alongside the other parallel tests: the migrations are broker
// subprocesses given the keys in their own environment (this process's is
// left alone), so most of its minute of CPU overlaps their waiting.
func TestMigrate100k(t *testing.T) {
	t.Parallel()
	srv := pgtest.StartT(t)
	url := srv.Schema(t)
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	env := []string{"BROKER_KEYS=" + kr.Format(), "BROKER_KEYS_FILE=", "BROKER_STORE="}
	const n = 100_000
	path := filepath.Join(t.TempDir(), "broker.db")
	start := time.Now()
	buildBolt(t, path, kr, n)
	t.Logf("bolt fixture: %d connections in %s", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	out, stderr, err := runBroker(t, env, "migrate", "--from", "bolt:"+path, "--to", url)
	if err != nil {
		t.Fatalf("migrate: %v\n%s\n%s", err, out, stderr)
	}
	t.Logf("migrate: %s(%s)", out, time.Since(start).Round(time.Millisecond))
	for _, want := range []string{"connections: 100000 copied, 0 already present", "grants: 3 copied, 0 already present", "key canaries: 0 added"} {
		if !strings.Contains(out, want) {
			t.Fatalf("report lacks %q:\n%s", want, out)
		}
	}

	pg, err := pgstore.Open(t.Context(), url, kr, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	digest := func() string {
		var d string
		if err := pg.Pool().QueryRow(t.Context(), "SELECT md5(string_agg(id || ':' || version || ':' || encode(record, 'base64'), ',' ORDER BY id)) FROM connections").Scan(&d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	before := digest()

	// Every record decrypts, with the tokens it had in bolt.
	ids, err := pg.ConnectionIDs(t.Context(), "", 0)
	if err != nil || len(ids) != n {
		t.Fatalf("%d connection ids after migration, want %d: %v", len(ids), n, err)
	}
	// Eight readers at a time, each taking the next id.
	var (
		opened, next atomic.Int64
		mu           sync.Mutex
		failed       error // the first failure; guarded by mu
		wg           sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ids)); i = next.Add(1) - 1 {
				c, err := pg.GetConnection(t.Context(), ids[i])
				if err == nil && (c.Token.AccessToken.Reveal() != "at-"+c.ID+"-secret" || c.Token.RefreshToken.Reveal() != "rt-"+c.ID+"-secret") {
					err = fmt.Errorf("%s: wrong tokens after migration", c.ID)
				}
				if err != nil {
					mu.Lock()
					failed = cmp.Or(failed, err)
					mu.Unlock()
					return
				}
				opened.Add(1)
			}
		})
	}
	wg.Wait()
	if failed != nil || opened.Load() != n {
		t.Fatalf("decrypted %d of %d: %v", opened.Load(), n, failed)
	}
	// Through the store API too: get, list by principal, grants.
	c, err := pg.GetConnection(t.Context(), "c099999")
	if err != nil || c.Version != 1 || c.Token.AccessToken.Reveal() != "at-c099999-secret" {
		t.Fatalf("get c099999: %+v %v", c.ID, err)
	}
	list, err := pg.ListConnections(t.Context(), vault.Principal{Issuer: "https://idp.example", Subject: "u012345"})
	if err != nil || len(list) != 4 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	if created, open, err := pg.CountGrants(t.Context(), vault.Principal{Issuer: "https://idp.example", Subject: "u000000"}, time.Time{}, time.Now()); err != nil || created != 3 || open != 3 {
		t.Fatalf("grants after migration: %d created, %d open, %v", created, open, err)
	}

	// Idempotent: a second run copies nothing and changes nothing.
	out, stderr, err = runBroker(t, env, "migrate", "--from", path, "--to", url, "--batch", "5000")
	if err != nil {
		t.Fatalf("second migrate: %v\n%s\n%s", err, out, stderr)
	}
	if !strings.Contains(out, "connections: 0 copied, 100000 already present") || !strings.Contains(out, "grants: 0 copied, 3 already present") {
		t.Fatalf("second run:\n%s", out)
	}
	if digest() != before {
		t.Fatal("the second run changed stored records")
	}
}

// TestMigrateRoundTrip moves a bolt store holding every kind of record
// (vaulttest.FillEveryKind, and a connection sealed with the key before a
// rotation) into PostgreSQL and from there into a new bolt file, and
// compares the two files record by record: the second must hold the
// first's records byte for byte. Hosts keep their clients, consents and
// token families, and people their IdP sessions (one sealed with the key
// before the rotation), so nobody signs in again; spent ID-JAGs stay
// spent; the gateway keeps its registrations at upstream servers. Runs
// repeated either way copy nothing.
func TestMigrateRoundTrip(t *testing.T) {
	clearKeyEnv(t)
	srv := pgtest.StartT(t)
	url := srv.Schema(t)
	old, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	kr, err := old.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("BROKER_KEYS", kr.Format())
	dir := t.TempDir()
	from, back := filepath.Join(dir, "from.db"), filepath.Join(dir, "back.db")
	ctx := t.Context()
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

	s, err := boltstore.Open(from, old, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateConnection(ctx, vaulttest.Conn("conn-old-key", alice, "github", "9")); err != nil {
		t.Fatal(err)
	}
	carol := vault.Principal{Issuer: "https://idp.example", Subject: "carol"}
	if _, err := s.IdPSessions().PutIdPSession(ctx, vault.IdPSession{Principal: carol, RefreshToken: "idp-rt-carol", IDToken: "idp-idt-carol"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = boltstore.Open(from, kr, boltstore.Options{}); err != nil {
		t.Fatal(err)
	}
	want := vaulttest.FillEveryKind(t, s)
	want[transfer.KindConnection]++
	want[transfer.KindIdPSession]++
	s.Close()

	report := func(copied bool) []string {
		lines := []string{"key canaries: 0 added"} // each store seals its own, for both keys
		for k, n := range want {
			if copied {
				lines = append(lines, fmt.Sprintf("%s: %d copied, 0 already present", k, n))
			} else {
				lines = append(lines, fmt.Sprintf("%s: 0 copied, %d already present", k, n))
			}
		}
		return lines
	}
	migrateOK := func(copied bool, args ...string) {
		t.Helper()
		out, stderr, err := runCmd(t, append([]string{"migrate"}, args...)...)
		if err != nil {
			t.Fatalf("migrate %q: %v\n%s%s", args, err, out, stderr)
		}
		for _, line := range report(copied) {
			if !strings.Contains(out, line+"\n") {
				t.Fatalf("migrate %q: the report lacks %q:\n%s", args, line, out)
			}
		}
	}
	migrateOK(true, "--from", "bolt:"+from, "--to", url, "--batch", "2")
	migrateOK(false, "--from", "bolt:"+from, "--to", url)
	migrateOK(true, "--from", url, "--to", "bolt:"+back, "--batch", "2")
	migrateOK(false, "--from", url, "--to", "bolt:"+back)

	a, err := boltstore.Open(from, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := boltstore.Open(back, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	vaulttest.SameRecords(t, a, b)

	// What came back works: tokens open with the key that sealed them, a
	// redeemed code stays redeemed, an app keeps its refresh token.
	c, err := b.GetConnection(ctx, "conn-old-key")
	if err != nil || c.SealedWith == kr.Primary() || c.Token.AccessToken.Reveal() != "at-conn-old-key-secret" {
		t.Fatalf("the connection sealed with the old key: %v, sealed with %s", err, c.SealedWith)
	}
	if _, err := b.RedeemAuthCode(ctx, vault.SecretKey("code-redeemed")); !errors.Is(err, vault.ErrCodeRedeemed) {
		t.Fatalf("the redeemed code: %v, want ErrCodeRedeemed", err)
	}
	app, err := b.FindAppAccess(ctx, alice, "client-public")
	if f, ok := app.Family("fam-1"); err != nil || !ok || f.RefreshHash != vault.SecretKey("rt-2") {
		t.Fatalf("the app's token family: %+v %v", app, err)
	}
	// An ID-JAG redeemed before the migration is refused after it.
	vaulttest.StillSpent(t, b)
	// The gateway's registrations upstream came along, secrets opening:
	// the broker does not register at those servers again.
	vaulttest.UpstreamClientsKept(t, b)
	// People keep their IdP sessions: no sign-in again before an
	// enterprise-managed connection works; carol's is still sealed with
	// the key before the rotation (it travelled sealed), and opens.
	vaulttest.IdPSessionsKept(t, b)
	if ss, err := b.IdPSessions().GetIdPSession(ctx, carol); err != nil || ss.RefreshToken.Reveal() != "idp-rt-carol" {
		t.Fatalf("carol's IdP session, sealed with the old key: %+v, %v", ss, err)
	}
	if usage, err := b.KeyUsage(ctx); err != nil || usage[old.Primary()] != 2 {
		t.Fatalf("records sealed with the old key after the round trip: %v, %v; want 2 (conn-old-key, carol's IdP session)", usage, err)
	}
}

func TestMigrateRejects(t *testing.T) {
	clearKeyEnv(t)
	srv := pgtest.StartT(t)
	url := srv.Schema(t)
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	other, _ := vault.ParseKeys(vault.GenerateKey())
	path := filepath.Join(t.TempDir(), "broker.db")
	buildBolt(t, path, kr, 10)
	// The target was written with other keys: refused before copying.
	seeded, err := pgstore.Open(t.Context(), srv.Schema(t), other, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	otherURL := seeded.Pool().Config().ConnString()
	seeded.Close()

	tests := []struct {
		name string
		keys *vault.Keyring
		args []string
		want string
	}{
		{"no from", kr, []string{"--to", url}, "--from is required"},
		{"no to", kr, []string{"--from", path}, "--to is required"},
		{"to is bolt", kr, []string{"--from", path, "--to", "bolt:/tmp/x.db"}, "--to must be a PostgreSQL store"},
		{"from is postgres", kr, []string{"--from", url, "--to", url}, "--from"},
		{"remote without TLS", kr, []string{"--from", path, "--to", "postgres://u:hunter2@db.example.com/x"}, "not on loopback"},
		{"bad batch", kr, []string{"--from", path, "--to", url, "--batch", "0"}, "--batch"},
		{"missing file", kr, []string{"--from", path + ".nope", "--to", url}, "no bolt store"},
		{"wrong keys for bolt", other, []string{"--from", path, "--to", url}, "wrong encryption key"},
		{"wrong keys for postgres", kr, []string{"--from", path, "--to", otherURL}, "wrong encryption key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("BROKER_KEYS", tt.keys.Format())
			out, stderr, err := runCmd(t, append([]string{"migrate"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q\n%s%s", err, tt.want, out, stderr)
			}
			if strings.Contains(err.Error()+out+stderr, "hunter2") {
				t.Fatal("a password was echoed")
			}
		})
	}
	// Nothing reached the target.
	pg, err := pgstore.Open(t.Context(), url, kr, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if ids, err := pg.ConnectionIDs(t.Context(), "", 0); err != nil || len(ids) != 0 {
		t.Fatalf("target holds %d connections after rejected runs: %v", len(ids), err)
	}
}

func TestParseStore(t *testing.T) {
	tests := []struct {
		in       string
		bolt, pg string
		wantErr  string
	}{
		{in: "bolt:./data/broker.db", bolt: "./data/broker.db"},
		{in: "/var/lib/broker.db", bolt: "/var/lib/broker.db"},
		{in: "postgres://broker@127.0.0.1:5432/broker", pg: "postgres://broker@127.0.0.1:5432/broker"},
		{in: "postgresql://broker@localhost/broker?sslmode=disable", pg: "postgresql://broker@localhost/broker?sslmode=disable"},
		{in: "postgres:host=/run/postgresql dbname=broker", pg: "host=/run/postgresql dbname=broker"},
		{in: "postgres://broker@db.example.com/broker?sslmode=verify-full", pg: "postgres://broker@db.example.com/broker?sslmode=verify-full"},
		{in: "postgres://broker:s3cret@db.example.com/broker", wantErr: "not on loopback"},
		{in: "postgres://broker@db.example.com/broker?sslmode=prefer", wantErr: "not on loopback"},
		{in: "postgres:", wantErr: "needs a connection string"},
		{in: "postgres://broker@127.0.0.1:99999999/x", wantErr: "bad PostgreSQL connection string"},
		{in: "mysql://x", wantErr: "unsupported store"},
		{in: "bolt:", wantErr: "needs a file path"},
		{in: "", wantErr: "empty store"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseStore(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
				if strings.Contains(err.Error(), "s3cret") {
					t.Fatalf("error shows the password: %v", err)
				}
				return
			}
			if err != nil || got.BoltPath != tt.bolt || got.Postgres != tt.pg {
				t.Fatalf("parseStore = %+v, %v; want bolt %q pg %q", got, err, tt.bolt, tt.pg)
			}
		})
	}
}
