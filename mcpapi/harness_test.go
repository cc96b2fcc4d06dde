package mcpapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/echoapi"
	"credbroker/internal/logbuf"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// testIssuer is a minimal OIDC provider: discovery document and JWKS over
// loopback, tokens signed with ES256.
type testIssuer struct {
	srv    *httptest.Server
	key    *ecdsa.PrivateKey
	signer jose.Signer
	other  jose.Signer // a key the JWKS does not publish
}

func newTestIssuer(t testing.TB) *testIssuer {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	iss := &testIssuer{key: key}
	opts := (&jose.SignerOptions{}).WithType("at+jwt").WithHeader("kid", "k1")
	if iss.signer, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, opts); err != nil {
		t.Fatal(err)
	}
	if iss.other, err = jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: otherKey}, opts); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{
			"issuer": iss.srv.URL, "jwks_uri": iss.srv.URL + "/jwks",
			"authorization_endpoint": iss.srv.URL + "/authorize", "token_endpoint": iss.srv.URL + "/token",
			"id_token_signing_alg_values_supported": []string{"ES256"},
		})
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	})
	iss.srv = httptest.NewServer(mux)
	t.Cleanup(iss.srv.Close)
	return iss
}

type tokenSpec struct {
	sub, aud, scope string
	iss             string
	exp, nbf        time.Time
	wrongKey        bool
}

