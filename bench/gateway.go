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
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/egress"
)

// The gateway part (-only gateway): tools/call test_simple_text relayed
// through /mcp/u/{provider} against the same call straight to the
// upstream MCP server, and through a bare forwarder (the floor), in turns
// of one second, at c=1 and c=16; then the cached tools/list.
//
// Two upstreams, both go-sdk servers over loopback:
//
//   - everything: the go-sdk's conformance everything-server, built from
//     the module cache and run as a child process (stateless streamable
//     HTTP), relayed with auth: none. Its rows run once, with the first
//     store's broker: the path reads no store.
//   - protected: a go-sdk server in this process behind
//     auth.RequireBearerToken, relayed with auth: oauth for people who
//     each have a stored connection to it, so every relayed call reads the
//     connection's token from the store and checks it needs no refresh.
//     Its rows run with every store's broker.
//
// The gateway admits at most 8 calls in flight and 600 a minute for one
// person and provider, so the calls take turns among gwPeople people (as
// many hosts would), each within the limits: a call the limits refused
// would fail the run (every answer counted must be a relayed result).

// gwUpstreams are the gateway's upstream servers, shared by the stores'
// brokers.
type gwUpstreams struct {
	// everything is the conformance server's MCP URL; sdk names the
	// go-sdk module it was built from.
	everything, sdk string
	// protected is the OAuth-protected server's MCP URL.
	protected string
	// openDone: the auth: none rows were measured (with the first store).
	openDone bool
	closers  []func()
}

func (u *gwUpstreams) close() {
	for i := len(u.closers) - 1; i >= 0; i-- {
		u.closers[i]()
	}
}

// Gateway providers and people.
const (
	gwOpen      = "everything" // auth: none
	gwProtected = "protected"  // auth: oauth
	gwTool      = "test_simple_text"
	gwText      = "This is a simple text response for testing."
	// gwUpstreamToken is carol's access token at the protected server.
	gwUpstreamToken = "up-bench-access-0123456789abcdef"
)

// gwPeople take turns calling through the gateway; each has a
// connection to protected. With the limit of 600 calls a minute for one
// person and provider, 200 people allow 2,000 calls a second for a minute
// on each endpoint.
const gwPeople = 200

func gwName(i int) string { return fmt.Sprintf("gw-%04d", i) }

// gwTargets are issue 31's performance targets for a relayed call.
var gwTargets = struct {
	p50c1, rpsC16, p99 float64 // ratios to the direct call's
	ownMs, listMs      float64
}{p50c1: 1.4, rpsC16: 0.7, p99: 1.5, ownMs: 0.1, listMs: 0.3}

// startGatewayUpstreams builds and starts the everything-server and
// starts the protected server.
func startGatewayUpstreams(dir string) (_ *gwUpstreams, err error) {
	u := &gwUpstreams{}
	defer func() {
		if err != nil {
			u.close()
		}
	}()
	t0 := time.Now()
	if u.everything, u.sdk, err = startEverything(dir, &u.closers); err != nil {
		return nil, fmt.Errorf("the go-sdk everything-server: %w", err)
	}
	if u.protected, err = startProtected(&u.closers); err != nil {
		return nil, err
	}
	fmt.Printf("\ngateway upstreams: the everything-server of %s (built and started in %s, a child process at %s); a go-sdk server behind auth.RequireBearerToken at %s\n",
		u.sdk, time.Since(t0).Round(10*time.Millisecond), u.everything, u.protected)
	return u, nil
}

// goTool is the go command that runs the bench (go run), else the one on
// PATH.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// startEverything builds the go-sdk's conformance/everything-server from
// the module cache (the module version go.mod requires) and runs it on a
// free loopback port until the closers run.
func startEverything(dir string, closers *[]func()) (url, sdk string, err error) {
	const mod = "github.com/modelcontextprotocol/go-sdk"
	out, err := exec.Command(goTool(), "list", "-m", "-f", "{{.Path}}@{{.Version}} {{.Dir}}", mod).Output()
	if err != nil {
		return "", "", fmt.Errorf("go list -m %s: %w", mod, err)
	}
	f := strings.Fields(string(out))
	if len(f) != 2 || !fileExists(filepath.Join(f[1], "conformance", "everything-server", "main.go")) {
		return "", "", fmt.Errorf("go list -m %s: no conformance/everything-server in %q", mod, out)
	}
	sdk = f[0]
	bin := filepath.Join(dir, "everything-server")
	build := exec.Command(goTool(), "build", "-o", bin, mod+"/conformance/everything-server")
	if b, err := build.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build: %w\n%s", err, b)
	}
	// The server takes an address, not a listener: a port just freed is
	// taken again, and a start that loses the port to someone else is
	// retried on another.
	for attempt := 0; ; attempt++ {
		ln, base, err := listen()
		if err != nil {
			return "", "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		var logs bytes.Buffer
		cmd := exec.Command(bin, "-http", addr)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		if err := cmd.Start(); err != nil {
			return "", "", err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			cmd.Process.Kill()
			<-exited
		}
		if err := awaitMCP(base+"/mcp", exited); err != nil {
			stop()
			if attempt < 3 {
				continue
			}
			return "", "", fmt.Errorf("%w\n%s", err, logs.String())
		}
		*closers = append(*closers, stop)
		return base + "/mcp", sdk, nil
	}
}

