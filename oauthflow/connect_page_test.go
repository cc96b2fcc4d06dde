package oauthflow

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// grants returns how many connect requests user has in the store.
func (h *harness) grants(user string) int {
	h.t.Helper()
	gs, err := h.store.ListGrants(context.Background(), vault.Principal{Issuer: h.idp.Issuer(), Subject: user}, time.Time{})
	if err != nil {
		h.t.Fatal(err)
	}
	return len(gs)
}

// signedIn returns an agent signed in as user, on the connections page.
func (h *harness) signedIn(user string) (*agent, page) {
	h.t.Helper()
	a := h.newAgent()
	p := a.signInIfAsked(a.get(h.srv.URL+"/connections"), user)
	mustStatus(h.t, p, http.StatusOK)
	return a, p
}

// TestConnectButtonBrowser: in Chromium, the signed-in connections page
// shows Connect for a provider the person has not connected; the button
// leads through the broker's consent, the provider and the callback (the
// person checked again there), and the page then lists the connection and
// no longer offers that provider.
func TestConnectButtonBrowser(t *testing.T) {
	h := newHarness(t, fakeProviders)
	alice := h.browserUser(t, startChromium(t), "alice")
	alice.open("/connections", "alice")
	alice.waitFor(`tr[data-provider="github"] button.connect`)
	if got := alice.text(`tr[data-provider="google"] td`); got != "Google" {
		t.Errorf("Google's offer row names %q", got)
	}
	alice.screenshot("connections-offers")
	alice.clickThen(`tr[data-provider="github"] button.connect`, "form.actions")
	if got := alice.text("h1"); got != "Connect your GitHub account?" {
		t.Fatalf("after Connect the page says %q, want the broker's consent", got)
	}
	if !strings.Contains(alice.location(), "/connect/") {
		t.Fatalf("after Connect the browser is at %s, want a connect link", alice.location())
	}
	// No app asked: the page does not invent one.
	if text := visibleText(alice.html()); !strings.Contains(text, "names no app (started with Connect on My connections") || strings.Contains(text, "an unnamed client") {
		t.Errorf("the consent page names a requester:\n%s", text)
	}
	alice.approveAll("h1.ok")
	conns := h.connections("alice")
	if len(conns) != 1 || conns[0].Provider != "github" || conns[0].AccountLogin != "octocat" || conns[0].Status != vault.StatusActive {
		t.Fatalf("connections after the Connect button: %+v", conns)
	}
	h.secret(conns[0].Token.AccessToken.Reveal())
	h.secret(conns[0].Token.RefreshToken.Reveal())
	alice.visit(h.srv.URL+"/connections", `tr[data-connection="`+conns[0].ID+`"]`)
	if row := alice.text(`tr[data-connection="` + conns[0].ID + `"]`); !strings.Contains(row, "GitHub") || !strings.Contains(row, "octocat") {
		t.Errorf("the page's row for the new connection: %q", row)
	}
	page := alice.html()
	if strings.Contains(page, `data-provider="github"`) || !strings.Contains(page, `data-provider="google"`) {
		t.Errorf("after connecting GitHub the page should offer Google only:\n%s", page)
	}
	alice.screenshot("connections-after-connect")
	h.finalCheck()
}

