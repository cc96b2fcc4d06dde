package pgtest_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"credbroker/vault/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestSchemaIsolation: two schemas on the shared server hold separate tables.
func TestSchemaIsolation(t *testing.T) {
	srv := pgtest.Shared(t)
	ctx := t.Context()
	urls := []string{srv.Schema(t), srv.Schema(t)}
	for i, u := range urls {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "CREATE TABLE x (n int)"); err != nil {
			t.Fatalf("schema %d: %v", i, err)
		}
		if _, err := c.Exec(ctx, "INSERT INTO x VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	for i, u := range urls {
		c, err := pgx.Connect(ctx, u)
		if err != nil {
			t.Fatal(err)
		}
		var n, count int
		if err := c.QueryRow(ctx, "SELECT min(n), count(*) FROM x").Scan(&n, &count); err != nil {
			t.Fatal(err)
		}
		c.Close(ctx)
		if n != i || count != 1 {
			t.Fatalf("schema %d sees n=%d count=%d", i, n, count)
		}
	}
}

// TestKillRestart: a crash (SIGKILL to every server process) loses no
// committed row; the restarted server recovers from its log on the same URL.
func TestKillRestart(t *testing.T) {
	srv := pgtest.StartT(t)
	ctx := t.Context()
	c, err := pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "CREATE TABLE acked (n int PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if _, err := c.Exec(ctx, "INSERT INTO acked VALUES ($1)", i); err != nil {
			t.Fatal(err)
		}
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
		t.Fatal("a connection to the killed server still answers")
	}
	c.Close(ctx)
	if err := srv.Restart(); err != nil {
		t.Fatalf("restart: %v\n%s", err, srv.Log())
	}
	c, err = pgx.Connect(ctx, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM acked").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 200 {
		t.Fatalf("%d of 200 committed rows after the crash", n)
	}
	if log := srv.Log(); !strings.Contains(log, "not properly shut down") && !strings.Contains(log, "redo") {
		t.Errorf("the server log shows no crash recovery:\n%s", log)
	}
}
