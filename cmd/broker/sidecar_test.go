package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker/internal/devidp/devidptest"
	"credbroker/provider"
	"credbroker/sidecar/client"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// TestSidecarWiringRequiredScope starts the broker's routes with the
// sidecar on a Unix socket and --required-scope set: the sidecar refuses
// user tokens without the scope, like the MCP endpoint.
func TestSidecarWiringRequiredScope(t *testing.T) {
	const scope, secret = "broker:use", "sidecar-secret-0123456789abcdef"
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	idp := devidptest.Start(t, nil, nil)
	reg, err := provider.ParseProviders("providers.yaml", []byte(`providers:
  demo:
    display_name: Demo
    type: oauth2
    authorization_url: http://127.0.0.1:1/authorize
    token_url: http://127.0.0.1:1/token
    client_id: demo
    client_secret: ${S}
    account: {url: "http://127.0.0.1:1/user", id_field: id, login_field: login}
    api: {base_url: "http://127.0.0.1:1/api"}
`), func(string) string { return "demo-client-secret" })
	if err != nil {
		t.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sock := filepath.Join(t.TempDir(), "sidecar.sock")
	if _, err := mount(ctx, mux, brokerDeps{
		PublicURL: srv.URL, Resource: srv.URL + "/mcp", Issuer: idp.Issuer(),
		ClientID: "broker", ClientSecret: vault.Secret("idp-client-secret"), DevMode: true,
		GrantTTL: time.Minute, StateTTL: time.Minute, RequiredScope: scope,
		Store: memstore.New(kr), Keys: kr, Providers: reg, Logger: newLogger(&strings.Builder{}, "json", 0),
		HTTPClient: outboundClient(),
		Sidecar:    sidecarConfig{Socket: sock, Secret: vault.Secret(secret)},
	}); err != nil {
		t.Fatal(err)
	}
	sc, err := client.New("unix://"+sock, secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		scopes []string
		code   string
	}{
		{"with the scope", []string{"openid", scope}, "not_connected"},
		{"without it", []string{"openid"}, "insufficient_scope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, _, err := idp.MintAccessToken("alice", srv.URL+"/mcp", tc.scopes, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			_, err = sc.Do(ctx, tok, "demo", client.Request{Path: "/user"})
			if e, ok := err.(*client.Error); !ok || e.Code != tc.code {
				t.Fatalf("proxy call: %v, want %s", err, tc.code)
			}
		})
	}
}
