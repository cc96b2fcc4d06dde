package boltstore_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

func TestIdPSessionConformance(t *testing.T) {
	kr := newKeyring(t)
	vaulttest.RunIdPSessions(t, func(t *testing.T) (vault.IdPSessionStore, vault.IdPSessionStore) {
		s := openStore(t, filepath.Join(t.TempDir(), "vault.db"), kr)
		return s, s
	})
}

func TestIdPSessionRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vault.db")
	vaulttest.RunIdPSessionRotation(t, func(t *testing.T, kr *vault.Keyring) vaulttest.KeyUser {
		s, err := boltstore.Open(path, kr, boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

// TestIdPSessionSealedAtRest: the file holds neither the IdP refresh
// token nor the ID token, and a session survives closing and reopening.
func TestIdPSessionSealedAtRest(t *testing.T) {
	kr := newKeyring(t)
	path := filepath.Join(t.TempDir(), "vault.db")
	s := openStore(t, path, kr)
	p := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	rt, idt := "idp-refresh-token-4f1b9c", "eyJ.idp-id-token-77aa.sig"
	if _, err := s.PutIdPSession(t.Context(), vault.IdPSession{Principal: p, RefreshToken: vault.Secret(rt), IDToken: vault.Secret(idt),
		IDTokenExpires: time.Now().Add(time.Hour), Created: time.Now(), Updated: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, secret := range []string{rt, idt} {
		if bytes.Contains(raw, []byte(secret)) {
			t.Errorf("the database file holds %q in the clear", secret)
		}
	}
	got, err := openStore(t, path, kr).GetIdPSession(t.Context(), p)
	if err != nil || got.RefreshToken.Reveal() != rt {
		t.Fatalf("after reopening: %v", err)
	}
}
