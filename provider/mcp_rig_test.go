package provider

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/oauth2"

	"credbroker/internal/egress"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// The rig of the mcp kind's tests: an upstream MCP server (go-sdk, behind
// the go-sdk's bearer middleware, which answers 401 with the RFC 9728
// challenge) and its authorization server, each on its own loopback
// server, a store, and Clients talking to both through the egress policy
// (loopback allowed).

// testClock is an injected clock tests move by hand.
type testClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Now().Truncate(time.Second)} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// asRequest is one request the authorization server received: its path,
// its query or form, and its client authentication.
type asRequest struct {
	Method, Path string
	Values       url.Values
	BasicUser    string
	BasicPass    string
}

// upstreamAS is a small authorization server of an upstream MCP server:
//
//	GET  /.well-known/oauth-authorization-server[/…]   RFC 8414 (meta, which tests change)
//	GET  /authorize   code flow: PKCE S256 and a known client required; redirects with code, state and iss
//	POST /token       authorization_code (PKCE checked) and refresh_token (rotating); an ID token
//	                  (idAlg) when openid was asked for
//	POST /register    RFC 7591 (regFail: 500)
//	POST /revoke      RFC 7009
//	GET  /jwks        the ID token keys
//	GET  /me          the account of an access token
//
// Its clients: "static-client" (secret "static-secret"), the ones it
// registered, and any https client_id (a Client ID Metadata Document,
// trusted as it is: the fake does not fetch it). Every request is
// recorded.
type upstreamAS struct {
	t      *testing.T
	srv    *httptest.Server
	base   string // the issuer
	clock  *testClock
	ecKey  *ecdsa.PrivateKey
	rsaKey *rsa.PrivateKey

	mu sync.Mutex // guards the fields below
	// meta is the RFC 8414 document; tests change its entries.
	meta map[string]any
	// sub is the account the next authorization approves.
	sub string
	// idAlg signs ID tokens: ES256 (default), RS256, or "stray" (ES256
	// with a key not in the JWKS).
	idAlg    string
	regFail  int
	reqs     []asRequest
	codes    map[string]asCode
	refresh  map[string]string // refresh token → account
	access   map[string]string // access token → account
	clients  map[string]string // client id → secret ("" public)
	n        int
	resource string // the MCP server its tokens are for
	// jwtBearer, when set, takes the JWT bearer grant (ID-JAGs,
	// idjag_test.go): it names the account of an acceptable assertion
	// for the authenticated client, or the error code of a refusal. Its
	// answers carry no refresh token.
	jwtBearer func(client string, form url.Values) (sub, errCode string)
	// refuseClient is a client the token endpoint refuses (invalid_client)
	// though it knows it: a wrong secret, a metadata document it cannot
	// fetch. tokenHook runs at each token request, before it is answered.
	refuseClient string
	tokenHook    func()
}

// rsaTestKey is one RSA key for every authorization server of the test
// binary (making one takes a while under the race detector).
var rsaTestKey = sync.OnceValues(func() (*rsa.PrivateKey, error) { return rsa.GenerateKey(rand.Reader, 2048) })

type asCode struct {
	client, redirect, challenge, resource, scope, nonce, sub string
}

// newUpstreamAS starts an authorization server whose issuer is
// http://host:port (host 127.0.0.1, or localhost for "another host").
func newUpstreamAS(t *testing.T, host string, clock *testClock) *upstreamAS {
	a := &upstreamAS{t: t, clock: clock, sub: "person-1", idAlg: "ES256", codes: map[string]asCode{}, refresh: map[string]string{},
		access: map[string]string{}, clients: map[string]string{"static-client": "static-secret"}}
	var err error
	if a.ecKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		t.Fatal(err)
	}
	if a.rsaKey, err = rsaTestKey(); err != nil {
		t.Fatal(err)
	}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	_, port, _ := net.SplitHostPort(a.srv.Listener.Addr().String())
	a.base = "http://" + net.JoinHostPort(host, port)
	a.meta = map[string]any{
		"issuer":                                a.base,
		"authorization_endpoint":                a.base + "/authorize",
		"token_endpoint":                        a.base + "/token",
		"registration_endpoint":                 a.base + "/register",
		"revocation_endpoint":                   a.base + "/revoke",
		"jwks_uri":                              a.base + "/jwks",
		"response_types_supported":              []string{"code"},
		"grant_types_supported":                 []string{"authorization_code", "refresh_token"},
		"code_challenge_methods_supported":      []string{"S256"},
		"token_endpoint_auth_methods_supported": []string{"client_secret_basic", "none"},
		"scopes_supported":                      []string{"openid", "issues:read", "issues:write", "offline_access"},
	}
	return a
}

