package provider

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// TestMCPOfflineAccess: mcp.offline_access decides whether the
// authorization request asks for offline_access (with prompt=consent, as
// OpenID Connect wants for it): auto when the server's metadata lists
// it, always whatever the metadata says, never even when the server
// names it among the scopes a connect asks for by default.
func TestMCPOfflineAccess(t *testing.T) {
	for _, c := range []struct {
		name, setting string
		listed        bool // the server's scopes_supported has offline_access
		defaults      bool // and its protected-resource metadata suggests it
		want          bool
	}{
		{"auto, listed", "auto", true, false, true},
		{"auto, not listed", "auto", false, false, false},
		{"always, not listed", "always", false, false, true},
		{"never, listed", "never", true, false, false},
		{"never, suggested by the server", "never", true, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			supported := []string{"openid", "issues:read"}
			if c.listed {
				supported = append(supported, "offline_access")
			}
			r.as.set("scopes_supported", supported)
			if c.defaults {
				r.up.with(func() { r.up.challenge, r.up.docs[pathPRM] = "", r.up.prm(r.as.base, "issues:read", "offline_access") })
			}
			reg := r.registry("      offline_access: "+c.setting+"\n", "")
			k := r.client(reg, nil)
			p, _ := reg.Lookup("linear")
			var asked []string
			if !c.defaults {
				asked = []string{"issues:read"}
			}
			a, err := k.AuthRequest(context.Background(), p, k.Scopes(p, asked), mcpRedirect)
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(a.URL)
			scopes := strings.Fields(u.Query().Get("scope"))
			got := slices.Contains(scopes, "offline_access")
			if got != c.want || (u.Query().Get("prompt") == "consent") != c.want {
				t.Fatalf("scope %q, prompt %q: offline access asked %v, want %v", u.Query().Get("scope"), u.Query().Get("prompt"), got, c.want)
			}
		})
	}
}
