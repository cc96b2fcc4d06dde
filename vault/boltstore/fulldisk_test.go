package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/internal/fulldisk"
	"credbroker/vault"
	"credbroker/vault/boltstore"
)

// TestFullDisk: when the disk under the database is full, a write fails
// as vault.ErrUnavailable, naming the file and the cause for the log
// ("no space left on device"), and changes nothing; reads go on; once
// space is free again the same Store writes again, and every write it
// acknowledged is in the file, which checks clean.
func TestFullDisk(t *testing.T) {
	disk := fulldisk.MountT(t, 2<<20)
	path := filepath.Join(disk.Dir, "broker.db")
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var acked []string
	write := func(i int) error {
		now := time.Now()
		id := fmt.Sprintf("conn-%04d", i)
		_, err := s.CreateConnection(ctx, vault.Connection{ID: id, Principal: alice, Provider: "demo",
			AccountID: fmt.Sprint(i), AccountLogin: "alice", Status: vault.StatusActive, Created: now, Updated: now,
			Token: vault.TokenSet{AccessToken: vault.Secret(strings.Repeat("a", 3000)), RefreshToken: vault.Secret(strings.Repeat("r", 3000))}})
		if err == nil {
			acked = append(acked, id)
		}
		return err
	}
	for i := range 20 {
		if err := write(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := disk.Fill(); err != nil {
		t.Fatal(err)
	}
	var full error
	for i := 20; i < 2000 && full == nil; i++ {
		full = write(i)
	}
	switch {
	case full == nil:
		t.Fatal("2000 writes on a full disk all succeeded")
	case !errors.Is(full, vault.ErrUnavailable):
		t.Fatalf("a write on a full disk: %v, want vault.ErrUnavailable", full)
	case !strings.Contains(full.Error(), "no space left on device") || !strings.Contains(full.Error(), path):
		t.Fatalf("the error names neither the file nor the cause: %v", full)
	}
	t.Logf("full after %d acknowledged writes: %v", len(acked), full)
	// Nothing of the refused write is there; reads answer.
	now := time.Now()
	if list, err := s.ListConnections(ctx, alice); err != nil || len(list) != len(acked) {
		t.Fatalf("listing on a full disk: %d connections, %v; want %d", len(list), err, len(acked))
	}
	if err := disk.Free(); err != nil {
		t.Fatal(err)
	}
	if err := write(5000); err != nil {
		t.Fatalf("a write once space is free again: %v", err)
	}
	if _, err := s.CreateGrant(ctx, vault.Grant{ID: "grant-free", Principal: alice, Provider: "demo", Created: now,
		Expires: now.Add(time.Hour), State: vault.GrantPending}); err != nil {
		t.Fatalf("a grant once space is free again: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, id := range acked {
		if c, err := s.GetConnection(ctx, id); err != nil || c.Token.RefreshToken == "" {
			t.Fatalf("acknowledged connection %s: %v", id, err)
		}
	}
	if err := s.DB().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatalf("the file does not check clean: %v", err)
	}
}
