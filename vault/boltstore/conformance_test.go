package boltstore_test

import (
	"path/filepath"
	"testing"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

func newKeyring(t testing.TB) *vault.Keyring {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func openStore(t testing.TB, path string, kr *vault.Keyring) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.Run(t, func(t *testing.T) vault.Store {
		return openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
	})
}

func TestAuthConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunAuth(t, func(t *testing.T) vaulttest.AuthBackend {
		return openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
	})
}

func TestOutboxConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook) vault.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "vault.db"), kr, boltstore.Options{Changes: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestAssertionConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunAssertions(t, func(t *testing.T) (vault.AssertionLedger, vault.AssertionLedger) {
		s := openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
		return s, s
	})
}

func TestAppOutboxConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.AppChangeHook) vaulttest.AuthBackend {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "vault.db"), kr, boltstore.Options{AppChanges: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
