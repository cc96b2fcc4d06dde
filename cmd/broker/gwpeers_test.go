package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/vault"
)

// The harness of the gateway's external-peer suites (TestGatewayOIDCProvider,
// TestGatewayTypeScriptUpstream): `broker serve` with its gateway endpoints
// (--mcp-auth issuer: the hosts' bearers are the dev IdP's JWTs naming
// each endpoint) behind the loopback TLS balancer, so its public URL and
// its Client ID Metadata Document are https; a host on the go-sdk client
// whose url elicitations a person completes with an HTTP client and a
// cookie jar; and the Node peers, installed by make from
// testdata/<peer>/package-lock.json.

// gwStack is the broker of a gateway suite.
type gwStack struct {
	t         *testing.T
	lb        *balancer
	idp       *devidp.IdP
	keys      *vault.Keyring
	dir       string
	addr      string
	args, env []string
	proc      *serveProc
	// procs are every broker process started, proc the last.
	procs []*serveProc
	// seen is every response body a host or a person's browser received.
	seen logbuf.Buffer
}

// newGWStack starts the balancer and the IdP (users alice and bob); start
// runs the broker once the providers are known.
func newGWStack(t *testing.T) *gwStack {
	t.Helper()
	s := &gwStack{t: t, lb: newBalancer(t), dir: t.TempDir(), addr: freeAddr(t)}
	s.idp = devidptest.Start(t, []devidp.User{
		{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"},
		{Username: "bob", Password: "bob", Subject: "bob", Email: "bob@example.test", Name: "Bob"},
	}, nil)
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{s.public() + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	var err error
	if s.keys, err = vault.ParseKeys(vault.GenerateKey()); err != nil {
		t.Fatal(err)
	}
	return s
}

// public is the broker's public URL (the balancer's https URL).
func (s *gwStack) public() string { return s.lb.srv.URL }

// endpoint is provider p's gateway endpoint.
func (s *gwStack) endpoint(p string) string { return s.public() + "/mcp/u/" + p }

// storePath is the broker's bolt file.
func (s *gwStack) storePath() string { return filepath.Join(s.dir, "broker.db") }

// start runs `broker serve` with providers (a providers.yaml document)
// and env (the secrets it references) and puts it behind the balancer.
func (s *gwStack) start(providers string, env ...string) {
	s.t.Helper()
	file := filepath.Join(s.dir, "providers.yaml")
	if err := os.WriteFile(file, []byte(providers), 0o600); err != nil {
		s.t.Fatal(err)
	}
	s.env = append([]string{"BROKER_KEYS=" + s.keys.Format(), "BROKER_CLIENT_SECRET=idp-secret",
		"BROKER_STORE=", "BROKER_KEYS_FILE=", "BROKER_MCP_AUTH=", "BROKER_CLIENT_METADATA_URL="}, env...)
	s.args = []string{"--public-url", s.public(), "--issuer", s.idp.Issuer(), "--client-id", devClientID,
		"--providers", file, "--store", "bolt:" + s.storePath(), "--log-format", "json", "--mcp-auth", "issuer",
		"--upstream-allow-private"}
	s.proc = startServe(s.t, "broker", s.addr, s.args, s.env)
	s.procs = append(s.procs, s.proc)
	s.lb.add("broker", s.proc.base)
}

// restart stops the broker (SIGTERM), runs between (the store is free
// then), and starts it again on the same address. Call it from the test
// itself, not a subtest: the new process lives until t ends.
func (s *gwStack) restart(between func()) {
	s.t.Helper()
	s.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.proc.exited:
	case <-time.After(30 * time.Second):
		s.t.Fatal("the broker did not stop on SIGTERM")
	}
	if between != nil {
		between()
	}
	s.proc = startServe(s.t, "broker", s.addr, s.args, s.env)
	s.procs = append(s.procs, s.proc)
}

// bearer is user's token for provider p's endpoint: a JWT of the IdP whose
// audience is that endpoint.
func (s *gwStack) bearer(t *testing.T, user, p string) string {
	t.Helper()
	tok, _, err := s.idp.MintAccessToken(user, s.endpoint(p), nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// gwHost is an MCP host (the go-sdk client, 2026-07-28, url elicitation
// declared) of one person at one gateway endpoint. Its url elicitations go
// to connect, which does what the person does with the link; the client
// then retries the call itself.
type gwHost struct {
	cs *mcp.ClientSession

	mu    sync.Mutex // guards links
	links []string
}

func (s *gwStack) host(t *testing.T, ctx context.Context, user, p string, connect func(ctx context.Context, link string) error) *gwHost {
	t.Helper()
	hc := &http.Client{Transport: bearerTransport{s.bearer(t, user, p), recording{&s.seen, s.lb.srv.Client().Transport}}}
	h := newGWHost(t, ctx, s.endpoint(p), s.public(), hc, connect)
	s.t.Cleanup(func() { h.cs.Close() })
	return h
}

// newGWHost connects a gwHost to endpoint through hc (which adds the
// bearer); its links must be connect links of the broker at public. The
// caller closes its session (h.cs).
func newGWHost(t *testing.T, ctx context.Context, endpoint, public string, hc *http.Client, connect func(ctx context.Context, link string) error) *gwHost {
	t.Helper()
	h := &gwHost{}
	client := mcp.NewClient(&mcp.Implementation{Name: "gateway-peer-host", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			h.mu.Lock()
			h.links = append(h.links, req.Params.URL)
			h.mu.Unlock()
			if req.Params.Mode != "url" || !strings.HasPrefix(req.Params.URL, public+"/connect/") {
				return nil, fmt.Errorf("elicitation %q %q is not a broker connect link", req.Params.Mode, req.Params.URL)
			}
			if err := connect(ctx, req.Params.URL); err != nil {
				return nil, err
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("host at %s: %v", endpoint, err)
	}
	h.cs = cs
	return h
}

// recording keeps a copy of every response body it passes on.
type recording struct {
	seen *logbuf.Buffer
	next http.RoundTripper
}

func (r recording) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.seen.Write(append(body, '\n'))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	return resp, err
}

// noLeak fails t when a host, a browser or the broker's log got any of
// the upstream's tokens (issue 31's invariant 1: no token passthrough).
func (s *gwStack) noLeak(t *testing.T, tokens []string) {
	t.Helper()
	text := s.seen.String()
	for _, p := range s.procs {
		text += p.logs.String()
	}
	noTokenIn(t, text, tokens)
}

// noTokenIn fails t when text (what hosts and browsers received, the
// broker's logs) holds any of the upstream's tokens.
func noTokenIn(t *testing.T, text string, tokens []string) {
	t.Helper()
	if len(tokens) == 0 {
		t.Fatal("no upstream token to look for")
	}
	for _, tok := range tokens {
		if tok != "" && strings.Contains(text, tok) {
			t.Errorf("an upstream token reached a host, a browser or the broker's log")
		}
	}
}

// asked is how many url elicitations the host has been given.
func (h *gwHost) asked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.links)
}

// call calls tool and returns its text, failing on a protocol error or a
// tool error.
func (h *gwHost) call(t *testing.T, ctx context.Context, tool string, args map[string]any) string {
	t.Helper()
	res, err := h.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error %s", tool, resultText(res))
	}
	return resultText(res)
}

// tools lists the endpoint's tool names.
func (h *gwHost) tools(t *testing.T, ctx context.Context) []string {
	t.Helper()
	res, err := h.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	return names
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// gwBrowser is a person's browser: an HTTP client with a cookie jar that
// trusts the balancer, remembering every URL it was redirected to.
type gwBrowser struct {
	c *http.Client

	mu        sync.Mutex // guards redirects
	redirects []*url.URL
}

func (s *gwStack) browser() *gwBrowser {
	jar, _ := cookiejar.New(nil)
	b := &gwBrowser{}
	b.c = &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: recording{&s.seen, s.lb.srv.Client().Transport},
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > 20 {
				return errors.New("too many redirects")
			}
			b.mu.Lock()
			b.redirects = append(b.redirects, req.URL)
			b.mu.Unlock()
			return nil
		}}
	return b
}

