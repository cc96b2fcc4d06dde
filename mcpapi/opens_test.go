package mcpapi

import (
	"strings"
	"testing"
)

// TestDecryptionsPerCall holds the tools to "decrypt at the point of use"
// (docs/SECURITY.md, Secrets and state): list_connections reads metadata
// only and opens no token set, and provider_request opens the one token set
// it sends, however many connections the person has. The key ring counts
// every envelope it opens, and the calls run one at a time on the MCP
// endpoint over loopback, so each call's count is exact. The benchmarks
// (bench/, "Decryptions per call") print the same figures for bob's five
// connections on the bolt store; every store decodes records through the
// same vault codec as the memory store here.
func TestDecryptionsPerCall(t *testing.T) {
	h := newHarness(t)
	bob := h.principal("bob")
	h.connect(bob, "github", "bob-gh", []string{"read:user"})
	h.connect(bob, "google", "bob@example.test", []string{"openid", "email"})
	h.connect(bob, "echo", "bob-echo", nil)
	// Someone else's connections are not bob's to open either.
	h.connect(h.principal("alice"), "github", "alice-gh", []string{"read:user"})

	for _, tc := range []struct {
		tool      string
		args      map[string]any
		wantOpens uint64
		check     func(t *testing.T, body string)
	}{
		{"list_connections", map[string]any{}, 0, func(t *testing.T, body string) {
			for _, login := range []string{"bob-gh", "bob@example.test", "bob-echo"} {
				if !strings.Contains(body, login) {
					t.Fatalf("list_connections does not list %s: %s", login, body)
				}
			}
		}},
		{"provider_request", map[string]any{"provider": "github", "method": "GET", "path": "/user"}, 1, func(t *testing.T, body string) {
			if !strings.Contains(body, `\"path\":\"/user\"`) {
				t.Fatalf("provider_request did not reach the API: %s", body)
			}
		}},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			// The first call counts too: nothing is cached that a later
			// call would need to decrypt again.
			for i := range 5 {
				before := h.keys.Opens()
				r, d := h.callTool("bob", "{}", tc.tool, tc.args, nil)
				opened := h.keys.Opens() - before
				if r.status != 200 || d.Error != nil || d.Result["isError"] == true || d.Result["resultType"] != "complete" {
					t.Fatalf("call %d: HTTP %d %s", i+1, r.status, r.body)
				}
				tc.check(t, string(r.body))
				if opened != tc.wantOpens {
					t.Fatalf("call %d of %s opened %d token sets, want %d", i+1, tc.tool, opened, tc.wantOpens)
				}
			}
		})
	}
}