// awaitMCP waits until the MCP server at url answers server/discover, at
// most 20 seconds, or until it exits.
func awaitMCP(url string, exited <-chan error) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		req := mcpRequest(url, "server/discover", "", nil, gwBody("server/discover", `{`))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && bytes.Contains(b, []byte(`"supportedVersions"`)) {
				return nil
			}
			return fmt.Errorf("server/discover: HTTP %d %s", resp.StatusCode, b)
		}
		select {
		case err := <-exited:
			return fmt.Errorf("the server exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer within 20 s: %v", err)
		}
	}
}

// startProtected serves a go-sdk server with the everything-server's
// test_simple_text behind auth.RequireBearerToken (which accepts
// gwUpstreamToken only), with its RFC 9728 metadata.
func startProtected(closers *[]func()) (string, error) {
	ln, base, err := listen()
	if err != nil {
		return "", err
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "bench-protected", Version: "1.0.0"}, nil)
	server.AddTool(&mcp.Tool{Name: gwTool, Description: "Tests simple text content response", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: gwText}}}, nil
		})
	meta := base + "/.well-known/oauth-protected-resource/mcp"
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		if tok != gwUpstreamToken {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Scopes: []string{"tools"}, Expiration: time.Now().Add(time.Hour)}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: meta})(
		mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true})))
	mux.Handle("GET /.well-known/oauth-protected-resource/mcp", auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource: base + "/mcp", AuthorizationServers: []string{base}, ScopesSupported: []string{"tools"}}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	*closers = append(*closers, func() { srv.Close() })
	return base + "/mcp", nil
}

// gwCatalogue is the catalogue's gateway entries.
func (u *gwUpstreams) catalogue() string {
	if u == nil {
		return ""
	}
	return `  ` + gwOpen + `:
    display_name: Everything
    type: mcp
    mcp: {url: ` + u.everything + `, auth: none}
  ` + gwProtected + `:
    display_name: Protected
    type: mcp
    mcp: {url: ` + u.protected + `}
`
}

// gwMeta is the _meta of every gateway request (2026-07-28).
const gwMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}},` +
	`"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}}}`

