package oauthflow

import (
	"context"
	"encoding/json"
	"errors"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/securecookie"

	"credbroker/connections"
	"credbroker/internal/devidp"
	"credbroker/internal/fakeprovider"
	"credbroker/vault"
)

// corpProvider uses the devidp itself as a generic OIDC provider "corp".
func corpProvider(h *harness) (string, map[string]string) {
	if err := h.idp.AddClient(devidp.Client{ID: "corp-app", Secret: "corp-secret-value", RedirectURIs: []string{h.srv.URL + "/oauth/corp/callback"}}); err != nil {
		h.t.Fatal(err)
	}
	return `providers:
  corp:
    display_name: Corp Directory
    type: oidc
    issuer: ` + h.idp.Issuer() + `
    client_id: corp-app
    client_secret: ${CORP_SECRET}
    default_scopes: [openid, email]
`, map[string]string{"CORP_SECRET": "corp-secret-value"}
}

func TestGenericOIDCFlow(t *testing.T) {
	h := newHarness(t, corpProvider)
	g := h.grant("alice", "corp", nil, `<script>alert("x")</script> Agent`)
	a := h.newAgent()
	consent := a.openConnect(g, "alice")
	mustStatus(t, consent, http.StatusOK)
	mustContain(t, consent, "Corp Directory", "127.0.0.1", "alice@example.test",
		"&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; Agent", `name="decision" value="approve"`, `name="decision" value="deny"`)
	if strings.Contains(consent.body, "<script>") {
		t.Fatalf("consent page carries an unescaped script tag")
	}
	csp := consent.header.Get("Content-Security-Policy")
	for _, w := range []string{"default-src 'none'", "frame-ancestors 'none'", "form-action 'self' " + strings.TrimSuffix(h.idp.Issuer(), "/idp")} {
		if !strings.Contains(csp, w) {
			t.Errorf("CSP %q lacks %q", csp, w)
		}
	}
	for k, v := range map[string]string{"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"} {
		if got := consent.header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	done := a.submit(consent, "/connect/", url.Values{"decision": {"approve"}})
	mustStatus(t, done, http.StatusOK)
	mustContain(t, done, "Connected: return to your app", "alice@example.test")
	cs := h.connections("alice")
	if len(cs) != 1 || cs[0].Provider != "corp" || cs[0].AccountID != "alice" || cs[0].Token.AccessToken == "" || cs[0].Status != vault.StatusActive {
		t.Fatalf("connections = %+v", cs)
	}
	h.secret(cs[0].Token.AccessToken.Reveal())
	h.secret(cs[0].Token.IDToken.Reveal())
	if st := h.grantState(g.ID); st != vault.GrantCompleted {
		t.Fatalf("grant state = %s, want completed", st)
	}
	// The same account again updates the connection instead of adding one.
	g2 := h.grant("alice", "corp", nil, "Agent")
	again := a.submit(a.openConnect(g2, "alice"), "/connect/", url.Values{"decision": {"approve"}})
	mustContain(t, again, "Connected: return to your app")
	cs2 := h.connections("alice")
	if len(cs2) != 1 || cs2[0].ID != cs[0].ID || cs2[0].Version != 2 {
		t.Fatalf("after reconnect: %+v", cs2)
	}
	h.secret(cs2[0].Token.AccessToken.Reveal())
	// The connections page lists it; Disconnect deletes it.
	list := a.get(h.srv.URL + "/connections")
	mustContain(t, list, "Corp Directory", "alice@example.test", "Disconnect")
	after := a.submit(list, "/disconnect", nil)
	// No revocation is configured, but the IdP's discovery document
	// advertises revocation_endpoint: the broker revokes there.
	mustContain(t, after, "Disconnected.", "revoked access at the provider")
	if n := len(h.connections("alice")); n != 0 {
		t.Fatalf("after disconnect: %d connections", n)
	}
	h.checkNoSecrets("log", h.logs.String())
}

// toCallback signs in, approves the consent and the provider's consent and
// returns the provider's redirect to the broker's callback, not yet followed.
func (a *agent) toCallback(g vault.Grant, user string) *url.URL {
	a.h.t.Helper()
	a.stopAtCallback = true
	defer func() { a.stopAtCallback = false }()
	consent := a.openConnect(g, user)
	mustStatus(a.h.t, consent, http.StatusOK)
	atProvider := a.submit(consent, "/connect/", url.Values{"decision": {"approve"}})
	back := atProvider
	if atProvider.status == http.StatusOK {
		back = a.submit(atProvider, "auth", url.Values{"decision": {"approve"}})
	}
	if back.status != http.StatusFound {
		a.h.t.Fatalf("provider did not redirect back: HTTP %d %s\n%s", back.status, back.url, back.body)
	}
	u, err := url.Parse(back.header.Get("Location"))
	if err != nil || !strings.HasPrefix(u.Path, "/oauth/") {
		a.h.t.Fatalf("provider redirected to %q", back.header.Get("Location"))
	}
	return u
}

func (a *agent) cookie(name string) *http.Cookie {
	u, _ := url.Parse(a.h.srv.URL)
	for _, c := range a.c.Jar.Cookies(u) {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func (a *agent) setCookie(c *http.Cookie) {
	u, _ := url.Parse(a.h.srv.URL)
	a.c.Jar.SetCookies(u, []*http.Cookie{{Name: c.Name, Value: c.Value, Path: "/"}})
}

func TestProviderFlowsHTTP(t *testing.T) {
	h := newHarness(t, fakeProviders)
	for _, tc := range []struct {
		provider, account string
		refresh           bool
	}{
		{"github", "octocat", false},
		{"google", "alice.g@example.test", true},
	} {
		t.Run(tc.provider, func(t *testing.T) {
			a := h.newAgent()
			g := h.grant("alice", tc.provider, nil, "Claude Desktop")
			done := a.get(a.toCallback(g, "alice").String())
			mustStatus(t, done, http.StatusOK)
			mustContain(t, done, "Connected: return to your app", tc.account)
			if c := a.cookie("cb_flow"); c != nil {
				t.Errorf("flow cookie still set after completion")
			}
			var conn vault.Connection
			for _, c := range h.connections("alice") {
				if c.Provider == tc.provider {
					conn = c
				}
			}
			if conn.ID == "" || conn.AccountLogin != tc.account || conn.Token.AccessToken == "" || (conn.Token.RefreshToken != "") != tc.refresh {
				t.Fatalf("stored connection = %+v (refresh token present: %v)", conn, conn.Token.RefreshToken != "")
			}
			h.secret(conn.Token.AccessToken.Reveal())
			h.secret(conn.Token.RefreshToken.Reveal())
			h.secret(conn.Token.IDToken.Reveal())
			if st := h.grantState(g.ID); st != vault.GrantCompleted {
				t.Fatalf("grant = %s, want completed", st)
			}
			// Disconnect revokes at the provider, then deletes.
			list := a.get(h.srv.URL + "/connections")
			after := a.submit(list, "/connections/"+conn.ID+"/disconnect", nil)
			mustContain(t, after, "revoked access at the provider")
			var revokes int
			if tc.provider == "github" {
				revokes = h.gh.Counts().Revoke
				if h.gh.TokenValid(conn.Token.AccessToken.Reveal()) {
					t.Error("GitHub token still valid after disconnect")
				}
			} else {
				revokes = h.google.Counts().Revoke
				if h.google.TokenValid(conn.Token.AccessToken.Reveal()) {
					t.Error("Google token still valid after disconnect")
				}
			}
			if revokes != 1 {
				t.Errorf("provider saw %d revocations, want 1", revokes)
			}
			if _, err := h.store.GetConnection(context.Background(), conn.ID); err == nil {
				t.Error("connection still stored after disconnect")
			}
		})
	}
	h.finalCheck()
}

// TestConsentIsStoredWithTheConnection: the consent form writes nothing
// (the consent travels to the callback in the sealed flow cookie), and the
// callback approves and completes the grant in the one write that stores
// the connection, so a browser connect costs one durable commit after the
// grant's creation.
func TestConsentIsStoredWithTheConnection(t *testing.T) {
	h := newHarness(t, fakeProviders)
	for _, prov := range []string{"github", "google"} {
		t.Run(prov, func(t *testing.T) {
			a := h.newAgent()
			g := h.grant("alice", prov, nil, "c")
			cb := a.toCallback(g, "alice")
			if a.cookie("cb_flow") == nil {
				t.Fatal("no flow cookie after the consent form")
			}
			if d := h.untouched(g.ID); d != "" {
				t.Fatalf("after the consent form: %s", d)
			}
			mustContain(t, a.get(cb.String()), "Connected: return to your app")
			got, err := h.store.GetGrant(context.Background(), g.ID)
			if err != nil {
				t.Fatal(err)
			}
			cs := h.connections("alice")
			if got.State != vault.GrantCompleted || got.Version != 2 || len(cs) != 1 || got.ConnectionID != cs[0].ID {
				t.Fatalf("after the callback: grant %s version %d connection %q, %d connections; want completed in one write with the one connection",
					got.State, got.Version, got.ConnectionID, len(cs))
			}
			h.store.DeleteConnection(context.Background(), cs[0].ID)
		})
	}
}

func TestCallbackFailuresStoreNothing(t *testing.T) {
	h := newHarness(t, fakeProviders)
	ctx := context.Background()
	noConnections := func(t *testing.T) {
		t.Helper()
		for _, u := range []string{"alice", "bob"} {
			if cs := h.connections(u); len(cs) != 0 {
				t.Fatalf("%s has %d connections, want none", u, len(cs))
			}
		}
	}
	t.Run("state mismatch", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		bad := *cb
		q := bad.Query()
		q.Set("state", "forged-state")
		bad.RawQuery = q.Encode()
		p := a.get(bad.String())
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "does not match the connection this browser started", "What to do next")
		noConnections(t)
		if d := h.untouched(g.ID); d != "" {
			t.Fatal(d)
		}
		// A forged answer does not spoil the real one.
		mustContain(t, a.get(cb.String()), "Connected: return to your app")
		for _, c := range h.connections("alice") {
			h.store.DeleteConnection(ctx, c.ID)
		}
	})
	// A mix-up: GitHub's answer (a plain OAuth 2.0 provider, no metadata,
	// no RFC 9207 iss to compare) delivered at another provider's redirect
	// URI. Each provider has its own redirect URI and the flow cookie names
	// the provider, which is the mix-up defence where iss cannot be checked
	// (RFC 9700 §4.4.2.2).
	t.Run("answer at another provider's redirect URI", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		if !strings.HasSuffix(cb.Path, "/oauth/github/callback") {
			t.Fatalf("GitHub answered at %s", cb.Path)
		}
		bad := *cb
		bad.Path = strings.TrimSuffix(cb.Path, "/oauth/github/callback") + "/oauth/google/callback"
		events := strings.Count(h.logs.String(), "callback_state_mismatch")
		p := a.get(bad.String())
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "does not match the connection this browser started")
		noConnections(t)
		if d := h.untouched(g.ID); d != "" {
			t.Fatal(d)
		}
		if n := strings.Count(h.logs.String(), "callback_state_mismatch"); n != events+1 {
			t.Errorf("%d callback_state_mismatch security events logged, want 1", n-events)
		}
	})
	t.Run("missing flow cookie", func(t *testing.T) {
		a := h.newAgent()
		cb := a.toCallback(h.grant("alice", "github", nil, "c"), "alice")
		other := h.newAgent()
		other.signInIfAsked(other.get(h.srv.URL+"/connections"), "alice")
		p := other.get(cb.String())
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "has no connection in progress")
		noConnections(t)
	})
	t.Run("replayed callback", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		flowCookie := a.cookie("cb_flow")
		mustContain(t, a.get(cb.String()), "Connected: return to your app")
		n := len(h.connections("alice"))
		// Same URL again: the flow cookie is spent.
		p := a.get(cb.String())
		mustStatus(t, p, http.StatusBadRequest)
		// Same URL with the old flow cookie put back: the grant is used.
		a.setCookie(flowCookie)
		p = a.get(cb.String())
		mustStatus(t, p, http.StatusGone)
		mustContain(t, p, "already used")
		if got := len(h.connections("alice")); got != n || n != 1 {
			t.Fatalf("connections = %d, want %d (one, from the first callback)", got, n)
		}
		if tok := h.gh.Counts().Token; tok != 2 {
			t.Errorf("token endpoint called %d times in total, want 2 (replays must not reach it)", tok)
		}
		for _, c := range h.connections("alice") {
			h.store.DeleteConnection(ctx, c.ID)
		}
	})
	t.Run("reused code", func(t *testing.T) {
		a := h.newAgent()
		first := a.toCallback(h.grant("alice", "github", nil, "c"), "alice")
		mustContain(t, a.get(first.String()), "Connected")
		for _, c := range h.connections("alice") {
			h.store.DeleteConnection(ctx, c.ID)
		}
		g2 := h.grant("alice", "github", nil, "c")
		second := a.toCallback(g2, "alice")
		q := second.Query()
		q.Set("code", first.Query().Get("code"))
		second.RawQuery = q.Encode()
		p := a.get(second.String())
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "already used or has expired")
		noConnections(t)
		if d := h.untouched(g2.ID); d != "" {
			t.Fatalf("not completed: %s", d)
		}
	})
	t.Run("expired grant", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		mustStatus(t, a.openConnect(g, "alice"), http.StatusOK)
		g2 := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g2, "alice")
		h.clock.Advance(11 * time.Minute)
		defer h.clock.Advance(-11 * time.Minute)
		p := a.get(h.srv.URL + "/connect/" + g.ID)
		mustStatus(t, p, http.StatusGone)
		mustContain(t, p, "expired")
		p = a.get(cb.String())
		mustStatus(t, p, http.StatusBadRequest)
		noConnections(t)
	})
	t.Run("provider access_denied", func(t *testing.T) {
		h.gh.SetAuthorizeError("access_denied", `<script>alert(1)</script><b>The user</b> denied access`)
		defer h.gh.SetAuthorizeError("", "")
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		p := a.get(a.toCallback(g, "alice").String())
		mustStatus(t, p, http.StatusForbidden)
		mustContain(t, p, "access was refused at GitHub", "&lt;script&gt;alert(1)&lt;/script&gt;&lt;b&gt;The user&lt;/b&gt; denied access")
		if strings.Contains(p.body, "<script>") || strings.Contains(p.body, "<b>The user") {
			t.Fatal("provider error description rendered unescaped")
		}
		noConnections(t)
		if st := h.grantState(g.ID); st != vault.GrantDenied {
			t.Fatalf("grant = %s, want denied", st)
		}
	})
	t.Run("provider 500 at token exchange", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		h.gh.FailNextTokens(1)
		p := a.get(cb.String())
		mustStatus(t, p, http.StatusBadGateway)
		mustContain(t, p, "did not answer properly", "Nothing was connected")
		noConnections(t)
		if d := h.untouched(g.ID); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("deny at consent", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "google", nil, "c")
		p := a.submit(a.openConnect(g, "alice"), "/connect/", url.Values{"decision": {"deny"}})
		mustContain(t, p, "You declined to connect your Google account")
		if st := h.grantState(g.ID); st != vault.GrantDenied {
			t.Fatalf("grant = %s, want denied", st)
		}
		p = a.get(h.srv.URL + "/connect/" + g.ID)
		mustStatus(t, p, http.StatusGone)
		noConnections(t)
	})
	t.Run("consent without csrf token", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		a.openConnect(g, "alice")
		p := a.post(h.srv.URL+"/connect/"+g.ID, url.Values{"decision": {"approve"}})
		mustStatus(t, p, http.StatusForbidden)
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/connect/"+g.ID, strings.NewReader("decision=approve"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", "cross-site")
		if p := a.do(req); p.status != http.StatusForbidden {
			t.Fatalf("cross-site POST: HTTP %d, want 403", p.status)
		}
		// The consent form writes nothing even when it succeeds, so what
		// matters is that no consent was handed out: no flow cookie.
		if a.cookie("cb_flow") != nil {
			t.Fatal("a refused consent form set the flow cookie")
		}
		if d := h.untouched(g.ID); d != "" {
			t.Fatal(d)
		}
	})
	t.Run("declined by the app during the provider step", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		if err := h.conns.Decline(ctx, h.principal("alice"), g.ID, "mcp"); err != nil {
			t.Fatal(err)
		}
		tokens := h.gh.Counts().Token
		p := a.get(cb.String())
		mustStatus(t, p, http.StatusGone)
		mustContain(t, p, "declined")
		noConnections(t)
		if h.gh.Counts().Token != tokens {
			t.Fatal("the callback for a declined request reached the token endpoint")
		}
		if st := h.grantState(g.ID); st != vault.GrantDenied {
			t.Fatalf("grant = %s, want still denied", st)
		}
	})
	t.Run("flow cookie naming another person", func(t *testing.T) {
		// Only the consent form mints the flow cookie, for the signed-in
		// person's own grant; the callback checks the person it names
		// again. A cookie sealed for bob but carrying alice's grant (which
		// no code path makes) is refused before the code is redeemed.
		a := h.newAgent()
		g := h.grant("alice", "github", nil, "c")
		cb := a.toCallback(g, "alice")
		reseal(t, h, a, func(fs *flowState) {
			if fs.Iss != h.principal("alice").Issuer || fs.Sub != h.principal("alice").Subject || fs.Grant != g.ID {
				t.Fatalf("flow cookie names %q %q for grant %s, want alice's consent to %s", fs.Iss, fs.Sub, connections.Ref(fs.Grant), connections.Ref(g.ID))
			}
			fs.Sub = h.principal("bob").Subject
		})
		tokens := h.gh.Counts().Token
		p := a.get(cb.String())
		mustStatus(t, p, http.StatusConflict)
		mustContain(t, p, "not approved by you in this browser")
		noConnections(t)
		if h.gh.Counts().Token != tokens {
			t.Fatal("the callback reached the token endpoint")
		}
		if d := h.untouched(g.ID); d != "" {
			t.Fatal(d)
		}
		if !strings.Contains(h.logs.String(), "event=callback_consent_mismatch") {
			t.Fatal("no security event logged")
		}
		// A cookie of an earlier release names no one: refused unless the
		// consent is in the store (that release's consent form approved
		// the grant), and then the callback completes it.
		g2 := h.grant("alice", "github", nil, "c")
		cb2 := a.toCallback(g2, "alice")
		legacy := reseal(t, h, a, func(fs *flowState) { fs.Iss, fs.Sub = "", "" })
		mustStatus(t, a.get(cb2.String()), http.StatusConflict)
		noConnections(t)
		// What that release's consent form wrote: the grant approved.
		if _, err := h.store.UpdateGrant(ctx, g2.ID, func(g vault.Grant) (vault.Grant, error) {
			g.State = vault.GrantApproved
			return g, nil
		}); err != nil {
			t.Fatal(err)
		}
		a.setCookie(legacy)
		mustContain(t, a.get(cb2.String()), "Connected: return to your app")
		if st := h.grantState(g2.ID); st != vault.GrantCompleted {
			t.Fatalf("approved grant with an earlier release's cookie: %s, want completed", st)
		}
		for _, c := range h.connections("alice") {
			h.store.DeleteConnection(ctx, c.ID)
		}
	})
	t.Run("static files", func(t *testing.T) {
		a := h.newAgent()
		if p := a.get(h.srv.URL + "/static/style.css"); p.status != http.StatusOK || p.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("style.css: HTTP %d", p.status)
		}
		if p := a.get(h.srv.URL + "/static/"); p.status != http.StatusNotFound {
			t.Fatalf("/static/ listing: HTTP %d, want 404", p.status)
		}
	})
	t.Run("unknown link", func(t *testing.T) {
		a := h.newAgent()
		p := a.get(h.srv.URL + "/connect/not-a-grant")
		mustStatus(t, p, http.StatusNotFound)
		mustContain(t, p, "Unknown connect link")
	})
	h.finalCheck()
}

