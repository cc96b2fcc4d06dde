package vaulttest

import (
	"context"
	"testing"
	"time"

	"credbroker/vault"
)

// testLocker: the store's Locker is one for the store: a connection
// locked through one Locker call cannot be locked through another until
// it is released, while another connection can.
func testLocker(t *testing.T, s vault.Store) {
	ctx := t.Context()
	unlock, err := s.Locker().LockConnection(ctx, "conn-1")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if u, err := s.Locker().LockConnection(short, "conn-1"); err == nil {
		u()
		t.Fatal("a second Locker took a held connection lock")
	}
	other, err := s.Locker().LockConnection(ctx, "conn-2")
	if err != nil {
		t.Fatalf("another connection: %v", err)
	}
	other()
	unlock()
	again, err := s.Locker().LockConnection(ctx, "conn-1")
	if err != nil {
		t.Fatalf("after the unlock: %v", err)
	}
	again()
}
