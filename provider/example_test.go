package provider_test

import (
	"fmt"
	"os"

	"credbroker/provider"
)

// Secrets are given by reference; every problem is reported with its line.
func ExampleParseProviders() {
	doc := []byte(`providers:
  acme:
    type: oauth2
    authorization_url: http://acme.example/authorize
    token_url: https://acme.example/token
    client_id: acme
    client_secret: hunter2
    colour: blue
`)
	_, err := provider.ParseProviders("providers.yaml", doc, os.Getenv)
	fmt.Println(err)
	// Output:
	// providers: 4 problems:
	//   providers.yaml:2: acme: account (url, id_field, login_field) is required for type "oauth2": it tells which account was connected
	//   providers.yaml:4: acme: authorization_url: "http://acme.example/authorize" must use https (http is allowed on loopback only)
	//   providers.yaml:7: acme: client_secret must be a reference ${NAME} to an environment variable (or use client_secret_file); secrets are never written in this file
	//   providers.yaml:8: unknown key "colour"
}
