package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"credbroker/internal/echoapi"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// testUpstream is a remote MCP server for the gateway's tests, with the
// authorization server that issues its tokens, on one loopback server:
//
//	POST /mcp                                          the MCP server (both eras, go-sdk), Bearer tokens only
//	GET  /.well-known/oauth-protected-resource/mcp     RFC 9728 (resource = srv.URL+"/mcp")
//	GET  /.well-known/oauth-authorization-server       RFC 8414 (S256, registration)
//	POST /token                                        refresh_token grant: rotates; resource must be the server
//	POST /register                                     RFC 7591
//
// Its tools: echo (answers its arguments), admin (needs the scope
// "admin": 403 insufficient_scope otherwise), ask (asks the host a form
// question first: input_required, then the answer), route (its region
// argument is also the header Mcp-Param-Region, SEP-2243, which the
// go-sdk's server checks); addLeakyTools adds two more.
type testUpstream struct {
	t      testing.TB
	srv    *httptest.Server
	server *mcp.Server // the MCP server, to change its lists

	mu sync.Mutex // guards the fields below
	// tokens are the access tokens it accepts, with their scopes.
	tokens map[string][]string
	// refresh maps a live refresh token to the scopes of its grant.
	refresh map[string][]string
	// refuseRefresh answers every refresh invalid_grant.
	refuseRefresh bool
	// refreshes counts token requests; resources the resource each named.
	refreshes int
	resources []string
	// seenAuth are the Authorization headers the MCP server received;
	// methods counts the JSON-RPC methods it was sent; progressTokens are
	// the progress tokens slow was called with; links counts link's calls.
	seenAuth    []string
	seenHeaders []http.Header
	methods     map[string]int
	// caps are the clientCapabilities the last request of each method
	// declared; regions the Mcp-Param-Region headers of route's calls.
	caps           map[string]json.RawMessage
	regions        []string
	progressTokens []any
	links          int
	n              int
	// linkURL is the link link asks for ("" for its https one).
	linkURL string
	// progressSeen, when set, is waited on after each progress
	// notification slow sends (the test reads it from the stream first).
	progressSeen chan struct{}
	// intercept, when set, answers every request (a server or
	// authorization server misbehaving), next being the usual answers.
	intercept func(w http.ResponseWriter, r *http.Request, next http.Handler)
	// listTTL is the ttlMs of its tools, prompts and resources lists (0,
	// the go-sdk's default, unless a test changes it).
	listTTL int
}

