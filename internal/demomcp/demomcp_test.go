package demomcp_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
)

// rig is the demo provider and the demo MCP server, mounted as `broker
// dev` mounts them (one server: /dev/provider and /dev/mcp-upstream) or
// standalone on two servers.
type rig struct {
	as  *demoprovider.Provider
	mcp *demomcp.Server
	// other is a second resource the provider serves, for tokens bound
	// elsewhere.
	other string
}

func start(t testing.TB, split bool) rig {
	t.Helper()
	asMux, mcpMux := http.NewServeMux(), http.NewServeMux()
	asSrv := httptest.NewServer(asMux)
	t.Cleanup(asSrv.Close)
	mcpSrv := asSrv
	if split {
		mcpSrv = httptest.NewServer(mcpMux)
		t.Cleanup(mcpSrv.Close)
	} else {
		mcpMux = asMux
	}
	resource := mcpSrv.URL + "/dev/mcp-upstream"
	other := mcpSrv.URL + "/dev/other-mcp"
	as, err := demoprovider.New(demoprovider.Options{
		BaseURL: asSrv.URL + "/dev/provider", ClientID: "credbroker-demo", ClientSecret: "demo-secret",
		RedirectURIs: []string{asSrv.URL + "/oauth/demo/callback"}, Resources: []string{resource, other},
	})
	if err != nil {
		t.Fatal(err)
	}
	as.Mount(asMux)
	srv, err := demomcp.New(demomcp.Options{URL: resource, AuthServer: as})
	if err != nil {
		t.Fatal(err)
	}
	srv.Mount(mcpMux)
	return rig{as: as, mcp: srv, other: other}
}

var noFollow = &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

var requestField = regexp.MustCompile(`name="request" value="([^"]+)"`)