// set changes (or with nil removes) metadata entries.
func (a *upstreamAS) set(kv ...any) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(a.meta, kv[i].(string))
		} else {
			a.meta[kv[i].(string)] = kv[i+1]
		}
	}
}

func (a *upstreamAS) with(f func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f()
}

// requests returns the recorded requests to path.
func (a *upstreamAS) requests(path string) []asRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []asRequest
	for _, r := range a.reqs {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func (a *upstreamAS) serve(w http.ResponseWriter, r *http.Request) {
	rec := asRequest{Method: r.Method, Path: r.URL.Path, Values: r.URL.Query()}
	if r.Method == http.MethodPost && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		r.ParseForm()
		rec.Values = r.PostForm
	}
	rec.BasicUser, rec.BasicPass, _ = r.BasicAuth()
	rec.BasicUser, _ = url.QueryUnescape(rec.BasicUser)
	rec.BasicPass, _ = url.QueryUnescape(rec.BasicPass)
	a.mu.Lock()
	a.reqs = append(a.reqs, rec)
	a.mu.Unlock()
	switch {
	case strings.HasPrefix(r.URL.Path, "/.well-known/oauth-authorization-server") && r.Method == http.MethodGet:
		a.mu.Lock()
		b, _ := json.Marshal(a.meta)
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write(b)
	case r.URL.Path == "/authorize" && r.Method == http.MethodGet:
		a.authorize(w, r)
	case r.URL.Path == "/token" && r.Method == http.MethodPost:
		a.token(w, r, rec)
	case r.URL.Path == "/register" && r.Method == http.MethodPost:
		a.register(w, r)
	case r.URL.Path == "/revoke" && r.Method == http.MethodPost:
		w.WriteHeader(http.StatusOK)
	case r.URL.Path == "/jwks" && r.Method == http.MethodGet:
		keys := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{
			{Key: a.ecKey.Public(), KeyID: "ec", Algorithm: "ES256", Use: "sig"},
			{Key: a.rsaKey.Public(), KeyID: "rsa", Algorithm: "RS256", Use: "sig"}}}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(keys)
	case r.URL.Path == "/me" && r.Method == http.MethodGet:
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		a.mu.Lock()
		sub, ok := a.access[tok]
		a.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"id": "acct-" + sub, "login": sub + "@example.com"})
	default:
		http.NotFound(w, r)
	}
}

func (a *upstreamAS) authorize(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	a.mu.Lock()
	defer a.mu.Unlock()
	_, known := a.clients[q.Get("client_id")]
	if !known && strings.HasPrefix(q.Get("client_id"), "https://") {
		known = true
	}
	if q.Get("response_type") != "code" || !known || q.Get("redirect_uri") == "" || q.Get("code_challenge") == "" || q.Get("code_challenge_method") != "S256" {
		http.Error(w, "bad authorization request", http.StatusBadRequest)
		return
	}
	a.n++
	code := fmt.Sprintf("code-%d", a.n)
	a.codes[code] = asCode{client: q.Get("client_id"), redirect: q.Get("redirect_uri"), challenge: q.Get("code_challenge"),
		resource: q.Get("resource"), scope: q.Get("scope"), nonce: q.Get("nonce"), sub: a.sub}
	to, _ := url.Parse(q.Get("redirect_uri"))
	v := to.Query()
	v.Set("code", code)
	v.Set("state", q.Get("state"))
	v.Set("iss", a.base)
	to.RawQuery = v.Encode()
	http.Redirect(w, r, to.String(), http.StatusFound)
}

