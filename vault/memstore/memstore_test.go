package memstore_test

import (
	"testing"

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
	vaulttest.RunAuth(t, func(t *testing.T) vaulttest.AuthBackend { return memstore.New(kr) })
}

func TestOutboxConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook) vault.Store {
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
		return s, s
	})
}

func TestAppOutboxConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.AppChangeHook) vaulttest.AuthBackend {
		return memstore.NewWith(kr, memstore.Options{AppChanges: hook})
	})
}
