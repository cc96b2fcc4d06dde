package mcpapi

import (
	"context"
	"strings"
	"testing"

	"credbroker/vault"
)

// TestConnectResultSaysRefreshTokenMissing: a connection stored without
// the refresh token its provider entry expects (offline_access was
// granted) says so in connect_account's result, so the user is not
// surprised when the access token expires.
func TestConnectResultSaysRefreshTokenMissing(t *testing.T) {
	h := newHarness(t)
	alice := h.principal("alice")
	with := h.connect(alice, "github", "octocat", []string{"read:user", "offline_access"})
	args := map[string]any{"provider": "github", "scopes": []string{"read:user"}}
	_, d := h.callTool("alice", urlCaps, "connect_account", args, nil)
	if msg := structured(t, d)["message"].(string); strings.Contains(msg, "no refresh token") {
		t.Fatalf("warned with a refresh token stored: %q", msg)
	}
	if _, err := h.store.UpdateConnection(context.Background(), with.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Token.RefreshToken = ""
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	_, d = h.callTool("alice", urlCaps, "connect_account", args, nil)
	sc := structured(t, d)
	if sc["status"] != "connected" || !strings.Contains(sc["message"].(string), "GitHub gave no refresh token") {
		t.Fatalf("connect result %v, want connected with the missing refresh token said", sc)
	}
}
