package oauthflow

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"credbroker/internal/browsertest"
	"credbroker/vault"
)

// browserUser is one person's browser: its own browser context (cookie
// store) in the shared Chromium.
type browserUser struct {
	t    *testing.T
	h    *harness
	ctx  context.Context
	name string
}

func startChromium(t *testing.T) context.Context { return browsertest.Start(t) }

func (h *harness) browserUser(t *testing.T, browser context.Context, name string) *browserUser {
	return &browserUser{t: t, h: h, ctx: browsertest.NewPerson(t, browser), name: name}
}

// in returns b reporting to t (each subtest reports to its own t).
func (b *browserUser) in(t *testing.T) *browserUser {
	c := *b
	c.t = t
	return &c
}

func (b *browserUser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.screenshot("failure-" + b.name)
		b.t.Fatalf("%s: %s: %v (at %s)", b.name, what, err, b.location())
	}
}

func (b *browserUser) location() string {
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	return loc
}

func (b *browserUser) html() string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil {
		b.t.Fatalf("%s: read page: %v", b.name, err)
	}
	b.h.seenMu.Lock()
	b.h.seen = append(b.h.seen, b.location(), s)
	b.h.seenMu.Unlock()
	return s
}

func (b *browserUser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("%s: text of %s: %v (at %s)", b.name, sel, err, b.location())
	}
	return strings.TrimSpace(s)
}

// waitFor waits until the page shows sel. A query started while the page
// navigates can stay bound to the old document, so it retries with short
// timeouts.
func (b *browserUser) waitFor(sel string) {
	b.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 700*time.Millisecond)
		err := chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(sel)))
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) || b.ctx.Err() != nil {
			b.screenshot("failure-" + b.name)
			b.t.Fatalf("%s: %s never appeared: %v (at %s)", b.name, sel, err, b.location())
		}
	}
}

// clickThen clicks sel and waits for the next page to show next.
// Every click here submits a form, so it first marks the current document
// and waits until a new document has replaced it: next may also exist on
// the page being left.
func (b *browserUser) clickThen(sel, next string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 15*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__leaving = true`)); err != nil {
		b.t.Fatalf("%s: mark page: %v", b.name, err)
	}
	b.do("click "+sel, chromedp.Click(chromedp.CSS(sel)))
	for {
		gone, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.readyState !== "loading" && window.__leaving !== true`))
		if err == nil && gone {
			break
		}
		select {
		case <-ctx.Done():
			b.t.Fatalf("%s: click %s: the page did not change (at %s)", b.name, sel, b.location())
		case <-time.After(50 * time.Millisecond):
		}
	}
	b.waitFor(next)
}

// visit navigates to an absolute URL and waits for sel.
func (b *browserUser) visit(u, sel string) {
	b.t.Helper()
	b.do("navigate", chromedp.Navigate(u))
	b.waitFor(sel)
}

// screenshot writes the current page to test-output/<name>.png.
func (b *browserUser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	dir := filepath.Join("..", "test-output")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oauthflow-"+name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// open navigates to path on the broker and signs in at the IdP when asked.
// It returns once a broker page (or the held callback) is shown.
func (b *browserUser) open(path, user string) {
	b.t.Helper()
	b.visit(b.h.srv.URL+path, "main")
	if strings.Contains(b.location(), "/idp/") {
		b.do("sign in as "+user,
			chromedp.WaitVisible(chromedp.CSS(`input[name="username"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="username"]`), user),
			chromedp.SendKeys(chromedp.CSS(`input[name="password"]`), user),
		)
		b.clickThen(`button[type="submit"]`, "main.card")
	}
}

// approveAtProvider clicks Approve on the broker's consent page, then on the
// provider's consent page, and waits for the page after the callback.
func (b *browserUser) approveAll(waitSel string) {
	b.t.Helper()
	// The provider's consent page: its form has no "actions" class.
	b.clickThen(`form.actions button[name="decision"][value="approve"]`, `form:not(.actions) button[name="decision"][value="approve"]`)
	b.clickThen(`button[name="decision"][value="approve"]`, waitSel)
}

func (b *browserUser) cookie(name string) *network.Cookie {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	cs, err := chromedp.Run(ctx, func(ctx context.Context, t *chromedp.Target) ([]*network.Cookie, error) {
		r, err := cdp.Call(ctx, t, network.GetCookies, network.GetCookiesParams{URLs: []string{b.h.srv.URL + "/"}})
		return r.Cookies, err
	})
	if err != nil {
		b.t.Fatalf("get cookies: %v", err)
	}
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	b.t.Fatalf("%s has no cookie %s", b.name, name)
	return nil
}

func (b *browserUser) setCookie(c *network.Cookie) {
	b.t.Helper()
	b.do("set cookie", func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, network.SetCookie, network.SetCookieParams{Name: c.Name, Value: c.Value, URL: b.h.srv.URL + "/"})
		return chromedp.Void{}, err
	})
}

