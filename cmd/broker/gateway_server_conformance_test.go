package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/vault"
)

// gatewayServerVersions are the requirement sets the server suite runs,
// each against the go-sdk's everything-server in the mode that serves that
// wire: stateless for 2026-07-28, with sessions for 2025-11-25.
var gatewayServerVersions = []struct{ version, flag string }{
	{"2026-07-28", "-stateless=true"},
	{"2025-11-25", "-stateless=false"},
}

// TestGatewayConformanceServer runs the pinned conformance suite's server
// scenarios of each requirement set in gatewayServerVersions twice: against
// the go-sdk's conformance everything-server directly, and through the
// gateway, the same server being a broker's type: mcp entry everything
// (auth: none) reached at /mcp/u/everything behind a loopback proxy that adds
// the person's bearer token (the suite sends none). Every check that passes
// directly must pass through the gateway too, or be listed with its reason
// in testdata/conformance/expected-failures-gateway-server.yaml; a listed
// check that passes through the gateway, or no longer passes directly, is
// stale and fails the test.
func TestGatewayConformanceServer(t *testing.T) {
	testskip.Short(t, "conformance suite")
	root, _ := filepath.Abs("../..")
	node, suite := conformanceSuite(t, root)
	var versions []string
	for _, v := range gatewayServerVersions {
		versions = append(versions, v.version)
	}
	baseline := loadConformanceBaseline(t, filepath.Join(root, "testdata", "conformance", "expected-failures-gateway-server.yaml"), versions)
	everything := everythingServerBinary(t)
	broker, _ := binaries(t)
	idp := devidptest.Start(t, []devidp.User{{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"}}, nil)
	ctx := testContext(t, 5*time.Minute)

	ran := map[string][]string{} // version -> scenarios that passed a check directly
	for _, v := range gatewayServerVersions {
		t.Run(v.version, func(t *testing.T) {
			upstream := startEverythingServer(t, everything, v.flag)
			endpoint := startGatewayFor(t, broker, idp, upstream)

			// The two runs are independent: the suite against the server,
			// and against the gateway relaying to the same server.
			var direct, relayed map[string][]conformanceCheck
			var directErr, relayedErr error
			var wg sync.WaitGroup
			wg.Go(func() { direct, directErr = runServerRequirements(ctx, node, suite, upstream, v.version, t.TempDir()) })
			wg.Go(func() {
				relayed, relayedErr = runServerRequirements(ctx, node, suite, endpoint, v.version, t.TempDir())
			})
			wg.Wait()
			if directErr != nil {
				t.Fatalf("directly: %v", directErr)
			}
			if relayedErr != nil {
				t.Fatalf("through the gateway: %v", relayedErr)
			}
			names := slices.Sorted(maps.Keys(direct))
			for _, s := range names {
				held := passedDirectly(direct[s], relayed[s])
				if len(held) == 0 {
					t.Logf("%s at %s: no check passes directly; nothing to hold the gateway to", s, v.version)
					continue
				}
				ran[v.version] = append(ran[v.version], s)
				t.Run(s, func(t *testing.T) { baseline.compare(t, v.version, s, held) })
			}
		})
	}
	baseline.leftOver(t, func(version, scenario string) bool { return slices.Contains(ran[version], scenario) })
}

// passedDirectly pairs each check that passed directly with the same
// check of the run through the gateway (matched by id, name and
// occurrence); one the gateway run did not report is a FAILURE.
func passedDirectly(direct, relayed []conformanceCheck) []conformanceCheck {
	type key struct {
		id, name string
		n        int
	}
	seen := map[[2]string]int{}
	keyOf := func(c conformanceCheck) key {
		k := [2]string{c.ID, c.Name}
		seen[k]++
		return key{c.ID, c.Name, seen[k]}
	}
	through := map[key]conformanceCheck{}
	for _, c := range relayed {
		through[keyOf(c)] = c
	}
	clear(seen)
	var out []conformanceCheck
	for _, c := range direct {
		k := keyOf(c)
		if c.Status != "SUCCESS" {
			continue
		}
		g, ok := through[k]
		if !ok {
			g = conformanceCheck{ID: c.ID, Name: c.Name, Status: "FAILURE", Description: c.Description,
				ErrorMessage: "passes directly, but the run through the gateway did not report it"}
		}
		out = append(out, g)
	}
	return out
}

// serverResultDir is a server scenario's result directory:
// server-<scenario>-<time>.
var serverResultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$`)

// runServerRequirements runs the suite's server scenarios of requirement
// set version against url, and returns each scenario's checks.
func runServerRequirements(ctx context.Context, node, suite, url, version, out string) (map[string][]conformanceCheck, error) {
	cmd := exec.CommandContext(ctx, node, suite, "server", "--url", url, "--requirements", version, "-o", out)
	b, runErr := cmd.CombinedOutput()
	entries, err := os.ReadDir(out)
	if err != nil {
		return nil, err
	}
	res := map[string][]conformanceCheck{}
	for _, e := range entries {
		m := serverResultDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		checks, err := readConformanceChecks(filepath.Join(out, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", m[1], err, b)
		}
		if _, dup := res[m[1]]; dup {
			return nil, fmt.Errorf("scenario %s ran twice", m[1])
		}
		res[m[1]] = checks
	}
	if len(res) < 20 {
		return nil, fmt.Errorf("the suite ran %d scenarios against %s (exit: %v):\n%s", len(res), url, runErr, b)
	}
	return res, nil
}

// everythingServerBinary builds the go-sdk's conformance everything-server
// from the module cache (the go-sdk version go.mod requires), once per run.
func everythingServerBinary(t *testing.T) string {
	t.Helper()
	binaries(t) // makes binDir
	everythingOnce.Do(func() {
		path := filepath.Join(binDir, "everything-server")
		out, err := exec.Command("go", "build", "-o", path, "github.com/modelcontextprotocol/go-sdk/conformance/everything-server").CombinedOutput()
		if err != nil {
			everythingErr = fmt.Errorf("go build everything-server: %v\n%s", err, out)
			return
		}
		everythingPath = path
	})
	if everythingErr != nil {
		t.Fatal(everythingErr)
	}
	return everythingPath
}

var (
	everythingOnce sync.Once
	everythingPath string
	everythingErr  error
)

// startEverythingServer runs the everything-server on a loopback port and
// returns its MCP URL once it accepts connections.
func startEverythingServer(t *testing.T, bin string, flags ...string) string {
	t.Helper()
	addr := freeAddr(t)
	logs := &logbuf.Buffer{}
	cmd := exec.Command(bin, append([]string{"-http=" + addr}, flags...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	// It logs before it listens: wait until it accepts a connection.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			t.Fatalf("everything-server exited at start:\n%s", logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("everything-server not listening on %s after 30s:\n%s", addr, logs.String())
		}
	}
	return "http://" + addr + "/mcp"
}

// startGatewayFor starts `broker serve` with one type: mcp entry,
// everything (auth: none, every kind of input relayed), for the server at
// upstream, behind a loopback proxy that adds alice's bearer token for the
// endpoint; the proxy is the broker's public URL, as a deployment's load
// balancer is. It returns the endpoint's URL.
func startGatewayFor(t *testing.T, broker string, idp *devidp.IdP, upstream string) string {
	t.Helper()
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	entry := "providers:\n  everything:\n    display_name: Everything\n    type: mcp\n    mcp:\n      url: " + upstream +
		"\n      auth: none\n      call_timeout: 60s\n      input_requests: [elicitation, sampling, roots]\n"
	if err := os.WriteFile(providers, []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	target, _ := url.Parse("http://" + addr)
	var token atomic.Value // string: alice's host's token, once it has one
	token.Store("")
	proxy := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) {
		pr.SetURL(target)
		pr.Out.Host = pr.In.Host // keep the Host the suite chose (DNS-rebinding scenario)
		if tok := token.Load().(string); tok != "" && pr.In.URL.Path == "/mcp/u/everything" {
			pr.Out.Header.Set("Authorization", "Bearer "+tok)
		}
	}}
	ps := httptest.NewUnstartedServer(wholeBody(proxy)) // its listener is bound: its URL is known
	public := "http://" + ps.Listener.Addr().String()
	if err := idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{public + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	args := []string{"--public-url", public, "--issuer", idp.Issuer(), "--client-id", devClientID, "--providers", providers,
		"--store", "bolt:" + filepath.Join(dir, "broker.db"), "--log-format", "json",
		"--upstream-allow-private", "--upstream-allow-unauthenticated"}
	env := []string{"BROKER_KEYS=" + keys.Format(), "BROKER_CLIENT_SECRET=idp-secret", "BROKER_STORE=", "BROKER_KEYS_FILE=",
		"BROKER_CLIENT_METADATA_URL="}
	proc := startServe(t, "gateway", addr, args, env)
	endpoint := public + "/mcp/u/everything"
	ps.Start()
	// The token is the one a host of alice's gets from the broker for this
	// endpoint (the proxy passes requests without one through as they
	// are).
	h := newGatewayHost(endpoint, "alice")
	tok, err := h.hostToken(testContext(t, time.Minute), public, endpoint)
	if err != nil {
		t.Fatalf("%v\n%s\nbroker log:\n%s", err, h.Transcript(), proc.logs.String())
	}
	token.Store(tok)
	t.Cleanup(ps.Close)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("broker log:\n%s", proc.logs.String())
		}
	})
	return endpoint
}
