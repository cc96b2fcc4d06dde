// Command bench is credbroker's reproducible load run (`make bench`), on
// loopback only and bounded in time:
//
//   - load: tools/call connect_account for an already connected user over
//     HTTP with a real signed JWT (devidp), at several concurrencies, next to
//     a baseline server in the same run (a bare net/http handler decoding
//     the same JSON-RPC body and answering fixed JSON); throughput, p50, p99
//     and the broker/baseline ratio;
//   - provider: provider_request's added latency at p50 (c=1);
//   - opens: token-set decryptions per list_connections and per
//     provider_request for a person with five connections;
//   - mrtr: the full MRTR round trip (first call, input_required, the
//     consent form's grant check, the callback's connections.Save, which
//     approves and completes the grant, retry, complete), CPU time
//     (and its kernel part) and durable commits per round trip, server side
//     only (the handler is called in-process), for 400 people in turns
//     with the default limits on connect requests;
//   - vault: a bolt store with -vault-conns connections: open time, Get
//     p50/p99 and process RSS (measured in a fresh child process).
//
// It ends with a table of the performance targets next to their measures.
//
// The broker is built as `serve` builds it: bolt store, telemetry (metrics
// and the store wrapper) on, JSON logs at info level to io.Discard behind
// the redacting handler.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/devidp"
	"credbroker/internal/logredact"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/mcpapi"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/boltstore"

	bolt "go.etcd.io/bbolt"
	"go.opentelemetry.io/otel/trace"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "vault-measure" {
		if err := vaultMeasure(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	var (
		duration   = flag.Duration("duration", 5*time.Second, "measured time per server and concurrency")
		warmup     = flag.Duration("warmup", time.Second, "unmeasured warm-up per server and concurrency")
		concs      = flag.String("c", "1,16,64", "concurrencies")
		cpuprofile = flag.String("cpuprofile", "", "write CPU profiles: the broker load run at c=16 to this file, the provider_request run to this file + \".provider\", the MRTR run (with the bare commits of its floor, which take turns with it) to this file + \".mrtr\"")
		mrtrN      = flag.Int("mrtr", 2000, "MRTR round trips to time (0 skips)")
		vaultN     = flag.Int("vault-conns", 1_000_000, "connections in the vault fixture (0 skips)")
		twoSteps   = flag.Bool("two-step-connect", false, "hide the store's one-transaction connect (compare with the callback's two writes)")
		only       = flag.String("only", "", "run only: load, provider, opens, mrtr or vault")
		memprofile = flag.String("memprofile", "", "write an allocation profile of the MRTR run (every allocation sampled) to this file + \".mrtr\"")
		traced     = flag.Bool("tracing", false, "trace as serve does with OTEL_EXPORTER_OTLP_ENDPOINT set: batched OTLP/HTTP export to a loopback sink the bench runs")
	)
	flag.Parse()
	benchTwoSteps = *twoSteps
	benchTracing = *traced
	benchMemProfile = *memprofile
	if err := run(*duration, *warmup, *concs, *cpuprofile, *mrtrN, *vaultN, *only); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// benchMemProfile is the -memprofile flag.
var benchMemProfile string

// benchTracing is the -tracing flag.
var benchTracing bool

func run(duration, warmup time.Duration, concs, cpuprofile string, mrtrN, vaultN int, only string) error {
	fmt.Printf("credbroker bench: %s, GOMAXPROCS=%d, %s, load average at start: %s\n",
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.GOARCH, loadavg())
	dir, err := os.MkdirTemp("", "credbroker-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var st *stack
	if only == "" || only == "load" || only == "mrtr" || only == "provider" || only == "opens" {
		st, err = newStack(dir)
		if err != nil {
			return err
		}
		defer st.close()
		if only == "" || only == "load" {
			if err := st.load(duration, warmup, concs, cpuprofile); err != nil {
				return err
			}
		}
		if only == "" || only == "provider" {
			if err := st.providerOverhead(duration, warmup, cpuprofile); err != nil {
				return err
			}
		}
		if only == "" || only == "opens" {
			if err := st.opens(); err != nil {
				return err
			}
		}
		if (only == "" || only == "mrtr") && mrtrN > 0 {
			if err := st.mrtr(mrtrN, cpuprofile); err != nil {
				return err
			}
		}
	}
	if (only == "" || only == "vault") && vaultN > 0 {
		if err := vaultRun(dir, vaultN); err != nil {
			return err
		}
	}
	if st != nil && len(st.sum) > 0 {
		fmt.Printf("\n## Targets (issue 16)\n\n| measure | measured | target | met |\n|---|---|---|---|\n")
		for _, l := range st.sum {
			met := "yes"
			if !l.met {
				met = "NO"
			}
			fmt.Printf("| %s | %s | %s | %s |\n", l.what, l.got, l.target, met)
		}
	}
	fmt.Printf("load average at end: %s\n", loadavg())
	return nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// stack is the broker's MCP endpoint with its real dependencies, the IdP
// and the baseline server, each on its own loopback listener.
type stack struct {
	base      string // broker base URL
	baseline  string // baseline server URL
	token     string
	header    http.Header // newRequest's headers
	alice     vault.Principal
	store     *boltstore.Store
	keys      *vault.Keyring
	mrtrSrv   *mcpapi.Server
	mrtrGrant *binding.Service
	mrtrConns *connections.Service
	people    []mrtrPerson   // who the MRTR round trips are for, in turns
	counter   *countingStore // durable commits through the broker's store
	bobToken  string         // bob has five connections (the opens run)
	apiURL    string         // the fake provider API
	proxyURL  string         // provider_request's floor: a bare forwarder
	sum       []summaryLine
	closers   []func()
}

func (st *stack) close() {
	for i := len(st.closers) - 1; i >= 0; i-- {
		st.closers[i]()
	}
}

func listen() (net.Listener, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	return ln, "http://" + ln.Addr().String(), nil
}

func serve(st *stack, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 120 * time.Second}
	go srv.Serve(ln)
	st.closers = append(st.closers, func() { srv.Close() })
}

func newStack(dir string) (*stack, error) {
	st := &stack{}
	ctx := context.Background()

	// The IdP, on its own listener.
	idpLn, idpURL, err := listen()
	if err != nil {
		return nil, err
	}
	users := devidp.DefaultUsers()
	for i := range mrtrPeople {
		name := mrtrName(i)
		users = append(users, devidp.User{Username: name, Password: name, Subject: name, Email: name + "@example.test", Name: name})
	}
	idp, err := devidp.New(devidp.Options{Issuer: idpURL + "/idp", Users: users})
	if err != nil {
		return nil, err
	}
	idpMux := http.NewServeMux()
	idpMux.Handle("/idp/", idp.Handler())
	serve(st, idpLn, idpMux)

	brokerLn, base, err := listen()
	if err != nil {
		return nil, err
	}
	st.base = base
	st.keys, err = vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		return nil, err
	}
	st.store, err = boltstore.Open(filepath.Join(dir, "broker.db"), st.keys, boltstore.Options{})
	if err != nil {
		return nil, err
	}
	st.closers = append(st.closers, func() { st.store.Close() })
	st.alice = vault.Principal{Issuer: idp.Issuer(), Subject: "alice"}
	now := time.Now()
	if _, err := st.store.CreateConnection(ctx, vault.Connection{
		ID: "conn_bench_alice_github", Principal: st.alice, Provider: "github", AccountID: "583231", AccountLogin: "octocat",
		Scopes: []string{"read:user", "repo"}, Status: vault.StatusActive, Created: now, Updated: now,
		Token: vault.TokenSet{AccessToken: benchAccessToken, TokenType: "bearer"},
	}); err != nil {
		return nil, err
	}
	log := slog.New(logredact.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo})))
	rec := telemetry.New(telemetry.Options{Providers: []string{"demo", "github"}, Audit: log, ProcessMetrics: true})
	// bob: five connections, one of them github with the fake API's token
	// (opens per list_connections and per provider_request).
	bob := vault.Principal{Issuer: idp.Issuer(), Subject: "bob"}
	for i, pv := range []string{"github", "gitlab", "slack", "notion", "linear"} {
		if _, err := st.store.CreateConnection(ctx, vault.Connection{
			ID: fmt.Sprintf("conn_bench_bob_%d", i), Principal: bob, Provider: pv, AccountID: strconv.Itoa(100 + i), AccountLogin: "bob-" + pv,
			Scopes: []string{"read:user"}, Status: vault.StatusActive, Created: now, Updated: now,
			Token: vault.TokenSet{AccessToken: benchAccessToken, TokenType: "bearer"},
		}); err != nil {
			return nil, err
		}
	}
	st.counter = &countingStore{Store: st.store, twoSteps: benchTwoSteps}
	tp, err := st.startTracing(ctx)
	if err != nil {
		return nil, err
	}
	store := tracing.WrapStore(tp, rec.WrapStore(st.counter))
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	// The fake provider API: answers GET /user for the seeded token.
	apiLn, apiURL, err := listen()
	if err != nil {
		return nil, err
	}
	st.apiURL = apiURL
	serve(st, apiLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+benchAccessToken || r.URL.Path != "/user" {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Write([]byte(`{"login":"octocat","id":583231,"name":"The Octocat","public_repos":8}`))
	}))
	reg, err := provider.ParseProviders("bench providers", []byte(`providers:
  github:
    display_name: GitHub
    type: oauth2
    authorization_url: `+apiURL+`/login/oauth/authorize
    token_url: `+apiURL+`/login/oauth/access_token
    client_id: bench
    client_secret: ${SECRET}
    default_scopes: [read:user]
    allowed_scopes: [read:user, repo]
    account: {url: `+apiURL+`/user, id_field: id, login_field: login}
    api: {base_url: `+apiURL+`}
  demo:
    display_name: Demo
    type: oauth2
    authorization_url: `+apiURL+`/demo/authorize
    token_url: `+apiURL+`/demo/token
    client_id: bench
    client_secret: ${SECRET}
    default_scopes: [profile]
    account: {url: `+apiURL+`/demo/user, id_field: id}
`), func(string) string { return "bench-secret" })
	if err != nil {
		return nil, err
	}
	pc, err := provider.New(provider.Options{Store: store, Providers: reg, HTTPClient: client, Logger: log, Telemetry: rec, Tracing: tp})
	if err != nil {
		return nil, err
	}
	grants := binding.New(store, binding.Options{})
	conns, err := connections.New(connections.Options{Store: store, Grants: grants,
		Client: pc, PublicURL: base, Telemetry: rec, Logger: log})
	if err != nil {
		return nil, err
	}
	opts := mcpapi.Options{
		PublicURL: base, Issuer: idp.Issuer(), DevMode: true, Connections: conns,
		StateKeys: st.keys.Derive("requestState"), Logger: log, HTTPClient: client, Telemetry: rec, Tracing: tp,
	}
	srv, err := mcpapi.New(opts)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	srv.Register(mux)
	mux.Handle("GET /metrics", rec.Handler())
	serve(st, brokerLn, mux)

	// The MRTR run goes through the same server, with the default limits
	// on connect requests per person (counted in the grant's creating
	// transaction, as in production): mrtrPeople take turns, so no one
	// passes the limit of requests per hour and each person's requests
	// stay as few as they would be.
	st.mrtrSrv, st.mrtrGrant, st.mrtrConns = srv, grants, conns
	for i := range mrtrPeople {
		name := mrtrName(i)
		tok, _, err := idp.MintAccessToken(name, base+"/mcp", nil, time.Hour)
		if err != nil {
			return nil, err
		}
		st.people = append(st.people, mrtrPerson{p: vault.Principal{Issuer: idp.Issuer(), Subject: name}, auth: []string{"Bearer " + tok}})
	}

	st.token, _, err = idp.MintAccessToken("alice", base+"/mcp", nil, time.Hour)
	if err != nil {
		return nil, err
	}
	st.header = http.Header{}
	st.header.Set("Authorization", "Bearer "+st.token)
	st.header.Set("Content-Type", "application/json")
	st.header.Set("Accept", "application/json, text/event-stream")
	st.header.Set("MCP-Protocol-Version", "2026-07-28")
	st.header.Set("Mcp-Method", "tools/call")
	st.header.Set("Mcp-Name", "connect_account")
	if st.bobToken, _, err = idp.MintAccessToken("bob", base+"/mcp", nil, time.Hour); err != nil {
		return nil, err
	}

	// The baseline: decode the same JSON-RPC body, answer the broker's
	// answer as fixed bytes (same size on the wire).
	blLn, blURL, err := listen()
	if err != nil {
		return nil, err
	}
	st.baseline = blURL
	fixed, err := st.brokerAnswer()
	if err != nil {
		return nil, err
	}
	serve(st, blLn, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      json.RawMessage `json:"id"`
			Method  string          `json:"method"`
			Params  json.RawMessage `json:"params"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&msg); err != nil || msg.Method != "tools/call" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed)
	}))

	pxLn, pxURL, err := listen()
	if err != nil {
		return nil, err
	}
	st.proxyURL = pxURL
	serve(st, pxLn, bareForwarder(apiURL))
	return st, nil
}

// bareForwarder is provider_request's floor: a JSON-RPC tools/call
// forwarder on net/http and encoding/json alone, with what any such
// gateway does and nothing more (no authentication, no store, no
// decryption, no checks, no redaction): decode the call, send its method
// and path to the API with the bench token over a keep-alive client, and
// answer the status and body in a JSON-RPC result.
func bareForwarder(apiURL string) http.Handler {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	type content struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type answer struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
	}
	type result struct {
		Content           []content `json:"content"`
		StructuredContent answer    `json:"structuredContent"`
	}
	type response struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  result          `json:"result"`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				Arguments struct {
					Method string `json:"method"`
					Path   string `json:"path"`
				} `json:"arguments"`
			} `json:"params"`
		}
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&msg); err != nil || msg.Method != "tools/call" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), msg.Params.Arguments.Method, apiURL+msg.Params.Arguments.Path, nil)
		if err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		req.Header.Set("Authorization", "Bearer "+benchAccessToken)
		resp, err := client.Do(req)
		if err != nil {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			http.Error(w, "bad gateway", http.StatusBadGateway)
			return
		}
		out, _ := json.Marshal(response{JSONRPC: "2.0", ID: msg.ID, Result: result{
			Content:           []content{{Type: "text", Text: string(body)}},
			StructuredContent: answer{Status: resp.StatusCode, Body: string(body)}}})
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	})
}

// startTracing, with -tracing, sets tracing up as serve does when
// OTEL_EXPORTER_OTLP_ENDPOINT is set (tracing.Setup: the SDK's batch span
// processor, the redacting exporter, OTLP/HTTP) and points it at a loopback
// sink that counts what it receives and answers as a collector does. At
// close it flushes and prints how many exports and bytes arrived, failing
// the run when none did. Without -tracing it returns nil (tracing off).
func (st *stack) startTracing(ctx context.Context) (trace.TracerProvider, error) {
	if !benchTracing {
		return nil, nil
	}
	ln, sinkURL, err := listen()
	if err != nil {
		return nil, err
	}
	var exports, bytesIn atomic.Int64
	serve(st, ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.NotFound(w, r)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		exports.Add(1)
		bytesIn.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty ExportTraceServiceResponse
	}))
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": sinkURL}
	tp, shutdown, err := tracing.Setup(ctx, func(k string) string { return env[k] }, "bench")
	if err != nil {
		return nil, err
	}
	if tp == nil {
		return nil, fmt.Errorf("tracing.Setup left tracing off")
	}
	// Runs before the sink's server closes (closers run in reverse).
	st.closers = append(st.closers, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := shutdown(sctx)
		fmt.Printf("tracing: %d OTLP exports, %.1f MB received by the loopback sink", exports.Load(), float64(bytesIn.Load())/1e6)
		if err != nil {
			fmt.Printf(" (shutdown: %v)", err)
		}
		fmt.Println()
	})
	fmt.Printf("tracing on: batched OTLP/HTTP export to %s\n", sinkURL)
	return tp, nil
}

// benchTwoSteps is -two-step-connect.
var benchTwoSteps bool

const benchAccessToken = "gho_benchaccesstoken0123456789"

// callBody is tools/call connect_account {provider: github} in 2026-07-28.
func callBody(id int, provider string, extra string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"connect_account","arguments":{"provider":"` + provider + `"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}},` +
		`"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}` + extra + `}}`)
}

