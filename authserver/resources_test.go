package authserver

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"credbroker/internal/bearer"
)

// withGateways lets the broker issue tokens for the gateway endpoints of
// "linear" and "notion", as cmd/broker does for type: mcp entries.
func withGateways(o *Options) {
	o.MoreResources = func(r string) bool {
		return r == o.PublicURL+"/mcp/u/linear" || r == o.PublicURL+"/mcp/u/notion"
	}
}

// TestGatewayResources: a host asks for a gateway endpoint's resource and
// gets a token for that endpoint only (refused by /mcp's verifier and by
// another endpoint's); consent is per person, client and resource, so an
// app allowed for /mcp is asked again for a gateway endpoint and keeps
// both; a token request naming another resource than its grant's is
// invalid_target, without spending the code's or refresh token's grant; an
// unknown resource is refused at /authorize.
func TestGatewayResources(t *testing.T) {
	h := newHarness(t, withGateways)
	linear, notion := h.srv.URL+"/mcp/u/linear", h.srv.URL+"/mcp/u/notion"
	client, redirect := h.publicClient()
	b := h.browser("alice")

	// Allowed for /mcp first.
	pk := newPKCE()
	code := h.approve(b, h.authorizeURL(client, redirect, pk, map[string]string{"scope": "offline_access"}), redirect)
	if a := h.exchange(client, code, redirect, pk, nil); a.AccessToken == "" {
		t.Fatalf("/mcp token: %+v", a)
	}

	// A gateway endpoint: the consent page again, naming it.
	pk = newPKCE()
	p := b.get(h.authorizeURL(client, redirect, pk, map[string]string{"resource": linear, "scope": "offline_access"}))
	if p.status != http.StatusOK || !strings.Contains(p.body, `<code class="gateway">`+linear+`</code>`) || strings.Contains(p.body, "Continue to this app?") {
		t.Fatalf("a remembered /mcp consent covered %s: HTTP %d\n%.2000s", linear, p.status, p.body)
	}
	p = b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}})
	code = h.callback(p, redirect).Get("code")
	// The code is for linear: asking to redeem it for notion fails.
	if a := h.exchange(client, code, redirect, pk, map[string]string{"resource": notion}); a.Error != "invalid_target" {
		t.Fatalf("code for linear redeemed for notion: %+v", a)
	}
	pk2 := newPKCE()
	code = h.approve(b, h.authorizeURL(client, redirect, pk2, map[string]string{"resource": linear, "scope": "offline_access"}), redirect)
	tok := h.exchange(client, code, redirect, pk2, map[string]string{"resource": linear})
	if tok.AccessToken == "" || tok.RefreshToken == "" {
		t.Fatalf("linear token: %+v", tok)
	}
	if _, err := h.as.VerifierFor(linear)(t.Context(), tok.AccessToken); err != nil {
		t.Fatalf("linear's verifier refuses linear's token: %v", err)
	}
	for name, v := range map[string]bearer.Verifier{"/mcp": h.as.Verifier(), "notion": h.as.VerifierFor(notion)} {
		if _, err := v(t.Context(), tok.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) {
			t.Errorf("%s's verifier on linear's token: %v", name, err)
		}
	}
	// Both consents are remembered: neither asks for the full page now.
	for _, r := range []string{h.opts.Resource, linear} {
		p := b.get(h.authorizeURL(client, redirect, newPKCE(), map[string]string{"resource": r, "scope": "offline_access"}))
		if p.status == http.StatusOK && !strings.Contains(p.body, "Continue to this app?") {
			t.Errorf("%s asks for the full consent again:\n%.1500s", r, p.body)
		}
	}
	// A refresh naming another resource: refused, and the token still works.
	if a := h.post("/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {client},
		"resource": {notion}}); a.Error != "invalid_target" {
		t.Fatalf("refresh for notion: %+v", a)
	}
	if a := h.post("/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {tok.RefreshToken}, "client_id": {client},
		"resource": {strings.ToUpper(h.srv.URL[:4]) + h.srv.URL[4:] + "/mcp/u/linear"}}); a.AccessToken == "" {
		t.Fatalf("the refresh for linear after the refused one: %+v", a)
	}
	// Resources the broker does not serve.
	for _, r := range []string{h.srv.URL + "/mcp/u/github", h.srv.URL + "/mcp/u/linear#x", "https://elsewhere.example/mcp/u/linear"} {
		q := h.callback(b.get(h.authorizeURL(client, redirect, newPKCE(), map[string]string{"resource": r})), redirect)
		if q.Get("error") != "invalid_target" || !strings.Contains(q.Get("error_description"), "/mcp/u/{provider}") {
			t.Errorf("resource %q: %v", r, q)
		}
	}
}

// TestIDJAGForGatewayResource: an ID-JAG naming a gateway endpoint is
// redeemed for a token of that endpoint only; the token request may not
// name another resource than the assertion's; one naming a resource the
// broker does not serve is refused.
func TestIDJAGForGatewayResource(t *testing.T) {
	e := newJAGEnv(t, withGateways)
	linear := e.srv.URL + "/mcp/u/linear"
	c := e.claims()
	c["resource"] = linear
	a := e.redeem(e.sign(c), nil)
	if a.AccessToken == "" {
		t.Fatalf("redeem: %+v", a)
	}
	if _, err := e.as.VerifierFor(linear)(t.Context(), a.AccessToken); err != nil {
		t.Fatalf("linear's verifier: %v", err)
	}
	if _, err := e.as.Verifier()(t.Context(), a.AccessToken); !errors.Is(err, bearer.ErrInvalidToken) {
		t.Fatalf("/mcp's verifier took linear's token: %v", err)
	}
	c = e.claims()
	c["resource"] = linear
	if a := e.redeem(e.sign(c), url.Values{"resource": {e.srv.URL + "/mcp/u/notion"}}); a.Error != "invalid_target" {
		t.Fatalf("a notion token from a linear assertion: %+v", a)
	}
	c = e.claims()
	c["resource"] = e.srv.URL + "/mcp/u/github"
	if a := e.redeem(e.sign(c), nil); a.Error != "invalid_grant" {
		t.Fatalf("an assertion for an endpoint the broker does not serve: %+v", a)
	}
}
