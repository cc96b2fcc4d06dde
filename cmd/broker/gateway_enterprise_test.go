package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/devidp"
	"credbroker/internal/testskip"
)

// jagUpstream is an upstream MCP server whose authorization server takes
// ID-JAGs and nothing else, on one loopback server: RFC 9728 metadata for
// /mcp; RFC 8414 metadata advertising the JWT bearer grant only; a token
// endpoint that redeems an ID-JAG for client broker-at-hr (Basic) when
// its typ is oauth-id-jag+jwt, its signature checks against the IdP's
// JWKS, iss is the IdP, aud this issuer, resource the server and
// client_id the authenticated client, and it has not expired (the
// draft's checks), issuing a token for the ID-JAG's sub; an authorization
// endpoint that refuses everything; a go-sdk MCP server whose whoami tool
// names the token's person. POST /test/expire forgets every access token
// (the server then answers 401).
type jagUpstream struct {
	t      *testing.T
	srv    *httptest.Server
	base   string
	url    string
	idp    *devidp.IdP
	keys   *oidc.RemoteKeySet
	secret string

	mu      sync.Mutex        // guards the fields below
	tokens  map[string]string // access token → sub
	jags    []map[string]any  // the claims of the ID-JAGs redeemed
	refused []string          // why redemptions were refused
	n       int
}

const jagClientID = "broker-at-hr"

func startJAGUpstream(t *testing.T, idp *devidp.IdP) *jagUpstream {
	t.Helper()
	u := &jagUpstream{t: t, idp: idp, secret: "hr-client-secret", tokens: map[string]string{},
		keys: oidc.NewRemoteKeySet(context.Background(), idp.Issuer()+"/keys")}
	mux := http.NewServeMux()
	u.srv = httptest.NewServer(mux)
	t.Cleanup(u.srv.Close)
	u.base, u.url = u.srv.URL, u.srv.URL+"/mcp"
	metadata := u.srv.URL + "/.well-known/oauth-protected-resource/mcp"
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{Resource: u.url, AuthorizationServers: []string{u.base},
			BearerMethodsSupported: []string{"header"}}).ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"issuer": u.base, "authorization_endpoint": u.base + "/authorize",
			"token_endpoint": u.base + "/token", "response_types_supported": []string{"code"},
			"grant_types_supported":                 []string{"urn:ietf:params:oauth:grant-type:jwt-bearer"},
			"token_endpoint_auth_methods_supported": []string{"client_secret_basic"}, "code_challenge_methods_supported": []string{"S256"}})
	})
	mux.HandleFunc("GET /authorize", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "this authorization server takes ID-JAGs only", http.StatusBadRequest)
	})
	mux.HandleFunc("POST /token", u.token)
	mux.HandleFunc("POST /test/expire", func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		clear(u.tokens)
		u.mu.Unlock()
	})
	server := mcp.NewServer(&mcp.Implementation{Name: "hr", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "whoami", Description: "The person the token is for.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "person=" + req.Extra.TokenInfo.UserID}}}, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		u.mu.Lock()
		defer u.mu.Unlock()
		sub, ok := u.tokens[tok]
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: sub, Expiration: time.Now().Add(time.Hour)}, nil
	}
	mux.Handle("/mcp", auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metadata})(handler))
	return u
}

