package memstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/vault/vaulttest"
)

func TestConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.Run(t, func(t *testing.T) vault.Store { return memstore.New(kr) })
}

func TestAuthConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunAuth(t, func(t *testing.T) vault.Store { return memstore.New(kr) })
}

func TestOutboxConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.Connection]) vault.Store {
		return memstore.NewWith(kr, memstore.Options{Changes: hook})
	})
}

func TestAssertionConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunAssertions(t, func(t *testing.T) (vault.AssertionLedger, vault.AssertionLedger) {
		s := memstore.New(kr)
		return s.Assertions(), s.Assertions()
	})
}

func TestAppOutboxConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.AppAccess]) vault.Store {
		return memstore.NewWith(kr, memstore.Options{AppChanges: hook})
	})
}

func TestUpstreamClientConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunUpstreamClients(t, func(t *testing.T) vault.Store { return memstore.New(kr) })
}

// counting is an Observer that counts the operations it sees end.
type counting struct{ n *atomic.Int64 }

func (c counting) Begin(ctx context.Context, op string) context.Context { return ctx }
func (c counting) End(context.Context, string, time.Duration, error)    { c.n.Add(1) }

// TestObservedConformance runs every conformance suite through
// vault.Observe: the observed store keeps the contract of the store it
// wraps, feature by feature.
func TestObservedConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	observe := func(s vault.Store) vault.Store { return vault.Observe(s, counting{&n}) }
	vaulttest.Run(t, func(t *testing.T) vault.Store { return observe(memstore.New(kr)) })
	vaulttest.RunAuth(t, func(t *testing.T) vault.Store { return observe(memstore.New(kr)) })
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.Connection]) vault.Store {
		return observe(memstore.NewWith(kr, memstore.Options{Changes: hook}))
	})
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.AppAccess]) vault.Store {
		return observe(memstore.NewWith(kr, memstore.Options{AppChanges: hook}))
	})
	vaulttest.RunUpstreamClients(t, func(t *testing.T) vault.Store { return observe(memstore.New(kr)) })
	vaulttest.RunAssertions(t, func(t *testing.T) (vault.AssertionLedger, vault.AssertionLedger) {
		s := observe(memstore.New(kr))
		return s.Assertions(), s.Assertions()
	})
	if n.Load() == 0 {
		t.Fatal("the observer saw nothing")
	}
}
