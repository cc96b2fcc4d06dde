package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/http/httputil"
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

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

// serveProc is a `broker serve` subprocess.
type serveProc struct {
	name   string
	base   string // http://addr, the replica's own listener
	cmd    *exec.Cmd
	logs   *logbuf.Buffer
	exited chan struct{}
}

func startServe(t *testing.T, name, addr string, args, env []string) *serveProc {
	t.Helper()
	broker, _ := binaries(t)
	p, err := launchServe(broker, name, addr, args, env)
	if p != nil {
		t.Cleanup(func() { p.stop(20 * time.Second); raceReport(t, "replica "+name, p.logs.String()) })
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launchServe starts `broker serve` on addr and waits until it serves and
// is ready. On an error after the start, the process is returned too, for
// the caller to stop.
func launchServe(broker, name, addr string, args, env []string) (*serveProc, error) {
	p := &serveProc{name: name, base: "http://" + addr, logs: &logbuf.Buffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(broker, append([]string{"serve", "--addr", addr}, args...)...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	// The broker logs "credbroker serving" once its listener is bound and
	// everything is wired; then it must be ready.
	if !p.logs.WaitFor("credbroker serving", p.exited, 60*time.Second) {
		select {
		case <-p.exited:
			return p, fmt.Errorf("replica %s exited at start:\n%s", name, p.logs.String())
		default:
			return p, fmt.Errorf("replica %s not serving in 60s:\n%s", name, p.logs.String())
		}
	}
	if code := p.readyz(); code != http.StatusOK {
		return p, fmt.Errorf("replica %s serving but /readyz answers %d:\n%s", name, code, p.logs.String())
	}
	return p, nil
}

// stop sends SIGTERM and waits for the process to exit (killing it after
// grace).
func (p *serveProc) stop(grace time.Duration) {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// readyz returns the status of the replica's GET /readyz (0: no answer).
func (p *serveProc) readyz() int {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(p.base + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *serveProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// balancer is a loopback TLS load balancer in front of the replicas (it
// terminates https, as production balancers do: serve insists on an https
// public URL): one public URL, round robin unless the request names a replica in
// X-Test-Replica. Hits per replica are counted. Each replica's proxy sits
// behind wholeBody, so no answer is cut in half under load.
type balancer struct {
	srv     *httptest.Server
	proxies map[string]http.Handler
	names   []string
	next    atomic.Uint64
	hits    sync.Map // name -> *atomic.Int64
}

func newBalancer(t *testing.T) *balancer {
	b := &balancer{proxies: map[string]http.Handler{}}
	b.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.Header.Get("X-Test-Replica")
		if name == "" {
			name = b.names[int(b.next.Add(1))%len(b.names)]
		}
		px, ok := b.proxies[name]
		if !ok {
			http.Error(w, "no such replica", http.StatusBadGateway)
			return
		}
		n, _ := b.hits.LoadOrStore(name, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		px.ServeHTTP(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// add registers a replica; call before traffic starts.
func (b *balancer) add(name, base string) {
	target, _ := url.Parse(base)
	b.proxies[name] = wholeBody(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "replica unavailable", http.StatusBadGateway)
		},
	})
	b.names = append(b.names, name)
}

func (b *balancer) hitsOf(name string) int64 {
	n, ok := b.hits.Load(name)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// pinTransport sends every request to the balancer's host to one replica.
type pinTransport struct {
	host, replica string
	next          http.RoundTripper
}

func (p pinTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host == p.host {
		r = r.Clone(r.Context())
		r.Header.Set("X-Test-Replica", p.replica)
	}
	return p.next.RoundTrip(r)
}

// mcpCall sends a 2026-07-28 tools/call (elicitation.url declared) through
// the balancer, to replica ("" = round robin). An error means no answer.
func mcpCall(c *http.Client, base, replica, bearer, tool string, args, extra map[string]any) (mcpAnswer, error) {
	params := map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "replica-test", "version": "1"},
	}}
	for k, v := range extra {
		params[k] = v
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcID.Add(1), "method": "tools/call", "params": params})
	req, _ := http.NewRequest(http.MethodPost, base+"/mcp", bytes.NewReader(body))
	for k, v := range map[string]string{
		"Authorization": "Bearer " + bearer, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2026-07-28",
		"Mcp-Method": "tools/call", "Mcp-Name": tool,
	} {
		req.Header.Set(k, v)
	}
	if replica != "" {
		req.Header.Set("X-Test-Replica", replica)
	}
	resp, err := c.Do(req)
	if err != nil {
		return mcpAnswer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := mcpAnswer{Status: resp.StatusCode, Raw: string(b)}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("HTTP %d, not JSON-RPC: %.200s", resp.StatusCode, b)
	}
	return a, nil
}

// elicitation returns the key and URL of an input_required answer's one
// url elicitation.
func elicitation(t *testing.T, a mcpAnswer) (key, link string) {
	t.Helper()
	if a.Result.ResultType != "input_required" {
		t.Fatalf("want input_required, got %s", a.Raw)
	}
	for k, raw := range a.Result.InputRequests {
		var ir struct {
			Params struct{ URL string } `json:"params"`
		}
		json.Unmarshal(raw, &ir)
		return k, ir.Params.URL
	}
	t.Fatalf("no input request in %s", a.Raw)
	return "", ""
}

// httpPage is a fetched page.
type httpPage struct {
	status int
	url    *url.URL
	body   string
}

func fetch(t *testing.T, c *http.Client, req *http.Request) httpPage {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return httpPage{status: resp.StatusCode, url: resp.Request.URL, body: string(body)}
}

// submitForm posts p's form whose action contains actionPart with its
// hidden inputs plus extra, as a browser does.
func submitForm(t *testing.T, c *http.Client, p httpPage, actionPart string, extra url.Values) httpPage {
	t.Helper()
	target, vals, err := htmlform.Find(p.url, p.body, actionPart, extra)
	if err != nil {
		t.Fatalf("%v on %s (HTTP %d):\n%.2000s", err, p.url, p.status, p.body)
	}
	req, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return fetch(t, c, req)
}

// replicaStack is two `broker serve` replicas sharing one PostgreSQL
// database and the same keys, behind one loopback balancer, with a devidp
// IdP, the demo provider (rotating refresh tokens) and the demo MCP server
// (the demo-mcp entry's upstream, whose authorization server is the demo
// provider) in-process.
type replicaStack struct {
	pg      *pgtest.Server
	dbURL   string
	lb      *balancer
	a, b    *serveProc
	idp     *devidp.IdP
	demo    *demoprovider.Provider
	mcp     *demomcp.Server
	store   *pgstore.Store // the test's own view of the database
	keys    *vault.Keyring
	bearers map[string]string
	client  *http.Client // trusts the balancer's certificate
}

func newReplicaStack(t *testing.T, users []string) *replicaStack {
	t.Helper()
	return newReplicaStackWith(t, users, nil, nil)
}

// newReplicaStackMode is newReplicaStack with the given --mcp-auth: in
// issuer mode the bearers are the IdP's JWTs; in broker mode there are none
// (hosts get theirs from the replicas' authorization server).
func newReplicaStackMode(t *testing.T, users []string, mcpAuth string) *replicaStack {
	t.Helper()
	return newReplicaStackWith(t, users, []string{"--mcp-auth", mcpAuth}, nil)
}

// newReplicaStackWith is newReplicaStack with extra serve flags (a later
// flag wins over the defaults, --mcp-auth issuer included) and environment
// for both replicas.
func newReplicaStackWith(t *testing.T, users, extraArgs, extraEnv []string) *replicaStack {
	t.Helper()
	return newReplicaStackOpts(t, users, replicaOptions{args: extraArgs, env: extraEnv})
}

// replicaOptions adjust a replicaStack.
type replicaOptions struct {
	// args and env are extra serve flags (a later flag wins over the
	// defaults, --mcp-auth issuer included) and environment.
	args, env []string
	// providers, when set, rewrites the providers.yaml the replicas read
	// (devProviders for the provider host).
	providers func(yaml string) string
	// demo, when set, adjusts the demo provider's options.
	demo func(*demoprovider.Options)
	// wrap, when set, wraps the demo provider's handler (its token
	// endpoint included).
	wrap func(http.Handler) http.Handler
}

func newReplicaStackOpts(t *testing.T, users []string, o replicaOptions) *replicaStack {
	extraArgs, extraEnv := o.args, o.env
	mcpAuth := "issuer"
	for i := 0; i+1 < len(extraArgs); i++ {
		if extraArgs[i] == "--mcp-auth" {
			mcpAuth = extraArgs[i+1]
		}
	}
	t.Helper()
	pg := pgtest.StartT(t)
	dbURL := pg.Schema(t)
	s := &replicaStack{pg: pg, dbURL: dbURL, lb: newBalancer(t), bearers: map[string]string{}}
	public := s.lb.srv.URL
	s.client = s.lb.srv.Client()
	s.client.Timeout = 30 * time.Second

	var idpUsers []devidp.User
	for _, u := range users {
		idpUsers = append(idpUsers, devidp.User{Username: u, Password: u, Subject: u, Email: u + "@example.test", Name: u})
	}
	s.idp = devidptest.Start(t, idpUsers, nil)
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{public + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
	var err error
	demoOpts := demoprovider.Options{
		BaseURL: psrv.URL + devProviderPath, ClientID: devDemoClientID, ClientSecret: "demo-secret",
		RedirectURIs: []string{public + "/oauth/demo/callback", public + "/oauth/demo-mcp/callback"},
		Resources:    []string{psrv.URL + devMCPPath},
	}
	if o.demo != nil {
		o.demo(&demoOpts)
	}
	if s.demo, err = demoprovider.New(demoOpts); err != nil {
		t.Fatal(err)
	}
	if s.mcp, err = demomcp.New(demomcp.Options{URL: psrv.URL + devMCPPath, AuthServer: s.demo}); err != nil {
		t.Fatal(err)
	}
	demoMux := http.NewServeMux()
	s.demo.Mount(demoMux)
	var demo http.Handler = demoMux
	if o.wrap != nil {
		demo = o.wrap(demo)
	}
	pmux.Handle("/", demo)
	s.mcp.Mount(pmux)
	yaml := devProviders(psrv.URL)
	if o.providers != nil {
		yaml = o.providers(yaml)
	}
	providers := filepath.Join(t.TempDir(), "providers.yaml")
	if err := os.WriteFile(providers, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if s.keys, err = vault.ParseKeys(vault.GenerateKey()); err != nil {
		t.Fatal(err)
	}
	env := []string{"BROKER_KEYS=" + s.keys.Format(), "BROKER_CLIENT_SECRET=idp-secret", "DEMO_CLIENT_SECRET=demo-secret",
		"BROKER_STORE=", "BROKER_KEYS_FILE="}
	args := []string{"--public-url", public, "--issuer", s.idp.Issuer(), "--client-id", devClientID,
		"--providers", providers, "--store", dbURL, "--log-format", "json", "--mcp-auth", "issuer"}
	args, env = append(args, extraArgs...), append(env, extraEnv...)
	s.dbURL = dbURL
	// Both start at once against an empty database: they migrate it once.
	var wg sync.WaitGroup
	addrA, addrB := freeAddr(t), freeAddr(t)
	wg.Go(func() { s.a = startServe(t, "a", addrA, args, env) })
	wg.Go(func() { s.b = startServe(t, "b", addrB, args, env) })
	wg.Wait()
	if s.a == nil || s.b == nil {
		t.FailNow()
	}
	s.lb.add("a", s.a.base)
	s.lb.add("b", s.b.base)
	if s.store, err = pgstore.Open(t.Context(), dbURL, s.keys, pgstore.Options{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.store.Close() })
	for _, u := range users {
		if mcpAuth != "issuer" {
			break
		}
		tok, _, err := s.idp.MintAccessToken(u, public+"/mcp", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s.bearers[u] = tok
	}
	return s
}

// browserOn is a person's browser whose requests reach only replica.
func (s *replicaStack) browserOn(replica string) *http.Client {
	jar, _ := cookiejar.New(nil)
	lbURL, _ := url.Parse(s.lb.srv.URL)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second,
		Transport: pinTransport{host: lbURL.Host, replica: replica, next: s.lb.srv.Client().Transport}}
}

// TestReplicas runs two broker processes on one PostgreSQL database.
func TestReplicas(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	users := []string{"alice"}
	for i := range 40 {
		users = append(users, fmt.Sprintf("u%02d", i))
	}
	s := newReplicaStack(t, users)
	public := s.lb.srv.URL

	t.Run("MRTR answered by A, completed in the browser on B, retried on A", func(t *testing.T) {
		first, err := mcpCall(s.client, public, "a", s.bearers["alice"], "connect_account", map[string]any{"provider": "demo"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		key, link := elicitation(t, first)
		if !strings.HasPrefix(link, public+"/connect/") {
			t.Fatalf("connect link %q is not on the public URL", link)
		}
		before := s.lb.hitsOf("b")
		br := s.browserOn("b")
		req, _ := http.NewRequest(http.MethodGet, link, nil)
		p := fetch(t, br, req)
		p = submitForm(t, br, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
		p = submitForm(t, br, p, "/connect/", url.Values{"decision": {"approve"}})
		p = submitForm(t, br, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
		if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
			t.Fatalf("browser ended on %s (HTTP %d):\n%.2000s", p.url, p.status, p.body)
		}
		if s.lb.hitsOf("b")-before < 4 {
			t.Fatalf("replica b served %d browser requests; the flow did not run on b", s.lb.hitsOf("b")-before)
		}
		hitsA := s.lb.hitsOf("a")
		retry, err := mcpCall(s.client, public, "a", s.bearers["alice"], "connect_account", map[string]any{"provider": "demo"}, map[string]any{
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}},
			"requestState":   first.Result.RequestState,
		})
		if err != nil {
			t.Fatal(err)
		}
		if retry.Result.ResultType != "complete" || retry.Result.IsError || !strings.Contains(retry.Raw, "alice-demo") {
			t.Fatalf("retry on a answered %s", retry.Raw)
		}
		if s.lb.hitsOf("a") != hitsA+1 {
			t.Fatal("the retry did not reach replica a")
		}
	})

	t.Run("100 concurrent calls on both replicas, expired token: one refresh", func(t *testing.T) {
		list, err := s.store.ListConnections(t.Context(), vault.Principal{Issuer: s.idp.Issuer(), Subject: "alice"})
		if err != nil || len(list) != 1 {
			t.Fatalf("alice's connections: %d, %v", len(list), err)
		}
		full, err := s.store.GetConnection(t.Context(), list[0].ID) // a listing carries no tokens
		if err != nil || full.Token.RefreshToken == "" {
			t.Fatalf("alice's connection: %v (refresh token present: %v)", err, full.Token.RefreshToken != "")
		}
		id, oldRT := full.ID, full.Token.RefreshToken
		if _, err := s.store.UpdateConnection(t.Context(), id, func(c vault.Connection) (vault.Connection, error) {
			c.Token.Expiry = time.Now().Add(-time.Minute)
			return c, nil
		}); err != nil {
			t.Fatal(err)
		}
		seqBefore := len(s.demo.Events())
		const n = 100
		answers := make([]mcpAnswer, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				answers[i], errs[i] = mcpCall(s.client, public, []string{"a", "b"}[i%2], s.bearers["alice"], "provider_request",
					map[string]any{"provider": "demo", "method": "GET", "path": "/user"}, nil)
			})
		}
		wg.Wait()
		refreshes, api := 0, 0
		var seen []string
		for _, e := range s.demo.Events()[seqBefore:] {
			switch {
			case e.Kind == "token" && e.GrantType == "refresh_token":
				refreshes++
			case e.Kind == "api":
				api++
			}
			seen = append(seen, fmt.Sprintf("%s/%s/%d/%s", e.Kind, e.GrantType, e.Status, e.Error))
		}
		for i := range n {
			if errs[i] != nil || !strings.Contains(answers[i].Raw, `alice-demo`) || answers[i].Result.IsError {
				t.Fatalf("call %d: %v %s\nprovider saw %d refreshes: %v\nlogs:\n%s\n%s", i, errs[i], answers[i].Raw, refreshes, seen,
					grepLines(s.a.logs.String(), "{"), grepLines(s.b.logs.String(), "{"))
			}
		}
		if refreshes != 1 || api != n {
			t.Fatalf("%d refreshes and %d API calls reached the provider; want exactly 1 refresh and %d calls", refreshes, api, n)
		}
		c, err := s.store.GetConnection(t.Context(), id)
		if err != nil || c.Token.RefreshToken == oldRT || c.Status != vault.StatusActive {
			t.Fatalf("after the refresh the store holds status %s, rotated %v (%v)", c.Status, c.Token.RefreshToken != oldRT, err)
		}
	})

	t.Run("SIGKILL of PostgreSQL mid-traffic loses no acknowledged write; both replicas recover", func(t *testing.T) {
		type ack struct{ user, grant string }
		var (
			mu           sync.Mutex // guards acked
			acked        []ack
			afterRestart atomic.Int64
			refused      atomic.Int64
			killed       atomic.Bool
		)
		killAt, outage, restarted, stop := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
		var killOnce, outageOnce sync.Once
		call := func(user, replica string) bool {
			a, err := mcpCall(s.client, public, replica, s.bearers[user], "connect_account", map[string]any{"provider": "demo"}, nil)
			if err != nil || a.Result.ResultType != "input_required" {
				return false // not acknowledged
			}
			_, link := elicitation(t, a)
			mu.Lock()
			defer mu.Unlock()
			acked = append(acked, ack{user, strings.TrimPrefix(link, public+"/connect/")})
			if len(acked) == 12 {
				killOnce.Do(func() { close(killAt) })
			}
			return true
		}
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					wasRestarted := isClosed(restarted)
					if call(fmt.Sprintf("u%02d", w*5+i%5), "") {
						if wasRestarted {
							afterRestart.Add(1)
						}
						continue
					}
					if killed.Load() && !wasRestarted {
						// The database is down: this writer waits for it.
						refused.Add(1)
						outageOnce.Do(func() { close(outage) })
						select {
						case <-restarted:
						case <-stop:
							return
						}
					}
				}
			})
		}
		<-killAt
		killed.Store(true)
		if err := s.pg.Kill(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-outage: // a call failed for want of the database
		case <-time.After(30 * time.Second):
			t.Fatal("no call failed within 30s of killing PostgreSQL")
		}
		if err := s.pg.Restart(); err != nil {
			t.Fatalf("restart PostgreSQL: %v\n%s", err, s.pg.Log())
		}
		close(restarted)
		// Each replica answers again with the same process: its pools drop
		// the connections the crash broke (at most one failed call each).
		for _, r := range []*serveProc{s.a, s.b} {
			failed := 0
			for !call("u00", r.name) {
				if failed++; failed == 64 {
					t.Fatalf("replica %s did not answer a call after PostgreSQL restarted:\n%s", r.name, grepLines(r.logs.String(), "{"))
				}
			}
			if isClosed(r.exited) {
				t.Fatalf("replica %s exited", r.name)
			}
			t.Logf("replica %s answers again after %d failed calls", r.name, failed)
		}
		close(stop)
		wg.Wait()
		if afterRestart.Load() == 0 {
			t.Fatal("no call through the balancer was answered after the restart")
		}
		// The test's own pool lost its connections too: a fresh view.
		s.store.Close()
		var err error
		if s.store, err = pgstore.Open(t.Context(), s.dbURL, s.keys, pgstore.Options{}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, a := range acked {
			g, err := s.store.GetGrant(t.Context(), a.grant)
			if err != nil || g.Principal.Subject != a.user || g.State != vault.GrantPending {
				t.Fatalf("acknowledged grant %s of %s after the crash: %+v, %v", a.grant, a.user, g, err)
			}
		}
		t.Logf("%d acknowledged grants survived a PostgreSQL crash; %d calls refused during the outage, %d answered through the balancer after it",
			len(acked), refused.Load(), afterRestart.Load())
	})

	t.Run("SIGKILL of one replica mid-traffic loses no acknowledged write", func(t *testing.T) {
		type ack struct{ user, grant string }
		var (
			mu        sync.Mutex
			acked     []ack
			afterKill atomic.Int64
			killed    atomic.Bool
		)
		killAt := make(chan struct{})
		var once sync.Once
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 8 {
					user := fmt.Sprintf("u%02d", w*5+i%5)
					a, err := mcpCall(s.client, public, "", s.bearers[user], "connect_account", map[string]any{"provider": "demo"}, nil)
					if err != nil || a.Result.ResultType != "input_required" {
						continue // not acknowledged (the replica died under it, or 502)
					}
					_, link := elicitation(t, a)
					mu.Lock()
					acked = append(acked, ack{user, strings.TrimPrefix(link, public+"/connect/")})
					if len(acked) == 12 {
						once.Do(func() { close(killAt) })
					}
					mu.Unlock()
					if killed.Load() {
						afterKill.Add(1)
					}
				}
			})
		}
		<-killAt
		s.a.kill()
		killed.Store(true)
		wg.Wait()
		if afterKill.Load() == 0 {
			t.Fatal("no call was answered after replica a died")
		}
		for _, a := range acked {
			g, err := s.store.GetGrant(t.Context(), a.grant)
			if err != nil || g.Principal.Subject != a.user || g.State != vault.GrantPending {
				t.Fatalf("acknowledged grant %s of %s: %+v, %v", a.grant, a.user, g, err)
			}
		}
		// The survivor serves alice's connection made on the other replica.
		res, err := mcpCall(s.client, public, "b", s.bearers["alice"], "list_connections", map[string]any{}, nil)
		if err != nil || res.Result.IsError || !strings.Contains(res.Raw, "alice-demo") {
			t.Fatalf("list on b after a died: %v %s", err, res.Raw)
		}
		t.Logf("%d acknowledged grants checked, %d answered after the kill", len(acked), afterKill.Load())
	})

	for _, p := range []*serveProc{s.a, s.b} {
		for _, secret := range []string{"idp-secret", "demo-secret", s.bearers["alice"]} {
			if strings.Contains(p.logs.String(), secret) {
				t.Errorf("replica %s logged a secret", p.name)
			}
		}
	}
}

// isClosed reports whether ch is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
