package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/telemetry"
	"credbroker/internal/testskip"
)

// oidcMCP is an upstream MCP server of TestGatewayOIDCProvider: a go-sdk
// server (stateless, both eras) behind auth.RequireBearerToken, whose
// verifier asks its authorization server (oidc-provider) to introspect the
// token and accepts it only when active and issued for exactly this
// server's URL (the audience of a resource-bound token). add_note needs the
// scope mcp:write: without it the server answers 403 with an RFC 6750
// insufficient_scope challenge naming mcp:read and mcp:write (the go-sdk's
// own scope check answers 403 without saying which, so the server checks
// this one itself).
type oidcMCP struct {
	path, url   string
	metadataURL string
	// as is the authorization server, known once it runs.
	as atomic.Pointer[oidcAS]
	// refused counts the requests answered 401 with a token.
	refused atomic.Int64

	mu     sync.Mutex // guards tokens
	tokens []string   // every access token it was sent
}

// seenTokens are the access tokens the server was sent.
func (u *oidcMCP) seenTokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.tokens)
}

// oidcAS is what a resource server knows of its authorization server.
type oidcAS struct {
	issuer, introspection string
	clientID, secret      string
}

const (
	oidcScopeRead  = "mcp:read"
	oidcScopeWrite = "mcp:write"
)

// startOIDCMCP serves one oidcMCP per path on one loopback server.
func startOIDCMCP(t *testing.T, paths ...string) map[string]*oidcMCP {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	out := map[string]*oidcMCP{}
	for _, p := range paths {
		u := &oidcMCP{path: p, url: srv.URL + p, metadataURL: srv.URL + "/.well-known/oauth-protected-resource" + p}
		out[p] = u
		mux.HandleFunc("GET /.well-known/oauth-protected-resource"+p, func(w http.ResponseWriter, r *http.Request) {
			auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
				Resource: u.url, AuthorizationServers: []string{u.as.Load().issuer},
				ScopesSupported: []string{oidcScopeRead, oidcScopeWrite}, BearerMethodsSupported: []string{"header"},
			}).ServeHTTP(w, r)
		})
		server := mcp.NewServer(&mcp.Implementation{Name: "oidc-notes", Version: "1"}, nil)
		server.AddTool(&mcp.Tool{Name: "whoami", Description: "The token's account, client and scopes.", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				ti := req.Extra.TokenInfo
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("account=%s client=%v scopes=%s",
					ti.UserID, ti.Extra["client_id"], strings.Join(ti.Scopes, " "))}}}, nil
			})
		server.AddTool(&mcp.Tool{Name: "add_note", Description: "Adds a note (needs mcp:write).", InputSchema: json.RawMessage(`{"type":"object"}`)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				if !slices.Contains(req.Extra.TokenInfo.Scopes, oidcScopeWrite) {
					return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no mcp:write"}}}, nil
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "noted for " + req.Extra.TokenInfo.UserID}}}, nil
			})
		handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
			&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
		bearer := auth.RequireBearerToken(u.verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: u.metadataURL, Scopes: []string{oidcScopeRead}})
		mux.Handle(p, u.countRefusals(bearer(u.needWrite(handler))))
	}
	return out
}

