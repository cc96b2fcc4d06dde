package mcpapi

import (
	"context"
	"credbroker/internal/bearer"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

func TestBearerValidation(t *testing.T) {
	h := newHarness(t)
	now := h.clock.Now()
	body := modernBody(1, "server/discover", "{}", nil)
	tests := []struct {
		name       string
		auth       string
		wantStatus int
		wantErr    string // error= in WWW-Authenticate
	}{
		{"valid", "Bearer " + h.bearer("alice"), 200, ""},
		{"lower-case scheme", "bearer " + h.bearer("alice"), 200, ""},
		{"missing", "", 401, ""},
		{"not bearer", "Basic YWxpY2U6cHc=", 401, "invalid_request"},
		{"garbage", "Bearer not.a.jwt", 401, "invalid_token"},
		{"other audience", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: "https://other.example.com/mcp", exp: now.Add(time.Hour)}), 401, "invalid_token"},
		{"expired", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(-time.Minute)}), 401, "invalid_token"},
		{"expired within leeway", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(-10 * time.Second)}), 200, ""},
		{"not yet valid", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(time.Hour), nbf: now.Add(5 * time.Minute)}), 401, "invalid_token"},
		{"unknown key", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(time.Hour), wrongKey: true}), 401, "invalid_token"},
		{"other issuer", "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(time.Hour), iss: "https://evil.example.com"}), 401, "invalid_token"},
		{"no subject", "Bearer " + h.iss.token(t, tokenSpec{aud: resource, exp: now.Add(time.Hour)}), 401, "invalid_token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hd := h.modernHeaders("alice", "server/discover", "")
			hd["Authorization"] = tt.auth
			r := h.do(rawCall{headers: hd, body: body})
			if r.status != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", r.status, tt.wantStatus, r.body)
			}
			if tt.wantStatus == 401 {
				www := r.header.Get("WWW-Authenticate")
				if !strings.HasPrefix(www, "Bearer ") || !strings.Contains(www, `resource_metadata="`+publicURL+`/.well-known/oauth-protected-resource/mcp"`) {
					t.Fatalf("WWW-Authenticate %q", www)
				}
				if tt.wantErr != "" && !strings.Contains(www, `error="`+tt.wantErr+`"`) {
					t.Fatalf("WWW-Authenticate %q lacks error=%s", www, tt.wantErr)
				}
				if d := decode(t, r.body); d.Error == nil {
					t.Fatal("401 without a JSON-RPC error body")
				}
			}
		})
	}
}

func TestRequiredScope(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RequiredScope = "broker" })
	now := h.clock.Now()
	body := modernBody(1, "server/discover", "{}", nil)
	for _, tt := range []struct {
		name, scope string
		want        int
	}{
		{"without", "openid email", 403},
		{"with", "openid broker", 200},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hd := h.modernHeaders("alice", "server/discover", "")
			hd["Authorization"] = "Bearer " + h.iss.token(t, tokenSpec{sub: "alice", aud: resource, exp: now.Add(time.Hour), scope: tt.scope})
			r := h.do(rawCall{headers: hd, body: body})
			if r.status != tt.want {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if tt.want == 403 {
				www := r.header.Get("WWW-Authenticate")
				if !strings.Contains(www, `error="insufficient_scope"`) || !strings.Contains(www, `scope="broker"`) || !strings.Contains(www, "resource_metadata=") {
					t.Fatalf("WWW-Authenticate %q", www)
				}
			}
		})
	}
	t.Run("missing token challenge names the scope", func(t *testing.T) {
		hd := h.modernHeaders("alice", "server/discover", "")
		hd["Authorization"] = ""
		r := h.do(rawCall{headers: hd, body: body})
		if !strings.Contains(r.header.Get("WWW-Authenticate"), `scope="broker"`) {
			t.Fatalf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
		}
	})
}

func TestProtectedResourceMetadata(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RequiredScope = "broker" })
	for _, path := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		t.Run(path, func(t *testing.T) {
			resp, err := http.Get(h.http.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var md oauthex.ProtectedResourceMetadata
			b, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(b, &md); err != nil {
				t.Fatal(err)
			}
			if md.Resource != resource || len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != h.iss.srv.URL ||
				len(md.ScopesSupported) != 1 || md.ScopesSupported[0] != "broker" ||
				!slices.Equal(md.BearerMethodsSupported, []string{"header"}) || md.ResourceName != "credbroker" {
				t.Fatalf("metadata %s", b)
			}
		})
	}
}

// A Verifier given in Options runs on every request: it is the broker's
// own tokens' verifier, which checks on every use that the token was not
// revoked, and caches its signature checks itself (bearer.Cached, tested
// in internal/bearer).
func TestCustomVerifierRunsOnEveryRequest(t *testing.T) {
	var calls atomic.Int32
	var h *harness
	revoked := atomic.Bool{}
	h = newHarness(t, func(o *Options) {
		o.Verifier = func(ctx context.Context, raw string) (bearer.TokenInfo, error) {
			calls.Add(1)
			if revoked.Load() {
				return bearer.TokenInfo{}, fmt.Errorf("%w: revoked", bearer.ErrInvalidToken)
			}
			return bearer.TokenInfo{Principal: h.principal("alice"), Expiry: h.clock.Now().Add(time.Minute)}, nil
		}
	})
	hd := h.modernHeaders("alice", "server/discover", "")
	hd["Authorization"] = "Bearer opaque-token-1"
	for range 3 {
		if r := h.do(rawCall{headers: hd, body: modernBody(1, "server/discover", "{}", nil)}); r.status != 200 {
			t.Fatal(r.status)
		}
	}
	if calls.Load() != 3 {
		t.Fatalf("verifier called %d times for 3 requests, want 3", calls.Load())
	}
	revoked.Store(true) // revocation takes effect on the next request
	if r := h.do(rawCall{headers: hd, body: modernBody(1, "server/discover", "{}", nil)}); r.status != 401 {
		t.Fatalf("after revocation: HTTP %d, want 401", r.status)
	}
}

func TestOrigin(t *testing.T) {
	for _, tt := range []struct {
		name   string
		dev    bool
		origin string
		want   int
	}{
		{"none", false, "", 200},
		{"public origin", false, publicURL, 200},
		{"other", false, "https://evil.example.com", 403},
		{"loopback outside dev mode", false, "http://127.0.0.1:3000", 403},
		{"loopback in dev mode", true, "http://localhost:3000", 200},
		{"null", true, "null", 403},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.DevMode = tt.dev })
			hd := h.modernHeaders("alice", "server/discover", "")
			hd["Origin"] = tt.origin
			r := h.do(rawCall{headers: hd, body: modernBody(1, "server/discover", "{}", nil)})
			if r.status != tt.want {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.status == 403 && decode(t, r.body).Error == nil {
				t.Fatal("403 without JSON-RPC error")
			}
		})
	}
}