// client authenticates the token request's client: its id, or "" when
// the client is unknown, its secret wrong, or it authenticated in a way
// the metadata's token_endpoint_auth_methods_supported does not list
// (RFC 8414 §2: the methods this server supports; client_secret_basic
// when the list is absent). The caller holds a.mu.
func (a *upstreamAS) client(r *http.Request, rec asRequest) string {
	id, secret, used := rec.BasicUser, rec.BasicPass, "client_secret_basic"
	if id == "" {
		id, secret, used = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret"), "client_secret_post"
		if !r.PostForm.Has("client_secret") {
			used = "none"
		}
	}
	methods, listed := a.meta["token_endpoint_auth_methods_supported"].([]string)
	if !listed {
		methods = []string{"client_secret_basic"}
	}
	if !slices.Contains(methods, used) && used != "none" {
		return ""
	}
	want, ok := a.clients[id]
	switch {
	case !ok && strings.HasPrefix(id, "https://"):
		return id
	case !ok || want != secret:
		return ""
	}
	return id
}

func (a *upstreamAS) token(w http.ResponseWriter, r *http.Request, rec asRequest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fail := func(code string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":%q}`, code)
	}
	if a.tokenHook != nil {
		a.tokenHook()
	}
	client := a.client(r, rec)
	if client == "" || client == a.refuseClient {
		fail("invalid_client")
		return
	}
	f := r.PostForm
	if res := f.Get("resource"); res != "" && res != a.resource {
		fail("invalid_target")
		return
	}
	var sub, scope, nonce string
	switch f.Get("grant_type") {
	case "authorization_code":
		c, ok := a.codes[f.Get("code")]
		delete(a.codes, f.Get("code"))
		sum := sha256.Sum256([]byte(f.Get("code_verifier")))
		if !ok || c.client != client || c.redirect != f.Get("redirect_uri") || base64.RawURLEncoding.EncodeToString(sum[:]) != c.challenge {
			fail("invalid_grant")
			return
		}
		sub, scope, nonce = c.sub, c.scope, c.nonce
	case "refresh_token":
		var ok bool
		if sub, ok = a.refresh[f.Get("refresh_token")]; !ok {
			fail("invalid_grant")
			return
		}
		delete(a.refresh, f.Get("refresh_token"))
	case grantJWTBearer:
		code := "unsupported_grant_type"
		if a.jwtBearer != nil {
			sub, code = a.jwtBearer(client, f)
		}
		if code != "" {
			fail(code)
			return
		}
		a.n++
		at := fmt.Sprintf("up-access-%d", a.n)
		a.access[at] = sub
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": at, "token_type": "Bearer", "expires_in": 3600, "scope": f.Get("scope")})
		return
	default:
		fail("unsupported_grant_type")
		return
	}
	a.n++
	at, rt := fmt.Sprintf("up-access-%d", a.n), fmt.Sprintf("up-refresh-%d", a.n)
	a.access[at], a.refresh[rt] = sub, sub
	out := map[string]any{"access_token": at, "refresh_token": rt, "token_type": "Bearer", "expires_in": 3600}
	if slices.Contains(strings.Fields(scope), "openid") {
		out["id_token"] = a.idToken(client, sub, nonce)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// idToken signs an ID token for client (a.mu held).
func (a *upstreamAS) idToken(client, sub, nonce string) string {
	var key jose.SigningKey
	switch a.idAlg {
	case "RS256":
		key = jose.SigningKey{Algorithm: jose.RS256, Key: jose.JSONWebKey{Key: a.rsaKey, KeyID: "rsa"}}
	case "stray":
		stray, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		key = jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: stray, KeyID: "ec"}}
	default:
		key = jose.SigningKey{Algorithm: jose.ES256, Key: jose.JSONWebKey{Key: a.ecKey, KeyID: "ec"}}
	}
	signer, err := jose.NewSigner(key, (&jose.SignerOptions{}).WithType("JWT"))
	if err != nil {
		a.t.Error(err)
		return ""
	}
	now := a.clock.Now()
	claims := map[string]any{"iss": a.base, "sub": sub, "aud": client, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(),
		"email": sub + "@example.com"}
	if nonce != "" {
		claims["nonce"] = nonce
	}
	b, _ := json.Marshal(claims)
	jws, err := signer.Sign(b)
	if err != nil {
		a.t.Error(err)
		return ""
	}
	s, _ := jws.CompactSerialize()
	return s
}