// approve plays the person at the demo provider's consent page: approve
// as account ("1001" alice-demo, "1002" bob-demo); it returns the
// authorization response's parameters.
func approve(ctx context.Context, authURL, account string) (url.Values, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	resp, err := noFollow.Do(req)
	if err != nil {
		return nil, err
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "" {
		u, err := url.Parse(loc)
		if err != nil {
			return nil, err
		}
		return u.Query(), nil // an error answered to the client
	}
	m := requestField.FindSubmatch(page)
	if m == nil {
		return nil, fmt.Errorf("authorize: HTTP %d %s", resp.StatusCode, page)
	}
	u, _ := url.Parse(authURL)
	u.RawQuery = ""
	resp, err = noFollow.PostForm(u.String(), url.Values{"request": {string(m[1])}, "decision": {"approve"}, "account": {account}})
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || resp.StatusCode != http.StatusFound {
		return nil, fmt.Errorf("consent: HTTP %d %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query(), nil
}

// codeFlow is an auth.OAuthHandler doing what a client of a hosted MCP
// server does, by hand: on a 401 or a 403 insufficient_scope, discover the
// protected resource metadata from the challenge, the authorization
// server's metadata (exact issuer), register dynamically once, run the
// code flow with PKCE S256 and the resource on the authorization and token
// requests (the scope: what it held plus what the challenge asks), and
// keep the token.
type codeFlow struct {
	resource string // the MCP endpoint the client was pointed at
	account  string
	method   string // token_endpoint_auth_method to register

	mu     sync.Mutex // guards the fields below
	conf   *oauth2.Config
	tok    *oauth2.Token
	scopes []string
	flows  []string // "401" or "403 <scope>" per authorization run
}

var _ auth.OAuthHandler = (*codeFlow)(nil)

func (f *codeFlow) TokenSource(context.Context) (oauth2.TokenSource, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tok == nil {
		return nil, nil
	}
	return oauth2.StaticTokenSource(f.tok), nil
}

func (f *codeFlow) token() *oauth2.Token {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tok
}

func (f *codeFlow) Authorize(ctx context.Context, _ *http.Request, resp *http.Response) error {
	resp.Body.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	challenges, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return err
	}
	var bearer map[string]string
	for _, c := range challenges {
		if c.Scheme == "bearer" {
			bearer = c.Params
		}
	}
	switch {
	case bearer == nil || bearer["resource_metadata"] == "":
		return fmt.Errorf("HTTP %d without a Bearer challenge naming resource_metadata", resp.StatusCode)
	case resp.StatusCode == http.StatusForbidden && bearer["error"] != "insufficient_scope":
		return fmt.Errorf("HTTP 403 %q", bearer["error"])
	}
	f.flows = append(f.flows, strings.TrimSpace(fmt.Sprintf("%d %s", resp.StatusCode, map[bool]string{true: bearer["scope"]}[resp.StatusCode == 403])))
	prm, err := oauthex.GetProtectedResourceMetadata(ctx, bearer["resource_metadata"], f.resource, nil)
	if err != nil {
		return err
	}
	if len(prm.AuthorizationServers) != 1 {
		return fmt.Errorf("authorization servers %v", prm.AuthorizationServers)
	}
	issuer := prm.AuthorizationServers[0]
	asm, err := auth.GetAuthServerMetadata(ctx, issuer, nil)
	if err != nil || asm == nil {
		return fmt.Errorf("authorization server metadata: %v", err)
	}
	if asm.Issuer != issuer || !slices.Contains(asm.CodeChallengeMethodsSupported, "S256") {
		return fmt.Errorf("metadata issuer %q for %q, PKCE %v", asm.Issuer, issuer, asm.CodeChallengeMethodsSupported)
	}
	if f.conf == nil {
		reg, err := oauthex.RegisterClient(ctx, asm.RegistrationEndpoint, &oauthex.ClientRegistrationMetadata{
			RedirectURIs: []string{"http://127.0.0.1:1/callback"}, TokenEndpointAuthMethod: f.method,
			GrantTypes: []string{"authorization_code", "refresh_token"}, ClientName: "demomcp test client",
		}, nil)
		if err != nil {
			return err
		}
		style := oauth2.AuthStyleInHeader
		if f.method != "client_secret_basic" {
			style = oauth2.AuthStyleInParams
		}
		f.conf = &oauth2.Config{ClientID: reg.ClientID, ClientSecret: reg.ClientSecret, RedirectURL: "http://127.0.0.1:1/callback",
			Endpoint: oauth2.Endpoint{AuthURL: asm.AuthorizationEndpoint, TokenURL: asm.TokenEndpoint, AuthStyle: style}}
	}
	for _, s := range strings.Fields(bearer["scope"]) {
		if !slices.Contains(f.scopes, s) {
			f.scopes = append(f.scopes, s)
		}
	}
	conf := *f.conf
	conf.Scopes = f.scopes
	verifier, state := oauth2.GenerateVerifier(), randomString()
	resource := oauth2.SetAuthURLParam("resource", prm.Resource)
	q, err := approve(ctx, conf.AuthCodeURL(state, oauth2.S256ChallengeOption(verifier), resource), f.account)
	if err != nil {
		return err
	}
	if q.Get("state") != state || q.Get("iss") != asm.Issuer || q.Get("code") == "" {
		return fmt.Errorf("authorization response %v", q)
	}
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(verifier), resource)
	if err != nil {
		return err
	}
	f.tok = tok
	return nil
}

func randomString() string {
	b := make([]byte, 16)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func connect(t *testing.T, r rig, era string, flow *codeFlow) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "demomcp-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: r.mcp.URL(), OAuthHandler: flow, DisableStandaloneSSE: true},
		&mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatalf("connect (%s): %v", era, err)
	}
	t.Cleanup(func() { cs.Close() })
	if got := cs.InitializeResult().ProtocolVersion; got != era {
		t.Fatalf("negotiated %s, want %s", got, era)
	}
	return cs
}

