package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/fakeprovider"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// opsStack is the whole broker mounted in-process exactly as `serve` mounts
// it (bolt store, JSON logs behind the redacting handler, telemetry), with
// a devidp IdP and a fake GitHub over loopback.
type opsStack struct {
	t     *testing.T
	srv   *httptest.Server
	idp   *devidp.IdP
	gh    *fakeprovider.GitHub
	demo  *demoprovider.Provider // its demo-keys API-key service
	logs  *logbuf.Buffer
	store vault.Store

	mu      sync.Mutex
	secrets map[string]string // value -> what it is
	// outbound counts the broker's own calls to the IdP and providers.
	outbound *countingTransport
}

// countingTransport counts requests per host.
type countingTransport struct {
	next http.RoundTripper
	mu   sync.Mutex
	host map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.host[r.URL.Host]++
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

func (c *countingTransport) count(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.host[host]
}

// testClient is what the tests themselves (agent, browser) use, so that
// http.DefaultTransport can be taken away from the broker.
var testClient = &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second}

// refuseDefault makes http.DefaultTransport fail for the rest of the test:
// a broker call that does not use the configured outbound client fails.
func refuseDefault(t *testing.T) {
	old := http.DefaultTransport
	http.DefaultTransport = refusing{t}
	t.Cleanup(func() { http.DefaultTransport = old })
}

type refusing struct{ t *testing.T }

func (r refusing) RoundTrip(req *http.Request) (*http.Response, error) {
	r.t.Errorf("a request to %s bypassed the configured outbound client", req.URL.Host)
	return nil, fmt.Errorf("default transport disabled by the test")
}

const (
	opsIdPSecret = "ops-idp-client-secret-5f1e2d"
	opsGHSecret  = "ops-github-client-secret-9a8b7c"
)

