package provider

import (
	"testing"
)

// TestMCPStaticClientAuthMethod: a pre-registered confidential client
// authenticates at the token endpoint the way the authorization server's
// metadata says it takes (RFC 8414 token_endpoint_auth_methods_supported):
// HTTP Basic when it lists client_secret_basic or lists nothing (the
// default), the form's client_secret when it lists client_secret_post
// only. The rig's server refuses any other way with invalid_client.
func TestMCPStaticClientAuthMethod(t *testing.T) {
	static := "    client_id: static-client\n    client_secret: ${LINEAR_SECRET}\n"
	for _, c := range []struct {
		name    string
		methods any // nil: the metadata lists none
		post    bool
	}{
		{"basic listed", []string{"client_secret_basic", "client_secret_post"}, false},
		{"nothing listed", nil, false},
		{"post only", []string{"client_secret_post"}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			r.as.set("token_endpoint_auth_methods_supported", c.methods)
			k := r.client(r.registry("", static), nil)
			r.connect(k, alice, "conn-1", nil)
			reqs := r.as.requests("/token")
			if len(reqs) == 0 {
				t.Fatal("no token request")
			}
			last := reqs[len(reqs)-1]
			basic := last.BasicUser == "static-client" && last.BasicPass == "static-secret"
			form := last.Values.Get("client_id") == "static-client" && last.Values.Get("client_secret") == "static-secret"
			if c.post && (!form || last.BasicUser != "") || !c.post && (!basic || last.Values.Has("client_secret")) {
				t.Fatalf("authenticated with Basic %q and form %v; want the secret only %s", last.BasicUser, last.Values, map[bool]string{true: "in the form", false: "in Basic"}[c.post])
			}
		})
	}
}

// TestMCPRegisteredClientAuthMethod: dynamic registration asks for a
// confidential client authenticated with Basic when the server takes
// that, for one authenticated with the form when the server takes only
// that (no public clients), else for a public client; the token requests
// then authenticate so.
func TestMCPRegisteredClientAuthMethod(t *testing.T) {
	for _, c := range []struct {
		name    string
		methods []string
		want    string // the registration's token_endpoint_auth_method
	}{
		{"basic", []string{"client_secret_basic", "none"}, "client_secret_basic"},
		{"nothing listed (RFC 8414: Basic)", nil, "client_secret_basic"},
		{"post only", []string{"client_secret_post"}, "client_secret_post"},
		{"public", []string{"none", "client_secret_post"}, "none"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			if c.methods == nil {
				r.as.set("token_endpoint_auth_methods_supported", nil) // not listed
			} else {
				r.as.set("token_endpoint_auth_methods_supported", c.methods)
			}
			k := r.client(r.registry("      registration: dcr\n", ""), nil)
			r.connect(k, alice, "conn-1", nil)
			regs := r.as.requests("/register")
			if len(regs) != 1 {
				t.Fatalf("%d registrations", len(regs))
			}
			reqs := r.as.requests("/token")
			last := reqs[len(reqs)-1]
			secretInForm, basic := last.Values.Has("client_secret"), last.BasicUser != ""
			if got := map[[2]bool]string{{false, true}: "client_secret_basic", {true, false}: "client_secret_post", {false, false}: "none"}[[2]bool{secretInForm, basic}]; got != c.want {
				t.Fatalf("the token request authenticated as %q (Basic %v, form secret %v), want %q", got, basic, secretInForm, c.want)
			}
		})
	}
}
