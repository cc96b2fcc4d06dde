package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/demomcp"
	"credbroker/vault"
)

// openUpstream is a go-sdk MCP server that takes no token (an auth: none
// entry's), speaking both eras or, legacy, 2025-11-25 only; hits counts
// the requests it got.
type openUpstream struct {
	url  string
	hits atomic.Int64
}

func startOpenUpstream(t *testing.T, legacy bool) *openUpstream {
	t.Helper()
	opts := &mcp.ServerOptions{}
	if legacy {
		opts.SupportedProtocolVersions = []string{"2025-11-25"}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "open", Version: "1"}, opts)
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + string(req.Params.Arguments)}}}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: !legacy, JSONResponse: true, DisableLocalhostProtection: true})
	u := &openUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	u.url = srv.URL + "/mcp"
	return u
}

// checkRows splits `broker upstreams check` output into its rows' columns
// (the tabwriter pads columns with two spaces or more; a column has single
// spaces at most), by provider; header is the first line's.
func checkRows(t *testing.T, out string) (header []string, rows map[string][]string) {
	t.Helper()
	sep := regexp.MustCompile(`\s{2,}`)
	rows = map[string][]string{}
	for i, l := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		cols := sep.Split(strings.TrimRight(l, " "), -1)
		if i == 0 {
			header = cols
			continue
		}
		rows[cols[0]] = cols
	}
	return header, rows
}

// clearBrokerEnv keeps the developer's environment out of the commands'
// defaults.
func clearBrokerEnv(t *testing.T) {
	for _, k := range []string{"BROKER_CLIENT_METADATA_URL", "BROKER_PUBLIC_URL", "BROKER_PROVIDERS", "BROKER_STORE", "BROKER_KEYS_FILE"} {
		t.Setenv(k, "")
	}
}