func newOpsStack(t *testing.T) *opsStack {
	t.Helper()
	s := &opsStack{t: t, logs: &logbuf.Buffer{}, secrets: map[string]string{}}
	mux := http.NewServeMux()
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	s.idp = devidptest.Start(t, nil, nil)
	if err := s.idp.AddClient(devidp.Client{ID: "broker", Secret: opsIdPSecret, RedirectURIs: []string{s.srv.URL + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	s.gh = fakeprovider.NewGitHub(t, fakeprovider.Options{ClientID: "gh-ops", ClientSecret: opsGHSecret,
		RedirectURIs: []string{s.srv.URL + "/oauth/github/callback"}})
	gh := s.gh.URL()
	demoMux := http.NewServeMux()
	demoSrv := httptest.NewServer(demoMux)
	t.Cleanup(demoSrv.Close)
	var err error
	s.demo, err = demoprovider.New(demoprovider.Options{BaseURL: demoSrv.URL + "/demo", ClientID: "unused", RedirectURIs: []string{demoSrv.URL + "/unused"}})
	if err != nil {
		t.Fatal(err)
	}
	demoMux.Handle("/demo/", s.demo.Handler())
	doc := `providers:
  github:
    display_name: GitHub
    type: oauth2
    authorization_url: ` + gh + `/login/oauth/authorize
    token_url: ` + gh + `/login/oauth/access_token
    client_id: gh-ops
    client_secret: ${GH_SECRET}
    token_endpoint_auth: client_secret_post
    default_scopes: [read:user]
    allowed_scopes: [read:user, repo]
    account: {url: ` + gh + `/user, id_field: id, login_field: login}
    api: {base_url: ` + gh + `}
    revocation: {style: github_grant, url: "` + gh + `/applications/{client_id}/grant"}
  demo-keys:
    display_name: Demo keys
    type: api_key
    instructions: Copy your demo account's key from the demo provider's key page.
    instructions_url: ` + s.demo.KeysURL() + `
    fields: [{name: api_key, label: API key, secret: true, pattern: '` + demoprovider.KeyPattern + `'}]
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /login}
    api: {base_url: ` + s.demo.KeysAPIBase() + `, allowed_paths: [GET /me]}
`
	reg, err := provider.ParseProviders("ops-providers.yaml", []byte(doc), func(k string) string {
		if k == "GH_SECRET" {
			return opsGHSecret
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	s.store, err = openStore(filepath.Join(t.TempDir(), "broker.db"), kr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	out := outboundClient()
	s.outbound = &countingTransport{next: out.Transport, host: map[string]int{}}
	out.Transport = s.outbound
	log := newLogger(s.logs, "json", -8) // everything, debug included
	rec := telemetry.New(telemetry.Options{Providers: reg.Names(), Audit: log})
	if _, err := mount(context.Background(), mux, brokerDeps{
		PublicURL: s.srv.URL, Resource: s.srv.URL + "/mcp", Issuer: s.idp.Issuer(),
		ClientID: "broker", ClientSecret: vault.Secret(opsIdPSecret), DevMode: true,
		GrantTTL: 10 * time.Minute, StateTTL: 10 * time.Minute,
		Store: s.store, Keys: kr, Providers: reg, Logger: log, HTTPClient: out,
		Telemetry: rec, MetricsOnMain: true,
	}); err != nil {
		t.Fatal(err)
	}
	s.secret(opsIdPSecret, "IdP client secret")
	s.secret(opsGHSecret, "GitHub client secret")
	return s
}

func (s *opsStack) secret(v, what string) {
	if len(v) < 8 {
		return // too short to grep for meaningfully
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets[v] = what
}

func (s *opsStack) bearer(user string) string {
	s.t.Helper()
	tok, _, err := s.idp.MintAccessToken(user, s.srv.URL+"/mcp", nil, time.Hour)
	if err != nil {
		s.t.Fatal(err)
	}
	s.secret(tok, "MCP bearer token of "+user)
	return tok
}

// mcpAnswer is a decoded JSON-RPC response.
type mcpAnswer struct {
	Status int
	Raw    string
	Result struct {
		ResultType        string                     `json:"resultType"`
		IsError           bool                       `json:"isError"`
		StructuredContent map[string]any             `json:"structuredContent"`
		InputRequests     map[string]json.RawMessage `json:"inputRequests"`
		RequestState      string                     `json:"requestState"`
		Content           []struct{ Text string }    `json:"content"`
	} `json:"result"`
	Error *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

var rpcID atomic.Int64

// call sends a 2026-07-28 tools/call with elicitation.url declared.
func (s *opsStack) call(token, tool string, args map[string]any, extra map[string]any) mcpAnswer {
	s.t.Helper()
	params := map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "ops-test", "version": "1"},
	}}
	for k, v := range extra {
		params[k] = v
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID.Add(1), "method": "tools/call", "params": params})
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/mcp", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	resp, err := testClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := mcpAnswer{Status: resp.StatusCode, Raw: string(b)}
	if err := json.Unmarshal(b, &a); err != nil {
		s.t.Fatalf("tools/call %s: HTTP %d, not JSON-RPC: %s", tool, resp.StatusCode, b)
	}
	if a.Result.RequestState != "" {
		s.secret(a.Result.RequestState, "requestState")
	}
	return a
}

// link returns the connect URL of an input_required answer.
func (s *opsStack) link(a mcpAnswer) string {
	s.t.Helper()
	if a.Result.ResultType != "input_required" {
		s.t.Fatalf("want input_required, got %s", a.Raw)
	}
	for _, raw := range a.Result.InputRequests {
		var ir struct {
			Params struct{ URL string } `json:"params"`
		}
		json.Unmarshal(raw, &ir)
		return ir.Params.URL
	}
	s.t.Fatalf("no input request in %s", a.Raw)
	return ""
}

// browser is a person's browser: a cookie jar and the redirects it saw.
type browser struct {
	s   *opsStack
	c   *http.Client
	jar *cookiejar.Jar
}

func (s *opsStack) browser() *browser {
	jar, _ := cookiejar.New(nil)
	b := &browser{s: s, jar: jar}
	b.c = &http.Client{Jar: jar, Transport: testClient.Transport, Timeout: 20 * time.Second, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) > 15 {
			return fmt.Errorf("too many redirects")
		}
		// Authorization codes travel in redirects: remember them.
		q := req.URL.Query()
		s.secret(q.Get("code"), "authorization code ("+req.URL.Host+")")
		return nil
	}}
	return b
}

type page struct {
	status int
	url    *url.URL
	body   string
}

func (b *browser) do(req *http.Request) page {
	b.s.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.s.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, u := range []string{b.s.srv.URL, b.s.gh.URL(), b.s.idp.Issuer()} {
		pu, _ := url.Parse(u)
		for _, c := range b.jar.Cookies(pu) {
			b.s.secret(c.Value, "cookie "+c.Name)
		}
	}
	return page{status: resp.StatusCode, url: resp.Request.URL, body: string(body)}
}

func (b *browser) get(u string) page {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return b.do(req)
}

// submit posts p's form whose action contains actionPart: its hidden
// inputs plus extra.
func (b *browser) submit(p page, actionPart string, extra url.Values) page {
	b.s.t.Helper()
	target, vals, err := htmlform.Find(p.url, p.body, actionPart, extra)
	if err != nil {
		b.s.t.Fatalf("%v on %s:\n%s", err, p.url, p.body)
	}
	req, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

// signIn completes the devidp sign-in form when p is it.
func (b *browser) signIn(p page, user string) page {
	if !strings.Contains(p.body, `name="password"`) {
		return p
	}
	return b.submit(p, "login", url.Values{"username": {user}, "password": {user}})
}

// connect opens link as user, approves on the broker and at fake GitHub.
func (b *browser) connect(link, user string) page {
	b.s.t.Helper()
	p := b.signIn(b.get(link), user)
	p = b.submit(p, "/connect/", url.Values{"decision": {"approve"}})
	p = b.submit(p, "/login/oauth/authorize", url.Values{"decision": {"approve"}})
	return p
}

// auditEvents returns the audit records of the captured JSON log.
func (s *opsStack) auditEvents() []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s.logs.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			s.t.Errorf("log line is not JSON: %s", sc.Text())
			continue
		}
		if m["audit"] == true {
			out = append(out, m)
		}
	}
	return out
}

func (s *opsStack) metrics() string {
	s.t.Helper()
	resp, err := testClient.Get(s.srv.URL + "/metrics")
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		s.t.Fatalf("/metrics: HTTP %d", resp.StatusCode)
	}
	return string(b)
}

