package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"credbroker/internal/testskip"
	"credbroker/sidecar/sidecartest"
)

// nodeAndExample returns the pinned Node 22 (installed with the MCP
// conformance suite by `make conformance-deps`) and examples/sidecar-ts
// with its locked dependencies (`make sidecar-ts-deps`); without them the
// test fails, or skips with CREDBROKER_ALLOW_SKIP=1 (see internal/testskip).
func nodeAndExample(t *testing.T) (node, dir string) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	node = pinnedNode(t, conformanceDir(root))
	dir = filepath.Join(root, "examples", "sidecar-ts")
	for _, p := range []string{node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "server", "package.json"),
		filepath.Join(dir, "node_modules", "@modelcontextprotocol", "client", "package.json"), filepath.Join(dir, "node_modules", "typescript", "bin", "tsc")} {
		if _, err := os.Stat(p); err != nil {
			testskip.Missing(t, "node 22 or examples/sidecar-ts's dependencies", fmt.Sprintf("%s is not installed: run `make sidecar-ts-deps` (needs npm)", p))
		}
	}
	return node, dir
}

// hostRun is one run of the example's test host (test/client.ts): the url
// elicitations it was asked to show and the tool's result.
type hostRun struct {
	links  []string
	result struct {
		IsError           bool `json:"isError"`
		Content           []struct{ Text string }
		StructuredContent map[string]any `json:"structuredContent"`
	}
	output string
}

// runHost calls list_demo_repos at mcpURL with the official TypeScript
// client as the person behind token; answer decides, for each url
// elicitation, what the person does and says.
func runHost(t *testing.T, node, dir, mcpURL, token string, answer func(link string) string) hostRun {
	t.Helper()
	ctx := testContext(t, 2*time.Minute)
	cmd := exec.CommandContext(ctx, node, "test/client.ts", mcpURL, token)
	cmd.Dir = dir
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var run hostRun
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	gotResult := false
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		var msg struct {
			Elicit *struct{ Mode, URL string } `json:"elicit"`
			Result json.RawMessage             `json:"result"`
		}
		if json.Unmarshal([]byte(line), &msg) != nil {
			continue
		}
		switch {
		case msg.Elicit != nil:
			if msg.Elicit.Mode != "url" {
				t.Errorf("elicitation mode %q, want url", msg.Elicit.Mode)
			}
			run.links = append(run.links, msg.Elicit.URL)
			io.WriteString(stdin, answer(msg.Elicit.URL)+"\n")
		case msg.Result != nil:
			if err := json.Unmarshal(msg.Result, &run.result); err != nil {
				t.Fatalf("result %s: %v", msg.Result, err)
			}
			gotResult = true
		}
	}
	if err := cmd.Wait(); err != nil || !gotResult {
		t.Fatalf("test host: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), stderr.String())
	}
	run.output = out.String()
	return run
}

// TestSidecarTypeScript runs examples/sidecar-ts, the TypeScript MCP
// server on the official SDK's server package, on the pinned Node 22
// against `broker dev`, with the official TypeScript client as the host:
// connect in Chromium and retry, then decline and cancel. The example's
// exchanges with the sidecar API go through a proxy that checks them
// against docs/sidecar.openapi.yaml.
func TestSidecarTypeScript(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	node, dir := nodeAndExample(t)
	t.Run("type-checks", func(t *testing.T) {
		cmd := exec.Command(node, "node_modules/typescript/bin/tsc", "--noEmit", "-p", ".")
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tsc --noEmit: %v\n%s", err, out)
		}
	})

	sideAddr, tsAddr := freeAddr(t), freeAddr(t)
	d := startDev(t, freeAddr(t), t.TempDir(), "--sidecar-addr", sideAddr)
	contract := sidecartest.NewContract(t)
	checked := contract.Proxy("http://" + sideAddr)
	ctx := testContext(t, 4*time.Minute)
	startServer(t, ctx, dir, os.Environ(), fmt.Sprintf("%s src/main.ts --addr %s --sidecar-url %s --secret-file %s",
		node, tsAddr, checked, filepath.Join(d.Data, "sidecar.secret")))
	mcpURL := "http://" + tsAddr + "/mcp"
	bctx := newBrowser(t)

	t.Run("connect and retry", func(t *testing.T) {
		var consent string
		run := runHost(t, node, dir, mcpURL, d.Token("alice"), func(link string) string {
			consent = completeInBrowser(t, personBrowser(t, bctx), link, "alice", "alice-demo")
			return "accept"
		})
		if len(run.links) != 1 || !strings.HasPrefix(run.links[0], d.BaseURL+"/connect/") {
			t.Fatalf("elicitations %q, want one broker connect link", run.links)
		}
		if run.result.IsError || run.result.StructuredContent["account"] != "alice-demo" {
			t.Fatalf("result after the retry: %s", run.output)
		}
		if repos, _ := run.result.StructuredContent["repos"].([]any); len(repos) != 2 {
			t.Fatalf("repos %v, want alice-demo's two", run.result.StructuredContent["repos"])
		}
		text := strings.Join(strings.Fields(consent), " ")
		for _, want := range []string{"Requested by dev-sidecar, a server your administrator configured.",
			"sidecar-ts-host (name as reported by the app; not verified)"} {
			if !strings.Contains(text, want) {
				t.Errorf("consent page lacks %q:\n%s", want, consent)
			}
		}
		// Connected now: the next call needs no browser step.
		again := runHost(t, node, dir, mcpURL, d.Token("alice"), func(string) string {
			t.Error("asked to connect again")
			return "cancel"
		})
		if again.result.IsError || again.result.StructuredContent["account"] != "alice-demo" {
			t.Fatalf("second call: %s", again.output)
		}
	})

	t.Run("decline", func(t *testing.T) {
		run := runHost(t, node, dir, mcpURL, d.Token("bob"), func(string) string { return "decline" })
		if len(run.links) != 1 || run.result.IsError || run.result.StructuredContent["status"] != "declined" ||
			!strings.Contains(run.result.Content[0].Text, "declined to connect Demo") {
			t.Fatalf("decline: %s", run.output)
		}
	})

	t.Run("cancel", func(t *testing.T) {
		run := runHost(t, node, dir, mcpURL, d.Token("bob"), func(string) string { return "cancel" })
		if len(run.links) != 1 || !run.result.IsError || !strings.Contains(run.result.Content[0].Text, "dismissed the request to connect Demo") {
			t.Fatalf("cancel: %s", run.output)
		}
	})

	seen := contract.Checked()
	for _, want := range []string{"POST /v1/require 200", "GET /v1/proxy/{provider}/{path} 200"} {
		if seen[want] == 0 {
			t.Errorf("no %s exchange was checked against the document: %v", want, seen)
		}
	}
}
