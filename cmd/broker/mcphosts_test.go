package main

import (
	"bufio"
	"context"
	"encoding/base64"
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
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/testskip"
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
	// The premise: this IdP cannot serve MCP hosts by itself.
	resp, err := http.Get(s.idp.Issuer() + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	var disc map[string]any
	json.NewDecoder(resp.Body).Decode(&disc)
	resp.Body.Close()
	if _, has := disc["registration_endpoint"]; has || disc["client_id_metadata_document_supported"] == true {
		t.Fatalf("the test IdP offers client registration: %v", disc)
	}
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{s.base + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
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
	if err := os.WriteFile(providers, []byte(devProviders(psrv.URL)), 0o600); err != nil {
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
	node = pinnedNode(t, conformanceDir(root))
	for _, p := range []string{node, filepath.Join(dir, "node_modules", "@modelcontextprotocol", "client", "package.json")} {
		if _, err := os.Stat(p); err != nil {
			testskip.Missing(t, "the TypeScript MCP client", fmt.Sprintf("%s is not installed: run `make mcpclient-deps`", p))
			return "", ""
		}
	}
	// The script resolves its imports from where it lies: next to the
	// installed node_modules.
	script = filepath.Join(dir, "host.mjs")
	installScript(t, filepath.Join(root, "testdata", "mcpclient", "host.mjs"), script)
	return node, script
}

// installScript copies the test script src to dst, next to installed
// packages, atomically: tests running side by side install the same
// script while another's Node process may be reading it.
func installScript(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(filepath.Dir(dst), ".install-*")
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err != nil {
		os.Remove(f.Name())
		t.Fatal(err)
	}
}

// hostEvent is one line host.mjs prints.
type hostEvent struct {
	Event   string          `json:"event"`
	URL     string          `json:"url"`
	Refresh bool            `json:"refresh"`
	Result  json.RawMessage `json:"result"`
	Message string          `json:"message"`
	// In command mode (HOST_COMMANDS=1): the tools listed, and whether a
	// link came as a 2025-11-25 -32042 error.
	Names  []string `json:"names"`
	Legacy bool     `json:"legacy"`
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
	err := chromedp.Do(ctx, chromedp.WaitVisible(approve), press(`button[name=decision][value=approve]`))
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
				press(`form [type=submit]`))
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
	err := chromedp.Do(ctx, chromedp.WaitVisible(approve), press(`button[name=decision][value=approve]`), chromedp.WaitVisible(chromedp.CSS(`select[name=account]`)))
	if err == nil {
		var picked bool
		if picked, err = chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(pickAccountJS, strconv.Quote(account)))); err == nil && !picked {
			err = fmt.Errorf("demo account %q is not offered", account)
		}
	}
	if err == nil {
		err = chromedp.Do(ctx, press(`button[name=decision][value=approve]`))
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
	testskip.Short(t, "end-to-end test")
	t.Parallel()
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

// goSDKHost is an MCP host on the go-sdk client with its own OAuth
// support (auth.AuthorizationCodeHandler): the loopback redirect target
// and the browser step are the host's; the tokens it got are kept so the
// test can check what removing the app does to them.
type goSDKHost struct {
	session *mcp.ClientSession
	tokens  chan *oauth2.Token
}

func (s *hostStack) startGoSDKHost(t *testing.T, ctx, person context.Context, user, account, metadataURL string) *goSDKHost {
	t.Helper()
	codes := make(chan url.Values, 1)
	cb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/callback" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "Signed in: return to the go-sdk host.")
		select {
		case codes <- r.URL.Query():
		default:
		}
	}))
	t.Cleanup(cb.Close)
	redirect := cb.URL + "/callback"
	cfg := &auth.AuthorizationCodeHandlerConfig{
		RedirectURL: redirect,
		AuthorizationCodeFetcher: func(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			if err := signInAndAllow(person, args.URL, user, "Signed in: return to the go-sdk host."); err != nil {
				return nil, err
			}
			q := <-codes
			return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
		},
	}
	if metadataURL != "" {
		cfg.ClientIDMetadataDocumentConfig = &auth.ClientIDMetadataDocumentConfig{URL: metadataURL}
	} else {
		cfg.DynamicClientRegistrationConfig = &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			RedirectURIs: []string{redirect}, TokenEndpointAuthMethod: "none", ClientName: "go-sdk host (test)",
			GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"},
		}}
	}
	h := &goSDKHost{tokens: make(chan *oauth2.Token, 4)}
	cfg.NewTokenSource = func(ctx context.Context, c *oauth2.Config, tok *oauth2.Token) (oauth2.TokenSource, error) {
		h.tokens <- tok
		return c.TokenSource(ctx, tok), nil
	}
	handler, err := auth.NewAuthorizationCodeHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-host-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if req.Params.Mode != "url" || !strings.HasPrefix(req.Params.URL, s.base+"/connect/") {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			if err := connectSignedIn(person, req.Params.URL, user, account); err != nil {
				return nil, err
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	h.session, err = client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.base + "/mcp", OAuthHandler: handler, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connect: %v\nbroker log:\n%s", err, s.proc.logs.String())
	}
	t.Cleanup(func() { h.session.Close() })
	res, err := h.session.CallTool(ctx, &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "demo"}})
	if err != nil || res.IsError {
		t.Fatalf("connect_account: %v %+v\nbroker log:\n%s", err, res, s.proc.logs.String())
	}
	if got := fmt.Sprint(structured(t, res)); !strings.Contains(got, account) {
		t.Fatalf("connect_account answered %s", got)
	}
	return h
}