// visited returns the redirects so far whose path ends in suffix.
func (b *gwBrowser) visited(suffix string) []*url.URL {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*url.URL
	for _, u := range b.redirects {
		if strings.HasSuffix(u.Path, suffix) {
			out = append(out, u)
		}
	}
	return out
}

func (b *gwBrowser) do(req *http.Request) (httpPage, error) {
	resp, err := b.c.Do(req)
	if err != nil {
		return httpPage{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return httpPage{status: resp.StatusCode, url: resp.Request.URL, body: string(body)}, err
}

func (b *gwBrowser) submit(p httpPage, actionPart string, extra url.Values) (httpPage, error) {
	target, vals, err := htmlform.Find(p.url, p.body, actionPart, extra)
	if err != nil {
		return httpPage{}, err
	}
	req, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

// connect follows a connect link as user to the broker's "Connected"
// page: the dev IdP's sign-in when asked, the broker's consent (approved),
// and the upstream authorization server's own pages when it shows any
// (oidc-provider's development login and consent, the demo provider's
// consent as alice-demo). It returns the text of
// the broker's consent page.
func (b *gwBrowser) connect(ctx context.Context, link, user string) (consent string, err error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, link, nil)
	p, err := b.do(req)
	for step := 0; err == nil; step++ {
		switch {
		case step > 10:
			err = errors.New("no end after 10 pages")
		case p.status == http.StatusOK && strings.HasSuffix(p.url.Path, "/callback") && strings.Contains(p.body, "Connected"):
			return consent, nil
		case strings.Contains(p.body, `name="prompt" value="login"`): // oidc-provider's sign-in
			p, err = b.submit(p, "/interaction/", url.Values{"login": {user}, "password": {user}})
		case strings.Contains(p.body, `name="prompt" value="consent"`): // oidc-provider's consent
			p, err = b.submit(p, "/interaction/", nil)
		case strings.Contains(p.body, `name="account"`) && strings.Contains(p.body, `name="decision"`): // the demo provider's consent
			p, err = b.submit(p, "authorize", url.Values{"decision": {"approve"}, "account": {demoAccountID(user)}})
		case strings.Contains(p.body, `name="password"`): // the dev IdP's sign-in
			p, err = b.submit(p, "login", url.Values{"username": {user}, "password": {user}})
		case strings.Contains(p.body, `name="decision"`) && strings.Contains(p.url.Path, "/connect/"):
			consent = p.body
			p, err = b.submit(p, "/connect/", url.Values{"decision": {"approve"}})
		case strings.Contains(p.body, `<select name="account">`) && strings.HasSuffix(p.url.Path, "/authorize"): // the demo provider's consent
			p, err = b.submit(p, "authorize", url.Values{"account": {"1001"}, "decision": {"approve"}})
		default:
			err = errors.New("an unexpected page")
		}
	}
	return consent, fmt.Errorf("connecting as %s: %v; ended on %s (HTTP %d):\n%.1500s", user, err, p.url, p.status, p.body)
}

// demoAccountID is the id of user's demo account (alice: alice-demo),
// the first one when user has none.
func demoAccountID(user string) string {
	accounts := demoprovider.Accounts()
	for _, a := range accounts {
		if a.Login == user+"-demo" {
			return strconv.FormatInt(a.ID, 10)
		}
	}
	return strconv.FormatInt(accounts[0].ID, 10)
}

// gwPeer returns the pinned Node 22 and the directory where make installed
// testdata/<name>'s locked packages (`make <name>-deps`, under .cache),
// with the suite's scripts copied next to its node_modules (Node resolves
// a script's imports from where it lies). pkg is a package that must be
// there.
func gwPeer(t *testing.T, name, pkg string, scripts ...string) (node, dir string) {
	t.Helper()
	root, _ := filepath.Abs("../..")
	node = pinnedNode(t, conformanceDir(root))
	dir = filepath.Join(root, ".cache", name)
	for _, p := range []string{node, filepath.Join(dir, "node_modules", pkg, "package.json")} {
		if _, err := os.Stat(p); err != nil {
			testskip.Missing(t, "node 22 or "+pkg, fmt.Sprintf("%s is not installed: run `make conformance-deps %s-deps` (needs npm)", p, name))
			return "", ""
		}
	}
	for _, s := range scripts {
		installScript(t, filepath.Join(root, "testdata", name, s), filepath.Join(dir, s))
	}
	return node, dir
}

// nodeProc is a Node process of a suite: stdout and stderr kept line by
// line, stdout apart so JSON events can be read from it.
type nodeProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout logbuf.Buffer
	stderr logbuf.Buffer
	exited chan struct{}
}

func startNode(t *testing.T, node, dir string, env []string, args ...string) *nodeProc {
	t.Helper()
	p := &nodeProc{t: t, exited: make(chan struct{})}
	p.cmd = exec.Command(node, args...)
	p.cmd.Dir, p.cmd.Env = dir, append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() { p.stop(syscall.SIGTERM) })
	return p
}

// wait waits for a stdout line containing text.
func (p *nodeProc) wait(text string) {
	p.t.Helper()
	if !p.stdout.WaitFor(text, p.exited, 60*time.Second) {
		p.t.Fatalf("node never printed %q:\nstdout:\n%s\nstderr:\n%s", text, p.stdout.String(), p.stderr.String())
	}
}

// stop signals the process and waits for it to end.
func (p *nodeProc) stop(sig os.Signal) {
	select {
	case <-p.exited:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// jsonLines decodes the JSON objects among text's lines into T.
func jsonLines[T any](text string) []T {
	var out []T
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var v T
		if strings.HasPrefix(sc.Text(), "{") && json.Unmarshal(sc.Bytes(), &v) == nil {
			out = append(out, v)
		}
	}
	return out
}
