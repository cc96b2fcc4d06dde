package main

import (
	"bufio"
	"credbroker/internal/testskip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestConformanceAuthorizationServer runs the official MCP conformance
// suite's authorization-server scenarios (authorization-server-metadata-
// endpoint, authorization-code-grant) against `broker dev`'s authorization
// server. The code grant scenario prints an authorization URL for a person
// to open; headless Chromium signs alice in at the development IdP and
// allows the client, whose redirect URI is the suite's loopback callback.
// The client is registered through the broker's dynamic registration.
func TestConformanceAuthorizationServer(t *testing.T) {
	testskip.Short(t, "conformance suite")
	root, _ := filepath.Abs("../..")
	dir := conformanceDir(root)
	node := pinnedNode(t, dir)
	suite := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	for _, p := range []string{node, suite} {
		if _, err := os.Stat(p); err != nil {
			testskip.Missing(t, "conformance suite", fmt.Sprintf("%s is not installed: run `make conformance-deps`", p))
			return
		}
	}
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

	cmd := exec.CommandContext(ctx, node, suite, "authorization", "--url", d.BaseURL, "--client-id", client.ClientID,
		"--resource", d.BaseURL+"/mcp", "--port", strconv.Itoa(port), "--spec-version", "2026-07-28")
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
	if err != nil || !browsed {
		t.Fatalf("the suite failed (%v, browsed %v):\n%s\n%s\nbroker log:\n%s", err, browsed, out.String(), stderr.String(), d.Stderr())
	}
	for _, want := range []string{"authorization-server-metadata", "authorization-code-grant"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the suite's output does not mention %s", want)
		}
	}
}
