package pgtest_test

import (
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
