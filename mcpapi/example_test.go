package mcpapi_test

import (
	"context"
	"log"
	"net/http"

	"credbroker/binding"
	"credbroker/mcpapi"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

type catalog map[string]mcpapi.ProviderInfo

func (c catalog) Provider(name string) (mcpapi.ProviderInfo, bool) { p, ok := c[name]; return p, ok }
func (c catalog) ProviderNames() []string                          { return []string{"github"} }

// The broker mounts the MCP endpoint and its protected-resource metadata on
// its mux; cmd/broker does this with the real store, grants and catalogue.
func ExampleServer_Register() {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		log.Fatal(err)
	}
	store := memstore.New(kr)
	srv, err := mcpapi.New(context.Background(), mcpapi.Options{
		PublicURL: "https://broker.example.com",
		Issuer:    "https://idp.example.com",
		Store:     store,
		Grants:    binding.New(store, binding.Options{}),
		Catalog: catalog{"github": {Name: "github", DisplayName: "GitHub",
			DefaultScopes: []string{"read:user"}, AllowedScopes: []string{"read:user", "repo"}}},
		StateKeys: kr.Derive("requestState"),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	srv.Register(mux) // POST /mcp, GET|DELETE /mcp → 405, /.well-known/oauth-protected-resource[/mcp]
	_ = &http.Server{Addr: "127.0.0.1:8080", Handler: mux}
}
