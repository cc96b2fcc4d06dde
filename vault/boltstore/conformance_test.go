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
	vaulttest.RunAuth(t, func(t *testing.T) vault.Store {
		return openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
	})
}

func TestOutboxConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.Connection]) vault.Store {
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
		return s.Assertions(), s.Assertions()
	})
}

func TestAppOutboxConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunAppOutbox(t, func(t *testing.T, hook vault.ChangeHook[vault.AppAccess]) vault.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "vault.db"), kr, boltstore.Options{AppChanges: hook})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

func TestUpstreamClientConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunUpstreamClients(t, func(t *testing.T) vault.Store {
		return openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
	})
}

// TestUpstreamClientRotation: key rotation re-seals upstream client
// secrets too, and keys status counts them.
func TestUpstreamClientRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.db")
	vaulttest.RunUpstreamClientRotation(t, func(t *testing.T, kr *vault.Keyring) vaulttest.KeyUser {
		return openStore(t, path, kr)
	})
}

// TestSecretsSealedAtRest: no record of the file holds a token, an API
// key or an upstream client secret in the clear.
func TestSecretsSealedAtRest(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "vault.db"), newKeyring(t))
	vaulttest.FillEveryKind(t, s)
	vaulttest.NothingInTheClear(t, s)
}
