package mcpapi

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestEncodeToolResultMatchesSDK checks the fast encoder against the SDK's
// encoding for every shape the tools produce, HTML-sensitive text included.
func TestEncodeToolResultMatchesSDK(t *testing.T) {
	var err error
	srv := &Server{impl: &mcp.Implementation{Name: "credbroker", Title: "cred<broker>", Version: "1&2"}}
	if srv.implJSON, err = json.Marshal(srv.impl); err != nil {
		t.Fatal(err)
	}
	errOutcome := complete(disconnectOutput{Provider: "github", Account: "a<b>&c", Revocation: "failed", Message: "x \"quoted\" \u2028 <tag>"})
	errOutcome.result.IsError = true
	tests := []struct {
		name string
		o    outcome
		fast bool
	}{
		{"connected", complete(connectOutput{Status: "connected", Message: "Connected: GitHub account <octo&cat>.",
			Connection: &connectionView{ID: "conn_1", Provider: "github", Account: "octo", Scopes: []string{"repo"}, Status: "active"}}), true},
		{"tool error without structured content", toolError("Unknown provider %q. Valid: <a>, b&c.", "x\x00y"), true},
		{"structured error", errOutcome, true},
		{"empty list", complete(listOutput{Connections: []connectionView{}}), true},
		{"two contents", outcome{result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}, &mcp.TextContent{Text: "b"}}}}, false},
		{"map structured content", outcome{result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}}, StructuredContent: map[string]any{"a": 1}}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := srv.encodeToolResult(tc.o.result)
			if ok != tc.fast {
				t.Fatalf("fast path = %v, want %v", ok, tc.fast)
			}
			if !ok {
				return
			}
			res := *tc.o.result
			res.Meta = srv.serverMeta()
			b, err := json.Marshal(&res)
			if err != nil {
				t.Fatal(err)
			}
			want := withResultType("complete", b)
			if !bytes.Equal(got, want) {
				t.Errorf("fast encoding differs:\n got %s\nwant %s", got, want)
			}
		})
	}
}