// TestOperateFullFlow runs a connect (with an identity mismatch on the way),
// a retry, a repeat call and a disconnect, then checks the audit log, the
// metrics and that no secret value reached the logs.
func TestOperateFullFlow(t *testing.T) {
	refuseDefault(t)
	s := newOpsStack(t)
	alice := s.bearer("alice")

	first := s.call(alice, "connect_account", map[string]any{"provider": "github"}, nil)
	link := s.link(first)
	grantID := link[strings.LastIndex(link, "/")+1:]

	// Bob opens Alice's link: refused, audited, counted.
	bb := s.browser()
	p := bb.signIn(bb.get(link), "bob")
	if p.status != http.StatusForbidden {
		t.Fatalf("bob opening alice's link: HTTP %d, want 403:\n%s", p.status, p.body)
	}

	done := s.browser().connect(link, "alice")
	if !strings.Contains(done.body, "Connected") {
		t.Fatalf("connect flow did not finish (HTTP %d):\n%s", done.status, done.body)
	}
	for _, e := range s.gh.Events() {
		s.secret(e.Token, "GitHub token ("+e.Kind+")")
	}

	retry := s.call(alice, "connect_account", map[string]any{"provider": "github"}, map[string]any{
		"requestState":   first.Result.RequestState,
		"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}},
	})
	if retry.Result.ResultType != "complete" || retry.Result.StructuredContent["status"] != "connected" {
		t.Fatalf("retry: %s", retry.Raw)
	}
	again := s.call(alice, "connect_account", map[string]any{"provider": "github"}, nil)
	if again.Result.StructuredContent["status"] != "connected" {
		t.Fatalf("repeat call: %s", again.Raw)
	}
	disc := s.call(alice, "disconnect_account", map[string]any{"provider": "github"}, nil)
	if disc.Result.StructuredContent["revocation"] != "revoked" || disc.Result.StructuredContent["deleted"] != true {
		t.Fatalf("disconnect: %s", disc.Raw)
	}

	// A legacy (2025-11-25) client's initialize, for the era label.
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/mcp", strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"old","version":"1"}}}`))
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if resp, err := testClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("legacy initialize: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	t.Run("outbound calls use the configured client", func(t *testing.T) {
		idpHost, _ := url.Parse(s.idp.Issuer())
		ghHost, _ := url.Parse(s.gh.URL())
		// IdP: discovery, JWKS, code exchange; GitHub: code exchange, account, revocation.
		if n := s.outbound.count(idpHost.Host); n < 3 {
			t.Errorf("%d calls to the IdP through the outbound client, want >= 3", n)
		}
		if n := s.outbound.count(ghHost.Host); n < 3 {
			t.Errorf("%d calls to GitHub through the outbound client, want >= 3", n)
		}
	})
	t.Run("audit events", func(t *testing.T) {
		events := s.auditEvents()
		want := []struct {
			kind, sub, grant string
			fields           []string
		}{
			{telemetry.EventIdentityMismatch, "bob", grantID, []string{"provider"}},
			{telemetry.EventConnect, "alice", grantID, []string{"provider", "account", "connection"}},
			{telemetry.EventRevoke, "alice", "", []string{"provider", "account", "connection", "outcome"}},
			{telemetry.EventDisconnect, "alice", "", []string{"provider", "account", "connection"}},
		}
		for _, w := range want {
			var found map[string]any
			for _, e := range events {
				if e["event"] == w.kind {
					found = e
					break
				}
			}
			if found == nil {
				t.Errorf("no %s audit event in:\n%s", w.kind, s.logs.String())
				continue
			}
			pr, _ := found["principal"].(map[string]any)
			if pr["sub"] != w.sub || pr["iss"] != s.idp.Issuer() {
				t.Errorf("%s: principal %v, want sub %s", w.kind, pr, w.sub)
			}
			if w.grant != "" && found["grant_ref"] != binding.Ref(w.grant) {
				t.Errorf("%s: grant_ref %v, want %s (the reference of the grant)", w.kind, found["grant_ref"], binding.Ref(w.grant))
			}
			for _, f := range w.fields {
				if v, _ := found[f].(string); v == "" {
					t.Errorf("%s: field %s missing: %v", w.kind, f, found)
				}
			}
			if found["provider"] != "github" {
				t.Errorf("%s: provider %v", w.kind, found["provider"])
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		m := s.metrics()
		for _, want := range []string{
			`credbroker_mcp_requests_total{era="2026-07-28",method="tools/call",outcome="input_required",tool="connect_account"} 1`,
			`credbroker_mcp_requests_total{era="2026-07-28",method="tools/call",outcome="complete",tool="connect_account"} 2`,
			`credbroker_mcp_requests_total{era="2026-07-28",method="tools/call",outcome="complete",tool="disconnect_account"} 1`,
			`credbroker_mcp_request_duration_seconds_count{era="2026-07-28",method="tools/call",tool="connect_account"} 3`,
			`credbroker_mcp_requests_total{era="2025-11-25",method="initialize",outcome="complete",tool=""} 1`,
			`credbroker_elicitations_total{event="issued"} 1`,
			`credbroker_elicitations_total{event="completed"} 1`,
			`credbroker_identity_mismatches_total 1`,
			`credbroker_audit_events_total{event="connect"} 1`,
			// The callback stores the connection and completes its grant in
			// one transaction (vault.GrantConnector), timed as "connect".
			`credbroker_vault_operation_duration_seconds_count{op="connect",outcome="ok"} 1`,
			`credbroker_vault_operation_duration_seconds_count{op="delete_connection",outcome="ok"} 1`,
		} {
			if !strings.Contains(m, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		// No high-cardinality labels: no principal, grant or connection id.
		for _, bad := range []string{grantID, "alice", "conn_", s.idp.Issuer()} {
			if strings.Contains(m, bad) {
				t.Errorf("metrics contain %q", bad)
			}
		}
	})

	t.Run("no secret in logs", func(t *testing.T) {
		logs := s.logs.String()
		s.mu.Lock()
		defer s.mu.Unlock()
		kinds := map[string]bool{}
		for v, what := range s.secrets {
			kinds[strings.Fields(what)[0]] = true
			if strings.Contains(logs, v) {
				t.Errorf("the log contains a %s", what)
			}
		}
		// The test must actually have collected each kind of secret.
		for _, k := range []string{"IdP", "GitHub", "MCP", "authorization", "cookie", "requestState"} {
			if !kinds[k] {
				t.Errorf("no %s value was collected; the check would prove nothing", k)
			}
		}
		if len(logs) < 1000 {
			t.Errorf("suspiciously short log (%d bytes)", len(logs))
		}
	})
}

// TestPerPrincipalLimits checks that limits answer with a tool error, never
// a new URL, and that oversized bodies get 413.
func TestPerPrincipalLimits(t *testing.T) {
	s := newOpsStack(t)
	bob := s.bearer("bob")
	var first mcpAnswer
	for i := range 10 {
		a := s.call(bob, "connect_account", map[string]any{"provider": "github"}, nil)
		s.link(a)
		if i == 0 {
			first = a
		}
	}
	t.Run("pending grants", func(t *testing.T) {
		a := s.call(bob, "connect_account", map[string]any{"provider": "github"}, nil)
		if !a.Result.IsError || a.Result.ResultType != "complete" || len(a.Result.InputRequests) > 0 || a.Result.RequestState != "" {
			t.Fatalf("11th open request: want a tool error, got %s", a.Raw)
		}
		if !strings.Contains(a.Raw, "Too many connect requests") || strings.Contains(a.Raw, "/connect/") {
			t.Errorf("unclear or URL-carrying error: %s", a.Raw)
		}
	})
	t.Run("rounds per grant", func(t *testing.T) {
		var last mcpAnswer
		for range 12 {
			last = s.call(bob, "connect_account", map[string]any{"provider": "github"}, map[string]any{
				"requestState":   first.Result.RequestState,
				"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}},
			})
			if last.Result.IsError {
				break
			}
		}
		if !last.Result.IsError || !strings.Contains(last.Raw, "retried too many times") || strings.Contains(last.Raw, "/connect/") {
			t.Fatalf("after many rounds: %s", last.Raw)
		}
	})
	t.Run("body cap", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/mcp", bytes.NewReader(bytes.Repeat([]byte(" "), 2<<20)))
		req.Header.Set("Authorization", "Bearer "+bob)
		req.Header.Set("Content-Type", "application/json")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "exceeds") {
			t.Fatalf("2 MiB body: HTTP %d %s", resp.StatusCode, b)
		}
	})
	m := s.metrics()
	if !strings.Contains(m, `outcome="tool_error",tool="connect_account"`) || !strings.Contains(m, `credbroker_elicitations_total{event="issued"} 10`) {
		t.Errorf("metrics do not show the limits:\n%s", grepLines(m, "credbroker_mcp_requests_total", "credbroker_elicitations"))
	}
}

func grepLines(text string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

// TestHealthAndReadiness covers /healthz, /readyz on the mounted broker and
// the readiness checks one by one (with caching).
func TestHealthAndReadiness(t *testing.T) {
	s := newOpsStack(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := testClient.Get(s.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: HTTP %d %s", path, resp.StatusCode, b)
		}
		if path == "/readyz" && !strings.Contains(string(b), `"ready":true`) {
			t.Errorf("/readyz: %s", b)
		}
	}

	var idpDown atomic.Bool
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if idpDown.Load() || r.URL.Path != "/.well-known/openid-configuration" {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		w.Write([]byte(`{}`))
	}))
	defer idp.Close()
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	store, err := openStore(filepath.Join(t.TempDir(), "r.db"), kr)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	rd := newReadiness(store, kr, idp.URL, outboundClient(), nil)
	rd.now = func() time.Time { return now }
	tick := func() { now = now.Add(readyCacheTTL + time.Second) }

	tests := []struct {
		name   string
		before func()
		ready  bool
		check  string // check name expected to fail
		reason string
	}{
		{"all good", func() {}, true, "", ""},
		{"cached while the IdP goes down", func() { idpDown.Store(true) }, true, "", ""},
		{"IdP down after the cache expires", tick, false, "idp", "answered HTTP 502"},
		{"IdP back", func() { idpDown.Store(false); tick() }, true, "", ""},
		{"IdP unreachable", func() { idp.Close(); tick() }, false, "idp", "unreachable"},
		{"store closed", func() { store.Close(); tick() }, false, "store", "store is closed"},
		{"no keys", func() { rd.keys = nil; tick() }, false, "keys", "no encryption keys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.before()
			rep := rd.report(context.Background())
			if rep.Ready != tc.ready {
				t.Fatalf("ready = %v, want %v: %v", rep.Ready, tc.ready, rep.Checks)
			}
			if tc.check != "" && !strings.Contains(rep.Checks[tc.check], tc.reason) {
				t.Errorf("check %s = %q, want %q", tc.check, rep.Checks[tc.check], tc.reason)
			}
		})
	}
}