// TestConnectButtonRefusals: a Connect post without the session's CSRF
// token, with another one, signed out, for an unknown provider or past the
// limits of connect requests is refused with its own page and stores no
// connect request; posting for a connected provider starts nothing.
func TestConnectButtonRefusals(t *testing.T) {
	h := newHarness(t, fakeProviders)
	a, _ := h.signedIn("alice")
	csrf := a.csrf()
	for _, tc := range []struct {
		name, path string
		form       url.Values
		signedOut  bool
		status     int
		says       string
	}{
		{"no CSRF token", "/connections/github/connect", url.Values{}, false, http.StatusForbidden, "Form expired"},
		{"another CSRF token", "/connections/github/connect", url.Values{"csrf": {"forged-token"}}, false, http.StatusForbidden, "Form expired"},
		{"signed out", "/connections/github/connect", url.Values{"csrf": {csrf}}, true, http.StatusUnauthorized, "You are signed out"},
		{"unknown provider", "/connections/gitlab/connect", url.Values{"csrf": {csrf}}, false, http.StatusNotFound, "Unknown provider &#34;gitlab&#34;. Valid providers: github, google."},
		{"hostile provider name", "/connections/" + url.PathEscape("<b>x</b>") + "/connect", url.Values{"csrf": {csrf}}, false, http.StatusNotFound, "Unknown provider &#34;&lt;b&gt;x&lt;/b&gt;&#34;"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := a
			if tc.signedOut {
				b = h.newAgent()
			}
			p := b.post(h.srv.URL+tc.path, tc.form)
			mustStatus(t, p, tc.status)
			mustContain(t, p, tc.says)
			if n := h.grants("alice"); n != 0 {
				t.Fatalf("a refused Connect stored %d connect requests", n)
			}
		})
	}

	t.Run("past the limit of open requests", func(t *testing.T) {
		for range 10 {
			h.grant("alice", "google", nil, "Some Agent")
		}
		p := a.post(h.srv.URL+"/connections/github/connect", url.Values{"csrf": {csrf}})
		mustStatus(t, p, http.StatusTooManyRequests)
		mustContain(t, p, "Too many connect requests are open", "Nothing was connected.")
		if n := h.grants("alice"); n != 10 {
			t.Fatalf("a refused Connect left %d connect requests, want the 10 there were", n)
		}
	})
	h.finalCheck()
}

// TestConnectButtonKinds: the Connect button of an API-key provider leads
// to the key form, and that of a type: mcp provider through the broker's
// consent (naming the relayed server) to the server's authorization; once
// connected, posting again starts nothing.
func TestConnectButtonKinds(t *testing.T) {
	t.Run("api key", func(t *testing.T) {
		h := newHarness(t, demoKeys)
		a, p := h.signedIn("alice")
		mustContain(t, p, `action="/connections/demo-keys/connect"`, "you will enter an API key")
		p = a.submit(p, "/connections/demo-keys/connect", nil)
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, `name="field.api_key"`)
		if !strings.HasPrefix(p.url.Path, "/connect/") || h.grants("alice") != 1 {
			t.Fatalf("the key form is at %s with %d connect requests", p.url.Path, h.grants("alice"))
		}
		h.finalCheck()
	})
	t.Run("mcp", func(t *testing.T) {
		h := newHarness(t, demoMCP)
		upstream := strings.TrimSuffix(h.demo.Issuer(), "/demo") + "/mcp"
		a, p := h.signedIn("alice")
		p = a.submit(p, "/connections/demo-mcp/connect", nil)
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, `<span class="relay">`+upstream+`</span>`, "Approve")
		p = a.submit(p, "/connect/", url.Values{"decision": {"approve"}})
		p = a.submit(p, "authorize", url.Values{"account": {"1001"}, "decision": {"approve"}})
		mustContain(t, p, "Connected")
		conns := h.connections("alice")
		if len(conns) != 1 || conns[0].Provider != "demo-mcp" {
			t.Fatalf("connections %+v", conns)
		}
		h.secret(conns[0].Token.AccessToken.Reveal())
		h.secret(conns[0].Token.RefreshToken.Reveal())
		p = a.get(h.srv.URL + "/connections")
		if strings.Contains(p.body, `/connections/demo-mcp/connect`) {
			t.Fatalf("a connected provider is still offered:\n%s", p.body)
		}
		// Posting anyway starts nothing and says so.
		before := h.grants("alice")
		p = a.post(h.srv.URL+"/connections/demo-mcp/connect", url.Values{"csrf": {a.csrf()}})
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, "connected already")
		if h.grants("alice") != before {
			t.Fatal("Connect of a connected provider stored a request")
		}
		h.finalCheck()
	})
}
