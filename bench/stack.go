package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"credbroker/apps"
	"credbroker/authserver"
	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/devidp"
	"credbroker/internal/logredact"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/mcpapi"
	"credbroker/oauthflow"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
	"credbroker/web"
)

// stack is one broker on one store: the MCP endpoint in both modes (the
// default one with the authorization server and the browser sign-in on the
// broker's listener, the issuer mode on a listener of its own, both on the
// same connections layer and store), the IdP, the fake provider API and
// the floors, each on its own loopback listener.
type stack struct {
	kind      string // storeBolt or storePostgres
	base      string // broker base URL (default mode: --mcp-auth broker)
	issuerURL string // the same broker in --mcp-auth issuer mode
	baseline  string // the JSON floor's URL
	sqlFloor  string // PostgreSQL: the JSON + one SQL round trip floor's URL
	header    http.Header
	alice     vault.Principal
	aliceAuth map[string][]string // Authorization header by mode
	bobAuth   map[string][]string
	store     vault.Store // the plain store
	// writes is the plain store for the bench's own writes once the
	// broker runs: on bolt announced to the broker's listing cache, as
	// every write in serve's process is; never counted.
	writes   vault.Store
	bolt     *boltstore.Store
	pg       *pgServer
	dbURL    string // PostgreSQL: the broker's database (its own schema)
	keys     *vault.Keyring
	srv      map[string]*mcpapi.Server // by mode
	handler  map[string]http.Handler   // by mode, and the floor's (floorName): what each listener serves
	grants   *binding.Service
	conns    *connections.Service
	apps     *apps.Service      // the default mode's apps core (token-family liveness)
	verify   bearer.Verifier    // the default mode's bearer check
	reg      *provider.Registry // the providers the broker serves
	idpIss   string             // the IdP's issuer
	log      *slog.Logger
	people   []mrtrPerson   // who the MRTR round trips are for, in turns
	counter  *commitCounter // durable commits through the broker's store
	waits    *callWaits     // provider_request's token read and upstream call
	apiURL   string         // the fake provider API
	proxyURL string         // provider_request's floor: a bare forwarder
	gw       *gwUpstreams   // the gateway's upstreams (nil: not measured)
	gwRoutes map[string]gwRoute
	sum      *summary
	closers  []func()
}

// MCP authorization modes (--mcp-auth), the default first.
const (
	modeBroker = "broker"
	modeIssuer = "issuer"
)

var modes = []string{modeBroker, modeIssuer}

// floorName keys the load run's JSON floor among stack.handler's modes.
const floorName = "floor"