// gwBody is a request of method whose params open with params (an
// unfinished object, "{" for none) and end with the _meta.
func gwBody(method, params string) []byte {
	sep := ","
	if params == "{" {
		sep = ""
	}
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"` + method + `","params":` + params + sep + gwMeta)
}

// mcpRequest is a POST of body to url with the headers of a 2026-07-28
// request for method (and name), and auth as its Authorization header.
func mcpRequest(url, method, name string, auth []string, body []byte) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header = http.Header{"Content-Type": {"application/json"}, "Accept": {"application/json, text/event-stream"},
		"Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {method}}
	if name != "" {
		req.Header["Mcp-Name"] = []string{name}
	}
	if auth != nil {
		req.Header["Authorization"] = auth
	}
	return req
}

// mcpForwarder is the gateway's floor: a JSON-RPC forwarder on net/http
// and encoding/json alone, doing what any relay must and nothing more (no
// authentication of the host, no store, no token handling, no checks of
// the answer): decode the message, POST its bytes to the upstream with
// the MCP headers (and auth, the upstream's fixed bearer token, when set)
// over a keep-alive client, and answer the upstream's JSON-RPC message
// (the data of its SSE event, or its JSON body) as application/json.
func mcpForwarder(upstream string, auth []string) http.Handler {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  json.RawMessage `json:"params"`
		}
		if err != nil || json.Unmarshal(body, &msg) != nil || msg.Method == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, upstream, bytes.NewReader(body))
		if err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		for _, k := range []string{"Content-Type", "Accept", "Mcp-Protocol-Version", "Mcp-Method", "Mcp-Name"} {
			req.Header[k] = r.Header[k]
		}
		if auth != nil {
			req.Header["Authorization"] = auth
		}
		resp, out, ok := fetch(w, client, req, 4<<20)
		if !ok {
			return
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			out = sseData(out)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(out)
	})
}

// sseData is the data of the first event of an SSE body.
func sseData(b []byte) []byte {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, len(b)+1)
	for sc.Scan() {
		if d, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: ")); ok {
			return d
		}
	}
	return nil
}

// gwRoute is one relayed upstream as the loader sees it.
type gwRoute struct {
	title    string // in the tables
	provider string
	gateway  string     // the broker's /mcp/u/{provider}
	hostAuth [][]string // each person's bearer token there
	direct   string     // the upstream itself
	upAuth   []string   // the upstream's bearer token (nil: none)
	floor    string     // the bare forwarder in front of the upstream
	next     *atomic.Int64
}

// person is the next person's bearer token, in turns.
func (rt gwRoute) person() []string {
	return rt.hostAuth[int(rt.next.Add(1))%len(rt.hostAuth)]
}

// gateway measures the relayed rows: the auth: none upstream's once (the
// first store that runs), the OAuth upstream's with every store.
func (st *stack) gateway(cfg config) error {
	if st.gw == nil {
		return errors.New("no gateway upstreams")
	}
	if !st.gw.openDone {
		if err := st.gatewayRows(cfg, st.gwRoutes[gwOpen]); err != nil {
			return err
		}
		st.gw.openDone = true
	}
	return st.gatewayRows(cfg, st.gwRoutes[gwProtected])
}

// relayed counts the upstream requests the broker's metrics recorded for
// provider and method with outcome ok (each relayed call that came back
// with a result).
func (st *stack) relayed(provider, method string) (float64, error) {
	resp, err := http.Get(st.base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	want := []string{`provider="` + provider + `"`, `method="` + method + `"`, `outcome="ok"`}
	var n float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "credbroker_upstream_requests_total{") {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(line, w)
		}
		if f := strings.Fields(line); ok && len(f) == 2 {
			var v float64
			fmt.Sscanf(f[1], "%g", &v)
			n += v
		}
	}
	return n, sc.Err()
}

// check calls the upstream and the forwarder once and the gateway once
// for each person (which opens their upstream sessions), and wants the
// tool's text from each.
func (rt gwRoute) check() error {
	call := gwBody("tools/call", `{"name":"`+gwTool+`","arguments":{}`)
	type path struct {
		what, url string
		auth      []string
	}
	paths := []path{{"the upstream", rt.direct, rt.upAuth}, {"the forwarder", rt.floor, nil}}
	for _, a := range rt.hostAuth {
		paths = append(paths, path{"the gateway", rt.gateway, a})
	}
	for _, p := range paths {
		resp, err := http.DefaultClient.Do(mcpRequest(p.url, "tools/call", gwTool, p.auth, call))
		if err != nil {
			return fmt.Errorf("%s: %w", p.what, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(gwText)) || bytes.Contains(b, []byte(`"isError":true`)) {
			return fmt.Errorf("%s (%s) answered HTTP %d: %s", p.what, rt.provider, resp.StatusCode, b)
		}
	}
	return nil
}

func (st *stack) gatewayRows(cfg config, rt gwRoute) error {
	if err := rt.check(); err != nil {
		return err
	}
	call := gwBody("tools/call", `{"name":"`+gwTool+`","arguments":{}`)
	hammer := func(url string, auth func() []string, method, name string, body []byte) func(c int) func(w, d time.Duration) loadResult {
		return func(c int) func(w, d time.Duration) loadResult {
			return func(w, d time.Duration) loadResult {
				return hammerWith(func() *http.Request { return mcpRequest(url, method, name, auth(), body) }, c, w, d, processCPU)
			}
		}
	}
	fixed := func(a []string) func() []string { return func() []string { return a } }
	gw := hammer(rt.gateway, rt.person, "tools/call", gwTool, call)
	direct := hammer(rt.direct, fixed(rt.upAuth), "tools/call", gwTool, call)
	floor := hammer(rt.floor, fixed(nil), "tools/call", gwTool, call)
	fmt.Printf("\n## Gateway (%s): tools/call %s, %s per path and concurrency (alternating 1s slices, +%s warm-up), loopback\n\n",
		rt.title, gwTool, cfg.duration, cfg.warmup)
	fmt.Println("| c | path | req/s | p50 ms | p99 ms | p50 ÷ direct's | req/s ÷ direct | p99 ÷ direct's | process CPU µs/call |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	what := "gateway " + rt.title
	for _, c := range cfg.levels {
		before, err := st.relayed(rt.provider, "tools/call")
		if err != nil {
			return err
		}
		res := alternate(cfg.duration, cfg.warmup, gw(c), direct(c), floor(c))
		after, err := st.relayed(rt.provider, "tools/call")
		if err != nil {
			return err
		}
		g, d, f := res[0], res[1], res[2]
		for i, name := range []string{"through the broker, /mcp/u/" + rt.provider, "direct to the upstream", "floor: bare forwarder"} {
			r := res[i]
			fmt.Printf("| %d | %s | %.0f | %s | %s | %.2f | %.2f | %.2f | %.0f |\n", c, name, r.rps, ms(r.p50), ms(r.p99),
				ratio(r.p50, d.p50), r.rps/d.rps, ratio(r.p99, d.p99), float64(r.srvCPU.Microseconds())/float64(max(r.n, 1)))
			if r.errors > 0 {
				fmt.Printf("|  | (%d errors) |\n", r.errors)
			}
		}
		// Every answer the loader counted is a relayed call with a result
		// (a tool error is a 200 too).
		if after-before < float64(g.all) {
			return fmt.Errorf("%s, c=%d: %d answers but %.0f relayed calls with a result", what, c, g.all, after-before)
		}
		ok := g.errors == 0
		p99 := ratio(g.p99, d.p99)
		at := fmt.Sprintf("%s, c=%d", what, c)
		if c == 1 {
			p50 := ratio(g.p50, d.p50)
			st.sum.add(at+": p50 ÷ direct's", fmt.Sprintf("%.2f× (%s vs %s ms)", p50, ms(g.p50), ms(d.p50)), fmt.Sprintf("≤ %.1f×", gwTargets.p50c1), p50 <= gwTargets.p50c1 && ok)
			own := float64((g.p50 - f.p50).Microseconds()) / 1000
			fmt.Printf("\nc=1: the broker adds %s ms at p50 over the direct call, the bare forwarder %s ms: the broker's own work is %.3f ms\n\n",
				ms(g.p50-d.p50), ms(f.p50-d.p50), own)
			st.sum.add(at+": the broker's own work at p50 over the bare forwarder, ms", fmt.Sprintf("%.3f (%s vs %s ms)", own, ms(g.p50), ms(f.p50)),
				fmt.Sprintf("≤ %.1f", gwTargets.ownMs), own <= gwTargets.ownMs && ok)
		} else {
			rps := g.rps / d.rps
			st.sum.add(at+": throughput ÷ direct", fmt.Sprintf("%.2f× (%.0f vs %.0f req/s)", rps, g.rps, d.rps), fmt.Sprintf("≥ %.2f×", gwTargets.rpsC16), rps >= gwTargets.rpsC16 && ok)
		}
		st.sum.add(at+": p99 ÷ direct's", fmt.Sprintf("%.2f× (%s vs %s ms)", p99, ms(g.p99), ms(d.p99)), fmt.Sprintf("≤ %.1f×", gwTargets.p99), p99 <= gwTargets.p99 && ok)
	}

	// The cached tools/list: each person's first answer fills their cache
	// (in check and the warm-up), then no request reaches the upstream.
	for _, a := range rt.hostAuth {
		resp, err := http.DefaultClient.Do(mcpRequest(rt.gateway, "tools/list", "", a, gwBody("tools/list", "{")))
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"name":"`+gwTool+`"`)) {
			return fmt.Errorf("tools/list through the gateway (%s): HTTP %d %s", rt.provider, resp.StatusCode, b)
		}
	}
	list := gwBody("tools/list", "{")
	before, err := st.relayed(rt.provider, "tools/list")
	if err != nil {
		return err
	}
	res := alternate(cfg.duration, cfg.warmup, hammer(rt.gateway, rt.person, "tools/list", "", list)(1), hammer(rt.direct, fixed(rt.upAuth), "tools/list", "", list)(1))
	after, err := st.relayed(rt.provider, "tools/list")
	if err != nil {
		return err
	}
	g, d := res[0], res[1]
	fmt.Printf("\ntools/list, c=1: through the broker (cached) %.0f req/s, p50 %s ms, p99 %s ms; direct to the upstream (uncached) %.0f req/s, p50 %s ms, p99 %s ms; upstream tools/list requests during the slices: %.0f\n",
		g.rps, ms(g.p50), ms(g.p99), d.rps, ms(d.p50), ms(d.p99), after-before)
	if after-before > 0 {
		return fmt.Errorf("%s: tools/list reached the upstream %.0f times while cached", what, after-before)
	}
	p50 := float64(g.p50.Microseconds()) / 1000
	st.sum.add(what+", cached tools/list, c=1: p50 ms", fmt.Sprintf("%.3f (direct, uncached: %s)", p50, ms(d.p50)), fmt.Sprintf("≤ %.1f", gwTargets.listMs), p50 <= gwTargets.listMs && g.errors == 0)

	if cfg.cpuprofile != "" {
		// c=16 for where the CPU goes under load; c=1 for the latency
		// target, where waiting and waking count as much as work.
		for _, c := range []int{16, 1} {
			name := cfg.cpuprofile + "." + st.kind + ".gateway-" + rt.provider
			if c == 1 {
				name += ".c1"
			}
			f, err := os.Create(name)
			if err != nil {
				return err
			}
			pprof.StartCPUProfile(f)
			r := gw(c)(cfg.warmup, cfg.duration)
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				return err
			}
			fmt.Printf("\nCPU profile of the gateway alone at c=%d (%s, %.0f req/s, load generator in the same process): %s\n", c, cfg.duration, r.rps, name)
		}
	}
	return nil
}