func structured[T any](t *testing.T, res *mcp.CallToolResult) T {
	t.Helper()
	var out T
	if res.IsError {
		t.Fatalf("tool error: %+v", res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return out
}

// TestClientFlowBothEras: a go-sdk client with the hand-written code flow
// discovers everything from the first 401, registers, authorizes with
// PKCE and the resource, lists and calls the tools over both eras (with
// the two pieces on one server, as `broker dev` mounts them, and on two),
// and steps up on 403 insufficient_scope to the union of scopes.
func TestClientFlowBothEras(t *testing.T) {
	for _, split := range []bool{false, true} {
		for _, era := range []string{"2026-07-28", "2025-11-25"} {
			t.Run(fmt.Sprintf("%s/split=%v", era, split), func(t *testing.T) {
				r := start(t, split)
				ctx := context.Background()
				flow := &codeFlow{resource: r.mcp.URL(), account: "1001", method: "client_secret_basic"}
				cs := connect(t, r, era, flow)

				tools, err := cs.ListTools(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				var names []string
				for _, tl := range tools.Tools {
					names = append(names, tl.Name)
				}
				slices.Sort(names)
				if !slices.Equal(names, []string{"add_note", "echo", "list_notes"}) {
					t.Fatalf("tools %v", names)
				}

				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"msg": "hello", "n": 2}})
				if err != nil {
					t.Fatal(err)
				}
				echo := structured[demomcp.EchoResult](t, res)
				if echo.Arguments["msg"] != "hello" || echo.Arguments["n"] != float64(2) || echo.Account != "alice-demo" ||
					echo.Authorization != "withheld" || !slices.Equal(echo.Scopes, []string{demomcp.ScopeRead}) {
					t.Fatalf("echo %+v", echo)
				}
				if _, ok := echo.Headers["Authorization"]; ok {
					t.Fatal("echo showed the Authorization header")
				}
				if got := echo.Headers["Mcp-Protocol-Version"]; !slices.Equal(got, []string{era}) {
					t.Fatalf("MCP-Protocol-Version %v", got)
				}
				if era == "2026-07-28" && (!slices.Equal(echo.Headers["Mcp-Method"], []string{"tools/call"}) || !slices.Equal(echo.Headers["Mcp-Name"], []string{"echo"})) {
					t.Fatalf("headers %v", echo.Headers)
				}
				tok := flow.token()
				raw, _ := json.Marshal(res)
				if strings.Contains(string(raw), tok.AccessToken) {
					t.Fatal("the token is in the result")
				}
				// What the server received, to the test only: the upstream token.
				reqs := r.mcp.Requests()
				last := reqs[len(reqs)-1]
				if last.Tool != "echo" || last.AuthScheme != "Bearer" || last.Token != demoprovider.Fingerprint(tok.AccessToken) || last.Status != 200 {
					t.Fatalf("last request %+v", last)
				}
				if reqs[0].Outcome != "missing_token" || reqs[0].Status != http.StatusUnauthorized {
					t.Fatalf("first request %+v", reqs[0])
				}
				if era == "2025-11-25" && !slices.ContainsFunc(reqs, func(q demomcp.Request) bool { return q.Method == "initialize" && q.Outcome == "ok" }) {
					t.Fatalf("no initialize in %+v", reqs)
				}

				if res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_notes", Arguments: map[string]any{}}); err != nil {
					t.Fatal(err)
				}
				if n := structured[demomcp.Notes](t, res); n.Account != "alice-demo" || len(n.Notes) != 0 {
					t.Fatalf("notes %+v", n)
				}
				// add_note needs notes:write: 403, a second authorization
				// for both scopes, and the retried call works.
				res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "add_note", Arguments: map[string]any{"text": "buy milk"}})
				if err != nil {
					t.Fatal(err)
				}
				if n := structured[demomcp.Notes](t, res); !slices.Equal(n.Notes, []string{"buy milk"}) {
					t.Fatalf("notes %+v", n)
				}
				if !slices.Equal(flow.flows, []string{"401", "403 notes:write"}) {
					t.Fatalf("authorizations %v", flow.flows)
				}
				in, ok := r.as.Introspect(flow.token().AccessToken)
				if !ok || !slices.Equal(in.Scopes, []string{demomcp.ScopeRead, demomcp.ScopeWrite}) || in.Resource != r.mcp.URL() {
					t.Fatalf("stepped-up token %+v", in)
				}
				// The resource went on every leg.
				for _, ev := range r.as.Events() {
					if (ev.Kind == "authorize" || ev.Kind == "token") && ev.Resource != r.mcp.URL() {
						t.Fatalf("a %s request without the resource: %+v", ev.Kind, ev)
					}
				}
			})
		}
	}
}