func newTestUpstream(t testing.TB) *testUpstream {
	u := &testUpstream{t: t, tokens: map[string][]string{}, refresh: map[string][]string{}, methods: map[string]int{}, caps: map[string]json.RawMessage{}}
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, &mcp.ServerOptions{
		Instructions: "Upstream instructions\u202e with a bidi override and \u200b a zero-width space.",
		SetCacheable: func(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
			switch req.(type) {
			case *mcp.ListToolsRequest, *mcp.ListPromptsRequest, *mcp.ListResourcesRequest:
				u.mu.Lock()
				c.TTLMs = u.listTTL
				u.mu.Unlock()
			}
		},
	})
	server.AddTool(&mcp.Tool{Name: "echo", Description: "Echo the arguments.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + string(req.Params.Arguments)}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "admin", Description: "Needs the admin scope.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "admin done"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "ask", Description: "Asks a question first.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			if r, ok := req.Params.InputResponses["colour"]; ok {
				er, _ := r.(*mcp.ElicitResult)
				if req.Params.RequestState != "upstream-state-1" || er == nil {
					return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "bad retry"}}, IsError: true}, nil
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("you said %v", er.Content["colour"])}}}, nil
			}
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"colour": &mcp.ElicitParams{Mode: "form", Message: "Which colour?",
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{"colour": map[string]any{"type": "string"}}}}},
				RequestState: "upstream-state-1"}, nil
		})
	server.AddTool(&mcp.Tool{Name: "route", Description: "Routed by region.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"},"n":{"type":"integer"}}}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "routed " + string(req.Params.Arguments)}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "slow", Description: "Reports progress twice.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			tok := req.Params.GetProgressToken()
			u.mu.Lock()
			u.progressTokens = append(u.progressTokens, tok)
			u.mu.Unlock()
			u.mu.Lock()
			seen := u.progressSeen
			u.mu.Unlock()
			for i := 1; i <= 2 && tok != nil; i++ {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 2,
					Message: fmt.Sprintf("step %d\u202e", i)})
				if seen != nil {
					select {
					case <-seen:
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow done"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "link", Description: "Asks for a link the legacy way once.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			u.links++
			n, link := u.links, u.linkURL
			u.mu.Unlock()
			if link == "" {
				link = "https://upstream.example/authorise"
			}
			if n == 1 {
				return nil, mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", Message: "Authorise the upstream's app",
					URL: link, ElicitationID: "e1"}})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "linked"}}}, nil
		})
	u.server = server
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true})
	mux := http.NewServeMux()
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		tok, _ := strings.CutPrefix(auth, "Bearer ")
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var m struct {
			Method string `json:"method"`
			Params struct {
				Meta struct {
					Caps json.RawMessage `json:"io.modelcontextprotocol/clientCapabilities"`
				} `json:"_meta"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &m)
		u.mu.Lock()
		u.seenAuth = append(u.seenAuth, auth)
		u.seenHeaders = append(u.seenHeaders, r.Header.Clone())
		u.methods[m.Method]++
		u.caps[m.Method] = m.Params.Meta.Caps
		if bytes.Contains(body, []byte(`"name":"route"`)) {
			u.regions = append(u.regions, r.Header.Get("Mcp-Param-Region"))
		}
		scopes, ok := u.tokens[tok]
		u.mu.Unlock()
		meta := u.srv.URL + "/.well-known/oauth-protected-resource/mcp"
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+meta+`"`)
			http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
			return
		}
		if bytes.Contains(body, []byte(`"name":"admin"`)) && !slices.Contains(scopes, "admin") {
			w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="tools admin", resource_metadata="`+meta+`"`)
			http.Error(w, `{"error":"insufficient_scope"}`, http.StatusForbidden)
			return
		}
		handler.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"resource": u.srv.URL + "/mcp", "authorization_servers": []string{u.srv.URL},
			"scopes_supported": []string{"tools"}})
	})
	mux.HandleFunc("GET /.well-known/oauth-authorization-server", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"issuer": u.srv.URL, "authorization_endpoint": u.srv.URL + "/authorize",
			"token_endpoint": u.srv.URL + "/token", "registration_endpoint": u.srv.URL + "/register",
			"response_types_supported": []string{"code"}, "code_challenge_methods_supported": []string{"S256"},
			"token_endpoint_auth_methods_supported": []string{"none"}, "scopes_supported": []string{"tools", "admin", "offline_access"}})
	})
	mux.HandleFunc("POST /register", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"client_id": "registered-broker", "redirect_uris": []string{publicURL + "/oauth/up/callback"}})
	})
	mux.HandleFunc("POST /token", func(w http.ResponseWriter, r *http.Request) {
		r.ParseForm()
		u.mu.Lock()
		defer u.mu.Unlock()
		u.refreshes++
		u.resources = append(u.resources, r.PostForm.Get("resource"))
		w.Header().Set("Content-Type", "application/json")
		scopes, ok := u.refresh[r.PostForm.Get("refresh_token")]
		if r.PostForm.Get("grant_type") != "refresh_token" || !ok || u.refuseRefresh {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid_grant"}`)
			return
		}
		if r.PostForm.Get("resource") != u.srv.URL+"/mcp" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"invalid_target"}`)
			return
		}
		delete(u.refresh, r.PostForm.Get("refresh_token"))
		at, rt := u.mint(scopes)
		json.NewEncoder(w).Encode(map[string]any{"access_token": at, "refresh_token": rt, "token_type": "Bearer", "expires_in": 3600})
	})
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		intercept := u.intercept
		u.mu.Unlock()
		if intercept == nil {
			mux.ServeHTTP(w, r)
			return
		}
		intercept(w, r, mux)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// addLeakyTools adds the upstream's tools that hand back what they were
// sent: echo_headers answers the Authorization header it got in every
// encoding echoapi knows, and every refresh token the upstream issued,
// after a progress notification saying the same (when asked for
// progress); echo_fail answers a JSON-RPC error saying the same.
func (u *testUpstream) addLeakyTools() {
	leak := func(h http.Header) string {
		u.mu.Lock()
		refresh := slices.Sorted(maps.Keys(u.refresh))
		u.mu.Unlock()
		echoes := echoapi.Echoes(h.Get("Authorization"))
		var b strings.Builder
		for _, form := range slices.Sorted(maps.Keys(echoes)) {
			fmt.Fprintf(&b, "%s: %s\n", form, echoes[form])
		}
		fmt.Fprintf(&b, "url: %s\nrefresh tokens: %q\n", url.QueryEscape(h.Get("Authorization")), refresh)
		return b.String()
	}
	u.server.AddTool(&mcp.Tool{Name: "echo_headers", Description: "Answers the headers it got.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			text := leak(req.Extra.Header)
			if tok := req.Params.GetProgressToken(); tok != nil {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: text})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: map[string]any{"headers": text}}, nil
		})
	u.server.AddTool(&mcp.Tool{Name: "echo_fail", Description: "Fails, saying the headers it got.", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "refused: " + leak(req.Extra.Header)}
		})
}

// mint issues an access and a refresh token for scopes (u.mu held).
func (u *testUpstream) mint(scopes []string) (string, string) {
	u.n++
	at, rt := fmt.Sprintf("up-access-%d", u.n), fmt.Sprintf("up-refresh-%d", u.n)
	u.tokens[at], u.refresh[rt] = scopes, scopes
	return at, rt
}

// grant issues a grant's first tokens, as the code exchange would.
func (u *testUpstream) grant(scopes ...string) (string, string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mint(scopes)
}

// revoke makes the upstream refuse access token at.
func (u *testUpstream) revoke(at string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.tokens, at)
}

func (u *testUpstream) url() string { return u.srv.URL + "/mcp" }

// issued returns every token the upstream has issued.
func (u *testUpstream) issued() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for i := 1; i <= u.n; i++ {
		out = append(out, fmt.Sprintf("up-access-%d", i), fmt.Sprintf("up-refresh-%d", i))
	}
	return out
}
