package oauthflow

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestLogoutForcesLoginForm: after POST /logout the next broker sign-in
// asks the IdP for prompt=login, so a person who landed on the mismatch page
// can really switch accounts instead of being signed straight back in by
// the IdP's own session.
func TestLogoutForcesLoginForm(t *testing.T) {
	h := newHarness(t, fakeProviders)
	b := h.newAgent()
	base := h.srv.URL
	askedForPassword := func(p page) bool { return strings.Contains(p.body, `name="password"`) }

	p := b.signInIfAsked(b.get(base+"/connections"), "alice")
	mustStatus(t, p, http.StatusOK)
	mustContain(t, p, "alice@example.test")
	// Sign out, then come back: the IdP form is shown again even though
	// the IdP's own session in this browser is still alive.
	p = b.submit(p, "/logout", nil)
	mustContain(t, p, "Signed out")
	p = b.get(base + "/connections")
	if !askedForPassword(p) {
		t.Fatalf("after sign-out the IdP signed the browser straight back in:\n%s", p.body)
	}
	// Bob signs in in this browser: the account really switched.
	p = b.signInIfAsked(p, "bob")
	mustStatus(t, p, http.StatusOK)
	mustContain(t, p, "bob@example.test")
	if strings.Contains(p.body, "alice@example.test") {
		t.Fatal("still signed in as alice")
	}
	h.finalCheck()
}

// TestWithoutLogoutIdPSessionIsReused is the control for the test above: a
// browser that never signed out is not asked for a password again when its
// broker session is gone but the IdP's is not (the broker did not force
// prompt=login).
func TestWithoutLogoutIdPSessionIsReused(t *testing.T) {
	h := newHarness(t, fakeProviders)
	b := h.newAgent()
	base := h.srv.URL
	p := b.signInIfAsked(b.get(base+"/connections"), "alice")
	mustContain(t, p, "alice@example.test")
	b.dropBrokerCookies(base)
	p = b.get(base + "/connections")
	if strings.Contains(p.body, `name="password"`) {
		t.Fatal("the IdP asked again although nobody signed out")
	}
	mustContain(t, p, "alice@example.test")
}

// dropBrokerCookies forgets the broker's cookies (not the IdP's), as when
// the broker session expires.
// (Cookies are scoped by host, not port, so the jar holds both the IdP's and
// the broker's under 127.0.0.1; the broker's are the cb_ ones.)
func (a *agent) dropBrokerCookies(base string) {
	u, err := url.Parse(base)
	if err != nil {
		panic(err)
	}
	for _, c := range a.c.Jar.Cookies(u) {
		if strings.HasPrefix(c.Name, "cb_") {
			a.c.Jar.SetCookies(u, []*http.Cookie{{Name: c.Name, Value: "", Path: "/", MaxAge: -1}})
		}
	}
}