// post sends one JSON-RPC request to the MCP endpoint as a 2026-07-28
// client would, with the Authorization header auth ("" none) and extra
// headers.
func post(t testing.TB, r rig, authz, method string, params any, header ...string) (*http.Response, []byte) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, r.mcp.URL(), strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func meta() map[string]any {
	return map[string]any{"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}
}

func callParams(tool string, args map[string]any) map[string]any {
	return map[string]any{"name": tool, "arguments": args, "_meta": meta()}
}

// demoToken runs the code flow by hand for the static client (confidential,
// registered with the provider) with scopes and resource ("" none).
func demoToken(t testing.TB, r rig, resource string, scopes ...string) *oauth2.Token {
	t.Helper()
	base := strings.TrimSuffix(r.as.AuthURL(), "/authorize")
	u, _ := url.Parse(base)
	conf := oauth2.Config{ClientID: "credbroker-demo", ClientSecret: "demo-secret", RedirectURL: u.Scheme + "://" + u.Host + "/oauth/demo/callback",
		Scopes: scopes, Endpoint: oauth2.Endpoint{AuthURL: r.as.AuthURL(), TokenURL: r.as.TokenURL(), AuthStyle: oauth2.AuthStyleInHeader}}
	v := oauth2.GenerateVerifier()
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(v)}
	if resource != "" {
		opts = append(opts, oauth2.SetAuthURLParam("resource", resource))
	}
	q, err := approve(context.Background(), conf.AuthCodeURL("s", opts...), "1002")
	if err != nil || q.Get("code") == "" {
		t.Fatalf("authorize: %v %v", q, err)
	}
	tok, err := conf.Exchange(context.Background(), q.Get("code"), oauth2.VerifierOption(v))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// bearerChallenge reads the Bearer challenge's parameters.
func bearerChallenge(t *testing.T, h http.Header) map[string]string {
	t.Helper()
	cs, err := oauthex.ParseWWWAuthenticate(h.Values("WWW-Authenticate"))
	if err != nil || len(cs) != 1 || cs[0].Scheme != "bearer" {
		t.Fatalf("challenge %q: %v", h.Values("WWW-Authenticate"), err)
	}
	return cs[0].Params
}

// TestTokensBoundToThisResource: only a live access token whose resource
// is this server's URL gets in; every other answer is a 401 challenge
// naming the metadata, which names this URL exactly.
func TestTokensBoundToThisResource(t *testing.T) {
	r := start(t, true)
	good := demoToken(t, r, r.mcp.URL())
	tests := []struct {
		name, authz, outcome, wantErr string
	}{
		{"no token", "", "missing_token", ""},
		{"another scheme", "Basic " + base64.StdEncoding.EncodeToString([]byte("a:b")), "missing_token", ""},
		{"unknown token", "Bearer made-up", "invalid_token", "invalid_token"},
		{"a refresh token", "Bearer " + good.RefreshToken, "invalid_token", "invalid_token"},
		{"the demo API's token (no resource)", "Bearer " + demoToken(t, r, "").AccessToken, "wrong_resource", "invalid_token"},
		{"another resource's token", "Bearer " + demoToken(t, r, r.other).AccessToken, "wrong_resource", "invalid_token"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, r, tc.authz, "tools/list", map[string]any{"_meta": meta()})
			if resp.StatusCode != http.StatusUnauthorized {
				t.Fatalf("HTTP %d %s", resp.StatusCode, body)
			}
			ch := bearerChallenge(t, resp.Header)
			if ch["resource_metadata"] != r.mcp.MetadataURL() || ch["error"] != tc.wantErr || ch["scope"] != demomcp.ScopeRead {
				t.Fatalf("challenge %v", ch)
			}
			reqs := r.mcp.Requests()
			if last := reqs[len(reqs)-1]; last.Outcome != tc.outcome || last.Account != "" {
				t.Fatalf("recorded %+v", last)
			}
		})
	}
	// The metadata names this URL exactly, as the go-sdk's client checks.
	prm, err := oauthex.GetProtectedResourceMetadata(context.Background(), r.mcp.MetadataURL(), r.mcp.URL(), nil)
	if err != nil || !slices.Equal(prm.AuthorizationServers, []string{r.as.Issuer()}) ||
		!slices.Equal(prm.ScopesSupported, []string{demomcp.ScopeRead, demomcp.ScopeWrite}) {
		t.Fatalf("metadata %+v, %v", prm, err)
	}
	// The right token works, until it is revoked.
	if resp, body := post(t, r, "Bearer "+good.AccessToken, "tools/list", map[string]any{"_meta": meta()}); resp.StatusCode != 200 || !strings.Contains(string(body), `"echo"`) {
		t.Fatalf("HTTP %d %s", resp.StatusCode, body)
	}
	req, _ := http.NewRequest(http.MethodPost, r.as.RevokeURL(), strings.NewReader(url.Values{"token": {good.AccessToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("credbroker-demo", "demo-secret")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Fatalf("revoke: %v", err)
	}
	if resp, _ := post(t, r, "Bearer "+good.AccessToken, "tools/list", map[string]any{"_meta": meta()}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("revoked token: HTTP %d", resp.StatusCode)
	}
}

// TestInvalidTarget: the authorization server refuses a token request
// whose resource is not the grant's (a client confusing two upstreams),
// and binds the token to the grant's resource otherwise.
func TestInvalidTarget(t *testing.T) {
	r := start(t, false)
	ctx := context.Background()
	reg, err := oauthex.RegisterClient(ctx, r.as.RegisterURL(), &oauthex.ClientRegistrationMetadata{
		RedirectURIs: []string{"http://127.0.0.1:1/callback"}, TokenEndpointAuthMethod: "none", GrantTypes: []string{"authorization_code", "refresh_token"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	conf := oauth2.Config{ClientID: reg.ClientID, RedirectURL: "http://127.0.0.1:1/callback",
		Endpoint: oauth2.Endpoint{AuthURL: r.as.AuthURL(), TokenURL: r.as.TokenURL(), AuthStyle: oauth2.AuthStyleInParams}}
	v := oauth2.GenerateVerifier()
	q, err := approve(ctx, conf.AuthCodeURL("s", oauth2.S256ChallengeOption(v), oauth2.SetAuthURLParam("resource", r.mcp.URL())), "1001")
	if err != nil {
		t.Fatal(err)
	}
	_, err = conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v), oauth2.SetAuthURLParam("resource", r.other))
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "invalid_target" {
		t.Fatalf("code for %s redeemed for %s: %v", r.mcp.URL(), r.other, err)
	}
	q, _ = approve(ctx, conf.AuthCodeURL("s", oauth2.S256ChallengeOption(v), oauth2.SetAuthURLParam("resource", r.other)), "1001")
	tok, err := conf.Exchange(ctx, q.Get("code"), oauth2.VerifierOption(v), oauth2.SetAuthURLParam("resource", r.other))
	if err != nil {
		t.Fatal(err)
	}
	// A token for the other resource does not open this one.
	if resp, _ := post(t, r, "Bearer "+tok.AccessToken, "tools/list", map[string]any{"_meta": meta()}); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("HTTP %d", resp.StatusCode)
	}
}

// TestInsufficientScope: a tools/call of a tool whose scope the token
// lacks gets 403 insufficient_scope naming that scope; other tools work.
func TestInsufficientScope(t *testing.T) {
	r := start(t, false)
	none := demoToken(t, r, r.mcp.URL())
	read := demoToken(t, r, r.mcp.URL(), demomcp.ScopeRead)
	both := demoToken(t, r, r.mcp.URL(), demomcp.ScopeRead, demomcp.ScopeWrite)
	tests := []struct {
		tok   *oauth2.Token
		tool  string
		scope string // "" = allowed
	}{
		{none, "echo", ""}, {none, "list_notes", demomcp.ScopeRead}, {none, "add_note", demomcp.ScopeWrite},
		{read, "list_notes", ""}, {read, "add_note", demomcp.ScopeWrite},
		{both, "add_note", ""},
	}
	for _, tc := range tests {
		args := map[string]any{}
		if tc.tool == "add_note" {
			args["text"] = "a note"
		}
		resp, body := post(t, r, "Bearer "+tc.tok.AccessToken, "tools/call", callParams(tc.tool, args), "Mcp-Name", tc.tool)
		if tc.scope == "" {
			if resp.StatusCode != 200 || strings.Contains(string(body), `"isError":true`) {
				t.Fatalf("%s: HTTP %d %s", tc.tool, resp.StatusCode, body)
			}
			continue
		}
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s without %s: HTTP %d %s", tc.tool, tc.scope, resp.StatusCode, body)
		}
		ch := bearerChallenge(t, resp.Header)
		if ch["error"] != "insufficient_scope" || ch["scope"] != tc.scope || ch["resource_metadata"] != r.mcp.MetadataURL() {
			t.Fatalf("challenge %v", ch)
		}
	}
	// Listing needs no scope beyond the token.
	if resp, body := post(t, r, "Bearer "+none.AccessToken, "tools/list", map[string]any{"_meta": meta()}); resp.StatusCode != 200 {
		t.Fatalf("tools/list: HTTP %d %s", resp.StatusCode, body)
	}
}

// TestEchoWithholdsAuthorization: echo shows every header it received but
// Authorization, and no byte of its answer holds the token; the test sees
// the credential through Requests.
func TestEchoWithholdsAuthorization(t *testing.T) {
	r := start(t, false)
	tok := demoToken(t, r, r.mcp.URL())
	resp, body := post(t, r, "Bearer "+tok.AccessToken, "tools/call", callParams("echo", map[string]any{"x": "y"}),
		"Cookie", "session=host-cookie", "X-Forwarded-Authorization", "Bearer host-token", "Mcp-Name", "echo")
	if resp.StatusCode != 200 {
		t.Fatalf("HTTP %d %s", resp.StatusCode, body)
	}
	var rpc struct {
		Result mcp.CallToolResult `json:"result"`
	}
	if err := json.Unmarshal(body, &rpc); err != nil {
		t.Fatal(err)
	}
	echo := structured[demomcp.EchoResult](t, &rpc.Result)
	if !slices.Equal(echo.Headers["Cookie"], []string{"session=host-cookie"}) || !slices.Equal(echo.Headers["X-Forwarded-Authorization"], []string{"Bearer host-token"}) {
		t.Fatalf("headers %v", echo.Headers)
	}
	if _, ok := echo.Headers["Authorization"]; ok || echo.Authorization != "withheld" || echo.Meta["io.modelcontextprotocol/protocolVersion"] != "2026-07-28" {
		t.Fatalf("echo %+v", echo)
	}
	for _, secret := range []string{tok.AccessToken, base64.StdEncoding.EncodeToString([]byte(tok.AccessToken)), fmt.Sprintf("%x", tok.AccessToken)} {
		if strings.Contains(string(body), secret) {
			t.Fatal("the answer holds the token")
		}
	}
	reqs := r.mcp.Requests()
	if last := reqs[len(reqs)-1]; last.Token != demoprovider.Fingerprint(tok.AccessToken) || last.AuthScheme != "Bearer" || last.Account != "bob-demo" {
		t.Fatalf("recorded %+v", last)
	}
	for _, q := range reqs {
		if strings.Contains(fmt.Sprint(q), tok.AccessToken) {
			t.Fatal("the request log holds the token")
		}
	}
}

func TestRefusedBodies(t *testing.T) {
	r := start(t, false)
	tok := demoToken(t, r, r.mcp.URL())
	req, _ := http.NewRequest(http.MethodPost, r.mcp.URL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"`+strings.Repeat("a", 2<<20)+`"}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("2 MiB body: HTTP %d", resp.StatusCode)
	}
	// Malformed JSON is the go-sdk's to refuse (after the token).
	if resp, body := post(t, r, "Bearer "+tok.AccessToken, "tools/call", "not an object"); resp.StatusCode < 400 && !strings.Contains(string(body), `"error"`) {
		t.Fatalf("HTTP %d %s", resp.StatusCode, body)
	}
	// A body the scope check and the go-sdk could read two ways is refused.
	for _, b := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note","NAME":"echo"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","name":"add_note"}}`,
		`{"jsonrpc":"2.0","id":1,"Method":"tools/list","method":"tools/call","params":{"name":"add_note"}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"param\u017f\":{}}",
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note"}}]`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list"} {"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	} {
		req, _ := http.NewRequest(http.MethodPost, r.mcp.URL(), strings.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		reqs := r.mcp.Requests()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), `"code":-32600`) || reqs[len(reqs)-1].Outcome != "bad_body" {
			t.Fatalf("%s: HTTP %d %s", b, resp.StatusCode, body)
		}
	}
	// A note too long is a tool error.
	both := demoToken(t, r, r.mcp.URL(), demomcp.ScopeWrite)
	_, body := post(t, r, "Bearer "+both.AccessToken, "tools/call", callParams("add_note", map[string]any{"text": strings.Repeat("n", 501)}), "Mcp-Name", "add_note")
	if !strings.Contains(string(body), `"isError":true`) {
		t.Fatalf("long note: %s", body)
	}
}