func (st *stack) newRequest(url string, body []byte) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	// The same headers each time: share their value slices (read only;
	// Set and Add on the request's own map replace or copy them) rather
	// than allocate six per request, which the MRTR figure would count.
	req.Header = make(http.Header, len(st.header))
	for k, v := range st.header {
		req.Header[k] = v[:len(v):len(v)]
	}
	return req
}

// brokerAnswer calls the broker once and checks it answers "connected".
func (st *stack) brokerAnswer() ([]byte, error) {
	resp, err := http.DefaultClient.Do(st.newRequest(st.base+"/mcp", callBody(1, "github", "")))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"status":"connected"`)) {
		return nil, fmt.Errorf("broker answered HTTP %d: %s", resp.StatusCode, b)
	}
	return b, nil
}

type loadResult struct {
	n        int
	errors   int
	elapsed  time.Duration
	lats     []time.Duration // sorted
	rps      float64
	p50, p99 time.Duration
}

// merge adds o's requests to r and recomputes the figures.
func (r *loadResult) merge(o loadResult) {
	r.n += o.n
	r.errors += o.errors
	r.elapsed += o.elapsed
	r.lats = append(r.lats, o.lats...)
	slices.Sort(r.lats)
	r.rps = float64(r.n) / r.elapsed.Seconds()
	if r.n > 0 {
		r.p50 = r.lats[r.n/2]
		r.p99 = r.lats[min(r.n-1, r.n*99/100)]
	}
}

// alternate measures each of runs for duration in one-second slices taken
// by turns (warm-up before the first slice of each), so that a change in
// machine load hits all alike, and merges each one's slices.
func alternate(duration, warmup time.Duration, runs ...func(warmup, d time.Duration) loadResult) []loadResult {
	out := make([]loadResult, len(runs))
	parts := max(1, int(duration/time.Second))
	for i := range parts {
		w := time.Duration(0)
		if i == 0 {
			w = warmup
		}
		for k, run := range runs {
			out[k].merge(run(w, duration/time.Duration(parts)))
		}
	}
	return out
}

// hammer sends the request from c keep-alive clients for d (after warmup).
func (st *stack) hammer(url string, c int, warmup, d time.Duration) loadResult {
	body := callBody(1, "github", "")
	return hammerWith(func() *http.Request { return st.newRequest(url, body) }, c, warmup, d)
}

// hammerWith sends newReq() from c keep-alive clients for d (after warmup).
func hammerWith(newReq func() *http.Request, c int, warmup, d time.Duration) loadResult {
	tr := &http.Transport{MaxIdleConns: c, MaxIdleConnsPerHost: c, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var measuring atomic.Bool
	var stop atomic.Bool
	lats := make([][]time.Duration, c)
	errs := make([]int, c)
	var wg sync.WaitGroup
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, 1<<16)
			for !stop.Load() {
				t0 := time.Now()
				resp, err := client.Do(newReq())
				ok := err == nil
				if ok {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok = err == nil && resp.StatusCode == 200
				}
				el := time.Since(t0)
				if measuring.Load() {
					if ok {
						own = append(own, el)
					} else {
						errs[i]++
					}
				}
			}
			lats[i] = own
		}()
	}
	time.Sleep(warmup)
	measuring.Store(true)
	t0 := time.Now()
	time.Sleep(d)
	measuring.Store(false)
	el := time.Since(t0)
	stop.Store(true)
	wg.Wait()
	var all []time.Duration
	r := loadResult{}
	for i := range c {
		all = append(all, lats[i]...)
		r.errors += errs[i]
	}
	out := loadResult{}
	out.merge(loadResult{n: len(all), errors: r.errors, elapsed: el, lats: all})
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d.Microseconds())/1000) }

func (st *stack) load(duration, warmup time.Duration, concs, cpuprofile string) error {
	var levels []int
	for _, s := range strings.Split(concs, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 || c > 1024 {
			return fmt.Errorf("-c: bad concurrency %q", s)
		}
		levels = append(levels, c)
	}
	fmt.Printf("\n## Load: tools/call connect_account, connected user, real JWT, %s per server and concurrency (alternating 1s slices, +%s warm-up), loopback\n\n", duration, warmup)
	fmt.Println("| c | broker req/s | broker p50 ms | broker p99 ms | baseline req/s | baseline p50 ms | baseline p99 ms | ratio | p99 ratio |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	var prof *os.File
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		prof = f
		defer f.Close()
	}
	for _, c := range levels {
		if prof != nil && c == 16 {
			pprof.StartCPUProfile(prof)
		}
		r := alternate(duration, warmup,
			func(w, d time.Duration) loadResult { return st.hammer(st.base+"/mcp", c, w, d) },
			func(w, d time.Duration) loadResult { return st.hammer(st.baseline+"/mcp", c, w, d) })
		b, bl := r[0], r[1]
		if prof != nil && c == 16 {
			pprof.StopCPUProfile()
		}
		ratio, p99ratio := b.rps/bl.rps, float64(b.p99)/float64(max(bl.p99, 1))
		fmt.Printf("| %d | %.0f | %s | %s | %.0f | %s | %s | %.2f | %.2f |\n", c, b.rps, ms(b.p50), ms(b.p99), bl.rps, ms(bl.p50), ms(bl.p99), ratio, p99ratio)
		switch c {
		case 16:
			st.summary("connected tools/call c=16: throughput / floor", fmt.Sprintf("%.2f× (%.0f vs %.0f req/s)", ratio, b.rps, bl.rps), "≥ 0.8×", ratio >= 0.8)
			st.summary("connected tools/call c=16: p99 / floor p99", fmt.Sprintf("%.2f× (%s vs %s ms)", p99ratio, ms(b.p99), ms(bl.p99)), "≤ 1.3×", p99ratio <= 1.3)
		case 1:
			st.summary("connected tools/call c=1: throughput / floor", fmt.Sprintf("%.2f× (%.0f vs %.0f req/s)", ratio, b.rps, bl.rps), "(reported)", true)
		}
		if b.errors+bl.errors > 0 {
			fmt.Printf("  (errors: broker %d, baseline %d)\n", b.errors, bl.errors)
		}
	}
	return nil
}

// usage is the process's CPU time and its system (kernel) part, from one
// getrusage call; with bbolt the kernel part is mostly each commit's pwrite
// and fdatasync. One call per snapshot: the call itself costs several
// microseconds here, and a second call would be charged to what is timed.
func usage() (cpu, sys time.Duration) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}

// mrtr times n full MRTR round trips through the handler, in-process: first
// call → input_required → the consent form's check (binding.Authorize, as
// oauthflow's loadGrant; it writes nothing) → the callback's
// connections.Save, which stores the new connection and approves and
// completes the grant in one transaction → retry → complete; then the
// connection is deleted so the next round starts unconnected.
func (st *stack) mrtr(n int, cpuprofile string) error {
	ctx := context.Background()
	demo, ok := st.mrtrConns.Providers().Lookup("demo")
	if !ok {
		return fmt.Errorf("no demo provider")
	}
	var commits int64                    // durable commits inside measured round trips
	var cleanCPU, cleanSys time.Duration // the cleanup deletes' share of the process CPU
	var cleanAllocs uint64               // and of the heap allocations
	var ms runtime.MemStats
	mallocs := func() uint64 { runtime.ReadMemStats(&ms); return ms.Mallocs }
	if total := len(st.people) + n + min(n, 500); total > 30*len(st.people) {
		return fmt.Errorf("-mrtr %d: %d round trips for %d people would pass the limit of 30 connect requests a person an hour", n, total, len(st.people))
	}
	do := func(who mrtrPerson, body []byte) ([]byte, error) {
		rr := &recorder{h: http.Header{}}
		req := st.newRequest(st.base+"/mcp", body)
		req.Header["Authorization"] = who.auth
		st.mrtrSrv.ServeHTTP(rr, req)
		if rr.status != 200 {
			return nil, fmt.Errorf("HTTP %d: %s", rr.status, rr.body.Bytes())
		}
		return rr.body.Bytes(), nil
	}
	countAllocs := false // ReadMemStats stops the world: only in the allocation pass
	turn := 0            // people take turns: no one has more than one round trip more than another
	round := func(i int) error {
		who := st.people[turn%len(st.people)]
		turn++
		c0 := st.counter.commits.Load()
		b, err := do(who, callBody(2*i, "demo", ""))
		if err != nil {
			return err
		}
		var first struct {
			Result struct {
				ResultType    string `json:"resultType"`
				RequestState  string `json:"requestState"`
				InputRequests map[string]struct {
					Params struct{ URL string } `json:"params"`
				} `json:"inputRequests"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &first); err != nil || first.Result.ResultType != "input_required" {
			return fmt.Errorf("first call: %s", b)
		}
		u := first.Result.InputRequests["connect_demo"].Params.URL
		grant := u[strings.LastIndex(u, "/")+1:]
		// The browser: the consent form checks the grant (and writes
		// nothing), then the callback stores what the code exchange
		// produced (connections.Save, as oauthflow calls it).
		g, err := st.mrtrGrant.Authorize(ctx, grant, who.p)
		if err != nil {
			return err
		}
		conn, err := st.mrtrConns.Save(ctx, who.p, g, demo, provider.Exchanged{
			Account: provider.Account{ID: "42", Login: "demo-user"}, Scopes: []string{"profile"},
			Token: vault.TokenSet{AccessToken: "demo-access-0123456789", TokenType: "bearer", Expiry: time.Now().Add(time.Hour)},
		})
		if err != nil {
			return err
		}
		b, err = do(who, callBody(2*i+1, "demo", `,"requestState":"`+first.Result.RequestState+`","inputResponses":{"connect_demo":{"action":"accept"}}`))
		if err != nil {
			return err
		}
		if !bytes.Contains(b, []byte(`"status":"connected"`)) {
			return fmt.Errorf("retry: %s", b)
		}
		commits += st.counter.commits.Load() - c0
		// Cleanup, not the round trip: not through the commit counter, and
		// its CPU is taken out of the total below.
		var m0 uint64
		if countAllocs {
			m0 = mallocs()
		}
		d0, ds0 := usage()
		err = st.store.DeleteConnection(ctx, conn.ID)
		d1, ds1 := usage()
		cleanCPU += d1 - d0
		cleanSys += ds1 - ds0
		if countAllocs {
			cleanAllocs += mallocs() - m0
		}
		return err
	}
	floor, err := st.newCommitFloor()
	if err != nil {
		return err
	}
	// Warm-up: a round trip for every person, so each one's bearer token
	// is verified (and cached) before the timed rounds, as a client's
	// would be after its first call.
	for i := range len(st.people) {
		if err := round(i); err != nil {
			return err
		}
		if i >= 50 {
			continue
		}
		if err := floor.round(i); err != nil {
			return err
		}
	}
	runtime.GC()
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile + ".mrtr")
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
	}
	// Round trips and the floor's bare commits take turns in blocks, so
	// both meet the same spells of the disk (its speed drifts within
	// minutes here).
	commits, cleanCPU, cleanSys = 0, 0, 0
	var cpu, sys, wall, floorCPU, floorSys time.Duration
	for b := 0; b < n; b += mrtrBlock {
		m := min(mrtrBlock, n-b)
		c0, s0 := usage()
		t0 := time.Now()
		for i := b; i < b+m; i++ {
			if err := round(1000 + i); err != nil {
				return err
			}
		}
		wall += time.Since(t0)
		c1, s1 := usage()
		for i := b; i < b+m; i++ {
			if err := floor.round(100 + i); err != nil {
				return err
			}
		}
		c2, s2 := usage()
		cpu, sys = cpu+c1-c0, sys+s1-s0
		floorCPU, floorSys = floorCPU+c2-c1, floorSys+s2-s1
	}
	cpu, sys = cpu-cleanCPU, sys-cleanSys
	if cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if err := floor.drop(); err != nil {
		return err
	}
	// A shorter pass, not timed, counts heap allocations per round trip.
	timedCommits := commits
	allocN := min(n, 500)
	countAllocs, cleanAllocs = true, 0
	if benchMemProfile != "" {
		runtime.MemProfileRate = 1
	}
	a0 := mallocs()
	for i := range allocN {
		if err := round(1000 + n + i); err != nil {
			return err
		}
	}
	allocs := float64(mallocs()-a0-cleanAllocs) / float64(allocN)
	if benchMemProfile != "" {
		runtime.GC()
		f, err := os.Create(benchMemProfile + ".mrtr")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
		runtime.MemProfileRate = 512 * 1024
	}
	perCommits := float64(timedCommits) / float64(n)
	perCPU := float64(cpu.Microseconds()) / float64(n) / 1000
	perFloor := float64(floorCPU.Microseconds()) / float64(n) / 1000
	fmt.Printf("\n## MRTR round trip (in-process handler, bolt store with fsync; first call, the consent form's check, the callback's connections.Save (approve and complete with the connection), retry; the cleanup delete after each is measured apart and left out)\n\n")
	fmt.Printf("%d round trips: CPU %.0f µs per round trip (%.0f µs of it in the kernel), wall %.2f ms per round trip incl. cleanup (%.0f round trips/s, one at a time); durable commits %.2f per round trip; the cleanup delete took %.0f µs CPU more\n",
		n, perCPU*1000, float64(sys.Microseconds())/float64(n), float64(wall.Microseconds())/1000/float64(n), float64(n)/wall.Seconds(), perCommits, float64(cleanCPU.Microseconds())/float64(n))
	fmt.Printf("%.0f heap allocations per round trip (counted over %d more round trips, cleanup left out)\n", allocs, allocN)
	fmt.Printf("floor, in turns with the round trips (blocks of %d): two bare durable bbolt commits in the same file (a %d-byte put, then two, no codec, no encryption, no HTTP): CPU %.0f µs per two (%.0f µs of it in the kernel), so the round trip adds %.0f µs\n",
		mrtrBlock, floorValue, perFloor*1000, float64(floorSys.Microseconds())/float64(n), (perCPU-perFloor)*1000)
	st.summary("MRTR round trip: durable commits", fmt.Sprintf("%.2f", perCommits), "≤ 3", perCommits <= 3)
	st.summary("MRTR round trip: CPU ms", fmt.Sprintf("%.3f (user %.3f; 2 bare commits %.3f)", perCPU, perCPU-float64(sys.Microseconds())/float64(n)/1000, perFloor), "≤ 1", perCPU <= 1)
	return nil
}

