package memstore_test

import (
	"testing"

	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/vault/vaulttest"
)

func TestIdPSessionConformance(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	vaulttest.RunIdPSessions(t, func(t *testing.T) (vault.IdPSessionStore, vault.IdPSessionStore) {
		s := memstore.New(kr)
		return s, s
	})
}