func (a *upstreamAS) register(w http.ResponseWriter, r *http.Request) {
	var m struct {
		RedirectURIs []string `json:"redirect_uris"`
		AuthMethod   string   `json:"token_endpoint_auth_method"`
	}
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.regFail > 0 {
		a.regFail--
		http.Error(w, `{"error":"server_error"}`, http.StatusInternalServerError)
		return
	}
	if json.Unmarshal(body, &m) != nil || len(m.RedirectURIs) == 0 {
		http.Error(w, `{"error":"invalid_client_metadata"}`, http.StatusBadRequest)
		return
	}
	a.n++
	id, secret := fmt.Sprintf("dcr-client-%d", a.n), ""
	if m.AuthMethod == "client_secret_basic" || m.AuthMethod == "client_secret_post" {
		secret = fmt.Sprintf("dcr-secret-%d", a.n)
	}
	a.clients[id] = secret
	out := map[string]any{"client_id": id, "redirect_uris": m.RedirectURIs, "token_endpoint_auth_method": m.AuthMethod}
	if secret != "" {
		out["client_secret"] = secret
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(out)
}

// upstreamMCP is the MCP server: a go-sdk server (one tool) behind the
// go-sdk's bearer middleware, which accepts the authorization server's
// access tokens and answers anything else 401 with resource_metadata set
// to challenge (and scope to scopes, when set: then no token passes); and
// its protected-resource metadata wherever docs says (path → document;
// redirects: path → Location).
type upstreamMCP struct {
	srv *httptest.Server
	url string

	mu        sync.Mutex // guards the fields below
	challenge string
	scopes    []string
	docs      map[string]any
	redirects map[string]string
	gets      []string
}

func newUpstreamMCP(t *testing.T, as *upstreamAS) *upstreamMCP {
	u := &upstreamMCP{docs: map[string]any{}, redirects: map[string]string{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "ping"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pong"}}}, nil, nil
	})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		as.mu.Lock()
		defer as.mu.Unlock()
		if _, ok := as.access[tok]; !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Expiration: as.clock.Now().Add(time.Hour)}, nil
	}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		if r.Method == http.MethodGet {
			u.gets = append(u.gets, r.URL.Path)
		}
		challenge, scopes, doc, to := u.challenge, u.scopes, u.docs[r.URL.Path], u.redirects[r.URL.Path]
		u.mu.Unlock()
		switch {
		case to != "":
			http.Redirect(w, r, to, http.StatusFound)
		case r.URL.Path == "/mcp":
			auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: challenge, Scopes: scopes})(handler).ServeHTTP(w, r)
		case doc != nil && r.Method == http.MethodGet:
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(doc)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(u.srv.Close)
	u.url = u.srv.URL + "/mcp"
	as.resource = u.url
	return u
}

// prm is protected-resource metadata naming issuer.
func (u *upstreamMCP) prm(issuer string, scopes ...string) map[string]any {
	if scopes == nil {
		scopes = []string{"issues:read", "issues:write"}
	}
	return map[string]any{"resource": u.url, "authorization_servers": []string{issuer}, "scopes_supported": scopes}
}

func (u *upstreamMCP) with(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f()
}