func modeLabel(m string) string {
	if m == modeBroker {
		return "--mcp-auth broker (default)"
	}
	return "--mcp-auth issuer"
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

// brokerClientID is the broker's own client at the IdP (its sign-in).
const brokerClientID = "credbroker-bench"

func newStack(cfg config, kind, dir string, pg *pgServer, gw *gwUpstreams) (_ *stack, err error) {
	st := &stack{kind: kind, pg: pg, gw: gw, srv: map[string]*mcpapi.Server{}, handler: map[string]http.Handler{}}
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	ctx := context.Background()
	t0 := time.Now()

	// The IdP, on its own listener.
	idpLn, idpURL, err := listen()
	if err != nil {
		return nil, err
	}
	users := devidp.DefaultUsers()
	for i := range gwPeople {
		if gw == nil {
			break
		}
		name := gwName(i)
		users = append(users, devidp.User{Username: name, Password: name, Subject: name, Email: name + "@example.test", Name: name})
	}
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
	if err := idp.AddClient(devidp.Client{ID: brokerClientID, Secret: "bench-idp-secret", RedirectURIs: []string{base + "/auth/callback"}}); err != nil {
		return nil, err
	}
	st.keys, err = vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		return nil, err
	}
	switch kind {
	case storeBolt:
		st.bolt, err = boltstore.Open(filepath.Join(dir, "broker.db"), st.keys, boltstore.Options{})
		if err != nil {
			return nil, err
		}
		st.store = st.bolt
	case storePostgres:
		dbURL, err := pg.freshSchema()
		if err != nil {
			return nil, err
		}
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ps, err := pgstore.Open(octx, dbURL, st.keys, pgstore.Options{})
		cancel()
		if err != nil {
			return nil, err
		}
		st.store, st.dbURL = ps, dbURL
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
	rec := telemetry.New(telemetry.Options{Providers: []string{"demo", "github", gwOpen, gwProtected}, Audit: log, ProcessMetrics: true})
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
	for i := range gwPeople {
		if gw == nil {
			break
		}
		// The gateway's people: a connection each to the OAuth-protected
		// upstream, its token valid for a day (each relayed call reads it
		// and checks it needs no refresh).
		name := gwName(i)
		if _, err := st.store.CreateConnection(ctx, vault.Connection{
			ID: "conn_bench_" + name, Principal: vault.Principal{Issuer: idp.Issuer(), Subject: name}, Provider: gwProtected,
			AccountID: name + "-up", AccountLogin: name + "@protected", Scopes: []string{"tools"}, Status: vault.StatusActive, Created: now, Updated: now,
			Token: vault.TokenSet{AccessToken: gwUpstreamToken, RefreshToken: "up-bench-refresh", TokenType: "Bearer", Expiry: now.Add(24 * time.Hour)},
		}); err != nil {
			return nil, err
		}
	}
	st.counter = &commitCounter{}
	st.waits = &callWaits{}
	tp, err := st.startTracing(ctx, cfg.tracing)
	if err != nil {
		return nil, err
	}
	// As serve observes its store (cmd/broker's observeStore), the
	// commit counter innermost.
	store := st.store
	if cfg.twoSteps {
		store = twoStepStore{store}
	}
	var listed connections.LateWrites // as serve: a bolt file's writes reach the listing cache
	st.writes = st.store
	if kind == storeBolt {
		store = vault.Announced(store, &listed)
		st.writes = vault.Announced(st.store, &listed)
	}
	store = vault.Observe(store, tracing.StoreObserver(tp), rec.StoreObserver(), st.counter, st.waits)
	client := &http.Client{Timeout: 10 * time.Second, Transport: st.waits.timed(&http.Transport{MaxIdleConnsPerHost: 64})}

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
`+gw.catalogue()), func(string) string { return "bench-secret" })
	if err != nil {
		return nil, err
	}
	// The gateway's egress clients, as serve builds them with
	// --upstream-allow-private (its upstreams are on loopback).
	authHTTP, mcpHTTP, err := upstreamClients()
	if err != nil {
		return nil, err
	}
	pc, err := provider.New(provider.Options{Store: store, Providers: reg, HTTPClient: client, Logger: log, Telemetry: rec, Tracing: tp,
		UpstreamHTTPClient: authHTTP, BrokerURL: base, ClientMetadataURL: base + "/oauth/client-metadata.json"})
	if err != nil {
		return nil, err
	}
	st.grants = binding.New(store, binding.Options{})
	st.conns, err = connections.New(connections.Options{Store: store, Grants: st.grants,
		Client: pc, PublicURL: base, Telemetry: rec, Logger: log, Watch: store.AppWatch(), SoleWriter: kind == storeBolt})
	if err != nil {
		return nil, err
	}
	listed.Set(st.conns)

	// As serve wires broker mode: the authorization server on the
	// observed store, people signing in through the browser flow's
	// session; the apps core on it too: a bolt file has this process as
	// its only writer, PostgreSQL tells each replica what the others
	// change (AppWatch).
	appSvc, err := apps.New(apps.Options{Store: store.Auth(), Watch: store.AppWatch(), SoleWriter: kind == storeBolt,
		Telemetry: rec, Logger: log})
	if err != nil {
		return nil, err
	}
	st.apps, st.reg, st.idpIss, st.log = appSvc, reg, idp.Issuer(), log
	fctx, stopFollow := context.WithCancel(ctx)
	st.closers = append(st.closers, stopFollow)
	go appSvc.Follow(fctx)
	go st.conns.Follow(fctx) // as serve: the listing cache follows PostgreSQL's feed
	var flow *oauthflow.Flow
	as, err := authserver.New(authserver.Options{
		PublicURL: base, Resource: base + "/mcp", IdPIssuer: idp.Issuer(), Store: store.Auth(), Keys: st.keys,
		Person: func(r *http.Request) (authserver.Person, bool) {
			p, ok := flow.SignedIn(r)
			return authserver.Person{Principal: p.Principal, Display: p.Display, CSRF: p.CSRF}, ok
		},
		StartSignIn:  func(w http.ResponseWriter, r *http.Request, returnTo string) { flow.StartSignIn(w, r, returnTo) },
		Registration: true, Apps: appSvc, Logger: log, Telemetry: rec, Tracing: tp,
		MoreResources: gw.resources(base),
	})
	if err != nil {
		return nil, err
	}
	flow, err = oauthflow.New(ctx, oauthflow.Options{
		PublicURL: base, Issuer: idp.Issuer(), ClientID: brokerClientID, ClientSecret: "bench-idp-secret",
		Connections: st.conns, CookieKeys: st.keys.Derive("cookies"),
		HTTPClient: client, Logger: log, Telemetry: rec, Tracing: tp,
	})
	if err != nil {
		return nil, err
	}
	upstreams := mcpup.New(mcpup.Options{HTTPClient: mcpHTTP, Tokens: pc.UpstreamTokens(), Version: "bench", Logger: log.With("component", "mcpup")})
	for _, m := range modes {
		opts := mcpapi.Options{
			PublicURL: base, ResourceURI: base + "/mcp", Issuer: idp.Issuer(), Connections: st.conns,
			StateKeys: st.keys.Derive("requestState"), Logger: log, HTTPClient: client, Telemetry: rec, Tracing: tp,
			Upstreams: upstreams,
		}
		if m == modeBroker {
			st.verify = as.Verifier()
			opts.Verifier, opts.VerifierFor = st.verify, as.VerifierFor
			opts.AuthorizationServers = []string{as.Issuer()}
		}
		if st.srv[m], err = mcpapi.New(opts); err != nil {
			return nil, err
		}
	}
	site := web.NewSite()
	flow.Register(site)
	st.srv[modeBroker].Register(site.API)
	as.Register(site)
	site.API.Handle("GET /metrics", rec.Handler())
	st.handler[modeBroker] = site
	serve(st, brokerLn, site)
	issLn, issURL, err := listen()
	if err != nil {
		return nil, err
	}
	st.issuerURL = issURL
	issMux := http.NewServeMux()
	st.srv[modeIssuer].Register(issMux)
	st.handler[modeIssuer] = issMux
	serve(st, issLn, issMux)

	// Bearer tokens. Default mode: as an MCP host gets them, from the
	// broker's authorization server after the person signed in and
	// allowed the host. Issuer mode: the IdP's JWTs for the resource.
	h, err := registerHost(base)
	if err != nil {
		return nil, err
	}
	st.aliceAuth, st.bobAuth = map[string][]string{}, map[string][]string{}
	names := []string{"alice", "bob"}
	mrtr := cfg.runs("mrtr") && cfg.mrtrN > 0
	if mrtr {
		for i := range mrtrPeople {
			names = append(names, mrtrName(i))
		}
	}
	brokerTokens, err := h.tokens(names, base+"/mcp", 4)
	if err != nil {
		return nil, err
	}
	issuerToken := func(user string) ([]string, error) {
		tok, _, err := idp.MintAccessToken(user, base+"/mcp", nil, time.Hour)
		return []string{"Bearer " + tok}, err
	}
	for _, w := range []struct {
		user string
		auth map[string][]string
	}{{"alice", st.aliceAuth}, {"bob", st.bobAuth}} {
		w.auth[modeBroker] = []string{"Bearer " + brokerTokens[w.user]}
		if w.auth[modeIssuer], err = issuerToken(w.user); err != nil {
			return nil, err
		}
	}
	// The MRTR run goes through the same servers, with the default limits
	// on connect requests per person (counted in the grant's creating
	// transaction, as in production): mrtrPeople take turns, so no one
	// passes the limit of requests per hour and each person's requests
	// stay as few as they would be.
	for i := range mrtrPeople {
		if !mrtr {
			break
		}
		name := mrtrName(i)
		p := mrtrPerson{p: vault.Principal{Issuer: idp.Issuer(), Subject: name}, auth: map[string][]string{
			modeBroker: {"Bearer " + brokerTokens[name]}}}
		if p.auth[modeIssuer], err = issuerToken(name); err != nil {
			return nil, err
		}
		st.people = append(st.people, p)
	}
	fmt.Printf("\n# Store: %s\n\nbroker built and %d people signed in through the host flow (registration, IdP sign-in, consent, code with PKCE) in %s\n",
		storeTitle(kind), len(names), time.Since(t0).Round(10*time.Millisecond))

	st.header = http.Header{}
	st.header.Set("Content-Type", "application/json")
	st.header.Set("Accept", "application/json, text/event-stream")
	st.header.Set("MCP-Protocol-Version", "2026-07-28")
	st.header.Set("Mcp-Method", "tools/call")
	st.header.Set("Mcp-Name", "connect_account")

	// The floor: decode the same JSON-RPC body, answer the broker's
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
	st.handler[floorName] = jsonFloor(fixed, nil)
	serve(st, blLn, st.handler[floorName])
	if kind == storePostgres {
		if st.sqlFloor, err = st.startSQLFloor(st.dbURL, fixed); err != nil {
			return nil, err
		}
	}

	pxLn, pxURL, err := listen()
	if err != nil {
		return nil, err
	}
	st.proxyURL = pxURL
	serve(st, pxLn, bareForwarder(apiURL))
	if gw != nil {
		if err := st.gatewayRoutes(h); err != nil {
			return nil, err
		}
	}
	return st, nil
}

func storeTitle(kind string) string {
	if kind == storePostgres {
		return "PostgreSQL (pgstore)"
	}
	return "bbolt (boltstore)"
}

// endpoint is the MCP URL of a mode.
func (st *stack) endpoint(mode string) string {
	if mode == modeIssuer {
		return st.issuerURL + "/mcp"
	}
	return st.base + "/mcp"
}

// jsonFloor is the load run's floor: a bare net/http handler that decodes
// the JSON-RPC body and answers fixed bytes; roundTrip, when set, runs
// between the two (the PostgreSQL floor's one SQL round trip).
func jsonFloor(fixed []byte, roundTrip func(context.Context) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		if roundTrip != nil {
			if err := roundTrip(r.Context()); err != nil {
				http.Error(w, "store", http.StatusServiceUnavailable)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(fixed)
	})
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
		resp, body, ok := fetch(w, client, req, 1<<20)
		if !ok {
			return
		}
		out, _ := json.Marshal(response{JSONRPC: "2.0", ID: msg.ID, Result: result{
			Content:           []content{{Type: "text", Text: string(body)}},
			StructuredContent: answer{Status: resp.StatusCode, Body: string(body)}}})
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	})
}

// fetch is the floors' request to what they stand in front of: req sent
// with client and its answer read, at most limit bytes; when either
// fails, w is answered 502 and ok is false.
func fetch(w http.ResponseWriter, client *http.Client, req *http.Request, limit int64) (*http.Response, []byte, bool) {
	resp, err := client.Do(req)
	if err != nil {
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return nil, nil, false
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	resp.Body.Close()
	if err != nil {
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return nil, nil, false
	}
	return resp, body, true
}

// startTracing, with -tracing, sets tracing up as serve does when
// OTEL_EXPORTER_OTLP_ENDPOINT is set (tracing.Setup: the SDK's batch span
// processor, the redacting exporter, OTLP/HTTP) and points it at a loopback
// sink that counts what it receives and answers as a collector does. At
// close it flushes and prints how many exports and bytes arrived. Without
// -tracing it returns nil (tracing off).
func (st *stack) startTracing(ctx context.Context, on bool) (trace.TracerProvider, error) {
	if !on {
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

const benchAccessToken = "gho_benchaccesstoken0123456789"

// callBody is tools/call connect_account {provider: github} in 2026-07-28.
func callBody(id int, provider string, extra string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"connect_account","arguments":{"provider":"` + provider + `"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}},` +
		`"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"}}` + extra + `}}`)
}

