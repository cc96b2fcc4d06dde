package mcpapi

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestGatewayModernUpstreamLinks: a 2026-07-28 upstream's url
// elicitation (in its input_required) is held to what the -32042 path
// relays: an https link of at most 2 KiB without user info reaches the
// host; http, user info, 2 KiB and more, or another scheme is a tool
// error naming no link, and nothing is relayed.
func TestGatewayModernUpstreamLinks(t *testing.T) {
	g, _ := connectedGateway(t, "tools")
	link := "https://upstream.example/ok"
	g.up.server.AddTool(&mcp.Tool{Name: "open_link", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{"page": &mcp.ElicitParams{Mode: "url", Message: "Open it", URL: link}},
				RequestState: "s"}, nil
		})
	d := g.gwCall("alice", urlCaps, "tools/call", "open_link", map[string]any{"arguments": map[string]any{}})
	if key, u, _ := elicitation(t, d); key != "page" || u != link {
		t.Fatalf("a good link relayed as %q %q", key, u)
	}
	for _, bad := range []string{"http://upstream.example/open", "https://user@upstream.example/open",
		"https://upstream.example/" + strings.Repeat("a", 2048), "javascript:alert(1)"} {
		link = bad
		d := g.gwCall("alice", urlCaps, "tools/call", "open_link", map[string]any{"arguments": map[string]any{}})
		if d.Result["isError"] != true || !strings.Contains(textOf(d), "a link the broker does not relay") || strings.Contains(textOf(d), bad) ||
			d.Result["inputRequests"] != nil {
			t.Fatalf("link %.40q relayed: %+v", bad, d)
		}
	}
}