// TestUpstreamsCheckOutput: `broker upstreams check` against real
// upstreams over loopback prints, per type: mcp entry, its URL, its
// authorization server's issuer, the registration the broker would use
// (dcr at the demo authorization server, which registers clients; static
// with a client_id), the scopes a connect asks for (those the server's
// challenge names, or the entry's default_scopes) and the era the server
// speaks (2026-07-28 or 2025-11-25 for servers that take no token; an
// OAuth-protected one needs a connection to tell). It registers nothing.
// An auth: none server nobody answers at gets a row that says why, the
// other entries are still checked and printed, and the command exits 1;
// without it the same entries exit 0.
func TestUpstreamsCheckOutput(t *testing.T) {
	up := startDemoUpstream(t)
	modern, legacy := startOpenUpstream(t, false), startOpenUpstream(t, true)
	gone := "http://" + freeAddr(t) + "/mcp" // a closed loopback port
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	yaml := strings.NewReplacer("{{NOTES}}", up.mcp.URL(), "{{MODERN}}", modern.url, "{{LEGACY}}", legacy.url, "{{GONE}}", gone).Replace(`providers:
  gone:
    type: mcp
    mcp: {url: {{GONE}}, auth: none}
  legacy:
    type: mcp
    mcp: {url: {{LEGACY}}, auth: none}
  modern:
    type: mcp
    mcp: {url: {{MODERN}}, auth: none}
  notes:
    display_name: Notes
    type: mcp
    mcp:
      url: {{NOTES}}
  notes-read:
    type: mcp
    mcp:
      url: {{NOTES}}
    client_id: broker-static
    default_scopes: [notes:write, notes:read]
`)
	if err := os.WriteFile(providers, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	clearBrokerEnv(t)
	check := func(args ...string) (string, string, error) {
		t.Helper()
		return runCmd(t, append([]string{"upstreams", "check", "--providers", providers, "--upstream-allow-private", "--upstream-allow-unauthenticated"}, args...)...)
	}

	out, errOut, err := check()
	if err == nil || err.Error() != "1 of 5 upstream(s) failed the check" || exitCode(err) != 1 {
		t.Fatalf("with an unreachable auth: none server: %v (exit %d), want 1 of 5 failed, exit 1\n%s%s", err, exitCode(err), out, errOut)
	}
	header, rows := checkRows(t, out)
	if want := []string{"PROVIDER", "URL", "ISSUER", "REGISTRATION", "SCOPES", "ERA"}; !slices.Equal(header, want) {
		t.Fatalf("header %q, want %q\n%s", header, want, out)
	}
	issuer := up.demo.Issuer()
	for name, want := range map[string][]string{
		"notes":      {"notes", up.mcp.URL(), issuer, "dcr", demomcp.ScopeRead, "(needs a connection to tell)"},
		"notes-read": {"notes-read", up.mcp.URL(), issuer, "static", demomcp.ScopeWrite + " " + demomcp.ScopeRead, "(needs a connection to tell)"},
		"modern":     {"modern", modern.url, "(auth: none)", "-", "-", "2026-07-28"},
		"legacy":     {"legacy", legacy.url, "(auth: none)", "-", "-", "2025-11-25"},
	} {
		if !slices.Equal(rows[name], want) {
			t.Errorf("row of %s:\n got %q\nwant %q\n%s", name, rows[name], want, out)
		}
	}
	if g := rows["gone"]; len(g) != 6 || !slices.Equal(g[:5], []string{"gone", gone, "(auth: none)", "-", "-"}) ||
		!strings.HasPrefix(g[5], "error: ") || !strings.Contains(g[5], "connection refused") {
		t.Errorf("row of the unreachable server %q: want its ERA to say it refused the connection\n%s", g, out)
	}
	if len(rows) != 5 {
		t.Errorf("%d rows, want one per entry:\n%s", len(rows), out)
	}
	for _, e := range up.demo.Events() {
		if e.Kind == "register" {
			t.Errorf("upstreams check registered a client: %+v", e)
		}
	}

	t.Run("every server answers", func(t *testing.T) {
		for _, name := range []string{"modern", "legacy", "notes"} {
			out, errOut, err := check(name)
			if _, rows := checkRows(t, out); err != nil || len(rows) != 1 || rows[name] == nil {
				t.Errorf("upstreams check %s: %v\n%s%s", name, err, out, errOut)
			}
		}
	})
	t.Run("the provider before the flags", func(t *testing.T) {
		out, errOut, err := runCmd(t, "upstreams", "check", "modern", "--providers", providers, "--upstream-allow-private", "--upstream-allow-unauthenticated")
		if _, rows := checkRows(t, out); err != nil || len(rows) != 1 || rows["modern"] == nil {
			t.Errorf("upstreams check modern --providers …: %v\n%s%s", err, out, errOut)
		}
	})
	t.Run("only the unreachable server", func(t *testing.T) {
		out, _, err := check("gone")
		if _, rows := checkRows(t, out); err == nil || err.Error() != "1 of 1 upstream(s) failed the check" || exitCode(err) != 1 || rows["gone"] == nil {
			t.Errorf("upstreams check gone: %v (exit %d), want 1 of 1 failed with its row\n%s", err, exitCode(err), out)
		}
	})
}

// TestUpstreamsCheckRunsServeChecks: `broker upstreams check` refuses
// what `broker serve` refuses to start with, with serve's messages, exit 1,
// before it asks any server or prints a row: an auth: none entry without
// --upstream-allow-unauthenticated, an mcp.call_timeout over
// --upstream-max-call-timeout (at its providers.yaml line). With the flags
// that let serve start, it checks the entries; `upstreams check PROVIDER`
// refuses only for that entry's problems.
func TestUpstreamsCheckRunsServeChecks(t *testing.T) {
	open := startOpenUpstream(t, false)
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	yaml := strings.ReplaceAll(`providers:
  open:
    type: mcp
    mcp: {url: {{OPEN}}, auth: none}
  slow:
    type: mcp
    mcp:
      url: {{OPEN}}
      auth: none
      call_timeout: 5m
`, "{{OPEN}}", open.url)
	if err := os.WriteFile(providers, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	broker := brokerCLI(t)
	store := filepath.Join(dir, "data", "broker.db")
	serve := func(args ...string) (string, error) {
		return broker(append([]string{"serve", "--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--store", "bolt:" + store, "--addr", "127.0.0.1:0", "--check-config", "--providers", providers}, args...)...)
	}
	check := func(args ...string) (string, error) {
		return broker(append([]string{"upstreams", "check", "--public-url", "https://broker.example.com", "--providers", providers, "--upstream-allow-private"}, args...)...)
	}
	unauth := func(name string) string {
		return "provider " + name + ": auth: none relays every signed-in person's calls to " + open.url + " with no account of theirs; start the broker with --upstream-allow-unauthenticated to allow it"
	}
	slow := providers + ":10: slow: mcp.call_timeout 5m0s is over --upstream-max-call-timeout 1m0s; lower mcp.call_timeout or raise --upstream-max-call-timeout"

	for _, c := range []struct {
		name  string
		flags []string
		only  string // upstreams check PROVIDER
		want  string
	}{
		{"no flags", nil, "", "configuration has problems:\n" + unauth("open") + "\n" + unauth("slow")},
		{"call_timeout over the maximum", []string{"--upstream-allow-unauthenticated", "--upstream-max-call-timeout", "1m"}, "",
			"configuration has problems:\n" + slow},
		{"both", []string{"--upstream-max-call-timeout", "1m"}, "",
			"configuration has problems:\n" + unauth("open") + "\n" + unauth("slow") + "\n" + slow},
		{"one entry", []string{"--upstream-max-call-timeout", "1m"}, "open", "configuration has problems:\n" + unauth("open")},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, serr := serve(c.flags...)
			if serr == nil || exitCode(serr) != 1 {
				t.Fatalf("serve --check-config %q started: %v", c.flags, serr)
			}
			args := c.flags
			if c.only != "" {
				args = append(slices.Clone(args), c.only)
			} else if serr.Error() != c.want {
				t.Fatalf("serve --check-config %q: %v\nwant:\n%s", c.flags, serr, c.want)
			}
			before := open.hits.Load()
			out, err := check(args...)
			if err == nil || err.Error() != c.want || exitCode(err) != 1 {
				t.Fatalf("upstreams check %q: %v (exit %d)\nwant:\n%s", args, err, exitCode(err), c.want)
			}
			if out != "" || open.hits.Load() != before {
				t.Errorf("a refused check printed %q and asked the server %d times", out, open.hits.Load()-before)
			}
		})
	}
	if _, err := os.Stat(filepath.Dir(store)); !os.IsNotExist(err) {
		t.Fatalf("a refused serve made the store's directory: %v", err)
	}

	t.Run("the flags serve starts with", func(t *testing.T) {
		flags := []string{"--upstream-allow-unauthenticated", "--upstream-max-call-timeout", "5m"}
		if out, err := serve(flags...); err != nil || out != "configuration OK: 2 provider(s): open, slow\n" {
			t.Fatalf("serve --check-config %q: %v\n%s", flags, err, out)
		}
		out, err := check(flags...)
		if _, rows := checkRows(t, out); err != nil || len(rows) != 2 || len(rows["slow"]) != 6 || rows["slow"][5] != "2026-07-28" {
			t.Fatalf("upstreams check %q: %v\n%s", flags, err, out)
		}
		if out, err := check("--upstream-max-call-timeout", "1m", "--upstream-allow-unauthenticated", "open"); err != nil || !strings.Contains(out, "\nopen ") {
			t.Fatalf("upstreams check open, whose entry sets no call_timeout, under a 1m maximum: %v\n%s", err, out)
		}
	})
}

