package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/pgstore/pgtest"
)

// TestUpstreamsForget: `broker upstreams forget PROVIDER` deletes the
// stored dynamic registration at the provider's authorization server
// (found by discovery, or named with --upstream-issuer), printing its
// client id and issuer and never its secret, and leaves every other
// registration; it exits non-zero naming the problem for an unknown
// provider, one that is not type: mcp, one with auth: none and one with
// nothing stored, deleting nothing. On bolt and on PostgreSQL.
func TestUpstreamsForget(t *testing.T) {
	for _, backend := range []string{"bolt", "postgres"} {
		t.Run(backend, func(t *testing.T) { testUpstreamsForget(t, backend) })
	}
}

func testUpstreamsForget(t *testing.T, backend string) {
	ctx := context.Background()
	up := startDemoUpstream(t)
	dir := t.TempDir()
	// An upstream nobody answers at (a closed loopback port): only
	// --upstream-issuer lets its registration be deleted.
	gone := "http://" + freeAddr(t) + "/mcp"
	providers := filepath.Join(dir, "providers.yaml")
	yaml := strings.ReplaceAll(notesProvidersYAML, "{{URL}}", up.mcp.URL()) +
		"  gone:\n    type: mcp\n    mcp:\n      url: " + gone + "\n" +
		"  open:\n    type: mcp\n    mcp: {url: https://open.example.com/mcp, auth: none}\n" +
		"  api:\n    type: oauth2\n    authorization_url: http://127.0.0.1:1/a\n    token_url: http://127.0.0.1:1/t\n    client_id: c\n    client_secret: ${S}\n    account: {url: http://127.0.0.1:1/u, id_field: id}\n"
	if err := os.WriteFile(providers, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	line := vault.GenerateKey()
	kr, err := vault.ParseKeys(line)
	if err != nil {
		t.Fatal(err)
	}
	keysFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("BROKER_KEYS", "")
	t.Setenv("S", "s3cret")
	store := "bolt:" + filepath.Join(dir, "broker.db")
	if backend == "postgres" {
		store = pgtest.StartT(t).Schema(t)
	}
	const public = "https://broker.example.com"
	notesKey := provider.UpstreamClientKey(up.demo.Issuer(), public+"/oauth/notes/callback")
	goneKey := provider.UpstreamClientKey("https://as.gone.example", public+"/oauth/gone/callback")
	s, err := openStore(store, kr)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []vault.UpstreamClient{
		{Key: notesKey, ClientID: "dcr-notes", ClientSecret: "notes-client-secret", AuthMethod: "client_secret_basic", Created: time.Now()},
		{Key: goneKey, ClientID: "dcr-gone", ClientSecret: "gone-client-secret", AuthMethod: "client_secret_basic", Created: time.Now()},
	} {
		if _, err := s.UpstreamClients().PutUpstreamClient(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	forget := func(args ...string) (string, error) {
		t.Helper()
		stdout, stderr, err := runCmd(t, append([]string{"upstreams", "forget"}, append(args, "--providers", providers, "--public-url", public,
			"--store", store, "--keys-file", keysFile, "--upstream-allow-private")...)...)
		out := stdout + stderr
		for _, secret := range []string{"notes-client-secret", "gone-client-secret"} {
			if strings.Contains(out, secret) {
				t.Fatalf("upstreams forget %v printed a client secret:\n%s", args, out)
			}
		}
		return stdout, err
	}
	stored := func(key string) string {
		t.Helper()
		s, err := openStore(store, kr)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c, err := s.UpstreamClients().GetUpstreamClient(ctx, key)
		if err != nil {
			return err.Error()
		}
		return c.ClientID
	}

	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown provider", []string{"linear"}, `has no provider "linear" (its providers: api, gone, notes, open)`},
		{"not mcp", []string{"api"}, "provider api is of type oauth2: the broker keeps no registration for it"},
		{"auth none", []string{"open"}, "provider open is of type mcp with auth: none: the broker keeps no registration for it"},
		{"upstream unreachable", []string{"gone"}, "name the issuer with --upstream-issuer"},
		{"nothing at that issuer", []string{"gone", "--upstream-issuer", "https://as.other.example"},
			"no registration of the broker is stored for gone: none at issuer https://as.other.example for redirect URI " + public + "/oauth/gone/callback; nothing was deleted"},
	} {
		out, err := forget(c.args...)
		if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v (exit %d)\n%s\nwant exit 1 saying %q", c.name, err, exitCode(err), out, c.want)
		}
	}
	if _, err := forget(); err == nil || exitCode(err) != 2 {
		t.Errorf("without a provider: %v (exit %d), want a usage error", err, exitCode(err))
	}
	if a, b := stored(notesKey), stored(goneKey); a != "dcr-notes" || b != "dcr-gone" {
		t.Fatalf("after the refusals the store holds %q and %q; want both registrations", a, b)
	}

	// Discovery finds the issuer: the flags may come after the provider.
	out, err := forget("notes")
	want := "deleted the registration of notes: client_id dcr-notes at issuer " + up.demo.Issuer() + " (redirect URI " + public + "/oauth/notes/callback"
	if err != nil || !strings.Contains(out, want) {
		t.Fatalf("forget notes: %v\n%s\nwant %q", err, out, want)
	}
	if got := stored(notesKey); !strings.Contains(got, "not found") {
		t.Fatalf("after forget notes the store holds %q", got)
	}
	if got := stored(goneKey); got != "dcr-gone" {
		t.Fatalf("forget notes touched gone's registration: %q", got)
	}
	if _, err := forget("notes"); err == nil || !strings.Contains(err.Error(), "no registration of the broker is stored for notes") {
		t.Fatalf("forget notes twice: %v", err)
	}
	// The issuer given: no discovery.
	if out, err := forget("--upstream-issuer", "https://as.gone.example", "gone"); err != nil || !strings.Contains(out, "client_id dcr-gone at issuer https://as.gone.example") {
		t.Fatalf("forget gone with its issuer: %v\n%s", err, out)
	}
	if got := stored(goneKey); !strings.Contains(got, "not found") {
		t.Fatalf("after forget gone the store holds %q", got)
	}
}
