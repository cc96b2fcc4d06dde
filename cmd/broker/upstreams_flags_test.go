package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// TestServeRefusesUnauthenticatedUpstream: a type: mcp entry with auth:
// none (a server that takes no token, so every signed-in person's calls
// reach it with no account of theirs) needs --upstream-allow-unauthenticated:
// without it `broker serve` refuses to start, naming the entry, its server
// and the flag, before it opens the store or listens; with the flag the
// same configuration passes. An entry with auth: oauth needs no flag.
func TestServeRefusesUnauthenticatedUpstream(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yaml string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	open := write("open.yaml", "providers:\n  everything:\n    type: mcp\n    mcp: {url: https://mcp.example.com/mcp, auth: none}\n")
	oauth := write("oauth.yaml", "providers:\n  linear:\n    type: mcp\n    mcp: {url: https://mcp.linear.example/mcp}\n")
	t.Setenv("BROKER_KEYS", vault.GenerateKey())
	t.Setenv("BROKER_CLIENT_SECRET", "s3cret-value")
	store := filepath.Join(dir, "data", "broker.db")
	serve := func(args ...string) (string, error) {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := run(ctx, append([]string{"serve", "--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--store", "bolt:" + store, "--addr", "127.0.0.1:0"}, args...), &out, &out)
		return out.String(), err
	}
	out, err := serve("--providers", open)
	const want = "provider everything: auth: none relays every signed-in person's calls to https://mcp.example.com/mcp with no account of theirs; start the broker with --upstream-allow-unauthenticated to allow it"
	if err == nil || !strings.Contains(err.Error(), want) || exitCode(err) == 0 {
		t.Fatalf("serve without the flag: %v (exit %d)\n%s\nwant it to say %q", err, exitCode(err), out, want)
	}
	if _, err := os.Stat(store); !os.IsNotExist(err) {
		t.Fatalf("the refused start opened the store: %v", err)
	}
	if out, err := serve("--providers", open, "--upstream-allow-unauthenticated", "--check-config"); err != nil || !strings.Contains(out, "configuration OK: 1 provider(s): everything") {
		t.Fatalf("with the flag: %v\n%s", err, out)
	}
	if out, err := serve("--providers", oauth, "--check-config"); err != nil || !strings.Contains(out, "configuration OK") {
		t.Fatalf("auth: oauth without the flag: %v\n%s", err, out)
	}
}
