package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker/internal/devidp/devidptest"
	"credbroker/sidecar"
	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// TestSidecarWiringRequiredScope starts the broker's routes with the
// sidecar on a Unix socket, --required-scope set and a second accepted
// audience: tokens for the MCP resource need the scope, like on the MCP
// endpoint; tokens for the other audience do not (its policy is its own).
func TestSidecarWiringRequiredScope(t *testing.T) {
	const scope, secret = "broker:use", "sidecar-secret-0123456789abcdef"
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	idp := devidptest.Start(t, nil, nil)
	reg := unreachableDemo(t)
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
		Sidecar: sidecarConfig{Socket: sock, Secret: vault.Secret(secret),
			Audiences: srv.URL + "/mcp,https://tools.example.test/mcp"},
	}); err != nil {
		t.Fatal(err)
	}
	// The client talks to the socket through a proxy that checks every
	// exchange against docs/sidecar.openapi.yaml.
	sc, err := client.New(sidecartest.NewContract(t).Proxy("unix://"+sock), secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, aud string
		scopes    []string
		code      string
	}{
		{"with the scope", srv.URL + "/mcp", []string{"openid", scope}, "not_connected"},
		{"without it", srv.URL + "/mcp", []string{"openid"}, "insufficient_scope"},
		{"other audience, without it", "https://tools.example.test/mcp", []string{"openid"}, "not_connected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, _, err := idp.MintAccessToken("alice", tc.aud, tc.scopes, time.Hour)
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

// TestSidecarSecretsFile: named secrets, one server per line, every
// problem reported with its line and never with a secret.
func TestSidecarSecretsFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", `# co-located servers
demorepos:repos-secret-0123456789

calendar:calendar-secret-0123456789 providers=google,github
`)
	c := sidecarConfig{Addr: "127.0.0.1:8081", SecretsFile: good, Secret: vault.Secret("unnamed-secret-0123456789")}
	callers, err := c.callers()
	if err != nil {
		t.Fatal(err)
	}
	if len(callers) != 3 || callers[0].Name != vault.UnnamedServer || callers[1].Name != "demorepos" || callers[1].Providers != nil ||
		callers[1].Secret.Reveal() != "repos-secret-0123456789" || callers[2].Name != "calendar" || fmt.Sprint(callers[2].Providers) != "[google github]" {
		t.Fatalf("callers %+v", callers)
	}
	bad := write("bad", `demorepos:repos-secret-0123456789
demorepos:other-secret-0123456789
Calendar:cal-secret-0123456789
unnamed:reserved-secret-0123456789
short:tiny
copy:repos-secret-0123456789
noseparator
mail:mail-secret-0123456789 colour=blue
`)
	_, err = sidecarConfig{Addr: "127.0.0.1:8081", SecretsFile: bad}.callers()
	if err == nil {
		t.Fatal("a bad secrets file was accepted")
	}
	for _, want := range []string{
		`line 2: the name "demorepos" is already on line 1`,
		`line 3: the name "Calendar": use lowercase`,
		`line 4: the name "unnamed" is reserved`,
		`line 5: the secret of short must be at least 16 characters`,
		`line 6: copy has the same secret as line 1`,
		`line 7: want name:secret`,
		`line 8: unknown option "colour"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	for _, secret := range []string{"repos-secret-0123456789", "other-secret", "tiny", "reserved-secret"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the error shows a secret (%s)", secret)
		}
	}
	if _, err := (sidecarConfig{Addr: "127.0.0.1:8081", SecretsFile: good, Secret: vault.Secret("repos-secret-0123456789")}).callers(); err == nil ||
		!strings.Contains(err.Error(), "demorepos has the secret of BROKER_SIDECAR_SECRET") {
		t.Errorf("a named server sharing the unnamed secret: %v", err)
	}
	if errs := (sidecarConfig{Addr: "127.0.0.1:8081"}).validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "needs a secret") {
		t.Errorf("no secret at all: %v", errs)
	}
	if errs := (sidecarConfig{SecretsFile: good}).validate(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "the sidecar API is off") {
		t.Errorf("a secrets file without a listener: %v", errs)
	}
}

// TestSidecarAudiencesFlag: each --sidecar-audiences entry has its own
// required scope; the MCP resource keeps --required-scope unless it says
// otherwise.
func TestSidecarAudiencesFlag(t *testing.T) {
	const res = "https://broker.example/mcp"
	for _, tc := range []struct {
		flag, err string
		want      []sidecar.Audience
	}{
		{"", "", []sidecar.Audience{{URI: res, RequiredScope: "broker:use"}}},
		{res + ",https://tools.example", "", []sidecar.Audience{{URI: res, RequiredScope: "broker:use"}, {URI: "https://tools.example"}}},
		{"https://tools.example=tools:run, " + res + "=other:scope", "", []sidecar.Audience{{URI: "https://tools.example", RequiredScope: "tools:run"}, {URI: res, RequiredScope: "other:scope"}}},
		{"https://tools.example=", "the scope after = is one scope", nil},
		{"https://a=x y", "the scope after = is one scope", nil},
		{"https://a,https://a", "listed twice", nil},
		{" , ", "lists no audience", nil},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			got, err := sidecarConfig{Audiences: tc.flag}.audiences(res, "broker:use")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("got %+v %v, want %+v", got, err, tc.want)
			}
		})
	}
}
