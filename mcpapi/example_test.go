package mcpapi_test

import (
	"log"
	"net/http"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/mcpapi"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// The broker mounts the MCP endpoint and its protected-resource metadata on
// its mux; cmd/broker does this with the real store and catalogue.
func ExampleServer_Register() {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New(kr)
	catalogue, err := provider.ParseProviders("providers.yaml", []byte(`providers:
  github:
    display_name: GitHub
    type: oauth2
    authorization_url: https://github.com/login/oauth/authorize
    token_url: https://github.com/login/oauth/access_token
    client_id: my-client
    client_secret: ${GITHUB_CLIENT_SECRET}
    default_scopes: [read:user]
    account: {url: https://api.github.com/user, id_field: id, login_field: login}
`), func(string) string { return "the-secret" })
	if err != nil {
		log.Fatal(err)
	}
	client, err := provider.New(provider.Options{Store: store, Providers: catalogue})
	if err != nil {
		log.Fatal(err)
	}
	conns, err := connections.New(connections.Options{Store: store, Grants: binding.New(store, binding.Options{}),
		Client: client, PublicURL: "https://broker.example.com"})
	if err != nil {
		log.Fatal(err)
	}
	srv, err := mcpapi.New(mcpapi.Options{
		PublicURL:   "https://broker.example.com",
		Issuer:      "https://idp.example.com",
		Connections: conns,
		StateKeys:   kr.Derive("requestState"),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	srv.Register(mux) // POST /mcp, GET|DELETE /mcp → 405, /.well-known/oauth-protected-resource[/mcp]
	_ = &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
}