// reseal opens a's flow cookie, lets edit change it, seals it again with
// the broker's cookie keys, sets it on a and returns it: a cookie no code
// path of the broker makes, for the callback's own checks.
func reseal(t *testing.T, h *harness, a *agent, edit func(*flowState)) *http.Cookie {
	t.Helper()
	c := a.cookie("cb_flow")
	if c == nil {
		t.Fatal("no flow cookie to reseal")
	}
	var fs flowState
	if err := securecookie.DecodeMulti(c.Name, c.Value, &fs, h.flow.jar.codecs...); err != nil {
		t.Fatal(err)
	}
	edit(&fs)
	enc, err := securecookie.EncodeMulti(c.Name, fs, h.flow.jar.codecs...)
	if err != nil {
		t.Fatal(err)
	}
	out := &http.Cookie{Name: c.Name, Value: enc}
	a.setCookie(out)
	return out
}

func TestPhishingHTTP(t *testing.T) {
	h := newHarness(t, fakeProviders)
	aliceB, bobB := h.newAgent(), h.newAgent()
	g := h.grant("alice", "github", nil, "c")
	// Bob (signed in as bob) opens Alice's link: refused at the landing page.
	p := bobB.openConnect(g, "bob")
	mustStatus(t, p, http.StatusForbidden)
	mustContain(t, p, "This link belongs to a different account", "bob@example.test")
	if strings.Contains(p.body, "alice") {
		t.Error("mismatch page reveals whose link it is")
	}
	if st := h.grantState(g.ID); st != vault.GrantPending {
		t.Fatalf("grant = %s after Bob's attempt, want pending", st)
	}
	// Bob posts the consent form for Alice's link with his own session's
	// CSRF token: refused, and no flow cookie (no consent) handed out.
	p = bobB.post(h.srv.URL+"/connect/"+g.ID, url.Values{"decision": {"approve"}, "csrf": {bobB.csrf()}})
	mustStatus(t, p, http.StatusForbidden)
	mustContain(t, p, "This link belongs to a different account")
	if bobB.cookie("cb_flow") != nil {
		t.Fatal("Bob's consent for Alice's link set a flow cookie")
	}
	if d := h.untouched(g.ID); d != "" {
		t.Fatalf("after Bob's consent form: %s", d)
	}
	// Alice approves and reaches the callback; Bob forges it with her flow
	// cookie and the provider's code: refused at the callback.
	cb := aliceB.toCallback(g, "alice")
	bobB.setCookie(aliceB.cookie("cb_flow"))
	p = bobB.get(cb.String())
	mustStatus(t, p, http.StatusForbidden)
	mustContain(t, p, "This link belongs to a different account")
	if n := len(h.connections("alice")) + len(h.connections("bob")); n != 0 {
		t.Fatalf("%d connections stored after the forged callback", n)
	}
	if c := h.gh.Counts().Token; c != 0 {
		t.Fatalf("the forged callback reached the token endpoint (%d calls)", c)
	}
	events, audits := 0, 0
	for _, line := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(line, "event=identity_mismatch") {
			if strings.Contains(line, "audit=true") {
				audits++
			} else {
				events++
			}
			if strings.Contains(line, "alice") {
				t.Errorf("security event names the grant's owner: %s", line)
			}
		}
	}
	if events != 3 || audits != 3 {
		t.Errorf("%d identity_mismatch security events and %d audit events logged, want 3 each (landing, consent form, callback):\n%s", events, audits, h.logs.String())
	}
	// Alice's own completion still works.
	mustContain(t, aliceB.get(cb.String()), "Connected: return to your app")
	if n := len(h.connections("alice")); n != 1 {
		t.Fatalf("alice has %d connections, want 1", n)
	}
	h.finalCheck()
}

