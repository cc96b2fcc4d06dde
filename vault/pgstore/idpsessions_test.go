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