// floorValue is the size of the value each floor commit puts: about a
// sealed grant or connection record.
const floorValue = 512

// mrtrPeople is how many people the MRTR round trips take turns for. At
// the default limit of 30 connect requests a person an hour, they carry
// up to 30 × mrtrPeople round trips a run, warm-up and allocation pass
// included.
const mrtrPeople = 400

func mrtrName(i int) string { return fmt.Sprintf("mrtr-%04d", i) }

type mrtrPerson struct {
	p    vault.Principal
	auth []string // the Authorization header's value
}

// mrtrBlock is how many MRTR round trips run before the same number of
// floor rounds take their turn.
const mrtrBlock = 100

// commitFloor is the two durable commits an MRTR round trip needs, done
// bare on the broker's own bolt file (same fsync, same disk): put a
// grant-sized value, then overwrite it and put a second one (the callback's
// grant and connection). Its bucket is dropped afterwards, outside any
// count.
type commitFloor struct {
	db     *bolt.DB
	bucket []byte
	val    []byte
}

func (st *stack) newCommitFloor() (*commitFloor, error) {
	f := &commitFloor{db: st.store.DB(), bucket: []byte("bench-floor"), val: bytes.Repeat([]byte{0x5a}, floorValue)}
	return f, f.db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(f.bucket)
		return err
	})
}