// TestDisconnectOutcomesOnThePage: the connections page reports each of
// the three revocation outcomes in words, deletes the connection whatever
// the outcome, and audits it as every front door does.
func TestDisconnectOutcomesOnThePage(t *testing.T) {
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"server_error"}`, http.StatusInternalServerError)
	}))
	t.Cleanup(broken.Close)
	h := newHarness(t, func(h *harness) (string, map[string]string) {
		doc, env := fakeProviders(h)
		other := fakeprovider.NewGitHub(h.t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "gh-secret-value",
			RedirectURIs: []string{h.srv.URL + "/oauth/plain/callback", h.srv.URL + "/oauth/broken/callback"}})
		entry := func(name, revocation string) string {
			return `  ` + name + `:
    type: oauth2
    authorization_url: ` + other.URL() + `/login/oauth/authorize
    token_url: ` + other.URL() + `/login/oauth/access_token
    client_id: gh-client
    client_secret: ${GITHUB_CLIENT_SECRET}
    token_endpoint_auth: client_secret_post
    account: {url: ` + other.URL() + `/user, id_field: id, login_field: login}
` + revocation
		}
		return doc + entry("plain", "") + entry("broken", "    revocation: {style: rfc7009, url: "+broken.URL+"/revoke}\n"), env
	})
	a := h.newAgent()
	for _, tt := range []struct {
		provider, outcome, words string
	}{
		{"github", "revoked", "revoked access at the provider"},
		{"plain", "not_supported", "no way to revoke"},
		{"broken", "not_confirmed", "did not confirm the revocation"},
	} {
		t.Run(tt.outcome, func(t *testing.T) {
			g := h.grant("alice", tt.provider, nil, "Agent")
			done := a.get(a.toCallback(g, "alice").String())
			mustContain(t, done, "Connected: return to your app")
			var conn vault.Connection
			for _, c := range h.connections("alice") {
				if c.Provider == tt.provider {
					conn = c
				}
			}
			h.secret(conn.Token.AccessToken.Reveal())
			list := a.get(h.srv.URL + "/connections")
			after := a.submit(list, "/connections/"+conn.ID+"/disconnect", nil)
			mustContain(t, after, "Disconnected", tt.words)
			if _, err := h.store.GetConnection(context.Background(), conn.ID); !errors.Is(err, vault.ErrNotFound) {
				t.Fatalf("connection still stored after disconnect: %v", err)
			}
			logs := h.logs.String()
			for _, want := range []string{"event=revoke", "outcome=" + tt.outcome, "connection=" + conn.ID, "via=browser", "event=disconnect"} {
				if !strings.Contains(logs, want) {
					t.Errorf("audit lacks %q", want)
				}
			}
		})
	}
	h.finalCheck()
}

// TestCallbackIssuer (RFC 9207, mix-up defence): a provider whose metadata
// promises the iss parameter must send its own issuer; a wrong iss, or
// none when promised, stores nothing and never reaches the token
// endpoint, while the right one connects.
func TestCallbackIssuer(t *testing.T) {
	for _, tt := range []struct {
		mode       string
		advertised bool // the metadata promises iss (authorization_response_iss_parameter_supported)
		connect    bool
	}{
		{"send", true, true},
		{"wrong", true, false},
		{"omit", true, false},
		// RFC 9207 §2.4: a client compares a present iss with the issuer
		// in the provider's metadata and refuses a mismatch, promised or
		// not; only a missing iss depends on the promise.
		{"wrong-unadvertised", false, false},
	} {
		t.Run(tt.mode, func(t *testing.T) {
			h := newHarness(t, func(h *harness) (string, map[string]string) {
				h.google = fakeprovider.NewGoogle(h.t, fakeprovider.Options{
					ClientID: "google-client", ClientSecret: "google-secret-value", RedirectURIs: []string{h.srv.URL + "/oauth/google/callback"},
					Email: "alice.g@example.test", IssParameter: tt.mode,
				})
				return `providers:
  google:
    display_name: Google
    type: oidc
    issuer: ` + h.google.Issuer() + `
    client_id: google-client
    client_secret: ${S}
    default_scopes: [openid, email]