// TestCheckConfig runs `broker serve --check-config` as a subprocess: every
// problem listed and a non-zero exit; a good configuration passes.
func TestCheckConfig(t *testing.T) {
	broker, _ := binaries(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "providers.yaml")
	os.WriteFile(good, []byte(`providers:
  github:
    type: oauth2
    authorization_url: https://github.com/login/oauth/authorize
    token_url: https://github.com/login/oauth/access_token
    client_id: abc
    client_secret: ${GH_SECRET}
    default_scopes: [read:user]
    account: {url: https://api.github.com/user, id_field: id, login_field: login}
`), 0o600)
	secrets := filepath.Join(dir, "sidecar.secrets")
	os.WriteFile(secrets, []byte("calendar:calendar-secret-0123456789 providers=github,gitlab\n"), 0o600)
	base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	tests := []struct {
		name  string
		args  []string
		env   []string
		code  int
		wants []string
	}{
		{"many problems", []string{"--public-url", "http://broker.example.com", "--log-format", "xml",
			"--metrics-addr", "nope", "--grant-ttl", "1s", "--providers", filepath.Join(dir, "missing.yaml"), "--store", "ftp://x",
			"--mcp-auth", "nope", "--registration", "maybe", "--access-token-ttl", "1s", "--trusted-proxies", "10.0.0.0/8, lb.internal"},
			nil, 1, []string{"must use https", "--issuer is required", "--client-id is required", "client secret is missing",
				"no encryption keys", "--log-format", "--metrics-addr", "--grant-ttl", "missing.yaml", "--store",
				`--mcp-auth "nope"`, `--registration "maybe"`, "--access-token-ttl",
				`--trusted-proxies: "lb.internal" is not an IP address or CIDR prefix`}},
		{"sidecar problems", []string{"--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--providers", good, "--sidecar-addr", "127.0.0.1:8081", "--sidecar-secrets-file", secrets,
			"--sidecar-audiences", "https://broker.example.com/mcp,https://tools.example.com="},
			[]string{"BROKER_KEYS=" + vault.GenerateKey(), "BROKER_CLIENT_SECRET=s3cret-value", "GH_SECRET=gh"}, 1,
			[]string{`calendar may use provider "gitlab", which is not in`, `--sidecar-audiences entry "https://tools.example.com="`}},
		{"plain http on loopback", []string{"--public-url", "http://127.0.0.1:8080", "--issuer", "http://127.0.0.1:9/idp",
			"--client-id", "broker", "--providers", good, "--mcp-auth", "issuer"},
			[]string{"BROKER_KEYS=" + vault.GenerateKey(), "BROKER_CLIENT_SECRET=s3cret-value", "GH_SECRET=gh"}, 0,
			[]string{"configuration OK"}},
		{"unsupported trace exporter", []string{"--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--providers", good},
			[]string{"BROKER_KEYS=" + vault.GenerateKey(), "BROKER_CLIENT_SECRET=s3cret-value", "GH_SECRET=gh", "OTEL_TRACES_EXPORTER=jaeger"}, 1,
			[]string{`tracing: OTEL_TRACES_EXPORTER="jaeger" is not supported (use otlp or none)`}},
		{"good", []string{"--public-url", "https://broker.example.com", "--issuer", "https://idp.example.com",
			"--client-id", "broker", "--providers", good, "--metrics-addr", "127.0.0.1:9090", "--trusted-proxies", "10.0.0.0/8,fd00::/8"},
			[]string{"BROKER_KEYS=" + vault.GenerateKey(), "BROKER_CLIENT_SECRET=s3cret-value", "GH_SECRET=gh"}, 0,
			[]string{"configuration OK: 1 provider(s): github"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(broker, append([]string{"serve", "--check-config"}, tc.args...)...)
			cmd.Env = append(base, tc.env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, out.String())
			}
			for _, w := range tc.wants {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if strings.Contains(out.String(), "s3cret-value") || strings.Contains(out.String(), "calendar-secret") {
				t.Errorf("a secret was printed")
			}
		})
	}
}

