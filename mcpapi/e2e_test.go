package mcpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// bearerTransport adds a bearer token to every request and records every
// response body's headers for inspection.
type bearerTransport struct {
	token string
	base  http.RoundTripper
}

func (b *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

func (h *harness) sdkClient(t *testing.T, sub, version string, handler func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *mcp.ClientSession {
	t.Helper()
	opts := &mcp.ClientOptions{ElicitationHandler: handler}
	if handler != nil {
		opts.Capabilities = &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}}
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "1"}, opts)
	tr := &mcp.StreamableClientTransport{
		Endpoint:             h.http.URL + "/mcp",
		HTTPClient:           &http.Client{Transport: &bearerTransport{token: h.bearer(sub), base: h.http.Client().Transport}},
		DisableStandaloneSSE: true,
	}
	cs, err := client.Connect(context.Background(), tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect (%s): %v", version, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func TestModernClientEndToEnd(t *testing.T) {
	h := newHarness(t)
	alice := h.principal("alice")
	var urls []string
	handler := func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		// The "browser": the user opens the URL, signs in as alice and
		// approves; the broker stores the connection and completes the grant.
		urls = append(urls, req.Params.URL)
		if req.Params.Mode != "url" || req.Params.ElicitationID != "" {
			t.Errorf("want a 2026-07-28 url elicitation without elicitationId, got %+v", req.Params)
		}
		h.completeGrant(grantIDOf(t, req.Params.URL), alice, "octocat")
		return &mcp.ElicitResult{Action: "accept"}, nil
	}
	cs := h.sdkClient(t, "alice", "", handler)
	if v := cs.InitializeResult().ProtocolVersion; v != versionModern {
		t.Fatalf("negotiated %s, want %s (server/discover)", v, versionModern)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 4 {
		t.Fatalf("tools/list: %v %v", tools, err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "github", "scopes": []string{"repo"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError || len(urls) != 1 {
		t.Fatalf("result %+v, elicitations %v", res, urls)
	}
	var out connectOutput
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &out)
	if out.Status != "connected" || out.Connection.Account != "octocat" || strings.Join(out.Connection.Scopes, " ") != "repo" {
		t.Fatalf("got %+v", out)
	}
	// Second call: already connected, no elicitation.
	res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_connections", Arguments: map[string]any{}})
	if err != nil || res.IsError || len(urls) != 1 {
		t.Fatalf("list: %+v %v", res, err)
	}
	if strings.Contains(string(b), providerSecret) {
		t.Fatal("token in result")
	}
}

func TestModernClientWithoutURLCapability(t *testing.T) {
	h := newHarness(t)
	cs := h.sdkClient(t, "alice", "", nil)
	_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "github"}})
	var re *jsonrpc.Error
	if !errors.As(err, &re) || re.Code != mcp.CodeMissingRequiredClientCapabilities {
		t.Fatalf("want -32021, got %v", err)
	}
}

func TestLegacyClientEndToEnd(t *testing.T) {
	h := newHarness(t)
	alice := h.principal("alice")
	never := func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		t.Error("a stateless server cannot send elicitation requests")
		return nil, errors.New("unexpected")
	}
	cs := h.sdkClient(t, "alice", versionLegacy, never)
	if v := cs.InitializeResult().ProtocolVersion; v != versionLegacy {
		t.Fatalf("negotiated %s", v)
	}
	params := &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "github"}}
	_, err := cs.CallTool(context.Background(), params)
	var re *jsonrpc.Error
	if !errors.As(err, &re) || re.Code != mcp.CodeURLElicitationRequired {
		t.Fatalf("want -32042, got %v", err)
	}
	var data struct {
		Elicitations []mcp.ElicitParams `json:"elicitations"`
	}
	if err := json.Unmarshal(re.Data, &data); err != nil || len(data.Elicitations) != 1 {
		t.Fatalf("data %s: %v", re.Data, err)
	}
	e := data.Elicitations[0]
	if e.Mode != "url" || e.ElicitationID != grantIDOf(t, e.URL) {
		t.Fatalf("elicitation %+v: elicitationId must be the grant id", e)
	}
	h.completeGrant(e.ElicitationID, alice, "octocat")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("retry: %+v %v", res, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	if !strings.Contains(string(b), `"status":"connected"`) || !strings.Contains(string(b), "octocat") {
		t.Fatalf("retry result %s", b)
	}
	res, err = cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "disconnect_account", Arguments: map[string]any{"provider": "github"}})
	if err != nil || res.IsError {
		t.Fatalf("disconnect: %+v %v", res, err)
	}
}

func TestLegacyClientWithoutURLCapability(t *testing.T) {
	h := newHarness(t)
	cs := h.sdkClient(t, "alice", versionLegacy, nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "github"}})
	if err != nil || !res.IsError {
		t.Fatalf("want a tool error, got %+v %v", res, err)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if strings.Contains(text, "/connect/") || !strings.Contains(text, "elicitation.url") {
		t.Fatalf("text %q", text)
	}
}