`, map[string]string{"S": "google-secret-value"}
			})
			if got := advertisesIss(t, h.google.Issuer()); got != tt.advertised {
				t.Fatalf("mode %s: the fake's metadata advertises iss: %v, want %v", tt.mode, got, tt.advertised)
			}
			a := h.newAgent()
			g := h.grant("alice", "google", nil, "c")
			cb := a.toCallback(g, "alice")
			if got := cb.Query().Get("iss"); (tt.mode == "send") != (got == h.google.Issuer()) {
				t.Fatalf("the fake sent iss %q in mode %s", got, tt.mode)
			}
			p := a.get(cb.String())
			if tt.connect {
				mustContain(t, p, "Connected: return to your app")
				if n := len(h.connections("alice")); n != 1 {
					t.Fatalf("%d connections, want 1", n)
				}
			} else {
				mustStatus(t, p, http.StatusBadRequest)
				mustContain(t, p, "did not come from Google as the broker expected", "Nothing was connected")
				if n := len(h.connections("alice")); n != 0 {
					t.Fatalf("%d connections stored after a %s iss", n, tt.mode)
				}
				if c := h.google.Counts().Token; c != 0 {
					t.Fatalf("the refused answer's code reached the token endpoint (%d calls)", c)
				}
				if !strings.Contains(h.logs.String(), "callback_issuer_mismatch") {
					t.Error("no security event logged")
				}
			}
			h.finalCheck()
		})
	}
}

// advertisesIss reports whether the OIDC metadata at issuer promises RFC
// 9207's iss parameter.
func advertisesIss(t *testing.T, issuer string) bool {
	t.Helper()
	resp, err := http.Get(issuer + "/.well-known/openid-configuration")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var md struct {
		Supported *bool `json:"authorization_response_iss_parameter_supported"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&md); err != nil {
		t.Fatal(err)
	}
	return md.Supported != nil && *md.Supported
}