func (f *commitFloor) put(keys ...string) error {
	return f.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(f.bucket)
		for _, k := range keys {
			if err := b.Put([]byte(k), f.val); err != nil {
				return err
			}
		}
		return nil
	})
}

// round is one floor round: two durable commits.
func (f *commitFloor) round(i int) error {
	g, c := fmt.Sprintf("g%08d", i), fmt.Sprintf("c%08d", i)
	if err := f.put(g); err != nil {
		return err
	}
	return f.put(c, g)
}

func (f *commitFloor) drop() error {
	return f.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(f.bucket) })
}

// recorder is a minimal http.ResponseWriter for in-process calls.
type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(s int) {
	if r.status == 0 {
		r.status = s
	}
}
func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = 200
	}
	return r.body.Write(b)
}

// providerOverhead compares GET /user through provider_request with the
// same call straight to the fake API, one client at a time.
func (st *stack) providerOverhead(duration, warmup time.Duration, cpuprofile string) error {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"provider_request","arguments":{"provider":"github","method":"GET","path":"/user"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`)
	brokerReq := func() *http.Request {
		r := st.newRequest(st.base+"/mcp", body)
		r.Header.Set("Mcp-Name", "provider_request")
		return r
	}
	// Check once that the broker really reaches the API.
	resp, err := http.DefaultClient.Do(brokerReq())
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`\"login\":\"octocat\"`)) {
		return fmt.Errorf("provider_request: HTTP %d %s", resp.StatusCode, b)
	}
	directReq := func() *http.Request {
		r, _ := http.NewRequest(http.MethodGet, st.apiURL+"/user", nil)
		r.Header.Set("Authorization", "Bearer "+benchAccessToken)
		return r
	}
	proxyReq := func() *http.Request {
		r := st.newRequest(st.proxyURL+"/mcp", body)
		r.Header.Set("Mcp-Name", "provider_request")
		return r
	}
	fmt.Printf("\n## provider_request overhead: GET /user through the broker vs straight to the fake API, and through a bare net/http forwarder (c=1, %s each, alternating 1s slices)\n\n", duration)
	fmt.Println("| path | req/s | p50 ms | p99 ms |")
	fmt.Println("|---|---|---|---|")
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile + ".provider")
		if err != nil {
			return err
		}
		defer f.Close()
		pprof.StartCPUProfile(f)
	}
	// The profile covers all three paths.
	r := alternate(duration, warmup,
		func(w, d time.Duration) loadResult { return hammerWith(brokerReq, 1, w, d) },
		func(w, d time.Duration) loadResult { return hammerWith(directReq, 1, w, d) },
		func(w, d time.Duration) loadResult { return hammerWith(proxyReq, 1, w, d) })
	if cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	br, dr, pr := r[0], r[1], r[2]
	fmt.Printf("| broker provider_request | %.0f | %s | %s |\n| direct | %.0f | %s | %s |\n| bare forwarder (floor) | %.0f | %s | %s |\n",
		br.rps, ms(br.p50), ms(br.p99), dr.rps, ms(dr.p50), ms(dr.p99), pr.rps, ms(pr.p50), ms(pr.p99))
	added, floor := br.p50-dr.p50, pr.p50-dr.p50
	fmt.Printf("\nadded at p50: %s ms; the bare forwarder adds %s ms (a second HTTP hop, one JSON decode and encode), so the broker's own work adds %s ms\n",
		ms(added), ms(floor), ms(added-floor))
	st.summary("provider_request: added p50 ms", fmt.Sprintf("%s (bare forwarder %s)", ms(added), ms(floor)), "≤ 0.1", added <= 100*time.Microsecond)
	return nil
}

