package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/loopback"
	"credbroker/internal/testskip"
	"credbroker/vault"
)

// The gateway against the MCP conformance suite's client scenarios: the
// broker is the client under test. For each scenario the suite starts its
// mock MCP server (and, for auth/*, its mock authorization server) and
// runs --command with the server's URL; the command is this test binary
// again (gatewayHelperEnv set), which hands the scenario to the running
// test over loopback and prints what happened. The test writes a
// providers.yaml whose entry conf is that URL (type: mcp), starts `broker
// serve` with it, and acts as a person's MCP host at /mcp/u/conf
// (gatewayHost): it connects through the connect link (the development
// IdP's sign-in, the broker's consent, the mock authorization server),
// retries, lists the upstream's tools and calls them. The suite judges
// what reached its mock servers: the broker's discovery, registration,
// token requests and relayed calls.

// gatewayClientVersion is the protocol version the client scenarios run
// at (the suite's requirement set of that revision).
const gatewayClientVersion = "2026-07-28"

// gatewayClientOthers are the client scenarios besides every auth/* one
// that TestGatewayConformanceClient runs: all must be in the suite's
// requirement set.
var gatewayClientOthers = []string{"sep-2322-client-request-state", "http-standard-headers", "http-custom-headers",
	"http-invalid-tool-headers", "request-metadata", "tools_call", "json-schema-ref-no-deref"}

// gatewayClientConcurrency is how many client scenarios run at a time.
const gatewayClientConcurrency = 4

// gatewayHelperEnv, when set in a test binary's environment, makes it the
// suite's --command: it posts the scenario to the control URL the variable
// holds and prints the answer (see TestMain).
const gatewayHelperEnv = "CREDBROKER_GATEWAY_CONFORMANCE_CONTROL"

// gatewayScenarioRequest is what the helper hands the test: the scenario,
// its context and the mock server's URL.
type gatewayScenarioRequest struct {
	Scenario string          `json:"scenario"`
	URL      string          `json:"url"`
	Context  json.RawMessage `json:"context,omitempty"`
	Version  string          `json:"version"`
}

// gatewayScenarioAnswer is the test's answer to the helper.
type gatewayScenarioAnswer struct {
	OK         bool   `json:"ok"`
	Transcript string `json:"transcript"`
}

// gatewayHelperMain is the test binary as the suite's --command: the last
// argument is the mock server's URL.
func gatewayHelperMain(control string, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "gateway conformance helper: no server URL")
		return 2
	}
	req, err := json.Marshal(gatewayScenarioRequest{Scenario: os.Getenv("MCP_CONFORMANCE_SCENARIO"), URL: args[len(args)-1],
		Context: json.RawMessage(os.Getenv("MCP_CONFORMANCE_CONTEXT")), Version: os.Getenv("MCP_CONFORMANCE_PROTOCOL_VERSION")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway conformance helper: MCP_CONFORMANCE_CONTEXT:", err)
		return 2
	}
	resp, err := http.Post(control, "application/json", bytes.NewReader(req))
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway conformance helper:", err)
		return 1
	}
	defer resp.Body.Close()
	var a gatewayScenarioAnswer
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		fmt.Fprintln(os.Stderr, "gateway conformance helper: answer:", err)
		return 1
	}
	fmt.Print(a.Transcript)
	if !a.OK {
		return 1
	}
	return 0
}

// gatewayClientRig is what the scenarios share: the development IdP, the
// broker binary, and each scenario's outcome for its subtest.
type gatewayClientRig struct {
	broker string
	idp    *devidp.IdP

	mu      sync.Mutex // guards the fields below
	n       int
	results map[string]*gatewayScenarioResult
}

// gatewayScenarioResult is one scenario's run as the test saw it.
type gatewayScenarioResult struct {
	transcript string
	brokerLog  string
	err        error
	elapsed    time.Duration
}