// TestGoSDKHostOAuth: the go-sdk v1.8.0 client's OAuth support, through
// dynamic registration and through a metadata document; then the person
// removes the app on "My connections" and every token it holds stops
// working.
func TestGoSDKHostOAuth(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	s := startHostStack(t)
	bctx := newBrowser(t)
	ctx := testContext(t, 3*time.Minute)

	carol := personBrowser(t, bctx)
	h := s.startGoSDKHost(t, ctx, carol, "carol", "alice-demo", "")
	tok := <-h.tokens
	if tok.RefreshToken == "" || tok.AccessToken == "" {
		t.Fatal("the go-sdk host got no refresh token")
	}
	// Alice's host identifies itself with a metadata document.
	aliceBrowser := personBrowser(t, bctx)
	alice := s.startGoSDKHost(t, ctx, aliceBrowser, "alice", "alice-demo", s.metadataURL())

	t.Run("removing the app on My connections revokes its tokens", func(t *testing.T) {
		if a, err := mcpCall(http.DefaultClient, s.base, "", tok.AccessToken, "list_connections", map[string]any{}, nil); err != nil || a.Status != 200 {
			t.Fatalf("before removal: %v %+v", err, a)
		}
		rctx, cancel := context.WithTimeout(carol, 30*time.Second)
		defer cancel()
		err := chromedp.Do(rctx, chromedp.Navigate(s.base+"/connections"), chromedp.WaitVisible(chromedp.CSS(`#apps`)))
		if err == nil {
			err = waitForText(rctx, "go-sdk host (test)")
		}
		if err == nil {
			err = chromedp.Do(rctx, press(`form[action^="/connections/apps/"] button`))
		}
		if err == nil {
			err = waitForText(rctx, "Removed. The app's tokens are revoked")
		}
		if err != nil {
			page, _ := chromedp.Run(carol, chromedp.Text(chromedp.CSS(`body`)))
			t.Fatalf("%v\npage: %s", err, page)
		}
		a, err := mcpCall(http.DefaultClient, s.base, "", tok.AccessToken, "list_connections", map[string]any{}, nil)
		if err != nil || a.Status != http.StatusUnauthorized {
			t.Fatalf("the removed app's access token: HTTP %d (%v)", a.Status, err)
		}
		resp, err := http.PostForm(s.base+"/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken},
			"client_id": {jwtClaim(t, tok.AccessToken, "client_id")}})
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"invalid_grant"`) {
			t.Fatalf("the removed app's refresh token: HTTP %d %s", resp.StatusCode, body)
		}
	})

	t.Run("signing out of the broker revokes no app", func(t *testing.T) {
		sctx, cancel := context.WithTimeout(aliceBrowser, 30*time.Second)
		defer cancel()
		err := chromedp.Do(sctx, chromedp.Navigate(s.base+"/connections"), press(`form[action="/logout"] button`))
		if err == nil {
			err = waitForText(sctx, "You are signed out")
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := alice.session.CallTool(ctx, &mcp.CallToolParams{Name: "list_connections", Arguments: map[string]any{}})
		if err != nil || res.IsError || !strings.Contains(fmt.Sprint(structured(t, res)), "alice-demo") {
			t.Fatalf("alice's app after she signed out: %v %+v", err, res)
		}
	})
}

// jwtClaim reads a string claim of a JWT without verifying it.
func jwtClaim(t *testing.T, jwt, name string) string {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	v, _ := m[name].(string)
	return v
}