func (u *upstreamMCP) fetched() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.gets)
}

const (
	pathPRM       = "/.well-known/oauth-protected-resource/mcp"
	rootPRM       = "/.well-known/oauth-protected-resource"
	challengePRM  = "/prm/from-challenge"
	mcpRedirect   = "https://broker.test/oauth/linear/callback"
	mcpClientMeta = "https://broker.test/oauth/client-metadata.json"
)

// mcpRig is an upstream (MCP server and authorization server), a store and
// what a Client needs.
type mcpRig struct {
	t       *testing.T
	clock   *testClock
	as      *upstreamAS
	up      *upstreamMCP
	store   *memstore.Store
	clients *recordingClients
}

// newMCPRig starts an upstream whose authorization server is at asHost
// (127.0.0.1: the MCP server's host; localhost: another host). The
// server's challenge names its path-inserted metadata.
func newMCPRig(t *testing.T, asHost string) *mcpRig {
	r := &mcpRig{t: t, clock: newTestClock(), clients: newRecordingClients()}
	r.as = newUpstreamAS(t, asHost, r.clock)
	r.up = newUpstreamMCP(t, r.as)
	r.up.challenge = r.up.srv.URL + pathPRM
	r.up.docs[pathPRM] = r.up.prm(r.as.base)
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	r.store = memstore.New(kr)
	return r
}

// registry is the catalogue with one mcp entry, linear, for the rig's
// server; mcpLines go under mcp:, entryLines under the entry.
func (r *mcpRig) registry(mcpLines, entryLines string) *Registry {
	r.t.Helper()
	doc := "providers:\n  linear:\n    type: mcp\n    display_name: Linear\n    mcp:\n      url: " + r.up.url + "\n" + mcpLines + entryLines
	reg, err := ParseProviders("rig.yaml", []byte(doc), env(map[string]string{"LINEAR_SECRET": "static-secret"}))
	if err != nil {
		r.t.Fatal(err)
	}
	return reg
}

// egressClient is the upstream client broker dev would use: the egress
// policy, loopback allowed.
func egressClient(t *testing.T, o egress.Options) *http.Client {
	c, err := egress.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// client is a Client (one replica) of reg on the rig's store and
// registrations; mod changes its options.
func (r *mcpRig) client(reg *Registry, mod func(*Options)) *Client {
	r.t.Helper()
	o := Options{Store: r.store, Providers: reg, Now: r.clock.Now, BrokerURL: "https://broker.test",
		UpstreamHTTPClient: egressClient(r.t, egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true}),
		UpstreamClients:    r.clients, ClientMetadataURL: mcpClientMeta, RetryBackoff: time.Millisecond}
	if mod != nil {
		mod(&o)
	}
	k, err := New(o)
	if err != nil {
		r.t.Fatal(err)
	}
	return k
}