func TestNewValidation(t *testing.T) {
	as, err := demoprovider.New(demoprovider.Options{BaseURL: "http://127.0.0.1:1/p", ClientID: "c", RedirectURIs: []string{"http://127.0.0.1:1/cb"},
		Resources: []string{"http://127.0.0.1:1/mcp"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []demomcp.Options{
		{URL: "http://127.0.0.1:1/mcp"},
		{URL: "http://127.0.0.1:1/other", AuthServer: as},
		{URL: "http://127.0.0.1:1", AuthServer: as},
		{URL: "http://127.0.0.1:1/mcp/", AuthServer: as},
		{URL: "http://127.0.0.1:1/mcp?x=1", AuthServer: as},
		{URL: "/mcp", AuthServer: as},
	} {
		if _, err := demomcp.New(tc); err == nil {
			t.Errorf("%+v accepted", tc)
		}
	}
	if _, err := demomcp.New(demomcp.Options{URL: "http://127.0.0.1:1/mcp", AuthServer: as}); err != nil {
		t.Fatal(err)
	}
}

// FuzzRequestBody: whatever the body and protocol version, with a token
// holding notes:read only, add_note never adds a note, the server never
// answers 5xx, and a tool the go-sdk ran is the one the scope check read
// (no body is read one way by the check and another by the go-sdk).
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note","arguments":{"text":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","Name":"add_note","arguments":{"text":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note","NAME":"echo","arguments":{"text":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note","name":"echo","arguments":{"text":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"METHOD":"ping","method":"tools/call","params":{"name":"add_note","arguments":{"text":"x"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"n\u0061me":"add_note","arguments":{"text":"x"}}}`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add_note","arguments":{"text":"x"}}}]`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(1))
		f.Add([]byte(s), uint8(2))
	}
	r := start(f, false)
	tok := demoToken(f, r, r.mcp.URL(), demomcp.ScopeRead)
	versions := []string{"2026-07-28", "2025-11-25", "2025-03-26", ""}
	f.Fuzz(func(t *testing.T, body []byte, sel uint8) {
		req, _ := http.NewRequest(http.MethodPost, r.mcp.URL(), strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
		if v := versions[int(sel)%len(versions)]; v != "" {
			req.Header.Set("Mcp-Protocol-Version", v)
		}
		if sel&4 != 0 {
			req.Header.Set("Mcp-Method", "tools/call")
			req.Header.Set("Mcp-Name", "add_note")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			t.Fatalf("HTTP %d", resp.StatusCode)
		}
		reqs := r.mcp.Requests()
		if last := reqs[len(reqs)-1]; last.Ran != "" && (last.Ran != last.Tool || last.Method != "tools/call") {
			t.Fatalf("the go-sdk ran %q, the scope check read %q %q", last.Ran, last.Method, last.Tool)
		}
		_, notes := post(t, r, "Bearer "+tok.AccessToken, "tools/call", callParams("list_notes", map[string]any{}), "Mcp-Name", "list_notes")
		if !strings.Contains(string(notes), `"notes":[]`) {
			t.Fatalf("notes after %q: %s", body, notes)
		}
	})
}
