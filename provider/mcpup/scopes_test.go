package mcpup

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestInsufficientScopeFromGoSDK: the go-sdk's own bearer check
// (auth.RequireBearerToken with Scopes) answers a token lacking one of
// its scopes 403 with a Bearer challenge naming the scopes but no error
// parameter; that is a *NeedScope with those scopes too, at the
// session's opening as at a call. A 403 whose challenge names another
// error is not.
func TestInsufficientScopeFromGoSDK(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "scoped", Version: "1"}, nil)
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	verify := func(_ context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
		if token != "read-only" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{Scopes: []string{"mcp:read"}, UserID: "alice"}, nil
	}
	bearer := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: "https://up.test/.well-known/oauth-protected-resource/mcp",
		Scopes: []string{"mcp:read", "mcp:write"}})
	srv := httptest.NewServer(bearer(handler))
	t.Cleanup(srv.Close)
	p := newPool(t, Options{Tokens: &fakeTokens{tok: map[string]string{"conn-1": "read-only"}}})
	_, err := p.Session(context.Background(), Target{Provider: "scoped", URL: srv.URL + "/mcp", Conn: "conn-1"})
	var ns *NeedScope
	if !errors.As(err, &ns) || !slices.Equal(ns.Scopes, []string{"mcp:read", "mcp:write"}) {
		t.Fatalf("opening a session with a read-only token: %v, want *NeedScope{mcp:read mcp:write}", err)
	}
	for _, c := range []struct {
		scheme string
		params map[string]string
		want   bool
	}{
		{"bearer", map[string]string{"error": "insufficient_scope", "scope": "a b"}, true},
		{"bearer", map[string]string{"scope": "a b", "resource_metadata": "https://up.test/prm"}, true},
		{"bearer", map[string]string{"error": "invalid_token", "scope": "a b"}, false},
		{"bearer", map[string]string{"resource_metadata": "https://up.test/prm"}, false},
		{"dpop", map[string]string{"error": "insufficient_scope", "scope": "a"}, false},
	} {
		if got := insufficientScope(c.scheme, c.params); got != c.want {
			t.Errorf("insufficientScope(%s %v) = %v, want %v", c.scheme, c.params, got, c.want)
		}
	}
}