func TestBrowserFlows(t *testing.T) {
	h := newHarness(t, fakeProviders)
	browser := startChromium(t)
	aliceB := h.browserUser(t, browser, "alice")
	bobB := h.browserUser(t, browser, "bob")
	const hostile = `<script>alert("pwned")</script> Evil <b>Agent</b> & co`

	t.Run("github", func(t *testing.T) {
		alice, bob := aliceB.in(t), bobB.in(t)
		_ = bob
		g := h.grant("alice", "github", []string{"read:user", "repo"}, hostile)
		alice.open("/connect/"+g.ID, "alice")
		alice.waitFor("form.actions")
		if got := alice.text(".client"); got != hostile {
			t.Errorf("client name shown as %q, want the literal text %q", got, hostile)
		}
		page := alice.html()
		if strings.Contains(page, "<script>") || !strings.Contains(page, "GitHub") || !strings.Contains(page, "127.0.0.1") {
			t.Errorf("consent page: script tag present or provider/domain missing")
		}
		alice.screenshot("consent")
		alice.approveAll("h1.ok")
		if got := alice.text("h1"); got != "Connected: return to your app" {
			t.Fatalf("done page heading = %q", got)
		}
		alice.html()
		alice.screenshot("done")
		assertConnected(t, h, g, "github", "octocat")
	})

	t.Run("google", func(t *testing.T) {
		alice, bob := aliceB.in(t), bobB.in(t)
		_ = bob
		g := h.grant("alice", "google", []string{"openid", "email"}, "Claude Desktop")
		alice.open("/connect/"+g.ID, "alice")
		alice.waitFor("form.actions")
		alice.approveAll("h1.ok")
		alice.html()
		alice.screenshot("done-google")
		c := assertConnected(t, h, g, "google", "alice.g@example.test")
		if c.Token.RefreshToken == "" {
			t.Error("Google connection stored without a refresh token (access_type=offline, prompt=consent)")
		}
	})

	t.Run("phishing", func(t *testing.T) {
		alice, bob := aliceB.in(t), bobB.in(t)
		_ = bob
		before := len(h.connections("alice"))
		tokenCalls := h.gh.Counts().Token
		g := h.grant("alice", "github", nil, "Innocent App")
		// Bob signed in as bob opens Alice's link.
		bob.open("/connect/"+g.ID, "bob")
		if got := bob.text("h1"); got != "This link belongs to a different account" {
			t.Fatalf("Bob sees %q at the landing page", got)
		}
		if strings.Contains(bob.html(), "alice") {
			t.Error("mismatch page reveals whose link it is")
		}
		bob.screenshot("mismatch")
		// Alice approves; her browser's callback is held by the test.
		alice.open("/connect/"+g.ID, "alice")
		alice.waitFor("form.actions")
		h.hold.Store(true)
		defer h.hold.Store(false)
		alice.approveAll("#held")
		cb := h.takeHeld()
		// Bob forges the callback with Alice's flow cookie and code.
		bob.setCookie(alice.cookie("cb_flow"))
		bob.visit(cb, "main.card h1")
		if got := bob.text("h1"); got != "This link belongs to a different account" {
			t.Fatalf("Bob's forged callback shows %q", got)
		}
		bob.screenshot("mismatch-callback")
		if len(h.connections("bob")) != 0 || len(h.connections("alice")) != before || h.gh.Counts().Token != tokenCalls {
			t.Fatal("the forged callback stored something or reached the token endpoint")
		}
		if d := h.untouched(g.ID); d != "" {
			t.Fatalf("after the forged callback: %s", d)
		}
		// Alice's own completion still works (same GitHub account: updated).
		alice.visit(cb, "h1.ok")
		assertConnected(t, h, g, "github", "octocat")
	})

	t.Run("pages", func(t *testing.T) {
		alice, bob := aliceB.in(t), bobB.in(t)
		_ = bob
		// Unknown link.
		alice.open("/connect/AAAAAAAAAAAAAAAAAAAAAA", "alice")
		if got := alice.text("h1"); got != "Unknown connect link" {
			t.Errorf("unknown link heading = %q", got)
		}
		alice.screenshot("unknown-link")
		// Deny at the consent page.
		g := h.grant("alice", "google", nil, "Some Agent")
		alice.open("/connect/"+g.ID, "alice")
		alice.clickThen(`form.actions button[value="deny"]`, "main.card h1:not(.x)")
		if got := alice.text("h1"); got != "Not connected" {
			t.Errorf("denied heading = %q", got)
		}
		alice.screenshot("denied")
		// Provider refuses, with markup in its description.
		h.gh.SetAuthorizeError("access_denied", `<img src=x onerror=alert(1)> The <b>user</b> said no`)
		g = h.grant("alice", "github", nil, "Some Agent")
		alice.open("/connect/"+g.ID, "alice")
		alice.clickThen(`form.actions button[value="approve"]`, ".detail")
		h.gh.SetAuthorizeError("", "")
		if got := alice.text(".detail q"); got != `<img src=x onerror=alert(1)> The <b>user</b> said no` {
			t.Errorf("provider description shown as %q", got)
		}
		alice.screenshot("provider-denied")
		// Expired link.
		g = h.grant("alice", "github", nil, "Some Agent")
		h.clock.Advance(11 * time.Minute)
		alice.open("/connect/"+g.ID, "alice")
		h.clock.Advance(-11 * time.Minute)
		if got := alice.text("h1"); got != "This connect link has expired" {
			t.Errorf("expired heading = %q", got)
		}
		alice.screenshot("expired")
		// My connections, then sign out.
		alice.open("/connections", "alice")
		alice.waitFor("table.conns")
		alice.screenshot("connections")
		// The signed-in pages also link to /connections, so wait for the
		// signed-out page's own paragraph.
		alice.clickThen(`form[action="/logout"] button`, `#signed-out`)
		if got := alice.text("h1"); got != "Signed out" {
			t.Errorf("sign-out heading = %q", got)
		}
		alice.screenshot("signed-out")
		alice.html()
	})
	h.finalCheck()
}

func assertConnected(t *testing.T, h *harness, g vault.Grant, provider, login string) vault.Connection {
	t.Helper()
	gg, err := h.store.GetGrant(context.Background(), g.ID)
	if err != nil || gg.State != vault.GrantCompleted {
		t.Fatalf("grant = %+v, %v; want completed", gg, err)
	}
	c, err := h.store.GetConnection(context.Background(), gg.ConnectionID)
	if err != nil {
		t.Fatalf("completed grant's connection: %v", err)
	}
	if c.Provider != provider || c.AccountLogin != login || c.Token.AccessToken == "" || c.Principal.Subject != "alice" || c.Status != vault.StatusActive {
		t.Fatalf("connection = %+v", c)
	}
	h.secret(c.Token.AccessToken.Reveal())
	h.secret(c.Token.RefreshToken.Reveal())
	return c
}