func (iss *testIssuer) token(t testing.TB, ts tokenSpec) string {
	t.Helper()
	if ts.iss == "" {
		ts.iss = iss.srv.URL
	}
	claims := map[string]any{"iss": ts.iss, "sub": ts.sub, "aud": []string{ts.aud}, "exp": ts.exp.Unix(), "iat": ts.exp.Add(-time.Hour).Unix()}
	if !ts.nbf.IsZero() {
		claims["nbf"] = ts.nbf.Unix()
	}
	if ts.scope != "" {
		claims["scope"] = ts.scope
	}
	signer := iss.signer
	if ts.wrongKey {
		signer = iss.other
	}
	raw, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

const (
	publicURL = "https://broker.example.com"
	resource  = publicURL + "/mcp"
	// providerSecret is the third-party token stored in every test
	// connection; no response or log line may contain it.
	providerSecret = "gho_PROVIDERSECRET0123456789"
	refreshSecret  = "ghr_REFRESHSECRET0123456789"
	// keySecret prefixes every API key of the test key service.
	keySecret = "mk_KEYSECRET0123456789abcdef"
)

var epoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

type harness struct {
	t      testing.TB
	iss    *testIssuer
	clock  *clock
	store  *memstore.Store
	keys   *vault.Keyring
	grants *binding.Service
	client *provider.Client
	conns  *connections.Service
	srv    *Server
	http   *httptest.Server
	logs   *logbuf.Buffer
	api    *testProvider
	connN  int
}

type harnessOpt func(*Options)

func newHarness(t testing.TB, mods ...harnessOpt) *harness {
	t.Helper()
	return newHarnessExtra(t, func(*harness, string) string { return "" }, mods...)
}

// newHarnessExtra is newHarness with more providers.yaml entries: extra
// gets the harness (its test provider running) and the echo API's URL.
func newHarnessExtra(t testing.TB, extra func(h *harness, echoURL string) string, mods ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, iss: newTestIssuer(t), clock: &clock{t: epoch}, logs: &logbuf.Buffer{}}
	h.api = newTestProvider(t)
	echo := echoapi.Start(t)
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	h.store, h.keys = memstore.New(kr), kr
	log := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg, err := provider.ParseProviders("mcpapi test", []byte(`providers:
  github:
    display_name: GitHub
    type: oauth2
    authorization_url: `+h.api.srv.URL+`/authorize
    token_url: `+h.api.srv.URL+`/token
    client_id: test-client
    client_secret: ${SECRET}
    default_scopes: [read:user]
    allowed_scopes: [read:user, repo]
    account: {url: `+h.api.srv.URL+`/api/user, id_field: id, login_field: login}
    api: {base_url: `+h.api.srv.URL+`/api}
    revocation: {style: rfc7009, url: `+h.api.srv.URL+`/revoke}
  google:
    display_name: Google
    type: oidc
    issuer: `+h.api.srv.URL+`
    client_id: test-client
    client_secret: ${SECRET}
    default_scopes: [openid, email]
    allowed_scopes: [openid, email]
    api: {base_url: `+h.api.srv.URL+`/api}
    revocation: {style: none}
  echo:
    display_name: Echo
    type: oauth2
    authorization_url: `+echo.URL+`/authorize
    token_url: `+echo.URL+`/token
    client_id: test-client
    client_secret: ${SECRET}
    account: {url: `+echo.URL+`/user, id_field: id}
    api: {base_url: `+echo.URL+`}
`+extra(h, echo.URL)), func(string) string { return "test-client-secret" })
	if err != nil {
		t.Fatal(err)
	}
	h.client, err = provider.New(provider.Options{Store: h.store, Providers: reg, Now: h.clock.Now, Logger: log,
		RetryBackoff: time.Millisecond, HTTPClient: h.api.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	h.setGrants(binding.Options{Now: h.clock.Now, MaxRounds: 3})
	opts := Options{
		PublicURL: publicURL, Issuer: h.iss.srv.URL, Connections: h.conns,
		StateKeys: kr.Derive("requestState"), Now: h.clock.Now, ServerVersion: "test", Logger: log,
	}
	for _, m := range mods {
		m(&opts)
	}
	h.srv, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.srv.Register(mux)
	h.http = httptest.NewServer(mux)
	t.Cleanup(h.http.Close)
	return h
}

// setGrants rebuilds the grant service and the connections layer with
// opts (the server, once built, is switched to the new layer).
func (h *harness) setGrants(opts binding.Options) {
	h.t.Helper()
	h.grants = binding.New(h.store, opts)
	var err error
	h.conns, err = connections.New(connections.Options{Store: h.store, Grants: h.grants, Client: h.client,
		PublicURL: publicURL, Now: h.clock.Now, Logger: slog.New(slog.NewJSONHandler(h.logs, nil))})
	if err != nil {
		h.t.Fatal(err)
	}
	if h.srv != nil {
		h.srv.opts.Connections = h.conns
	}
}

// testProvider is a loopback OAuth provider for the tools: an API that
// records which connection's token called it, a token endpoint that
// refreshes, and an RFC 7009 revocation endpoint. A connection's tokens
// can be killed (the API answers 401 and the refresh invalid_grant).
type testProvider struct {
	srv *httptest.Server

	mu        sync.Mutex // guards the fields below
	used      []string   // connection ids, from the token suffix
	dead      map[string]bool
	revoked   []string
	revokeErr bool
}

func newTestProvider(t testing.TB) *testProvider {
	p := &testProvider{dead: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		id, ok := strings.CutPrefix(tok, providerSecret+"-")
		p.mu.Lock()
		defer p.mu.Unlock()
		if !ok || p.dead[id] {
			http.Error(w, `{"message":"Bad credentials"}`, http.StatusUnauthorized)
			return
		}
		p.used = append(p.used, id)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"path":"`+strings.TrimPrefix(r.URL.Path, "/api")+`"}`)
	})
	// The key service: X-Api-Key keySecret-<login> is that login's key
	// until it is killed.
	mux.HandleFunc("/keysapi/", func(w http.ResponseWriter, r *http.Request) {
		login, ok := strings.CutPrefix(r.Header.Get("X-Api-Key"), keySecret+"-")
		p.mu.Lock()
		defer p.mu.Unlock()
		if !ok || p.dead["key:"+login] {
			http.Error(w, `{"message":"invalid key"}`, http.StatusUnauthorized)
			return
		}
		p.used = append(p.used, "key:"+login)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"id-`+login+`","login":"`+login+`","path":"`+strings.TrimPrefix(r.URL.Path, "/keysapi")+`"}`)
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		id, _ := strings.CutPrefix(r.PostFormValue("refresh_token"), refreshSecret+"-")
		p.mu.Lock()
		dead := p.dead[id]
		p.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if id == "" || dead {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid_grant"}`)
			return
		}
		io.WriteString(w, `{"access_token":"`+providerSecret+"-"+id+`","refresh_token":"`+refreshSecret+"-"+id+`","token_type":"bearer","expires_in":3600}`)
	})
	mux.HandleFunc("POST /revoke", func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.revokeErr {
			http.Error(w, `{"error":"server_error"}`, http.StatusInternalServerError)
			return
		}
		p.revoked = append(p.revoked, r.PostFormValue("token"))
	})
	p.srv = httptest.NewServer(mux)
	t.Cleanup(p.srv.Close)
	return p
}

