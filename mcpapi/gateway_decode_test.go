package mcpapi

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/provider/mcpup"
)

// relayedBytes is what the gateway writes for res to a 2026-07-28 host.
func relayedBytes(t testing.TB, g *gateway, res *mcp.CallToolResult) []byte {
	t.Helper()
	if b, ok := g.fastResult(true, res); ok {
		return b
	}
	b, err := g.slowResult(true, res)
	if err != nil {
		t.Fatalf("slowResult: %v", err)
	}
	return b
}

// checkFastToolResult: whenever fastToolResult takes an upstream's result
// bytes, the go-sdk's decoder takes them too and the gateway relays the
// same bytes for both decodings. It reports whether the fast path took
// them.
func checkFastToolResult(t testing.TB, g *gateway, wire []byte) bool {
	t.Helper()
	fast, ok := fastToolResult(wire)
	if !ok {
		return false
	}
	var sdk mcp.CallToolResult
	if err := sdk.UnmarshalJSON(wire); err != nil {
		t.Fatalf("the fast path took what the go-sdk refuses (%v): %s", err, wire)
	}
	if a, b := relayedBytes(t, g, fast), relayedBytes(t, g, &sdk); !bytes.Equal(a, b) {
		t.Fatalf("for %s:\nfast   %s\ngo-sdk %s", wire, a, b)
	}
	return true
}

const upstreamInfo = `"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"mcp-conformance-test-server","version":"1.0.0"}}`

// fastToolResultCases are upstream results and whether the fast path
// takes them.
var fastToolResultCases = []struct {
	wire string
	fast bool
}{
	// The go-sdk everything-server's test_simple_text, as it answers.
	{`{` + upstreamInfo + `,"content":[{"type":"text","text":"This is a simple text response for testing."}],"resultType":"complete"}`, true},
	{` { "content" : [ { "text" : "a" , "type" : "text" } ] , "isError" : true } `, true},
	{`{"content":[{"type":"text","text":"é ✓ <&>"}],"isError":false,"_meta":{}}`, true},
	{`{"content":[]}`, true},
	{`{"content":[{"type":"text","text":"a"},{"type":"text","text":""}],"resultType":"complete"}`, true},
	{`{"_meta":{"io.modelcontextprotocol/serverInfo":5},"content":[{"type":"text","text":"a"}]}`, true},
	// Left to the go-sdk.
	{`{"content":[{"type":"text","text":"a\nb"}]}`, false},
	{`{"content":[{"type":"text","text":"a","annotations":{"priority":1}}]}`, false},
	{`{"content":[{"type":"text","text":"a","_meta":{"k":1}}]}`, false},
	{`{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}`, false},
	{`{"content":[{"type":"text"}]}`, false},
	{`{"content":[{"type":"text","text":"a","type":"text"}]}`, false},
	{`{"content":[{"type":"text","text":"a"}],"structuredContent":{"a":1}}`, false},
	{`{"content":[{"type":"text","text":"a"}],"resultType":"input_required","requestState":"x"}`, false},
	{`{"content":[{"type":"text","text":"a"}],"Content":[]}`, false},
	{`{"Content":[{"type":"text","text":"a"}]}`, false},
	{`{"content":[{"type":"text","text":"a"}],"content":[]}`, false},
	{`{"content":[{"type":"text","text":"a"}],"_meta":{"k":1}}`, false},
	{`{"content":[{"type":"text","text":"a"}],"_meta":{"io.modelcontextprotocol/serverInfo":1,"io.modelcontextprotocol/serverInfo":2}}`, false},
	{`{"content":null}`, false},
	{`{"content":[null]}`, false},
	{`{"isError":true}`, false},
	{`{"content":[{"type":"text","text":"a"}],"isError":null}`, false},
	{`{"content":[{"type":"text","text":"a"}]} x`, false},
	{`null`, false},
}

// TestFastToolResult: the usual relayed results take the fast path and
// are relayed as the go-sdk's decoding of them is; anything else is left
// to the go-sdk.
func TestFastToolResult(t *testing.T) {
	g := gatewayEncodeTestServer(t)
	for _, tc := range fastToolResultCases {
		if got := checkFastToolResult(t, g, []byte(tc.wire)); got != tc.fast {
			t.Errorf("fast path %v, want %v: %s", got, tc.fast, tc.wire)
		}
	}
}

// TestRelayedToolResult: a result the pool's own exchange hands over
// undecoded is decoded by the fast path for a 2026-07-28 host, else by
// the go-sdk (a 2025-11-25 host gets the upstream's _meta as it was); one
// the go-sdk refuses, or panics on, is an error; one the session decoded
// is as it is.
func TestRelayedToolResult(t *testing.T) {
	usual := json.RawMessage(`{` + upstreamInfo + `,"content":[{"type":"text","text":"hi"}]}`)
	for _, tc := range []struct {
		raw    string
		modern bool
		meta   bool
		err    bool
	}{
		{string(usual), true, false, false},
		{string(usual), false, true, false},
		{`{"content":[{"type":"text","text":"a\nb"}]}`, true, false, false},
		{`{"content":[{"type":"nonsense"}]}`, true, false, true},
		// The go-sdk's decoder panics on a null input request: an error.
		{`{"inputRequests":{"k":null},"requestState":"s"}`, true, false, true},
		{`{"inputRequests":{"k":null},"requestState":"s"}`, false, false, true},
	} {
		res, err := relayedToolResult(mcpup.ToolResult{Raw: json.RawMessage(tc.raw)}, tc.modern)
		if (err != nil) != tc.err {
			t.Fatalf("%s (modern %v): %v", tc.raw, tc.modern, err)
		}
		if err == nil && (len(res.Content) != 1 || (res.Meta != nil) != tc.meta) {
			t.Errorf("%s (modern %v): %+v", tc.raw, tc.modern, res)
		}
	}
	decoded := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "x"}}}
	if res, err := relayedToolResult(mcpup.ToolResult{Decoded: decoded}, true); err != nil || res != decoded {
		t.Errorf("the session's result: %v, %v", res, err)
	}
}

// FuzzFastToolResult: whatever bytes an upstream answers, the fast path
// relays them as the go-sdk's decoding of them is relayed, or leaves
// them to it.
func FuzzFastToolResult(f *testing.F) {
	for _, tc := range fastToolResultCases {
		f.Add([]byte(tc.wire))
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		checkFastToolResult(t, gatewayEncodeTestServer(t), wire)
	})
}
