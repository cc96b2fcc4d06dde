package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"credbroker/internal/devidp/devidptest"
	"credbroker/provider"
	"credbroker/sidecar/client"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// TestBrokerModeFrontDoors: with --mcp-auth broker both the MCP endpoint
// and the sidecar API accept the broker's own tokens and identify the
// person by the IdP's (iss, sub); an IdP token is refused unless the
// sidecar was given its audience explicitly.
func TestBrokerModeFrontDoors(t *testing.T) {
	const secret = "sidecar-secret-0123456789abcdef"
	idp := devidptest.Start(t, nil, nil)
	reg := unreachableDemo(t)
	for _, tc := range []struct {
		name      string
		audiences string
		idpOK     bool
	}{
		{"default audiences", "", false},
		{"explicit IdP audience", "https://tools.example/sidecar", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			kr, err := vault.ParseKeys(vault.GenerateKey())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			t.Cleanup(cancel)
			sock := filepath.Join(t.TempDir(), "sidecar.sock")
			m, err := mount(ctx, mux, brokerDeps{
				PublicURL: srv.URL, Resource: srv.URL + "/mcp", Issuer: idp.Issuer(),
				ClientID: "broker", ClientSecret: vault.Secret("idp-client-secret"), DevMode: true,
				GrantTTL: time.Minute, StateTTL: time.Minute,
				Store: memstore.New(kr), Keys: kr, Providers: reg, Logger: newLogger(&discard{}, "json", 0),
				HTTPClient: outboundClient(),
				Sidecar:    sidecarConfig{Socket: sock, Secret: vault.Secret(secret), Audiences: tc.audiences},
				AuthServer: &authServerConfig{Registration: true},
			})
			if err != nil {
				t.Fatal(err)
			}
			brokerTok, _, err := m.Auth.MintAccessToken(ctx, vault.Principal{Issuer: idp.Issuer(), Subject: "alice"}, "urn:credbroker:test", "test", "", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			aud := srv.URL + "/mcp"
			if tc.audiences != "" {
				aud = tc.audiences
			}
			idpTok, _, err := idp.MintAccessToken("alice", aud, nil, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			sc, err := client.New("unix://"+sock, secret, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Accepted: the person is known, and has no demo connection.
			if _, err := sc.Do(ctx, brokerTok, "demo", client.Request{Path: "/user"}); !isCode(err, "not_connected") {
				t.Fatalf("the broker's token on the sidecar: %v", err)
			}
			_, err = sc.Do(ctx, idpTok, "demo", client.Request{Path: "/user"})
			if tc.idpOK != isCode(err, "not_connected") {
				t.Fatalf("the IdP's token on the sidecar: %v (accepted want %v)", err, tc.idpOK)
			}
			a, err := mcpCall(http.DefaultClient, srv.URL, "", brokerTok, "list_connections", map[string]any{}, nil)
			if err != nil || a.Status != 200 || a.Result.IsError {
				t.Fatalf("the broker's token on the MCP endpoint: %v %s", err, a.Raw)
			}
			mcpIdP, _, _ := idp.MintAccessToken("alice", srv.URL+"/mcp", nil, time.Hour)
			if a, _ := mcpCall(http.DefaultClient, srv.URL, "", mcpIdP, "list_connections", map[string]any{}, nil); a.Status != http.StatusUnauthorized {
				t.Fatalf("an issuer-mode token on the MCP endpoint in broker mode: HTTP %d, want 401", a.Status)
			}
		})
	}
}

func isCode(err error, code string) bool {
	e, ok := err.(*client.Error)
	return ok && e.Code == code
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// unreachableDemo is a catalogue of one OAuth provider, demo, whose
// endpoints nothing answers: for tests of the broker's own routes, which
// never reach the provider.
func unreachableDemo(t *testing.T) *provider.Registry {
	t.Helper()
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
	return reg
}