// summaryLine is one row of the closing table: a measure next to its target.
type summaryLine struct {
	what, got, target string
	met               bool
}

func (st *stack) summary(what, got, target string, met bool) {
	st.sum = append(st.sum, summaryLine{what, got, target, met})
}

// opens counts token-set decryptions per tools/call for bob, who has five
// connections: list_connections should open none, provider_request (GET
// /user at github) exactly the one it uses. Calls run in-process, one at a
// time, so the keyring's counter is exact.
func (st *stack) opens() error {
	const n = 200
	call := func(tool, args string) (float64, error) {
		body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `,` +
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
		do := func() error {
			r := st.newRequest(st.base+"/mcp", body)
			r.Header.Set("Authorization", "Bearer "+st.bobToken)
			r.Header.Set("Mcp-Name", tool)
			rr := &recorder{h: http.Header{}}
			st.mrtrSrv.ServeHTTP(rr, r)
			if rr.status != 200 || bytes.Contains(rr.body.Bytes(), []byte(`"isError":true`)) {
				return fmt.Errorf("%s: HTTP %d %s", tool, rr.status, rr.body.Bytes())
			}
			return nil
		}
		if err := do(); err != nil { // warm: token cache, last use
			return 0, err
		}
		before := st.keys.Opens()
		for range n {
			if err := do(); err != nil {
				return 0, err
			}
		}
		return float64(st.keys.Opens()-before) / n, nil
	}
	list, err := call("list_connections", "{}")
	if err != nil {
		return err
	}
	req, err := call("provider_request", `{"provider":"github","method":"GET","path":"/user"}`)
	if err != nil {
		return err
	}
	fmt.Printf("\n## Decryptions per call (bob: five connections, %d calls each)\n\nlist_connections: %.2f opens per call; provider_request: %.2f opens per call\n", n, list, req)
	st.summary("list_connections, 5 connections: opens per call", fmt.Sprintf("%.2f", list), "0", list == 0)
	st.summary("provider_request: opens per call", fmt.Sprintf("%.2f", req), "1", req == 1)
	return nil
}
