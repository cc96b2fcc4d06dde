package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"credbroker/internal/testskip"
)

// conformanceAuthVersion is the protocol version the authorization
// server's scenarios run at.
const conformanceAuthVersion = "2026-07-28"

// TestConformanceAuthorizationServer runs the official MCP conformance
// suite's authorization-server scenarios (authorization-server-metadata-
// endpoint, authorization-code-grant) against `broker dev`'s authorization
// server. The code grant scenario prints an authorization URL for a person
// to open; headless Chromium signs alice in at the development IdP and
// allows the client, whose redirect URI is the suite's loopback callback.
// The client is registered through the broker's dynamic registration.
//
// The suite's exit status says only whether a check reported FAILURE, so
// the test reads the checks each scenario recorded instead, as
// TestConformance does: every scenario the suite lists must have run, and
// every check must pass or be listed in
// testdata/conformance/expected-failures-authorization.yaml with its
// reason (a listed check that passes is stale and fails the test).
func TestConformanceAuthorizationServer(t *testing.T) {
	testskip.Short(t, "conformance suite")
	t.Parallel()
	root, _ := filepath.Abs("../..")
	node, suite := conformanceSuite(t, root)
	versions := []string{conformanceAuthVersion}
	baseline := loadConformanceBaseline(t, filepath.Join(root, "testdata", "conformance", "expected-failures-authorization.yaml"), versions)
	scenarios := listConformanceScenarios(t, node, suite, "--authorization", 2)
	d := startDev(t, freeAddr(t), t.TempDir())
	person := personBrowser(t, newBrowser(t))
	ctx := testContext(t, 3*time.Minute)

	_, portStr, _ := net.SplitHostPort(freeAddr(t))
	port, _ := strconv.Atoi(portStr)
	reg, _ := json.Marshal(map[string]any{
		"redirect_uris": []string{"http://127.0.0.1:" + portStr + "/callback"}, "token_endpoint_auth_method": "none",
		"client_name": "MCP conformance suite", "application_type": "native",
	})
	resp, err := http.Post(d.BaseURL+"/register", "application/json", strings.NewReader(string(reg)))
	if err != nil {
		t.Fatal(err)
	}
	var client struct {
		ClientID string `json:"client_id"`
	}
	json.NewDecoder(resp.Body).Decode(&client)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || client.ClientID == "" {
		t.Fatalf("registration: HTTP %d", resp.StatusCode)
	}

	results := t.TempDir()
	cmd := exec.CommandContext(ctx, node, suite, "authorization", "--url", d.BaseURL, "--client-id", client.ClientID,
		"--resource", d.BaseURL+"/mcp", "--port", strconv.Itoa(port), "--spec-version", conformanceAuthVersion, "-o", results)
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	browsed := false
	sc := bufio.NewScanner(io.TeeReader(stdout, &out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, d.BaseURL+"/authorize?") && !browsed {
			browsed = true
			if err := signInAndAllow(person, line, "alice", "OK. You can close this page."); err != nil {
				cmd.Process.Kill()
				t.Fatalf("%v\nsuite output:\n%s\nbroker log:\n%s", err, out.String(), d.Stderr())
			}
		}
	}
	err = cmd.Wait()
	t.Logf("%s", out.String())
	if !browsed {
		t.Fatalf("the suite never printed an authorization URL (exit: %v):\n%s\n%s\nbroker log:\n%s", err, out.String(), stderr.String(), d.Stderr())
	}
	// The exit status is not the verdict (it ignores warnings and skipped
	// checks, and a failure the baseline expects makes it non-zero): the
	// checks are.
	t.Logf("the suite exited with %v", err)
	var names []string
	for s, vs := range scenarios {
		if slices.Contains(vs, conformanceAuthVersion) {
			names = append(names, s)
		}
	}
	slices.Sort(names)
	for _, s := range names {
		t.Run(s, func(t *testing.T) {
			checks, err := readConformanceChecks(filepath.Join(results, "authorization-server-"+s+"-[0-9]*"))
			if err != nil {
				t.Fatalf("scenario %s: %v\n%s\n%s\nbroker log:\n%s", s, err, out.String(), stderr.String(), d.Stderr())
			}
			baseline.compare(t, conformanceAuthVersion, s, checks)
		})
	}
	baseline.leftOver(t, func(version, scenario string) bool {
		return slices.Contains(scenarios[scenario], version)
	})
}
