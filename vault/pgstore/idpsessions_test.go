package pgstore_test

import (
	"testing"

	"credbroker/vault"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// TestIdPSessionConformance runs the IdP session suite with two stores
// (two pools, as two replicas) on one database.
func TestIdPSessionConformance(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	vaulttest.RunIdPSessions(t, func(t *testing.T) (vault.IdPSessionStore, vault.IdPSessionStore) {
		url := srv.Schema(t)
		return open(t, url, kr), open(t, url, kr)
	})
}

// TestIdPSessionRotation: key rotation re-seals IdP sessions too, and
// keys status counts them.
func TestIdPSessionRotation(t *testing.T) {
	url := pgtest.Shared(t).Schema(t)
	vaulttest.RunIdPSessionRotation(t, func(t *testing.T, kr *vault.Keyring) vaulttest.KeyUser {
		return open(t, url, kr)
	})
}
