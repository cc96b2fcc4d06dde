package mcpup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestLegacyPushes: with a 2025-11-25 server, the pool's session declares
// only url elicitation in its initialize, and answers what the server
// pushes as issue 31's era table says: a url elicitation is cancelled,
// and a sampling request and a roots listing are each -32601 (the broker
// serves neither on its own session: the person is not on it). The call
// itself then completes. (A go-sdk server sends no form elicitation to a
// client that declared only url ones; the TypeScript server's push,
// cmd/broker TestGatewayTypeScriptUpstream, gets -32601.)
func TestLegacyPushes(t *testing.T) {
	var mu sync.Mutex
	got := map[string]string{}
	record := func(what string, res any, err error) {
		mu.Lock()
		defer mu.Unlock()
		var we *jsonrpc.Error
		switch {
		case errors.As(err, &we):
			got[what] = fmt.Sprint("error ", we.Code)
		case err != nil:
			got[what] = "failed: " + err.Error()
		default:
			b, _ := json.Marshal(res)
			got[what] = string(b)
		}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "legacy", Version: "1"}, &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}})
	server.AddTool(&mcp.Tool{Name: "push", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			er, err := req.Session.Elicit(ctx, &mcp.ElicitParams{Mode: "url", Message: "Open this", URL: "https://x.example/a", ElicitationID: "e1"})
			record("url elicitation", er, err)
			cm, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{MaxTokens: 10,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "q"}}}})
			record("sampling", cm, err)
			lr, err := req.Session.ListRoots(ctx, nil)
			record("roots", lr, err)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "pushed"}}}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{DisableLocalhostProtection: true})
	var initialize []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		if bytes.Contains(b, []byte(`"method":"initialize"`)) {
			mu.Lock()
			initialize = b
			mu.Unlock()
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p := newPool(t, Options{})
	res, era, err := Do(context.Background(), p, Target{Provider: "legacy", URL: srv.URL + "/mcp"}, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		return cs.CallTool(ctx, &mcp.CallToolParams{Name: "push", Arguments: map[string]any{}})
	})
	if err != nil || era != "2025-11-25" || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != "pushed" {
		t.Fatalf("the call: %+v, era %q, %v", res, era, err)
	}
	var init struct {
		Params struct {
			Capabilities json.RawMessage `json:"capabilities"`
		} `json:"params"`
	}
	mu.Lock()
	defer mu.Unlock()
	if json.Unmarshal(initialize, &init) != nil || !jsonEqual(init.Params.Capabilities, `{"elicitation":{"url":{}}}`) {
		t.Errorf("initialize declared %s, want only url elicitation", init.Params.Capabilities)
	}
	want := map[string]string{
		"url elicitation": `{"action":"cancel"}`,
		"sampling":        "error -32601",
		"roots":           "error -32601",
	}
	for what, w := range want {
		if got[what] != w {
			t.Errorf("a pushed %s was answered %s, want %s", what, got[what], w)
		}
	}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a json.RawMessage, b string) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal([]byte(b), &y) == nil && equalJSON(x, y)
}

func equalJSON(x, y any) bool {
	bx, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return bytes.Equal(bx, by)
}
