package mcpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestGatewayUpstreamErrorTexts: an upstream's JSON-RPC error reaches the
// host with its message cleaned as other upstream text is (a bidi
// override and a zero-width space stripped); a -32042 answered to a list
// carries no link (only a call can) and is an error saying to call a
// tool; and a -32042 for an entry whose mcp.input_requests leaves out
// elicitation is a tool error, for a 2025-11-25 host as for a 2026-07-28
// one.
func TestGatewayUpstreamErrorTexts(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	g.up.server.AddTool(&mcp.Tool{Name: "fail_bidi", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: -32002, Message: "no such\u202e record\u200b"}
		})
	d := g.gwCall("alice", urlCaps, "tools/call", "fail_bidi", map[string]any{"arguments": map[string]any{}})
	if d.Error == nil || d.Error.Code != -32002 || d.Error.Message != "no such record" {
		t.Fatalf("an upstream error with a bidi override: %+v", d.Error)
	}

	// Every tools/list the upstream answers with a -32042.
	g.up.mu.Lock()
	g.up.intercept = func(w http.ResponseWriter, r *http.Request, next http.Handler) {
		if r.Header.Get("Mcp-Method") == "tools/list" {
			var req struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.NewDecoder(r.Body).Decode(&req)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"error":{"code":-32042,"message":"open it","data":{"elicitations":[{"mode":"url","url":"https://upstream.example/a","message":"m","elicitationId":"e"}]}}}`))
			return
		}
		next.ServeHTTP(w, r)
	}
	g.up.mu.Unlock()
	g.clock.Advance(11 * 60 * 1e9) // past the cached list
	d = g.gwCall("alice", urlCaps, "tools/list", "", nil)
	if d.Error == nil || !strings.Contains(d.Error.Message, "call one of its tools to be given the link") || d.Result != nil {
		t.Fatalf("a -32042 to tools/list: %+v %+v", d.Result, d.Error)
	}
}

// TestGatewayLegacyLinksNotRelayedWhenElicitationOff: with
// mcp.input_requests leaving out elicitation, a 2025-11-25 upstream's
// -32042 is a tool error for a 2025-11-25 host that declared url
// elicitation too, as for a 2026-07-28 one.
func TestGatewayLegacyLinksNotRelayedWhenElicitationOff(t *testing.T) {
	g := newGatewayHarnessWith(t, []string{"input_requests: [sampling]"})
	_, link, _ := elicitation(t, g.gwCall("alice", urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}}))
	g.connectUp(grantIDOf(t, link), "tools")
	if d := g.gwCall("alice", urlCaps, "tools/call", "link", map[string]any{"arguments": map[string]any{}}); d.Result["isError"] != true || !strings.Contains(textOf(d), "elicitation") {
		t.Fatalf("2026-07-28 host: %+v %+v", d.Result, d.Error)
	}
	g.up.mu.Lock()
	g.up.links = 0
	g.up.mu.Unlock()
	d := g.legacyRequest("alice", "tools/call", map[string]any{"name": "link", "arguments": map[string]any{}})
	if d.Error != nil || d.Result["isError"] != true || !strings.Contains(textOf(d), "mcp.input_requests") {
		t.Fatalf("2025-11-25 host: %+v %+v", d.Result, d.Error)
	}
}
