package mcpapi

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
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

type staticCatalog map[string]ProviderInfo

func (c staticCatalog) Provider(name string) (ProviderInfo, bool) {
	p, ok := c[name]
	return p, ok
}

func (c staticCatalog) ProviderNames() []string { return []string{"github", "google"} }

var testCatalog = staticCatalog{
	"github": {Name: "github", DisplayName: "GitHub", DefaultScopes: []string{"read:user"}, AllowedScopes: []string{"read:user", "repo"}},
	"google": {Name: "google", DisplayName: "Google", DefaultScopes: []string{"openid", "email"}, AllowedScopes: []string{"openid", "email"}},
}

const (
	publicURL = "https://broker.example.com"
	resource  = publicURL + "/mcp"
	// providerSecret is the third-party token stored in every test
	// connection; no response or log line may contain it.
	providerSecret = "gho_PROVIDERSECRET0123456789"
	refreshSecret  = "ghr_REFRESHSECRET0123456789"
)

var epoch = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

type harness struct {
	t         testing.TB
	iss       *testIssuer
	clock     *clock
	store     *memstore.Store
	grants    *binding.Service
	srv       *Server
	http      *httptest.Server
	logs      *syncBuffer
	revoked   []string
	revokeErr error
	mu        sync.Mutex // guards revoked
	connN     int
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harnessOpt func(*Options)

func newHarness(t testing.TB, mods ...harnessOpt) *harness {
	t.Helper()
	h := &harness{t: t, iss: newTestIssuer(t), clock: &clock{t: epoch}, logs: &syncBuffer{}}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	h.store = memstore.New(kr)
	h.grants = binding.New(h.store, binding.Options{Now: h.clock.Now, MaxRounds: 3})
	opts := Options{
		PublicURL: publicURL, Issuer: h.iss.srv.URL, Store: h.store, Grants: h.grants, Catalog: testCatalog,
		StateKeys: kr.Derive("requestState"), Now: h.clock.Now, ServerVersion: "test",
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Revoke: func(ctx context.Context, c vault.Connection) (bool, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.revoked = append(h.revoked, c.ID)
			return h.revokeErr == nil, h.revokeErr
		},
	}
	for _, m := range mods {
		m(&opts)
	}
	h.srv, err = New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.srv.Register(mux)
	h.http = httptest.NewServer(mux)
	t.Cleanup(h.http.Close)
	return h
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
	c, err := h.store.CreateConnection(context.Background(), vault.Connection{
		ID: "conn-" + string(rune('0'+h.connN)), Principal: p, Provider: provider, AccountID: "10" + string(rune('0'+h.connN)),
		AccountLogin: login, Scopes: scopes, Status: vault.StatusActive, Created: now, Updated: now,
		Token: vault.TokenSet{AccessToken: providerSecret, RefreshToken: refreshSecret, TokenType: "bearer", Expiry: now.Add(time.Hour)},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// completeGrant approves grant id and completes it with a new connection,
// as the broker's browser pages would.
func (h *harness) completeGrant(id string, p vault.Principal, login string) vault.Connection {
	h.t.Helper()
	ctx := context.Background()
	g, err := h.grants.Approve(ctx, id, p)
	if err != nil {
		h.t.Fatalf("approve %s: %v", id, err)
	}
	c := h.connect(p, g.Provider, login, g.Scopes)
	if _, err := h.grants.Complete(ctx, id, p, c.ID); err != nil {
		h.t.Fatalf("complete %s: %v", id, err)
	}
	return c
}

// rawCall is one HTTP exchange with the endpoint.
type rawCall struct {
	method  string // HTTP method, default POST
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
	req, err := http.NewRequest(m, h.http.URL+"/mcp", strings.NewReader(c.body))
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
