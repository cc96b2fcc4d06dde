package mcpapi

import (
	"encoding/json"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestMissingCapability: an upstream's input request, decoded as the
// go-sdk decodes an input_required result, is relayed only to a host that
// declared its kind, and only when the entry relays that kind.
func TestMissingCapability(t *testing.T) {
	requests := map[string]string{
		"form":     `{"method":"elicitation/create","params":{"message":"m","requestedSchema":{"type":"object"}}}`,
		"url":      `{"method":"elicitation/create","params":{"mode":"url","message":"m","url":"https://x.example/a"}}`,
		"sampling": `{"method":"sampling/createMessage","params":{"messages":[{"role":"user","content":{"type":"text","text":"q"}}],"maxTokens":10}}`,
		"roots":    `{"method":"roots/list","params":{}}`,

		// No mode, but a URL: url, as the go-sdk's encoding (and so the host) reads it.
		"url, inferred": `{"method":"elicitation/create","params":{"message":"m","url":"https://x.example/a","elicitationId":"e"}}`,
	}
	all := []string{"elicitation", "sampling", "roots"}
	for _, tc := range []struct {
		req, caps string
		allowed   []string
		want      string
	}{
		{"form", `{"elicitation":{}}`, all, ""},
		{"form", `{"elicitation":{"form":{}}}`, all, ""},
		{"form", `{"elicitation":{"url":{}}}`, all, "elicitation.form"},
		{"url", `{"elicitation":{"url":{}}}`, all, ""},
		{"url", `{"elicitation":{}}`, all, "elicitation.url"},
		{"url, inferred", `{"elicitation":{"form":{}}}`, all, "elicitation.url"},
		{"url, inferred", `{"elicitation":{"url":{}}}`, all, ""},
		{"form", `{"elicitation":{}}`, []string{"sampling"}, "elicitation (not relayed for this server)"},
		{"sampling", `{"sampling":{}}`, all, ""},
		{"sampling", `{}`, all, "sampling"},
		{"sampling", `{"sampling":{}}`, []string{"elicitation"}, "sampling"},
		{"roots", `{"roots":{}}`, all, ""},
		{"roots", `{"roots":{"listChanged":true}}`, all, ""},
		{"roots", `{}`, all, "roots"},
		{"roots", `{"roots":{}}`, []string{"elicitation", "sampling"}, "roots"},
	} {
		var m mcp.InputRequestMap
		if err := json.Unmarshal([]byte(`{"k":`+requests[tc.req]+`}`), &m); err != nil {
			t.Fatal(err)
		}
		var host hostCapabilities
		if err := json.Unmarshal([]byte(tc.caps), &host); err != nil {
			t.Fatal(err)
		}
		if got := missingCapability(m["k"], host, tc.allowed); got != tc.want {
			t.Errorf("%s request, host %s, relayed %v: missing %q, want %q", tc.req, tc.caps, tc.allowed, got, tc.want)
		}
	}
}
