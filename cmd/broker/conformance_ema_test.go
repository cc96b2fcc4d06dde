package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/connections"
	"credbroker/internal/egress"
	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// The conformance suite's client scenario auth/enterprise-managed-
// authorization with the broker's gateway layers as the client under
// test. The scenario starts its own IdP (discovery and a token endpoint
// that takes RFC 8693 token exchange only; no sign-in page, no keys), an
// authorization server that takes the JWT bearer grant only (for its one
// client, client_secret_basic) and an MCP server, and hands the client
// (MCP_CONFORMANCE_CONTEXT) the client's credentials at the authorization
// server, its client id at the IdP and an ID token the IdP issued for it
// (the outcome of a sign-in the scenario does not stage). The broker's
// side of the mapping: the scenario's IdP is the organisation's IdP
// (--issuer, --client-id idp_client_id), the ID token is the person's
// IdP session as the broker's sign-in would have kept it, and the MCP
// server is an entry with mcp.auth: enterprise and the static client
// (client_id, client_secret). The test runs exactly that: the
// connections layer asked for the person's upstream (Upstream, as the
// gateway asks on a call) must be Ready with no connect link, and the
// upstream client (mcpup) lists and calls the server's tool with the
// connection's token. The suite judges the token exchange and the
// redemption.

// emaHelper is the suite's --command: it posts the server URL and the
// scenario's context to the test (CREDBROKER_EMA_CONTROL) and prints the
// answer; it exits 1 when the test says the scenario failed.
const emaHelper = `const url = process.argv[process.argv.length - 1];
const res = await fetch(process.env.CREDBROKER_EMA_CONTROL, {method: "POST", headers: {"content-type": "application/json"},
  body: JSON.stringify({url, context: JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT || "{}")})});
const out = await res.json();
process.stdout.write(out.transcript);
process.exit(out.ok ? 0 : 1);
`

// emaContext is the scenario's context.
type emaContext struct {
	ClientID         string `json:"client_id"`
	ClientSecret     string `json:"client_secret"`
	IdPClientID      string `json:"idp_client_id"`
	IdPIDToken       string `json:"idp_id_token"`
	IdPIssuer        string `json:"idp_issuer"`
	IdPTokenEndpoint string `json:"idp_token_endpoint"`
}

// TestConformanceEnterpriseManagedAuthorization runs the scenario (see
// above); every check the suite records must pass.
func TestConformanceEnterpriseManagedAuthorization(t *testing.T) {
	testskip.Short(t, "conformance suite")
	root, _ := filepath.Abs("../..")
	node, suite := conformanceSuite(t, root)
	dir := t.TempDir()
	helper := filepath.Join(dir, "ema-helper.mjs")
	if err := os.WriteFile(helper, []byte(emaHelper), 0o600); err != nil {
		t.Fatal(err)
	}
	var transcript logbuf.Buffer
	ran := make(chan error, 1)
	control := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			URL     string     `json:"url"`
			Context emaContext `json:"context"`
		}
		err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req)
		if err == nil {
			err = runEMAScenario(r.Context(), req.URL, req.Context, &transcript)
		}
		ran <- err
		msg := transcript.String()
		if err != nil {
			msg += "error: " + err.Error() + "\n"
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"ok": err == nil, "transcript": msg})
	}))
	t.Cleanup(control.Close)

	out := filepath.Join(dir, "results")
	cmd := exec.CommandContext(testContext(t, 2*time.Minute), node, suite, "client", "--command", node+" "+helper,
		"--scenario", "auth/enterprise-managed-authorization", "--spec-version", "2026-07-28", "--force", "--timeout", "60000", "-o", out)
	cmd.Env = append(os.Environ(), "CREDBROKER_EMA_CONTROL="+control.URL)
	output, runErr := cmd.CombinedOutput()
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("the broker's side: %v\n%s", err, transcript.String())
		}
	default:
		t.Fatalf("the suite never ran the helper (exit: %v):\n%s", runErr, output)
	}
	// The suite names the result directory <scenario>-<time>.
	checks, err := readConformanceChecks(filepath.Join(out, "auth", "enterprise-managed-authorization-*"))
	if err != nil {
		t.Fatalf("%v (exit: %v)\n%s", err, runErr, output)
	}
	seen := map[string]bool{}
	for _, c := range checks {
		seen[c.ID] = true
		if c.Status != "SUCCESS" && c.Status != "INFO" {
			t.Errorf("check %s: %s: %s", c.ID, c.Status, c.Description)
		}
	}
	for _, id := range []string{"complete-flow-token-exchange", "complete-flow-jwt-bearer"} {
		if !seen[id] {
			t.Errorf("the suite recorded no %s check", id)
		}
	}
	if t.Failed() {
		t.Logf("suite output:\n%s\nbroker side:\n%s", output, transcript.String())
	}
}