// verify introspects token at the authorization server.
func (u *oidcMCP) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	u.mu.Lock()
	if !slices.Contains(u.tokens, token) {
		u.tokens = append(u.tokens, token)
	}
	u.mu.Unlock()
	as := u.as.Load()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, as.introspection, strings.NewReader(url.Values{"token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(as.clientID, as.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var in struct {
		Active   bool   `json:"active"`
		Scope    string `json:"scope"`
		Aud      any    `json:"aud"`
		Exp      int64  `json:"exp"`
		Sub      string `json:"sub"`
		ClientID string `json:"client_id"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&in) != nil {
		return nil, fmt.Errorf("introspection answered HTTP %d", resp.StatusCode)
	}
	if !in.Active {
		return nil, fmt.Errorf("%w: inactive", auth.ErrInvalidToken)
	}
	if !slices.Contains(audiences(in.Aud), u.url) {
		return nil, fmt.Errorf("%w: issued for %v, not %s", auth.ErrInvalidToken, in.Aud, u.url)
	}
	return &auth.TokenInfo{Scopes: strings.Fields(in.Scope), Expiration: time.Unix(in.Exp, 0), UserID: in.Sub,
		Extra: map[string]any{"client_id": in.ClientID}}, nil
}

func audiences(aud any) []string {
	switch a := aud.(type) {
	case string:
		return []string{a}
	case []any:
		var out []string
		for _, v := range a {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// needWrite sends a tools/call of add_note through the go-sdk's own
// bearer check with Scopes mcp:read and mcp:write: a token without
// mcp:write gets its 403, a Bearer challenge naming both scopes (and no
// error parameter), which the broker steps up on.
func (u *oidcMCP) needWrite(next http.Handler) http.Handler {
	write := auth.RequireBearerToken(u.verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: u.metadataURL,
		Scopes: []string{oidcScopeRead, oidcScopeWrite}})(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		if msg.Method == "tools/call" && msg.Params.Name == "add_note" {
			write.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// countRefusals counts the 401s answered to requests that carried a token.
func (u *oidcMCP) countRefusals(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &telemetry.StatusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.Status == http.StatusUnauthorized && r.Header.Get("Authorization") != "" {
			u.refused.Add(1)
		}
	})
}

// asEvent is one line as.mjs prints.
type asEvent struct {
	Event     string `json:"event"`
	AS        string `json:"as"`
	Issuer    string `json:"issuer"`
	Route     string `json:"route"`
	Status    int    `json:"status"`
	ClientID  string `json:"client_id"`
	GrantType string `json:"grant_type"`
	Resource  any    `json:"resource"`
	Scope     string `json:"scope"`
	Prompt    string `json:"prompt"`
	// RefreshToken: a token answer carried a refresh token.
	RefreshToken bool   `json:"refresh_token"`
	URL          string `json:"url"`
	Removed      int    `json:"removed"`
}

func (e asEvent) String() string {
	b, _ := json.Marshal(e)
	return string(b)
}

// asEvents are the authorization servers' events so far.
func asEvents(p *nodeProc) []asEvent { return jsonLines[asEvent](p.stdout.String()) }

// asEventsSince returns the authorization servers' events from mark on,
// once cond holds for them (waiting at most 30 s: see logsWhen).
func asEventsSince(p *nodeProc, mark int, cond func([]asEvent) bool) []asEvent {
	text := logsWhen(&p.stdout, p.exited, func(text string) bool { return cond(jsonLines[asEvent](text)[mark:]) })
	return jsonLines[asEvent](text)[mark:]
}

// filterAS returns the events that match keep.
func filterAS(events []asEvent, keep func(asEvent) bool) []asEvent {
	var out []asEvent
	for _, e := range events {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// asControl posts one of as.mjs's test controls and returns how many
// records it removed.
func asControl(t *testing.T, issuer, op, clientID string) int {
	t.Helper()
	resp, err := http.Post(issuer+"/test/"+op+"?"+url.Values{"client_id": {clientID}}.Encode(), "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Removed int }
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
		t.Fatalf("%s: HTTP %d", op, resp.StatusCode)
	}
	return out.Removed
}

const oidcProvidersYAML = `providers:
  oidc-static:
    display_name: Notes (static client)
    type: mcp
    mcp:
      url: {{A}}
      registration: auto
    client_id: credbroker-static
    client_secret: ${OIDC_STATIC_SECRET}
    default_scopes: [mcp:read]
  oidc-cimd:
    display_name: Notes (metadata document)
    type: mcp
    mcp:
      url: {{A}}
      registration: auto
    default_scopes: [mcp:read]
  oidc-dcr:
    display_name: Notes (dynamic registration)
    type: mcp
    mcp:
      url: {{B}}
      registration: auto
    default_scopes: [mcp:read]
`

// TestGatewayOIDCProvider runs the gateway against oidc-provider (pinned in
// testdata/oidcprovider) as the upstream MCP servers' authorization
// server, through `broker serve`: server A's authorization server has a
// client registered for the broker, supports Client ID Metadata Documents
// (fetched from the broker over https, trusted through NODE_EXTRA_CA_CERTS)
// and dynamic registration; server B's supports dynamic registration only.
// Three entries with registration: auto therefore become the broker's
// pre-registered client at A, its metadata document at A, and a client it
// registered at B, in the specification's order. Each is connected by a
// person through the link (the dev IdP, the broker's consent, oidc-provider's
// login and consent) and then relays calls. The authorization servers see
// resource on the authorization request, the code exchange and the
// refresh; 50 concurrent calls after the access token was withdrawn cause
// one refresh; a revoked grant asks the person to connect again; a 403
// insufficient_scope opens a connect request for the union of the scopes.
func TestGatewayOIDCProvider(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	node, dir := gwPeer(t, "oidcprovider", "oidc-provider", "as.mjs")
	ctx := testContext(t, 3*time.Minute)
	s := newGWStack(t)
	ups := startOIDCMCP(t, "/a/mcp", "/b/mcp")
	a, b := ups["/a/mcp"], ups["/b/mcp"]

	// The authorization servers, trusting the balancer's certificate (the
	// broker's metadata document is behind it).
	ca := filepath.Join(s.dir, "balancer.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.lb.srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	const staticSecret, rsSecret = "oidc-static-client-secret-4e1d", "resource-server-secret-8c2b"
	client := func(p string) map[string]any {
		return map[string]any{"client_id": "credbroker-static", "client_secret": staticSecret,
			"redirect_uris": []string{s.public() + "/oauth/" + p + "/callback"}, "grant_types": []string{"authorization_code", "refresh_token"},
			"response_types": []string{"code"}, "token_endpoint_auth_method": "client_secret_basic"}
	}
	cfg, _ := json.Marshal(map[string]any{
		"servers": []map[string]any{
			{"name": "a", "cimd": true, "resources": []string{a.url}, "scope": oidcScopeRead + " " + oidcScopeWrite, "clients": []any{client("oidc-static")}},
			{"name": "b", "cimd": false, "resources": []string{b.url}, "scope": oidcScopeRead + " " + oidcScopeWrite, "clients": []any{}},
		},
		"introspector": map[string]string{"client_id": "mcp-rs", "client_secret": rsSecret},
	})
	as := startNode(t, node, dir, []string{"NODE_EXTRA_CA_CERTS=" + ca}, "as.mjs", string(cfg))
	as.wait(`"event":"listening","as":"b"`)
	issuer := map[string]string{}
	for _, e := range filterAS(asEvents(as), func(e asEvent) bool { return e.Event == "listening" }) {
		issuer[e.AS] = e.Issuer
	}
	a.as.Store(&oidcAS{issuer: issuer["a"], introspection: issuer["a"] + "/token/introspection", clientID: "mcp-rs", secret: rsSecret})
	b.as.Store(&oidcAS{issuer: issuer["b"], introspection: issuer["b"] + "/token/introspection", clientID: "mcp-rs", secret: rsSecret})
	providers := strings.NewReplacer("{{A}}", a.url, "{{B}}", b.url).Replace(oidcProvidersYAML)
	s.start(providers, "OIDC_STATIC_SECRET="+staticSecret)
	cimdURL := s.public() + "/oauth/client-metadata.json"
	fail := func(t *testing.T, format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nauthorization servers:\n%s\n%s\nbroker log:\n%s", append(args, as.stdout.String(), as.stderr.String(), s.proc.logs.String())...)
	}

	t.Run("upstreams check picks the registration in the specification's order", func(t *testing.T) {
		out, errOut, err := runBroker(t, append(s.env, "BROKER_PROVIDERS="), "upstreams", "check", "--providers", filepath.Join(s.dir, "providers.yaml"),
			"--public-url", s.public(), "--upstream-allow-private")
		if err != nil {
			t.Fatalf("upstreams check: %v\n%s%s", err, out, errOut)
		}
		for p, want := range map[string][]string{"oidc-static": {issuer["a"], "static"}, "oidc-cimd": {issuer["a"], "cimd"}, "oidc-dcr": {issuer["b"], "dcr"}} {
			line := grepLines(out, p+" ")
			if f := strings.Fields(line); len(f) < 4 || f[2] != want[0] || f[3] != want[1] {
				t.Errorf("upstreams check says for %s %q, want issuer %s and registration %s:\n%s", p, line, want[0], want[1], out)
			}
		}
		if n := len(filterAS(asEvents(as), func(e asEvent) bool { return e.Route == "registration" })); n != 0 {
			t.Errorf("upstreams check registered %d clients; it must register nothing", n)
		}
	})

	// alice's browser: one sign-in at the IdP and at each authorization
	// server for all three connections.
	br := s.browser()
	var consentMu sync.Mutex
	var lastConsent string
	connect := func(ctx context.Context, link string) error {
		consent, err := br.connect(ctx, link, "alice")
		consentMu.Lock()
		lastConsent = consent
		consentMu.Unlock()
		return err
	}
	hosts := map[string]*gwHost{}
	clients := map[string]string{}
	for _, c := range []struct{ provider, as, method string }{
		{"oidc-static", "a", "static"}, {"oidc-cimd", "a", "cimd"}, {"oidc-dcr", "b", "dcr"},
	} {
		t.Run("connect through "+c.method, func(t *testing.T) {
			h := s.host(t, ctx, "alice", c.provider, connect)
			hosts[c.provider] = h
			if got := h.tools(t, ctx); !slices.Equal(got, []string{"connect_account"}) {
				t.Fatalf("tools before connecting: %v", got)
			}
			mark := len(asEvents(as))
			text := h.call(t, ctx, "whoami", nil)
			if h.asked() != 1 {
				fail(t, "whoami asked %d times to connect, want once", h.asked())
			}
			isAuth := func(e asEvent) bool { return e.AS == c.as && e.Route == "authorization" && e.ClientID != "" }
			// The connect's requests at the authorization server: the
			// registration or the metadata document's fetch, the
			// authorization, the code exchange.
			ev := asEventsSince(as, mark, func(ev []asEvent) bool {
				auths := filterAS(ev, isAuth)
				if len(auths) == 0 {
					return false
				}
				switch c.method {
				case "cimd":
					if !slices.ContainsFunc(ev, func(e asEvent) bool { return e.Event == "fetch" && e.URL == cimdURL && e.Status == 200 }) {
						return false
					}
				case "dcr":
					if !slices.ContainsFunc(ev, func(e asEvent) bool { return e.Route == "registration" }) {
						return false
					}
				}
				return slices.ContainsFunc(ev, func(e asEvent) bool {
					return e.Route == "token" && e.GrantType == "authorization_code" && e.ClientID == auths[0].ClientID && e.Status == 200
				})
			})
			auths := filterAS(ev, isAuth)
			if len(auths) == 0 {
				fail(t, "%s saw no authorization request: %v", c.as, ev)
			}
			id := auths[0].ClientID
			clients[c.provider] = id
			switch c.method {
			case "static":
				if id != "credbroker-static" {
					fail(t, "the broker used client %q, want its pre-registered credbroker-static", id)
				}
			case "cimd":
				if id != cimdURL {
					fail(t, "the broker used client %q, want its metadata document %s", id, cimdURL)
				}
				if f := filterAS(ev, func(e asEvent) bool { return e.Event == "fetch" && e.URL == cimdURL && e.Status == 200 }); len(f) == 0 {
					fail(t, "the authorization server never fetched %s over https: %v", cimdURL, ev)
				}
			case "dcr":
				regs := filterAS(ev, func(e asEvent) bool { return e.Route == "registration" })
				if len(regs) != 1 || regs[0].AS != "b" || regs[0].Status != http.StatusCreated || id == "credbroker-static" || id == cimdURL {
					fail(t, "dynamic registration: %v; the broker used client %q", regs, id)
				}
			}
			if !strings.Contains(text, "account=alice ") || !strings.Contains(text, "client="+id+" ") || !strings.HasSuffix(text, "scopes="+oidcScopeRead) {
				fail(t, "whoami through %s answered %q", c.provider, text)
			}
			// resource on the authorization request and the code exchange.
			resource := a.url
			if c.as == "b" {
				resource = b.url
			}
			for _, e := range filterAS(ev, func(e asEvent) bool { return e.ClientID == id }) {
				if e.Route == "authorization" || e.Route == "token" {
					if fmt.Sprint(e.Resource) != resource {
						fail(t, "%s request without resource %s: %v", e.Route, resource, e)
					}
				}
			}
			// offline_access (the server offers it), with prompt=consent
			// as OpenID Connect asks: else oidc-provider drops the scope
			// and issues no refresh token.
			if sc := strings.Fields(auths[0].Scope); !slices.Contains(sc, "offline_access") || auths[0].Prompt != "consent" {
				fail(t, "the authorization request asked for %q with prompt %q; want offline_access with prompt=consent", auths[0].Scope, auths[0].Prompt)
			}
			if codes := filterAS(ev, func(e asEvent) bool {
				return e.Route == "token" && e.GrantType == "authorization_code" && e.ClientID == id && e.Status == 200
			}); len(codes) != 1 || !codes[0].RefreshToken {
				fail(t, "code exchanges of client %s: %v; want one, with a refresh token", id, codes)
			}
			if got := h.tools(t, ctx); !slices.Equal(got, []string{"whoami", "add_note"}) && !slices.Equal(got, []string{"add_note", "whoami"}) {
				t.Fatalf("tools once connected: %v", got)
			}
		})
	}
	if t.Failed() {
		t.FailNow()
	}

	t.Run("50 concurrent calls after the access token was withdrawn refresh once, with resource", func(t *testing.T) {
		h, id := hosts["oidc-static"], clients["oidc-static"]
		mark, refused := len(asEvents(as)), a.refused.Load()
		if n := asControl(t, issuer["a"], "expire-access-tokens", id); n == 0 {
			t.Fatal("the authorization server had no access token of the broker's to withdraw")
		}
		const n = 50
		answers := make([]string, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { answers[i], errs[i] = callRetryingBusy(ctx, h, "whoami") })
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || !strings.Contains(answers[i], "account=alice ") {
				fail(t, "call %d: %v %q", i, errs[i], answers[i])
			}
		}
		isRefresh := func(e asEvent) bool { return e.Route == "token" && e.GrantType == "refresh_token" }
		ev := asEventsSince(as, mark, func(ev []asEvent) bool { return slices.ContainsFunc(ev, isRefresh) })
		refreshes := filterAS(ev, isRefresh)
		if len(refreshes) != 1 || refreshes[0].ClientID != id || refreshes[0].Status != 200 || fmt.Sprint(refreshes[0].Resource) != a.url {
			fail(t, "refreshes after the access token was withdrawn: %v; want one of client %s with resource %s", refreshes, id, a.url)
		}
		if a.refused.Load() == refused {
			t.Error("the upstream never refused the withdrawn token: the test did not force a refresh")
		}
		if h.asked() != 1 {
			t.Errorf("the refresh asked the person to connect again (%d elicitations)", h.asked())
		}
	})

	t.Run("a revoked grant asks the person to connect again", func(t *testing.T) {
		h, id := hosts["oidc-dcr"], clients["oidc-dcr"]
		mark := len(asEvents(as))
		if n := asControl(t, issuer["b"], "revoke-grants", id); n == 0 {
			t.Fatal("the authorization server had no grant of the broker's to revoke")
		}
		asked := h.asked()
		text := h.call(t, ctx, "whoami", nil)
		if h.asked() != asked+1 || !strings.Contains(text, "account=alice ") {
			fail(t, "after the revocation: %d elicitations (want %d), whoami %q", h.asked(), asked+1, text)
		}
		isRefused := func(e asEvent) bool {
			return e.Route == "token" && e.GrantType == "refresh_token" && e.ClientID == id && e.Status == http.StatusBadRequest
		}
		isAgain := func(e asEvent) bool { return e.Route == "authorization" && e.ClientID == id }
		ev := asEventsSince(as, mark, func(ev []asEvent) bool {
			return slices.ContainsFunc(ev, isRefused) && slices.ContainsFunc(ev, isAgain)
		})
		refused := filterAS(ev, isRefused)
		again := filterAS(ev, isAgain)
		if len(refused) != 1 || len(again) == 0 {
			fail(t, "after the revocation the broker tried %d refreshes refused (want 1) and %d authorizations: %v", len(refused), len(again), ev)
		}
	})

	t.Run("403 insufficient_scope connects again for the union of the scopes", func(t *testing.T) {
		h, id := hosts["oidc-cimd"], clients["oidc-cimd"]
		mark := len(asEvents(as))
		asked := h.asked()
		text := h.call(t, ctx, "add_note", map[string]any{"text": "hello"})
		if text != "noted for alice" || h.asked() != asked+1 {
			fail(t, "add_note answered %q after %d elicitations, want one", text, h.asked()-asked)
		}
		consentMu.Lock()
		consent := lastConsent
		consentMu.Unlock()
		if !strings.Contains(consent, oidcScopeWrite) {
			t.Errorf("the broker's consent page does not name the added scope %s:\n%s", oidcScopeWrite, consent)
		}
		isAuth := func(e asEvent) bool { return e.Route == "authorization" && e.ClientID == id }
		ev := asEventsSince(as, mark, func(ev []asEvent) bool { return slices.ContainsFunc(ev, isAuth) })
		auths := filterAS(ev, isAuth)
		if len(auths) == 0 {
			fail(t, "no authorization request for the step-up: %v", ev)
		}
		if sc := strings.Fields(auths[0].Scope); !slices.Contains(sc, oidcScopeRead) || !slices.Contains(sc, oidcScopeWrite) || fmt.Sprint(auths[0].Resource) != a.url {
			fail(t, "the step-up asked for %q (resource %v), want both scopes for %s", auths[0].Scope, auths[0].Resource, a.url)
		}
		if who := h.call(t, ctx, "whoami", nil); !strings.HasSuffix(who, "scopes="+oidcScopeRead+" "+oidcScopeWrite) {
			t.Errorf("after the step-up whoami says %q", who)
		}
	})

	s.noLeak(t, append(a.seenTokens(), b.seenTokens()...))
}

// callRetryingBusy calls tool until it is not refused for the per-person
// limit on calls in flight (a tool error with a retry hint), as a host
// does; any other tool error or protocol error is returned.
func callRetryingBusy(ctx context.Context, h *gwHost, tool string) (string, error) {
	for {
		res, err := h.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{}})
		switch {
		case err != nil:
			return "", err
		case !res.IsError:
			return resultText(res), nil
		case !strings.Contains(resultText(res), "Too many calls"):
			return "", fmt.Errorf("tool error: %s", resultText(res))
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