// authorize builds linear's authorization request, has the authorization
// server approve it, and returns the request and the code.
func (r *mcpRig) authorize(k *Client, scopes []string) (AuthRequest, string) {
	r.t.Helper()
	p, _ := k.opts.Providers.Lookup("linear")
	a, err := k.AuthRequest(context.Background(), p, k.Scopes(p, scopes), mcpRedirect)
	if err != nil {
		r.t.Fatalf("AuthRequest: %v", err)
	}
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Get(a.URL)
	if err != nil {
		r.t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if resp.StatusCode != http.StatusFound || err != nil || loc.Query().Get("code") == "" || loc.Query().Get("state") != a.State {
		r.t.Fatalf("authorization answered %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	return a, loc.Query().Get("code")
}

// connect runs the code flow for pr and stores the connection under id
// with an access token that has expired (so the next use refreshes).
func (r *mcpRig) connect(k *Client, pr vault.Principal, id string, scopes []string) (vault.Connection, Exchanged) {
	r.t.Helper()
	p, _ := k.opts.Providers.Lookup("linear")
	a, code := r.authorize(k, scopes)
	ex, err := k.Exchange(context.Background(), p, pr, mcpRedirect, code, a)
	if err != nil {
		r.t.Fatalf("Exchange: %v", err)
	}
	now := r.clock.Now()
	ex.Token.Expiry = now.Add(-time.Minute)
	c, err := r.store.CreateConnection(context.Background(), vault.Connection{ID: id, Principal: pr, Provider: "linear",
		AccountID: ex.Account.ID, AccountLogin: ex.Account.Login, Scopes: ex.Scopes, Token: ex.Token, Status: vault.StatusActive,
		Created: now, Updated: now})
	if err != nil {
		r.t.Fatal(err)
	}
	return c, ex
}

// tokenOf is a stored token set as x/oauth2's token.
func tokenOf(ts vault.TokenSet) *oauth2.Token {
	return &oauth2.Token{AccessToken: ts.AccessToken.Reveal(), RefreshToken: ts.RefreshToken.Reveal(), TokenType: ts.TokenType, Expiry: ts.Expiry}
}

// recordingClients is the default registration store, counting what it
// is asked; afterGet runs after each lookup with the number of lookups so
// far.
type recordingClients struct {
	memUpstreamClients
	mu       sync.Mutex // guards the fields below
	gets     int
	puts     []UpstreamClient
	afterGet func(n int)
}

func newRecordingClients() *recordingClients {
	return &recordingClients{memUpstreamClients: memUpstreamClients{m: map[string]UpstreamClient{}}}
}

func (s *recordingClients) GetUpstreamClient(ctx context.Context, key string) (UpstreamClient, error) {
	s.mu.Lock()
	s.gets++
	n, after := s.gets, s.afterGet
	s.mu.Unlock()
	if after != nil {
		after(n)
	}
	return s.memUpstreamClients.GetUpstreamClient(ctx, key)
}

func (s *recordingClients) PutUpstreamClient(ctx context.Context, c UpstreamClient) (UpstreamClient, error) {
	s.mu.Lock()
	s.puts = append(s.puts, c)
	s.mu.Unlock()
	return s.memUpstreamClients.PutUpstreamClient(ctx, c)
}

// with runs f on the stored registrations, as another replica sharing
// the store would change them.
func (s *recordingClients) with(f func(m map[string]UpstreamClient)) {
	s.memUpstreamClients.mu.Lock()
	defer s.memUpstreamClients.mu.Unlock()
	f(s.memUpstreamClients.m)
}

func (s *recordingClients) counts() (gets, puts int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gets, len(s.puts)
}

// upstreamError returns err as an *UpstreamError, failing the test when it
// is not one (or does not say the provider is unavailable).
func upstreamError(t *testing.T, err error) *UpstreamError {
	t.Helper()
	var ue *UpstreamError
	if !errors.As(err, &ue) || !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("err = %T %v, want *UpstreamError", err, err)
	}
	if !strings.HasPrefix(ue.Error(), "Linear: ") {
		t.Errorf("error %q does not name the upstream", ue.Error())
	}
	return ue
}

// memUpstreamClients keeps registrations in a map the rig can change as
// another replica would (recordingClients).
type memUpstreamClients struct {
	mu sync.Mutex
	m  map[string]UpstreamClient
}

func (s *memUpstreamClients) GetUpstreamClient(_ context.Context, key string) (UpstreamClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.m[key]
	if !ok {
		return UpstreamClient{}, vault.ErrNotFound
	}
	return c, nil
}

func (s *memUpstreamClients) PutUpstreamClient(_ context.Context, c UpstreamClient) (UpstreamClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.m[c.Key]; ok {
		return old, nil
	}
	s.m[c.Key] = c
	return c, nil
}

func (s *memUpstreamClients) DeleteUpstreamClient(_ context.Context, key, clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[key]
	switch {
	case !ok:
		return vault.ErrNotFound
	case clientID != "" && old.ClientID != clientID:
		return vault.ErrConflict
	}
	delete(s.m, key)
	return nil
}