// processCPU is this process's CPU time (the loader's, the broker's or
// the forwarder's, and the protected upstream's).
func processCPU() time.Duration { cpu, _ := usage(); return cpu }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }

// upstreamClients are the gateway's egress clients as serve builds them
// (cmd/broker upstreams.go) with --upstream-allow-private: auth for the
// upstreams' authorization servers, mcp for the MCP sessions.
func upstreamClients() (authHTTP, mcpHTTP *http.Client, err error) {
	base := egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true, DialTimeout: 5 * time.Second, TLSHandshakeTimeout: 5 * time.Second}
	a := base
	a.ResponseHeaderTimeout, a.MaxResponseBytes = 15*time.Second, 1<<20
	if authHTTP, err = egress.New(a); err != nil {
		return nil, nil, err
	}
	m := base
	m.Timeout = -1
	mcpHTTP, err = egress.New(m)
	return authHTTP, mcpHTTP, err
}

// gatewayRoutes starts the forwarders (the floors) and names each
// route's paths and tokens: the host's are the broker's own, for the
// endpoint, which h gets for each person as a host does (the default
// path: --mcp-auth broker).
func (st *stack) gatewayRoutes(h *host) error {
	st.gwRoutes = map[string]gwRoute{}
	people := make([]string, gwPeople)
	for i := range people {
		people[i] = gwName(i)
	}
	for _, r := range []struct {
		provider, title, upstream string
		upAuth                    []string
	}{
		{gwOpen, "/mcp/u/" + gwOpen + " (auth: none)", st.gw.everything, nil},
		{gwProtected, "/mcp/u/" + gwProtected + " (OAuth upstream, " + storeTitle(st.kind) + ")", st.gw.protected, []string{"Bearer " + gwUpstreamToken}},
	} {
		ln, url, err := listen()
		if err != nil {
			return err
		}
		serve(st, ln, mcpForwarder(r.upstream, r.upAuth))
		endpoint := st.base + "/mcp/u/" + r.provider
		rt := gwRoute{title: r.title, provider: r.provider, gateway: endpoint, direct: r.upstream, upAuth: r.upAuth, floor: url + "/mcp", next: new(atomic.Int64)}
		toks, err := h.tokens(people, endpoint, 4)
		if err != nil {
			return fmt.Errorf("tokens for %s: %w", endpoint, err)
		}
		for _, name := range people {
			rt.hostAuth = append(rt.hostAuth, []string{"Bearer " + toks[name]})
		}
		st.gwRoutes[r.provider] = rt
	}
	return nil
}

// resources are the gateway endpoints the broker's authorization server
// issues tokens for (as serve's: the type: mcp entries), none without
// the upstreams.
func (u *gwUpstreams) resources(base string) func(string) bool {
	if u == nil {
		return nil
	}
	return func(r string) bool { return r == base+"/mcp/u/"+gwOpen || r == base+"/mcp/u/"+gwProtected }
}