// token is the JWT bearer grant, ID-JAGs only.
func (u *jagUpstream) token(w http.ResponseWriter, r *http.Request) {
	fail := func(code, why string) {
		u.mu.Lock()
		u.refused = append(u.refused, why)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"error":%q,"error_description":%q}`, code, why)
	}
	id, secret, ok := r.BasicAuth()
	if !ok || id != jagClientID || secret != u.secret {
		fail("invalid_client", "client authentication")
		return
	}
	if r.ParseForm() != nil || r.PostForm.Get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer" {
		fail("unsupported_grant_type", "ID-JAGs only")
		return
	}
	raw := r.PostForm.Get("assertion")
	jws, err := jose.ParseSignedCompact(raw, []jose.SignatureAlgorithm{jose.RS256, jose.ES256})
	if err != nil {
		fail("invalid_grant", "not a JWS")
		return
	}
	if typ, _ := jws.Signatures[0].Protected.ExtraHeaders["typ"].(string); typ != "oauth-id-jag+jwt" {
		fail("invalid_grant", "typ")
		return
	}
	payload, err := u.keys.VerifySignature(r.Context(), raw)
	if err != nil {
		fail("invalid_grant", "signature")
		return
	}
	var c map[string]any
	if json.Unmarshal(payload, &c) != nil {
		fail("invalid_grant", "claims")
		return
	}
	exp, _ := c["exp"].(float64)
	sub, _ := c["sub"].(string)
	switch {
	case c["iss"] != u.idp.Issuer():
		fail("invalid_grant", "iss")
	case c["aud"] != u.base:
		fail("invalid_grant", "aud")
	case c["resource"] != u.url:
		fail("invalid_grant", "resource")
	case c["client_id"] != id:
		fail("invalid_grant", "client_id")
	case time.Unix(int64(exp), 0).Before(time.Now()) || sub == "":
		fail("invalid_grant", "exp or sub")
	default:
		u.mu.Lock()
		u.n++
		at := fmt.Sprintf("hr-access-%d-%s", u.n, randomSecret())
		u.tokens[at] = sub
		u.jags = append(u.jags, c)
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": at, "token_type": "Bearer", "expires_in": 3600})
	}
}

// redeemed returns the claims of the ID-JAGs redeemed and why others
// were refused.
func (u *jagUpstream) redeemed() ([]map[string]any, []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.jags), slices.Clone(u.refused)
}

// accessTokens are the access tokens the authorization server issued.
func (u *jagUpstream) accessTokens() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for at := range u.tokens {
		out = append(out, at)
	}
	return out
}

// signIn signs user in at the broker's pages (the IdP's sign-in form
// when asked), as a person does once.
func (b *gwBrowser) signIn(t *testing.T, ctx context.Context, public, user string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, public+"/connections", nil)
	p, err := b.do(req)
	if err == nil && strings.Contains(p.body, `name="password"`) {
		p, err = b.submit(p, "login", url.Values{"username": {user}, "password": {user}})
	}
	if err != nil || p.status != http.StatusOK || !strings.HasSuffix(p.url.Path, "/connections") {
		t.Fatalf("%s signing in at the broker: %v; ended on %s (HTTP %d)", user, err, p.url, p.status)
	}
}

// TestGatewayEnterprise: an upstream MCP server whose authorization
// server takes ID-JAGs only (jagUpstream), as mcp.auth: enterprise,
// through `broker serve` and the real dev IdP over loopback. alice signed
// in at the broker once (offline access: the broker keeps her IdP
// session), so her host's calls are relayed with no browser step at all:
// the broker got an ID-JAG for exactly the server's authorization server,
// resource and its client there, and redeemed it; when the server forgets
// the access token, a new ID-JAG gets the next one, still without the
// person. bob, whom the IdP's policy refuses, and carol, who never signed
// in at the broker, get the url elicitation instead, and the page says
// why; carol, signed in through the link, is connected by her host's
// retry with no code flow. Each exchange is an audit event and a count. No IdP refresh token
// and no upstream token reaches a host, a browser or the broker's log.
func TestGatewayEnterprise(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	ctx := testContext(t, 3*time.Minute)
	s := newGWStack(t)
	if err := s.idp.AddUser(devidp.User{Username: "carol", Password: "carol", Subject: "carol", Email: "carol@example.test"}); err != nil {
		t.Fatal(err)
	}
	up := startJAGUpstream(t, s.idp)
	s.idp.SetIDJAGRules([]devidp.IDJAGRule{
		{User: "bob", Client: devClientID, Audience: up.base, Deny: true},
		{User: "*", Client: devClientID, Audience: up.base, Resources: []string{up.url}, AudienceClientID: jagClientID},
	})
	s.start(`providers:
  hr:
    type: mcp
    display_name: HR
    mcp:
      url: `+up.url+`
      auth: enterprise
    client_id: `+jagClientID+`
    client_secret: ${HR_SECRET}
`, "HR_SECRET="+up.secret)

	alice := s.browser()
	alice.signIn(t, ctx, s.public(), "alice")
	host := s.host(t, ctx, "alice", "hr", func(ctx context.Context, link string) error {
		return fmt.Errorf("alice was sent to %s", link)
	})
	if got := host.call(t, ctx, "whoami", nil); got != "person=alice" {
		t.Fatalf("whoami = %q", got)
	}
	if n := host.asked(); n != 0 {
		t.Fatalf("alice was asked %d times to connect", n)
	}
	jags, refused := up.redeemed()
	if len(jags) != 1 {
		t.Fatalf("%d ID-JAGs redeemed, want 1 (refused: %v)", len(jags), refused)
	}
	if j := jags[0]; j["aud"] != up.base || j["resource"] != up.url || j["client_id"] != jagClientID || j["sub"] != "alice" {
		t.Errorf("the ID-JAG redeemed: %v", j)
	}
	// The server forgets the token: the broker's forced refresh is a new
	// ID-JAG, and the call goes through without the person.
	resp, err := http.Post(up.base+"/test/expire", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := host.call(t, ctx, "whoami", nil); got != "person=alice" || host.asked() != 0 {
		t.Fatalf("after the server forgot the token: %q, asked %d", got, host.asked())
	}
	if jags, _ = up.redeemed(); len(jags) != 2 {
		t.Fatalf("after the server forgot the token: %d ID-JAGs redeemed, want 2", len(jags))
	}

	// bob: the IdP's policy says no; carol: no IdP session. Each gets the
	// link, and its page says why. bob stops there (the server's
	// authorization server takes no code flow); carol, signed in at the
	// broker through the link, goes back to her app, whose retry connects
	// her by ID-JAG.
	for _, c := range []struct {
		user, says string
		signedIn   bool
	}{
		{"bob", "did not allow it", true},
		{"carol", "held no current session of yours", false},
	} {
		b := s.browser()
		if c.signedIn {
			b.signIn(t, ctx, s.public(), c.user)
		}
		var page string
		h := s.host(t, ctx, c.user, "hr", func(ctx context.Context, link string) error {
			consent, err := b.connect(ctx, link, c.user)
			if consent == "" {
				return fmt.Errorf("no consent page for %s: %v", c.user, err)
			}
			page = consent
			if c.signedIn {
				return errors.New("the person stops at the consent page")
			}
			return nil // back to the app, which retries
		})
		res, err := h.cs.CallTool(ctx, &mcp.CallToolParams{Name: "whoami"})
		if h.asked() != 1 || !strings.Contains(page, "through your organisation&#39;s sign-in and could not") || !strings.Contains(page, c.says) {
			t.Errorf("%s: asked %d times; the consent page does not say why (%q):\n%.2000s", c.user, h.asked(), c.says, page)
		}
		if c.user == "carol" && (err != nil || res.IsError || resultText(res) != "person=carol") {
			t.Errorf("carol's retry after signing in through the link: %v %+v", err, res)
		}
	}

	audits := []string{`"event":"upstream_idjag_issued"`, `"outcome":"idp_refused"`, `"outcome":"no_idp_session"`}
	logs := logsWhen(s.proc.logs, s.proc.exited, func(logs string) bool {
		for _, want := range audits {
			if !strings.Contains(logs, want) {
				return false
			}
		}
		return true
	})
	for _, want := range audits {
		if !strings.Contains(logs, want) {
			t.Errorf("the broker's audit log has no %s:\n%s", want, grepLines(logs, `{"time"`))
		}
	}
	resp, err = http.Get(s.proc.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// bob's refusal by the IdP is held a minute: one exchange for his
	// discover, call and retry; carol's missing session is checked anew
	// each time (a sign-in would work at once), at no cost to the IdP.
	for _, want := range []string{`credbroker_upstream_idjag_total{outcome="issued",provider="hr"} 3`,
		`credbroker_upstream_idjag_total{outcome="idp_refused",provider="hr"} 1` + "\n",
		`credbroker_upstream_idjag_total{outcome="no_idp_session",provider="hr"} `} {
		if !strings.Contains(string(m), want) {
			t.Errorf("no %s in /metrics:\n%s", want, grepLines(string(m), "credbroker_upstream_idjag"))
		}
	}
	secrets := s.idp.IssuedRefreshTokens()
	if len(secrets) < 2 {
		t.Fatalf("the IdP issued %d refresh tokens: the broker did not ask for offline access", len(secrets))
	}
	seen := s.seen.String()
	for _, rt := range secrets {
		if strings.Contains(seen, rt) || strings.Contains(logs, rt) {
			t.Error("an IdP refresh token reached a host, a browser or the broker's log")
		}
	}
	s.noLeak(t, up.accessTokens())
}
