package oauthflow

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

func TestCookieAttributesAndRotation(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dev        bool
		name       string
		wantSecure bool
	}{
		{dev: false, name: "__Host-cb_session", wantSecure: true},
		{dev: true, name: "cb_session", wantSecure: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jar := newCookieJar(kr.Derive("cookies"), tc.dev, time.Now)
			rec := httptest.NewRecorder()
			s := session{Issuer: "https://idp", Subject: "alice", CSRF: "c", Expires: time.Now().Add(time.Minute)}
			if err := jar.set(rec, "session", s, sessionTTL); err != nil {
				t.Fatal(err)
			}
			res := rec.Result()
			cs := res.Cookies()
			if len(cs) != 1 {
				t.Fatalf("cookies = %v", cs)
			}
			c := cs[0]
			if c.Name != tc.name || !c.HttpOnly || c.SameSite != http.SameSiteLaxMode || c.Secure != tc.wantSecure || c.Path != "/" || c.Domain != "" || c.MaxAge != int(sessionTTL/time.Second) {
				t.Fatalf("cookie = %+v", c)
			}
			if strings.Contains(c.Value, "alice") {
				t.Fatal("cookie value is not encrypted")
			}
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.AddCookie(c)
			if got := jar.session(req); got == nil || got.Subject != "alice" {
				t.Fatalf("session round trip = %+v", got)
			}
			// After key rotation (new primary, old key kept) the cookie still opens.
			rotated, err := kr.WithNewPrimary()
			if err != nil {
				t.Fatal(err)
			}
			if got := newCookieJar(rotated.Derive("cookies"), tc.dev, time.Now).session(req); got == nil || got.Subject != "alice" {
				t.Fatal("cookie sealed with the old primary does not open after rotation")
			}
			// Another key ring, a tampered value, or a cookie renamed to
			// another purpose do not open.
			other, _ := vault.ParseKeys(vault.GenerateKey())
			if newCookieJar(other.Derive("cookies"), tc.dev, time.Now).session(req) != nil {
				t.Fatal("cookie opened with an unrelated key ring")
			}
			tampered := httptest.NewRequest(http.MethodGet, "/", nil)
			tampered.AddCookie(&http.Cookie{Name: c.Name, Value: c.Value[:len(c.Value)-2] + "AA"})
			if jar.session(tampered) != nil {
				t.Fatal("tampered cookie accepted")
			}
			renamed := httptest.NewRequest(http.MethodGet, "/", nil)
			renamed.AddCookie(&http.Cookie{Name: jar.name("flow"), Value: c.Value})
			if _, ok := jar.flow(renamed); ok {
				t.Fatal("session cookie accepted as a flow cookie")
			}
			// Expired by the injected clock.
			late := newCookieJar(kr.Derive("cookies"), tc.dev, func() time.Time { return time.Now().Add(2 * time.Minute) })
			if late.session(req) != nil {
				t.Fatal("expired session accepted")
			}
		})
	}
}

func TestLoginCallbackRejects(t *testing.T) {
	h := newHarness(t, corpProvider)
	a := h.newAgent()
	p := a.get(h.srv.URL + "/auth/callback?code=x&state=y")
	mustStatus(t, p, http.StatusBadRequest)
	mustContain(t, p, "Sign-in expired")
	// A real login cookie but a forged state.
	a.c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	a.get(h.srv.URL + "/connections")
	p = a.get(h.srv.URL + "/auth/callback?code=x&state=forged")
	mustStatus(t, p, http.StatusBadRequest)
	mustContain(t, p, "Sign-in not accepted")
	if !strings.Contains(h.logs.String(), "login_state_mismatch") {
		t.Error("no security event for the forged sign-in state")
	}
	// Pages that need a session send the browser to the IdP, never render.
	p = a.get(h.srv.URL + "/connections")
	if p.status != http.StatusFound || !strings.HasPrefix(p.header.Get("Location"), h.idp.Issuer()) {
		t.Fatalf("GET /connections signed out: HTTP %d to %q", p.status, p.header.Get("Location"))
	}
	for _, v := range []string{"code_challenge_method=S256", "nonce=", "state=", "scope=openid"} {
		if !strings.Contains(p.header.Get("Location"), v) {
			t.Errorf("sign-in redirect lacks %s: %s", v, p.header.Get("Location"))
		}
	}
}