// TestUpstreamMaxCallTimeout: --upstream-max-call-timeout takes 1s to 10m
// (serve: a configuration problem, exit 1; upstreams check: a usage error,
// exit 2). Under it, an entry whose mcp.call_timeout is longer is refused
// at start-up, named at its line of providers.yaml (block or flow style),
// by serve and upstreams check alike; an entry that sets no call_timeout
// is not refused (its default, 120s, is lowered to the maximum), nor is
// one within it.
func TestUpstreamMaxCallTimeout(t *testing.T) {
	dir := t.TempDir()
	write := func(name, yaml string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	timeouts := write("providers.yaml", `providers:
  flow: {type: mcp, mcp: {url: 'https://flow.example.com/mcp', call_timeout: 3m}}
  plain:
    display_name: Plain
    type: mcp
    mcp:
      url: https://plain.example.com/mcp
  quick:
    type: mcp
    mcp:
      url: https://quick.example.com/mcp
      call_timeout: 30s
  slow:
    type: mcp
    mcp:
      url: https://slow.example.com/mcp
      call_timeout: 5m
`)
	unset := write("unset.yaml", "providers:\n  plain:\n    type: mcp\n    mcp:\n      url: https://plain.example.com/mcp\n  quick:\n    type: mcp\n    mcp: {url: 'https://quick.example.com/mcp', call_timeout: 30s}\n")
	broker := brokerCLI(t)
	store := filepath.Join(dir, "data", "broker.db")
	serve := func(file string, args ...string) (string, error) {
		return broker(append([]string{"serve", "--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--store", "bolt:" + store, "--addr", "127.0.0.1:0", "--check-config", "--providers", file}, args...)...)
	}

	t.Run("the flag's range", func(t *testing.T) {
		for _, v := range []string{"0s", "500ms", "10m1s", "1h"} {
			want := "--upstream-max-call-timeout " + map[string]string{"0s": "0s", "500ms": "500ms", "10m1s": "10m1s", "1h": "1h0m0s"}[v] + ": must be between 1s and 10m0s"
			if _, err := serve(unset, "--upstream-max-call-timeout", v); err == nil || err.Error() != "configuration has problems:\n"+want || exitCode(err) != 1 {
				t.Errorf("serve --upstream-max-call-timeout %s: %v (exit %d), want %q", v, err, exitCode(err), want)
			}
			if out, err := broker("upstreams", "check", "--providers", unset, "--upstream-max-call-timeout", v); err == nil || err.Error() != want || exitCode(err) != 2 || out != "" {
				t.Errorf("upstreams check --upstream-max-call-timeout %s: %v (exit %d)\n%s\nwant %q, exit 2", v, err, exitCode(err), out, want)
			}
		}
		for _, v := range []string{"1s", "10m"} {
			// 1s: plain's default is lowered; quick's 30s is over it.
			out, err := serve(unset, "--upstream-max-call-timeout", v)
			if v == "10m" && (err != nil || out != "configuration OK: 2 provider(s): plain, quick\n") {
				t.Errorf("serve --upstream-max-call-timeout %s: %v\n%s", v, err, out)
			}
			if v == "1s" && (err == nil || err.Error() != "configuration has problems:\n"+unset+":8: quick: mcp.call_timeout 30s is over --upstream-max-call-timeout 1s; lower mcp.call_timeout or raise --upstream-max-call-timeout") {
				t.Errorf("serve --upstream-max-call-timeout %s: %v", v, err)
			}
		}
	})

	t.Run("entries over the maximum", func(t *testing.T) {
		const fix = "; lower mcp.call_timeout or raise --upstream-max-call-timeout"
		want := "configuration has problems:\n" +
			timeouts + ":2: flow: mcp.call_timeout 3m0s is over --upstream-max-call-timeout 1m0s" + fix + "\n" +
			timeouts + ":17: slow: mcp.call_timeout 5m0s is over --upstream-max-call-timeout 1m0s" + fix
		if out, err := serve(timeouts, "--upstream-max-call-timeout", "1m"); err == nil || err.Error() != want || exitCode(err) != 1 || out != "" {
			t.Errorf("serve: %v (exit %d)\n%s\nwant:\n%s", err, exitCode(err), out, want)
		}
		if out, err := broker("upstreams", "check", "--providers", timeouts, "--upstream-max-call-timeout", "1m"); err == nil || err.Error() != want || exitCode(err) != 1 || out != "" {
			t.Errorf("upstreams check: %v (exit %d)\n%s\nwant:\n%s", err, exitCode(err), out, want)
		}
		if out, err := serve(timeouts, "--upstream-max-call-timeout", "5m"); err != nil || out != "configuration OK: 4 provider(s): flow, plain, quick, slow\n" {
			t.Errorf("serve under a 5m maximum: %v\n%s", err, out)
		}
	})

	t.Run("an entry without call_timeout", func(t *testing.T) {
		// The default, 2m, is over these maximums: it is lowered, not
		// refused.
		for _, max := range []string{"1m", "31s"} {
			if out, err := serve(unset, "--upstream-max-call-timeout", max); err != nil || out != "configuration OK: 2 provider(s): plain, quick\n" {
				t.Errorf("serve --upstream-max-call-timeout %s: %v\n%s", max, err, out)
			}
		}
	})
	if _, err := os.Stat(filepath.Dir(store)); !os.IsNotExist(err) {
		t.Fatalf("--check-config made the store's directory: %v", err)
	}
}

// brokerCLI runs the broker's command line in this process, its
// environment cleared but for fresh keys and a client secret, and returns
// what it printed on stdout.
func brokerCLI(t *testing.T) func(args ...string) (string, error) {
	t.Helper()
	clearBrokerEnv(t)
	t.Setenv("BROKER_KEYS", vault.GenerateKey())
	t.Setenv("BROKER_CLIENT_SECRET", "s3cret-value")
	return func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		err := run(ctx, args, &out, &errOut)
		return out.String(), err
	}
}