// conf is the scenario's MCP server as a catalogue entry.
const emaProviders = `providers:
  conf:
    type: mcp
    display_name: Conformance server
    mcp:
      url: %s
      auth: enterprise
    client_id: %s
    client_secret: ${CONF_CLIENT_SECRET}
`

// runEMAScenario is the broker's side of the scenario for server url.
func runEMAScenario(ctx context.Context, url string, sc emaContext, log *logbuf.Buffer) error {
	ctx, cancel := context.WithTimeout(ctx, 45*time.Second)
	defer cancel()
	logf := func(format string, args ...any) { fmt.Fprintf(log, format+"\n", args...) }
	// The person: the subject of the ID token the IdP issued at sign-in.
	parts := strings.Split(sc.IdPIDToken, ".")
	if len(parts) != 3 || sc.IdPIssuer == "" || sc.ClientID == "" {
		return fmt.Errorf("the scenario's context is not the one this test knows: %+v", sc)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return err
	}
	var idt struct {
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(payload, &idt); err != nil || idt.Sub == "" {
		return fmt.Errorf("the scenario's ID token names nobody: %v", err)
	}
	person := vault.Principal{Issuer: sc.IdPIssuer, Subject: idt.Sub}
	reg, err := provider.ParseProviders("providers.yaml", fmt.Appendf(nil, emaProviders, url, sc.ClientID),
		func(k string) string {
			if k == "CONF_CLIENT_SECRET" {
				return sc.ClientSecret
			}
			return ""
		})
	if err != nil {
		return err
	}
	keys, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		return err
	}
	store := memstore.New(keys)
	// What the broker's sign-in at this IdP would have kept.
	now := time.Now()
	if _, err := store.PutIdPSession(ctx, vault.IdPSession{Principal: person, IDToken: vault.Secret(sc.IdPIDToken),
		IDTokenExpires: time.Unix(idt.Exp, 0), Created: now, Updated: now}); err != nil {
		return err
	}
	egressClient, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true})
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(log, nil))
	client, err := provider.New(provider.Options{Store: store, Providers: reg, Logger: logger, BrokerURL: "https://broker.example",
		HTTPClient: &http.Client{Timeout: 10 * time.Second}, UpstreamHTTPClient: egressClient,
		IdP:         &provider.OrgIdP{Issuer: sc.IdPIssuer, ClientID: sc.IdPClientID, ClientSecret: "broker-idp-secret"},
		IdPSessions: store})
	if err != nil {
		return err
	}
	conns, err := connections.New(connections.Options{Store: store, Client: client, PublicURL: "https://broker.example", Logger: logger})
	if err != nil {
		return err
	}
	o, err := conns.Upstream(ctx, connections.Request{Principal: person, Provider: "conf", Via: "mcp", CanAsk: true}, "", connections.NoAnswer)
	if err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	ready, ok := o.(connections.Ready)
	if !ok {
		return fmt.Errorf("the person was not connected without the browser: %T %+v", o, o)
	}
	logf("connected by ID-JAG: connection %s, account %s", ready.Conn.ID, ready.Conn.AccountLogin)
	pool := mcpup.New(mcpup.Options{HTTPClient: egressClient, Tokens: client.UpstreamTokens(), Version: "test", Logger: logger})
	tools, _, err := mcpup.Do(ctx, pool, ready.Target, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.ListToolsResult, error) {
		return cs.ListTools(ctx, nil)
	})
	if err != nil {
		return fmt.Errorf("tools/list: %w", err)
	}
	for _, tool := range tools.Tools {
		res, _, err := mcpup.Do(ctx, pool, ready.Target, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
			return cs.CallTool(ctx, &mcp.CallToolParams{Name: tool.Name, Arguments: map[string]any{}})
		})
		if err != nil {
			return fmt.Errorf("tools/call %s: %w", tool.Name, err)
		}
		var text bytes.Buffer
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text.WriteString(tc.Text)
			}
		}
		logf("tools/call %s: %q", tool.Name, text.String())
	}
	return nil
}