// kill makes connection id's tokens dead at the provider.
func (p *testProvider) kill(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dead[id] = true
}

// lastUsed is the connection id of the last API call.
func (p *testProvider) lastUsed() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.used) == 0 {
		return ""
	}
	return p.used[len(p.used)-1]
}

func (p *testProvider) calls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.used)
}

func (h *harness) principal(sub string) vault.Principal {
	return vault.Principal{Issuer: h.iss.srv.URL, Subject: sub}
}

// bearer returns a valid access token for sub.
func (h *harness) bearer(sub string) string {
	return h.iss.token(h.t, tokenSpec{sub: sub, aud: resource, exp: h.clock.Now().Add(time.Hour)})
}

// connect stores a connection for p as the browser flow would.
func (h *harness) connect(p vault.Principal, provider, login string, scopes []string) vault.Connection {
	h.t.Helper()
	h.connN++
	now := h.clock.Now()
	id := fmt.Sprintf("conn-%d", h.connN)
	c, err := h.store.CreateConnection(context.Background(), vault.Connection{
		ID: id, Principal: p, Provider: provider, AccountID: fmt.Sprintf("10%d", h.connN),
		AccountLogin: login, Scopes: scopes, Status: vault.StatusActive, Created: now, Updated: now,
		Token: h.tokens(id),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// tokens is the token set the test provider issues for connection id.
func (h *harness) tokens(id string) vault.TokenSet {
	return vault.TokenSet{AccessToken: vault.Secret(providerSecret + "-" + id), RefreshToken: vault.Secret(refreshSecret + "-" + id),
		TokenType: "bearer", Expiry: h.clock.Now().Add(time.Hour)}
}

// completeGrant approves grant id and completes it with a new connection,
// as the broker's browser pages would.
func (h *harness) completeGrant(id string, p vault.Principal, login string) vault.Connection {
	h.t.Helper()
	h.connN++
	return h.save(id, p, provider.Account{ID: fmt.Sprintf("10%d", h.connN), Login: login})
}

// reconnect completes grant id for the account of existing connection c,
// as a reconnect in the browser would: same connection, new tokens.
func (h *harness) reconnect(id string, c vault.Connection) vault.Connection {
	h.t.Helper()
	h.api.mu.Lock()
	delete(h.api.dead, c.ID)
	h.api.mu.Unlock()
	return h.save(id, c.Principal, provider.Account{ID: c.AccountID, Login: c.AccountLogin})
}

// save saves a browser step's result for grant id through the connections
// layer, as the callback does (Save approves and completes the grant).
func (h *harness) save(id string, p vault.Principal, acct provider.Account) vault.Connection {
	h.t.Helper()
	return h.saveGranting(id, p, acct, nil)
}

// saveGranting is save where the provider granted only the scopes
// granted (nil: every scope the grant asked for).
func (h *harness) saveGranting(id string, p vault.Principal, acct provider.Account, granted []string) vault.Connection {
	h.t.Helper()
	ctx := context.Background()
	g, err := h.grants.Authorize(ctx, id, p)
	if err != nil {
		h.t.Fatalf("authorize %s: %v", id, err)
	}
	pr, _ := h.conns.Providers().Lookup(g.Provider)
	// The connection id is only known once stored: store, then give it
	// tokens the test provider recognises.
	if granted == nil {
		granted = g.Scopes
	}
	c, err := h.conns.Save(ctx, p, g, pr, provider.Exchanged{Account: acct, Scopes: granted, Token: h.tokens("pending")})
	if err != nil {
		h.t.Fatalf("save %s: %v", id, err)
	}
	c, err = h.store.UpdateConnection(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
		old.Token = h.tokens(old.ID)
		return old, nil
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// rawCall is one HTTP exchange with the endpoint.
type rawCall struct {
	method  string // HTTP method, default POST
	path    string // default /mcp
	headers map[string]string
	body    string
}

type rawResult struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(c rawCall) rawResult {
	h.t.Helper()
	m := c.method
	if m == "" {
		m = http.MethodPost
	}
	path := c.path
	if path == "" {
		path = "/mcp"
	}
	req, err := http.NewRequest(m, h.http.URL+path, strings.NewReader(c.body))
	if err != nil {
		h.t.Fatal(err)
	}
	for k, v := range c.headers {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := h.http.Client().Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return rawResult{status: resp.StatusCode, header: resp.Header, body: b}
}

// modernHeaders are the headers of a well-formed 2026-07-28 request.
func (h *harness) modernHeaders(sub, method, name string) map[string]string {
	m := map[string]string{
		"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + h.bearer(sub), "MCP-Protocol-Version": versionModern, "Mcp-Method": method,
	}
	if name != "" {
		m["Mcp-Name"] = name
	}
	return m
}

const urlCaps = `{"elicitation":{"url":{}}}`

// modernBody renders a 2026-07-28 request body.
func modernBody(id int, method string, caps string, params map[string]any) string {
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    versionModern,
		"io.modelcontextprotocol/clientCapabilities": json.RawMessage(caps),
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "test-agent", "version": "1.0"},
	}
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	return string(b)
}

// decoded parses a JSON-RPC response body.
type decoded struct {
	Result map[string]any `json:"result"`
	Error  *struct {
		Code    int64           `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

func decode(t testing.TB, b []byte) decoded {
	t.Helper()
	var d decoded
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("response is not JSON: %v\n%s", err, b)
	}
	return d
}

// callTool does a modern tools/call and returns the decoded response.
func (h *harness) callTool(sub, caps, tool string, args map[string]any, extra map[string]any) (rawResult, decoded) {
	h.t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	for k, v := range extra {
		params[k] = v
	}
	r := h.do(rawCall{headers: h.modernHeaders(sub, "tools/call", tool), body: modernBody(7, "tools/call", caps, params)})
	return r, decode(h.t, r.body)
}

// elicitation returns the url elicitation and requestState of an
// input_required result.
func elicitation(t testing.TB, d decoded) (key, url, state string) {
	t.Helper()
	if d.Result == nil || d.Result["resultType"] != "input_required" {
		t.Fatalf("want input_required, got %+v", d)
	}
	irs, _ := d.Result["inputRequests"].(map[string]any)
	if len(irs) != 1 {
		t.Fatalf("want one input request, got %v", irs)
	}
	for k, v := range irs {
		p := v.(map[string]any)["params"].(map[string]any)
		if v.(map[string]any)["method"] != "elicitation/create" || p["mode"] != "url" {
			t.Fatalf("want a url elicitation, got %v", v)
		}
		state, _ = d.Result["requestState"].(string)
		return k, p["url"].(string), state
	}
	return
}

func grantIDOf(t testing.TB, url string) string {
	t.Helper()
	id, ok := strings.CutPrefix(url, publicURL+"/connect/")
	if !ok || !binding.ValidID(id) {
		t.Fatalf("connect URL %q is not %s/connect/<grant id>", url, publicURL)
	}
	return id
}
