package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"credbroker/provider"
	"credbroker/vault"
)

// TestCIMDNeedsHTTPSMetadataURL: an mcp entry with registration: cimd
// needs the broker's Client ID Metadata Document at an https URL, which
// only the flags say (--client-metadata-url, default
// <public-url>/oauth/client-metadata.json). When it is http, `broker
// serve` (--check-config or not) and `broker upstreams check` refuse,
// each such entry named at its mcp.registration line of providers.yaml
// with the URL and the fix, exit 1, before the store is opened or any
// server is asked; registration: auto is not refused (it skips the
// document when it is not https). With an https URL the same catalogue
// passes, and broker dev's own catalogue passes its check.
func TestCIMDNeedsHTTPSMetadataURL(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yaml string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cimd := write("providers.yaml", `providers:
  linear:
    display_name: Linear
    type: mcp
    mcp:
      url: https://mcp.linear.example/mcp
      registration: cimd
  notion:
    type: mcp
    mcp: {url: https://mcp.notion.example/mcp, registration: auto}
  wiki:
    type: mcp
    mcp: {url: https://wiki.example/mcp, registration: cimd}
`)
	auto := write("auto.yaml", "providers:\n  notion:\n    type: mcp\n    mcp: {url: https://mcp.notion.example/mcp, registration: auto}\n  plain:\n    type: mcp\n    mcp: {url: https://mcp.plain.example/mcp}\n")
	t.Setenv("BROKER_KEYS", vault.GenerateKey())
	t.Setenv("BROKER_CLIENT_SECRET", "s3cret-value")
	for _, k := range []string{"BROKER_CLIENT_METADATA_URL", "BROKER_PUBLIC_URL", "BROKER_PROVIDERS", "BROKER_STORE", "BROKER_KEYS_FILE"} {
		t.Setenv(k, "")
	}
	store := filepath.Join(dir, "data", "broker.db")
	broker := func(args ...string) (stdout string, err error) {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err = run(ctx, args, &out, &errOut)
		return out.String(), err
	}
	serve := func(public string, args ...string) (string, error) {
		return broker(append([]string{"serve", "--public-url", public, "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--store", "bolt:" + store, "--addr", "127.0.0.1:0"}, args...)...)
	}
	const fix = "; give the broker an https --public-url or --client-metadata-url, or another mcp.registration (auto skips the document when it is not https)"
	linear := cimd + ":7: linear: registration cimd needs an https client metadata URL (--client-metadata-url is http://127.0.0.1:8080/oauth/client-metadata.json, from --public-url)" + fix
	wiki := cimd + ":13: wiki: registration cimd needs an https client metadata URL (--client-metadata-url is http://127.0.0.1:8080/oauth/client-metadata.json, from --public-url)" + fix

	for _, c := range []struct {
		name string
		run  func() (string, error)
		want string
	}{
		{"serve, the default document URL", func() (string, error) { return serve("http://127.0.0.1:8080", "--providers", cimd) },
			"configuration has problems:\n" + linear + "\n" + wiki},
		{"serve --check-config", func() (string, error) {
			return serve("http://127.0.0.1:8080/", "--providers", cimd, "--check-config")
		}, "configuration has problems:\n" + linear + "\n" + wiki},
		{"serve, --client-metadata-url http", func() (string, error) {
			return serve("https://broker.example.com", "--providers", cimd, "--client-metadata-url", "http://127.0.0.1:9000/broker.json")
		}, "configuration has problems:\n" +
			cimd + ":7: linear: registration cimd needs an https client metadata URL (--client-metadata-url is http://127.0.0.1:9000/broker.json)" + fix + "\n" +
			cimd + ":13: wiki: registration cimd needs an https client metadata URL (--client-metadata-url is http://127.0.0.1:9000/broker.json)" + fix},
		{"upstreams check, the default --public-url", func() (string, error) {
			return broker("upstreams", "check", "--providers", cimd)
		}, "configuration has problems:\n" + linear + "\n" + wiki},
		{"upstreams check of one entry", func() (string, error) {
			return broker("upstreams", "check", "--providers", cimd, "--public-url", "http://127.0.0.1:8080", "wiki")
		}, "configuration has problems:\n" + wiki},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, err := c.run()
			if err == nil || err.Error() != c.want || exitCode(err) != 1 {
				t.Fatalf("got %v (exit %d)\nwant:\n%s", err, exitCode(err), c.want)
			}
			if out != "" {
				t.Errorf("a refused command printed %q", out)
			}
			if _, err := os.Stat(filepath.Dir(store)); !os.IsNotExist(err) {
				t.Fatalf("the refused command made the store's directory: %v", err)
			}
		})
	}

	t.Run("auto over http, cimd over https", func(t *testing.T) {
		if out, err := serve("http://127.0.0.1:8080", "--providers", auto, "--check-config"); err != nil || out != "configuration OK: 2 provider(s): notion, plain\n" {
			t.Errorf("registration auto with an http document URL: %v\n%s", err, out)
		}
		if out, err := serve("https://broker.example.com", "--providers", cimd, "--check-config"); err != nil || out != "configuration OK: 3 provider(s): linear, notion, wiki\n" {
			t.Errorf("registration cimd with the https default: %v\n%s", err, out)
		}
		if out, err := serve("http://127.0.0.1:8080", "--providers", cimd, "--check-config", "--client-metadata-url", "https://broker.example.com/cimd.json"); err != nil || out != "configuration OK: 3 provider(s): linear, notion, wiki\n" {
			t.Errorf("registration cimd with an https --client-metadata-url: %v\n%s", err, out)
		}
		if _, err := os.Stat(filepath.Dir(store)); !os.IsNotExist(err) {
			t.Fatalf("--check-config made the store's directory: %v", err)
		}
	})

	t.Run("broker dev's catalogue", func(t *testing.T) {
		const base = "http://127.0.0.1:8080"
		reg, err := provider.ParseProviders("dev providers", []byte(devProviders(base)), func(string) string { return "demo-secret" })
		if err != nil {
			t.Fatal(err)
		}
		uc := upstreamConfig{AllowPrivate: true, MaxCallTimeout: provider.MaxCallTimeout}
		if problems := uc.checkProviders(reg, base); len(problems) != 0 {
			t.Fatalf("broker dev's own catalogue: %v", problems)
		}
	})
}