// newRequest is a POST of body to url with the MCP headers and auth as
// its Authorization header.
func (st *stack) newRequest(url string, auth []string, body []byte) *http.Request {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	// The same headers each time: share their value slices (read only;
	// Set and Add on the request's own map replace or copy them) rather
	// than allocate six per request, which the MRTR figure would count.
	req.Header = make(http.Header, len(st.header)+1)
	for k, v := range st.header {
		req.Header[k] = v[:len(v):len(v)]
	}
	if auth != nil {
		req.Header["Authorization"] = auth[:len(auth):len(auth)]
	}
	return req
}

// brokerAnswer calls the broker once in each mode, checks both answer
// "connected" alike, and returns the answer.
func (st *stack) brokerAnswer() ([]byte, error) {
	var out []byte
	for _, m := range modes {
		resp, err := http.DefaultClient.Do(st.newRequest(st.endpoint(m), st.aliceAuth[m], callBody(1, "github", "")))
		if err != nil {
			return nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"status":"connected"`)) {
			return nil, fmt.Errorf("broker (%s) answered HTTP %d: %s", modeLabel(m), resp.StatusCode, b)
		}
		if out != nil && !bytes.Equal(out, b) {
			return nil, fmt.Errorf("the two modes answer differently:\n%s\n%s", out, b)
		}
		out = b
	}
	return out, nil
}