// visibleText is a page's text as a person reads it: tags dropped,
// entities decoded, white space collapsed.
func visibleText(body string) string {
	s := regexp.MustCompile(`(?s)<head>.*?</head>|<[^>]+>`).ReplaceAllString(body, "")
	return strings.Join(strings.Fields(html.UnescapeString(s)), " ")
}

// TestConsentNamesTheRequestingServer: a connect request asked by a
// co-located server through the sidecar names that server as the
// administrator configured it, and shows the host's self-asserted name
// apart, as not verified; an MCP client's request is shown as before.
func TestConsentNamesTheRequestingServer(t *testing.T) {
	h := newHarness(t, corpProvider)
	const hostile = `<b>Claude</b> "Desktop"`
	for _, tc := range []struct {
		name, server, client string
		want, notWant        []string
	}{
		{"named server, host named", "demorepos", hostile,
			[]string{"Requested by demorepos, a server your administrator configured.", "Through the app " + hostile + " (name as reported by the app; not verified)"},
			[]string{"An app wants"}},
		{"named server, host silent", "demorepos", "",
			[]string{"Requested by demorepos, a server your administrator configured."},
			[]string{"Through the app", "not verified", "an unnamed client"}},
		{"unnamed secret", vault.UnnamedServer, "Claude",
			[]string{"Requested by an unnamed server your administrator configured.", "Through the app Claude (name as reported by the app; not verified)"},
			[]string{"Requested by unnamed"}},
		{"MCP client", "", "Claude",
			[]string{"An app wants to use your Corp Directory account", "Requested by Claude (name as reported by the client; not verified)"},
			[]string{"administrator configured"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h.serverGrant("alice", "corp", nil, tc.server, tc.client)
			consent := h.newAgent().openConnect(g, "alice")
			mustStatus(t, consent, http.StatusOK)
			text := visibleText(consent.body)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("consent page text lacks %q:\n%s", w, text)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(text, w) {
					t.Errorf("consent page text has %q:\n%s", w, text)
				}
			}
			if strings.Contains(consent.body, "<b>Claude") {
				t.Error("the host's name reached the page unescaped")
			}
		})
	}
}
