package provider

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestMCPHostGate: every request made for an mcp entry's authorization
// goes only to mcp.url's host, mcp.allowed_hosts or its account.url's
// host, whatever a server's challenge or metadata names (docs/SECURITY.md,
// invariant 18): protected-resource metadata named by the challenge on
// another host is not fetched (the well-known URIs are used instead), and
// an ID token whose keys (jwks_uri) are on another host is not checked
// against them, so nothing is stored; listing the host in
// mcp.allowed_hosts lets both through.
func TestMCPHostGate(t *testing.T) {
	other := func(r *mcpRig, path string) string {
		return strings.Replace(r.up.srv.URL, "127.0.0.1", "localhost", 1) + path
	}
	t.Run("metadata named by the challenge", func(t *testing.T) {
		for _, allowed := range []bool{false, true} {
			r := newMCPRig(t, "127.0.0.1")
			r.up.with(func() {
				r.up.docs[challengePRM] = r.up.prm(r.as.base, "via-the-challenge")
				r.up.challenge = other(r, challengePRM)
			})
			lines := ""
			if allowed {
				lines = "      allowed_hosts: [localhost]\n"
			}
			chk, err := r.client(r.registry(lines, ""), nil).CheckUpstream(context.Background(), "linear")
			if err != nil {
				t.Fatalf("allowed %v: %v", allowed, err)
			}
			fetched := slices.Contains(r.up.fetched(), challengePRM)
			if via := slices.Contains(chk.Scopes, "via-the-challenge"); via != allowed || fetched != allowed {
				t.Fatalf("allowed_hosts lists localhost: %v; the challenge's document fetched %v, used %v (scopes %v)", allowed, fetched, via, chk.Scopes)
			}
		}
	})
	t.Run("ID token keys", func(t *testing.T) {
		for _, allowed := range []bool{false, true} {
			r := newMCPRig(t, "127.0.0.1")
			r.as.with(func() { r.as.idAlg, r.as.sub = "ES256", "person-42" })
			r.as.set("jwks_uri", strings.Replace(r.as.base, "127.0.0.1", "localhost", 1)+"/jwks")
			lines := ""
			if allowed {
				lines = "      allowed_hosts: [localhost]\n"
			}
			k := r.client(r.registry(lines, ""), nil)
			a, code := r.authorize(k, []string{"openid"})
			p, _ := k.opts.Providers.Lookup("linear")
			ex, err := k.Exchange(context.Background(), p, alice, mcpRedirect, code, a)
			// go-oidc keeps only the text of the key fetch's error.
			refused := (&HostNotAllowedError{Host: "localhost"}).Error()
			switch {
			case allowed && (err != nil || ex.Account.ID != "person-42"):
				t.Fatalf("with localhost allowed: %+v, %v", ex.Account, err)
			case !allowed && (!errors.Is(err, ErrAccountUnknown) || !strings.Contains(err.Error(), refused)):
				t.Fatalf("keys on localhost, not allowed: Exchange = %v, want ErrAccountUnknown saying %q", err, refused)
			case !allowed && len(r.as.requests("/jwks")) != 0:
				t.Fatalf("the keys on a host not allowed were fetched")
			}
		}
	})
}
