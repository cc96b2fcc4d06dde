package adminapi

import (
	"testing"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// newConnections is the connections layer the tests' admin APIs act on:
// one oauth2 provider, demo, over a memory store, seen through wrap when
// it is not nil (a store that fails as an outage does).
func newConnections(t *testing.T, wrap func(vault.Store) vault.Store) *connections.Service {
	t.Helper()
	keys, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	var store vault.Store = memstore.New(keys)
	if wrap != nil {
		store = wrap(store)
	}
	reg, err := provider.ParseProviders("test", []byte(`providers:
  demo:
    type: oauth2
    authorization_url: https://demo.example/authorize
    token_url: https://demo.example/token
    client_id: c
    client_secret: ${S}
    default_scopes: [profile]
    account: {url: https://demo.example/user, id_field: id, login_field: login}
`), func(string) string { return "secret-value" })
	if err != nil {
		t.Fatal(err)
	}
	client, err := provider.New(provider.Options{Store: store, Providers: reg})
	if err != nil {
		t.Fatal(err)
	}
	conns, err := connections.New(connections.Options{Store: store, Grants: binding.New(store, binding.Options{}),
		Client: client, PublicURL: "https://broker.example"})
	if err != nil {
		t.Fatal(err)
	}
	return conns
}