// TestGatewayConformanceClient runs the pinned conformance suite's client
// scenarios of the 2026-07-28 requirement set (every auth/* one and those
// in gatewayClientOthers) with the gateway as the client under test (see
// above). Every check must pass or be listed, with its reason, in
// testdata/conformance/expected-failures-gateway-client.yaml; a listed
// check that passes or is no longer reported is stale and fails the test.
func TestGatewayConformanceClient(t *testing.T) {
	testskip.Short(t, "conformance suite")
	t.Parallel()
	root, _ := filepath.Abs("../..")
	node, suite := conformanceSuite(t, root)
	versions := []string{gatewayClientVersion}
	baseline := loadConformanceBaseline(t, filepath.Join(root, "testdata", "conformance", "expected-failures-gateway-client.yaml"), versions)
	scenarios, extension := gatewayClientScenarios(t, suite)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(self, " \t'\"") {
		t.Fatalf("the test binary's path %q has characters the suite's --command cannot carry", self)
	}
	broker, _ := binaries(t)
	rig := &gatewayClientRig{broker: broker, results: map[string]*gatewayScenarioResult{},
		idp: devidptest.Start(t, []devidp.User{{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"}}, nil)}
	control := httptest.NewServer(http.HandlerFunc(rig.serveScenario))
	t.Cleanup(control.Close)

	// Each scenario's subtest starts the suite for it and waits in
	// parallel with the others: gatewayClientConcurrency runs at a time,
	// whatever -parallel says, since each mostly waits for processes to
	// start and answer. The baseline's left-overs are judged once all have
	// run.
	results := t.TempDir()
	t.Cleanup(func() {
		baseline.leftOver(t, func(version, scenario string) bool {
			return version == gatewayClientVersion && slices.Contains(scenarios, scenario)
		})
	})
	ctx := testContext(t, 10*time.Minute)
	slots := make(chan struct{}, gatewayClientConcurrency)
	type suiteRun struct {
		output []byte
		err    error
	}
	for _, s := range scenarios {
		t.Run(s, func(t *testing.T) {
			out := filepath.Join(results, strings.ReplaceAll(s, "/", "-"))
			args := []string{suite, "client", "--command", self, "--scenario", s, "--spec-version", gatewayClientVersion,
				"--timeout", "90000", "-o", out}
			if extension[s] {
				// Extensions are on no version's timeline: run at 2026-07-28.
				args = append(args, "--force")
			}
			done := make(chan suiteRun, 1)
			go func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
				defer cancel()
				cmd := exec.CommandContext(sctx, node, args...)
				cmd.Env = append(os.Environ(), gatewayHelperEnv+"="+control.URL)
				output, err := cmd.CombinedOutput()
				done <- suiteRun{output, err}
			}()
			t.Parallel()
			run := <-done
			output, runErr := run.output, run.err
			if bytes.Contains(output, []byte("SKIPPED: scenario")) {
				t.Fatalf("the suite did not run scenario %s:\n%s", s, output)
			}
			rig.mu.Lock()
			r := rig.results[s]
			rig.mu.Unlock()
			if r == nil {
				t.Fatalf("the suite never ran the helper for %s (exit: %v):\n%s", s, runErr, output)
			}
			t.Logf("%s: the host took %s: %v", s, r.elapsed.Round(time.Millisecond), r.err)
			// The suite names the result directory <scenario>-<time>.
			checks, err := readConformanceChecks(filepath.Join(out, s+"-[0-9]*"))
			if err != nil {
				t.Fatalf("scenario %s: %v (exit: %v)\n%s\nhost:\n%s\nbroker log:\n%s", s, err, runErr, output, r.transcript, r.brokerLog)
			}
			baseline.compare(t, gatewayClientVersion, s, checks)
			if t.Failed() {
				t.Logf("suite output:\n%s\nhost:\n%s\nbroker log:\n%s", output, r.transcript, r.brokerLog)
			}
		})
	}
}

// gatewayClientScenarios reads the suite's requirement set for
// gatewayClientVersion and returns the client scenarios to run: every
// auth/* one (scored or not) and gatewayClientOthers, sorted, and which
// of them are extensions.
func gatewayClientScenarios(t *testing.T, suite string) ([]string, map[string]bool) {
	t.Helper()
	path := filepath.Join(filepath.Dir(filepath.Dir(suite)), "requirements", gatewayClientVersion+".yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var req struct {
		Client    []string `yaml:"client"`
		NotScored []struct {
			Scenario string `yaml:"scenario"`
			Leg      string `yaml:"leg"`
			Reason   string `yaml:"reason"`
		} `yaml:"not_scored"`
	}
	if err := yaml.Unmarshal(b, &req); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	all := slices.Clone(req.Client)
	extension := map[string]bool{}
	for _, n := range req.NotScored {
		if n.Leg == "client" {
			all = append(all, n.Scenario)
			extension[n.Scenario] = n.Reason == "extension"
		}
	}
	var out []string
	for _, s := range all {
		if strings.HasPrefix(s, "auth/") || slices.Contains(gatewayClientOthers, s) {
			out = append(out, s)
		}
	}
	for _, s := range gatewayClientOthers {
		if !slices.Contains(all, s) {
			t.Errorf("gatewayClientOthers names %s, which %s does not list", s, path)
		}
	}
	if len(out) < 20 {
		t.Fatalf("%s lists only %d of the client scenarios to run: %v", path, len(out), out)
	}
	slices.Sort(out)
	return out, extension
}

// serveScenario runs the scenario the helper posts and answers with the
// host's transcript.
func (rig *gatewayClientRig) serveScenario(w http.ResponseWriter, r *http.Request) {
	var req gatewayScenarioRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Scenario == "" || req.URL == "" {
		http.Error(w, "want a scenario and a URL", http.StatusBadRequest)
		return
	}
	start := time.Now()
	res := rig.runScenario(r.Context(), req)
	res.elapsed = time.Since(start)
	rig.mu.Lock()
	rig.results[req.Scenario] = res
	rig.mu.Unlock()
	a := gatewayScenarioAnswer{OK: res.err == nil, Transcript: res.transcript}
	if res.err != nil {
		a.Transcript += "error: " + res.err.Error() + "\n"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(a)
}

// runScenario configures a broker for the scenario's server, starts it,
// and runs the host against its endpoint.
func (rig *gatewayClientRig) runScenario(ctx context.Context, req gatewayScenarioRequest) *gatewayScenarioResult {
	ctx, cancel := context.WithTimeout(ctx, 80*time.Second)
	defer cancel()
	res := &gatewayScenarioResult{}
	var sc struct {
		ClientID     string            `json:"client_id"`
		ClientSecret string            `json:"client_secret"`
		ToolCalls    []gatewayToolCall `json:"toolCalls"`
	}
	if len(req.Context) > 0 {
		if err := json.Unmarshal(req.Context, &sc); err != nil {
			res.err = fmt.Errorf("MCP_CONFORMANCE_CONTEXT: %w", err)
			return res
		}
	}
	rig.mu.Lock()
	rig.n++
	clientID := fmt.Sprintf("credbroker-%d", rig.n)
	rig.mu.Unlock()

	oauth := strings.HasPrefix(req.Scenario, "auth/")
	// The host declares every kind of input; the entry relays all of them
	// (roots only when listed).
	entry := "providers:\n  conf:\n    display_name: Conformance server\n    type: mcp\n    mcp:\n      url: " + req.URL +
		"\n      call_timeout: 30s\n      input_requests: [elicitation, sampling, roots]\n"
	if !oauth {
		entry += "      auth: none\n"
	}
	env := []string{"BROKER_CLIENT_SECRET=idp-secret", "BROKER_STORE=", "BROKER_KEYS_FILE=", "BROKER_CLIENT_METADATA_URL="}
	if sc.ClientID != "" && oauth {
		// A client the suite's authorization server knows (auth/pre-
		// registration), configured as an operator would.
		entry += "    client_id: " + sc.ClientID + "\n"
		if sc.ClientSecret != "" {
			entry += "    client_secret: ${CONF_CLIENT_SECRET}\n"
			env = append(env, "CONF_CLIENT_SECRET="+sc.ClientSecret)
		}
	}
	dir, err := os.MkdirTemp("", "credbroker-gwconf-")
	if err != nil {
		res.err = err
		return res
	}
	defer os.RemoveAll(dir)
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, []byte(entry), 0o600); err != nil {
		res.err = err
		return res
	}
	keys, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		res.err = err
		return res
	}
	addr, err := loopback.FreeAddr()
	if err != nil {
		res.err = err
		return res
	}
	public := "http://" + addr
	if err := rig.idp.AddClient(devidp.Client{ID: clientID, Secret: "idp-secret", RedirectURIs: []string{public + "/auth/callback"}}); err != nil {
		res.err = err
		return res
	}
	args := []string{"--public-url", public, "--issuer", rig.idp.Issuer(), "--client-id", clientID, "--providers", providers,
		"--store", "bolt:" + filepath.Join(dir, "broker.db"), "--log-format", "json",
		"--upstream-allow-private", "--upstream-allow-unauthenticated"}
	if req.Scenario == "auth/basic-cimd" {
		// The suite's authorization server takes this client id as the
		// broker's Client ID Metadata Document (it fetches nothing).
		args = append(args, "--client-metadata-url", "https://conformance-test.local/client-metadata.json")
	}
	proc, err := launchServe(rig.broker, req.Scenario, addr, args, append(env, "BROKER_KEYS="+keys.Format()))
	if proc != nil {
		defer func() {
			proc.stop(20 * time.Second)
			res.brokerLog = proc.logs.String()
			if strings.Contains(res.brokerLog, "WARNING: DATA RACE") && res.err == nil {
				res.err = errors.New("the broker reported a data race")
			}
		}()
	}
	if err != nil {
		res.err = err
		return res
	}
	endpoint := public + "/mcp/u/conf"
	h := newGatewayHost(endpoint, "alice")
	defer func() { res.transcript = h.Transcript() }()
	if h.bearer, err = h.hostToken(ctx, public, endpoint); err != nil {
		res.err = err
		return res
	}
	res.err = h.run(ctx, oauth, sc.ToolCalls)
	return res
}