// TestGracefulShutdown sends SIGTERM to `broker dev` while a request is
// half sent: the request still gets its answer, new connections are
// refused, and the process exits 0. The request asks for "100 Continue", so
// the server itself says when its handler has started reading the body, and
// the broker logs when its listener has closed: no step waits on a guess.
func TestGracefulShutdown(t *testing.T) {
	d := startDev(t, freeAddr(t), t.TempDir())
	tok := d.Token("alice")
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	conn, err := net.Dial("tcp", d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	head := fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"+
		"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n"+
		"Content-Length: %d\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n", d.Addr, tok, len(body))
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	// Go's server sends "100 Continue" on the handler's first read of the body.
	cont, err := http.ReadResponse(br, nil)
	if err != nil || cont.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue once the handler reads the body, got %v %v", cont, err)
	}
	half := len(body) / 2
	if _, err := io.WriteString(conn, body[:half]); err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The listener closes: new connections are refused.
	if !d.WaitStderr("listener closed", 10*time.Second) {
		t.Fatalf("no \"listener closed\" log line within 10s of SIGTERM:\n%s", d.Stderr())
	}
	if c, err := net.DialTimeout("tcp", d.Addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatal("the listener still accepts connections after SIGTERM")
	}
	select {
	case <-d.exited:
		t.Fatal("the broker exited with a request in flight")
	default:
	}
	if _, err := io.WriteString(conn, body[half:]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight request lost: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"connect_account"`) {
		t.Fatalf("in-flight request: HTTP %d %s", resp.StatusCode, b)
	}
	select {
	case <-d.exited:
	case <-time.After(15 * time.Second):
		t.Fatal("the broker did not exit after the in-flight request finished")
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0; stderr:\n%s", code, d.Stderr())
	}
	if !strings.Contains(d.Stderr(), "shutting down") {
		t.Errorf("no shutdown message in:\n%s", d.Stderr())
	}
}

// TestOperateAPIKeyFlow runs the API-key flow through the whole broker as
// serve mounts it (bolt, JSON logs at debug level behind the redacting
// handler): connect_account for demo-keys, a wrong key and then the right
// one on the entry page, the retry, provider_request, a key replaced at
// the provider (needs_reconnect, re-elicitation, a new key), disconnect.
// Every API key used, and the usual secrets, are then grepped for in the
// log, the MCP answers and the pages; the audit trail is checked.
func TestOperateAPIKeyFlow(t *testing.T) {
	refuseDefault(t)
	s := newOpsStack(t)
	alice := s.bearer("alice")
	for _, a := range demoprovider.Accounts() {
		s.secret(s.demo.APIKey(a.Login), "API key of "+a.Login)
	}
	wrong := "demo_" + strings.Repeat("W", 43)
	s.secret(wrong, "API key typed wrong")
	var seen strings.Builder
	call := func(tool string, args, extra map[string]any) mcpAnswer {
		a := s.call(alice, tool, args, extra)
		seen.WriteString(a.Raw)
		return a
	}
	page := func(p page) page {
		seen.WriteString(p.body)
		return p
	}
	keysArgs := map[string]any{"provider": "demo-keys"}
	me := map[string]any{"provider": "demo-keys", "method": "GET", "path": "/me"}

	first := call("connect_account", keysArgs, nil)
	link := s.link(first)
	br := s.browser()
	p := page(br.signIn(br.get(link), "alice"))
	if !strings.Contains(p.body, `type="password" name="field.api_key"`) {
		t.Fatalf("no key entry form (HTTP %d):\n%s", p.status, p.body)
	}
	p = page(br.submit(p, "/key", url.Values{"decision": {"approve"}, "field.api_key": {wrong}}))
	if p.status != http.StatusBadRequest || !strings.Contains(p.body, "refused by Demo keys (401)") {
		t.Fatalf("wrong key: HTTP %d\n%s", p.status, p.body)
	}
	p = page(br.submit(br.get(link), "/key", url.Values{"decision": {"approve"}, "field.api_key": {s.demo.APIKey("alice-demo")}}))
	if !strings.Contains(p.body, "Connected") {
		t.Fatalf("right key: HTTP %d\n%s", p.status, p.body)
	}
	retry := call("connect_account", keysArgs, map[string]any{"requestState": first.Result.RequestState,
		"inputResponses": map[string]any{"connect_demo-keys": map[string]any{"action": "accept"}}})
	if retry.Result.StructuredContent["status"] != "connected" {
		t.Fatalf("retry: %s", retry.Raw)
	}
	if a := call("provider_request", me, nil); a.Result.StructuredContent["status"] != float64(200) || !strings.Contains(a.Raw, `alice-demo`) {
		t.Fatalf("provider_request: %s", a.Raw)
	}
	rotated, err := s.demo.RotateKey("alice-demo")
	if err != nil {
		t.Fatal(err)
	}
	s.secret(rotated, "API key of alice-demo (new)")
	again := call("provider_request", me, nil)
	if !strings.Contains(again.Raw, "key was rejected; enter a new one") {
		t.Fatalf("after the key was replaced at the provider: %s", again.Raw)
	}
	page(br.submit(br.get(s.link(again)), "/key", url.Values{"decision": {"approve"}, "field.api_key": {rotated}}))
	done := call("provider_request", me, map[string]any{"requestState": again.Result.RequestState,
		"inputResponses": map[string]any{"connect_demo-keys": map[string]any{"action": "accept"}}})
	if done.Result.StructuredContent["status"] != float64(200) {
		t.Fatalf("with the new key: %s", done.Raw)
	}
	page(br.get(s.srv.URL + "/connections"))
	disc := call("disconnect_account", keysArgs, nil)
	if disc.Result.StructuredContent["revocation"] != "not_supported" || !strings.Contains(disc.Raw, s.demo.KeysURL()) {
		t.Fatalf("disconnect: %s", disc.Raw)
	}

	t.Run("no API key or other secret anywhere", func(t *testing.T) {
		logs := s.logs.String()
		s.mu.Lock()
		defer s.mu.Unlock()
		keys := 0
		for v, what := range s.secrets {
			if strings.Contains(logs, v) {
				t.Errorf("the log contains a %s", what)
			}
			if strings.HasPrefix(what, "API key") {
				keys++
				if strings.Contains(seen.String(), v) {
					t.Errorf("an MCP answer or a page contains the %s", what)
				}
			}
		}
		if keys < 4 {
			t.Errorf("only %d API keys collected; the grep would prove little", keys)
		}
	})
	t.Run("audit events", func(t *testing.T) {
		count := map[string]int{}
		for _, e := range s.auditEvents() {
			if e["provider"] == "demo-keys" {
				count[e["event"].(string)]++
			}
		}
		if count[telemetry.EventConnect] != 2 || count[telemetry.EventNeedsReconnect] != 1 || count[telemetry.EventRevoke] != 1 || count[telemetry.EventDisconnect] != 1 {
			t.Errorf("demo-keys audit events %v; want 2 connect, 1 needs_reconnect, 1 revoke (not_supported), 1 disconnect", count)
		}
	})
}
