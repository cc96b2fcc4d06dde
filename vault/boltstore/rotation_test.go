package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

// cancelAfter cancels its context after n ConnectionIDs pages, simulating a
// rotation interrupted part way.
type cancelAfter struct {
	vault.Store
	n      int
	cancel context.CancelFunc
}

// plainStore hides the optional Resealer so Rekey takes its generic,
// one-UpdateConnection-per-record path.
type plainStore struct{ vault.Store }

func (plainStore) Resealer() vault.Resealer { return nil }

func (c *cancelAfter) ConnectionIDs(ctx context.Context, after string, limit int) ([]string, error) {
	ids, err := c.Store.ConnectionIDs(ctx, after, limit)
	if c.n--; c.n <= 0 {
		c.cancel()
	}
	return ids, err
}

func firstKeyLine(kr *vault.Keyring) string {
	for line := range strings.Lines(kr.Format()) {
		if !strings.HasPrefix(line, "#") {
			return line
		}
	}
	return ""
}

func TestRotation(t *testing.T) {
	tests := []struct {
		name string
		wrap func(s *boltstore.Store, cancel context.CancelFunc) vault.Store
		use  func(s *boltstore.Store) vault.Store
	}{
		{"batch reseal",
			func(s *boltstore.Store, cancel context.CancelFunc) vault.Store {
				return &cancelAfter{Store: s, n: 2, cancel: cancel}
			},
			func(s *boltstore.Store) vault.Store { return s }},
		{"generic update path",
			func(s *boltstore.Store, cancel context.CancelFunc) vault.Store {
				return &cancelAfter{Store: plainStore{s}, n: 2, cancel: cancel}
			},
			func(s *boltstore.Store) vault.Store { return plainStore{s} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testRotation(t, tt.wrap, tt.use)
		})
	}
}

func testRotation(t *testing.T, wrap func(*boltstore.Store, context.CancelFunc) vault.Store, use func(*boltstore.Store) vault.Store) {
	path := filepath.Join(t.TempDir(), "v.db")
	oldKR := newKeyring(t)
	s, err := boltstore.Open(path, oldKR, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 95
	for i := range n {
		p := vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("u%d", i%9)}
		if _, err := s.CreateConnection(t.Context(), vaulttest.Conn(fmt.Sprintf("c%03d", i), p, "github", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	newKR, err := oldKR.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	s = openStore(t, path, newKR)

	// Interrupted run: cancelled after two batches.
	ctx, cancel := context.WithCancel(t.Context())
	n1, err := vault.Rekey(ctx, wrap(s, cancel), newKR, 10)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted rekey: n=%d err=%v, want context.Canceled", n1, err)
	}
	usage, err := s.KeyUsage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if usage[newKR.Primary()] != n1 || usage[oldKR.Primary()] != n-n1 || n1 == 0 || n1 == n {
		t.Fatalf("after interruption: %d rewritten, usage %v", n1, usage)
	}

	// The rerun finishes while writers keep using the store.
	var wg sync.WaitGroup
	writeErrs := make(chan error, 20)
	for i := range 20 {
		wg.Go(func() {
			_, err := s.UpdateConnection(t.Context(), fmt.Sprintf("c%03d", i*4), func(c vault.Connection) (vault.Connection, error) {
				c.AccountLogin = "online"
				return c, nil
			})
			writeErrs <- err
		})
	}
	n2, err := vault.Rekey(t.Context(), use(s), newKR, 10)
	wg.Wait()
	close(writeErrs)
	for err := range writeErrs {
		if err != nil {
			t.Fatalf("write during rekey: %v", err)
		}
	}
	if err != nil {
		t.Fatalf("rerun: %v", err)
	}
	if n1+n2 > n {
		t.Fatalf("rewrote %d+%d records of %d", n1, n2, n)
	}
	if n3, err := vault.Rekey(t.Context(), use(s), newKR, 10); n3 != 0 || err != nil {
		t.Fatalf("third run rewrote %d, %v; want 0 (idempotent)", n3, err)
	}
	usage, _ = s.KeyUsage(t.Context())
	if len(usage) != 1 || usage[newKR.Primary()] != n {
		t.Fatalf("usage after rotation = %v, want all %d on %s", usage, n, newKR.Primary())
	}
	s.Close()

	// The old key can go: a ring of the new key alone opens everything.
	onlyNew, err := vault.ParseKeys(firstKeyLine(newKR))
	if err != nil || len(onlyNew.IDs()) != 1 || onlyNew.Primary() != newKR.Primary() {
		t.Fatalf("new-only ring: %v %v", onlyNew.IDs(), err)
	}
	s2 := openStore(t, path, onlyNew)
	for i := range n {
		id := fmt.Sprintf("c%03d", i)
		c, err := s2.GetConnection(t.Context(), id)
		if err != nil {
			t.Fatalf("%s after removing the old key: %v", id, err)
		}
		if c.SealedWith != newKR.Primary() || c.Token.AccessToken.Reveal() != "at-"+id+"-secret" {
			t.Fatalf("%s: sealed with %s, token ok %v", id, c.SealedWith, c.Token.AccessToken.Reveal() == "at-"+id+"-secret")
		}
		if i%4 == 0 && i < 80 && c.AccountLogin != "online" {
			t.Fatalf("%s lost its concurrent update", id)
		}
	}
}
