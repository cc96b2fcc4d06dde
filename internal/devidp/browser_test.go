package devidp_test

import (
	"context"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/oauth2"

	"credbroker/internal/browsertest"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/testskip"
)

// TestBrowserSignIn signs in through headless Chromium: the form, the
// session cookie (second sign-in is immediate) and prompt=login. Screenshots
// go to $TEST_OUTPUT_DIR when set.
func TestBrowserSignIn(t *testing.T) {
	testskip.Short(t, "browser test")
	// The RP: a callback page on its own loopback server.
	rpMux := http.NewServeMux()
	rp := httptest.NewServer(rpMux)
	defer rp.Close()
	rpMux.HandleFunc("GET /cb", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		if r.URL.Query().Get("code") != "" {
			_, _ = w.Write([]byte(`<html><body><p id="result">code received</p></body></html>`))
			return
		}
		_, _ = w.Write([]byte(`<html><body><p id="result">error</p></body></html>`))
	})
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "web", Secret: "web-secret", RedirectURIs: []string{rp.URL + "/cb"}}})
	cfg := oauth2.Config{ClientID: "web", RedirectURL: rp.URL + "/cb", Scopes: []string{"openid"},
		Endpoint: oauth2.Endpoint{AuthURL: idp.Issuer() + "/authorize"}}

	browser := browsertest.Start(t)
	ctx, cancelTimeout := context.WithTimeout(browser, 30*time.Second)
	defer cancelTimeout()

	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	shot := func(name string) {
		t.Helper()
		dir := os.Getenv("TEST_OUTPUT_DIR")
		if dir == "" {
			return
		}
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "devidp-"+name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	verifier := oauth2.GenerateVerifier()
	run("open", chromedp.Navigate(cfg.AuthCodeURL("s1", oauth2.S256ChallengeOption(verifier))),
		chromedp.WaitVisible(chromedp.CSS(`input[name=username]`)))
	shot("login")
	run("wrong password", chromedp.SendKeys(chromedp.CSS(`input[name=username]`), "alice"),
		chromedp.SendKeys(chromedp.CSS(`input[name=password]`), "wrong"),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`.error`)))
	shot("login-error")
	if got := text(`.error`); !strings.Contains(got, "Wrong username or password") {
		t.Fatalf("error %q", got)
	}
	run("sign in", chromedp.SetValue(chromedp.CSS(`input[name=username]`), "alice"),
		chromedp.SendKeys(chromedp.CSS(`input[name=password]`), "alice"),
		chromedp.Click(chromedp.CSS(`button[type=submit]`)),
		chromedp.WaitVisible(chromedp.CSS(`#result`)))
	if got := text(`#result`); got != "code received" {
		t.Fatalf("result %q", got)
	}
	// The session cookie makes a second authorization immediate.
	run("second authorization", chromedp.Navigate(cfg.AuthCodeURL("s2", oauth2.S256ChallengeOption(verifier))),
		chromedp.WaitVisible(chromedp.CSS(`#result`)))
	if got := text(`#result`); got != "code received" {
		t.Fatalf("second sign-in: %q", got)
	}
	// prompt=login forces the form.
	run("prompt=login", chromedp.Navigate(cfg.AuthCodeURL("s3", oauth2.SetAuthURLParam("prompt", "login"))),
		chromedp.WaitVisible(chromedp.CSS(`input[name=password]`)))
}

// TestBrowserCrossSiteSignInRefused is the login CSRF attack in Chromium:
// mallory starts an auth request and reads its sign-in form; her page on
// another site makes the victim's browser post that form with bob's
// password. The IdP refuses it, the victim's browser gets no session (her
// next authorization shows the form), and mallory's request stays unused.
func TestBrowserCrossSiteSignInRefused(t *testing.T) {
	testskip.Short(t, "browser test")
	rpMux := http.NewServeMux()
	rp := httptest.NewServer(rpMux)
	defer rp.Close()
	rpMux.HandleFunc("GET /cb", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<html><body><p id="result">code received</p></body></html>`))
	})
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "web", Secret: "web-secret", RedirectURIs: []string{rp.URL + "/cb"}}})
	cfg := oauth2.Config{ClientID: "web", RedirectURL: rp.URL + "/cb", Scopes: []string{"openid"},
		Endpoint: oauth2.Endpoint{AuthURL: idp.Issuer() + "/authorize"}}

	// Mallory's live request and its form, read in her own client.
	p := get(t, browser(t), cfg.AuthCodeURL("mallory", oauth2.S256ChallengeOption(oauth2.GenerateVerifier())))
	attack := loginForm(t, p, url.Values{"username": {"bob"}, "password": {"bob"}})
	if attack.vals.Get("csrf") == "" {
		t.Fatalf("form without a csrf token: %s", p.body)
	}
	// Her page, on another site: "localhost" is not the IdP's 127.0.0.1.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		var b strings.Builder
		fmt.Fprintf(&b, `<html><body><form method="post" action="%s">`, html.EscapeString(attack.target))
		for k, vs := range attack.vals {
			fmt.Fprintf(&b, `<input type="hidden" name="%s" value="%s">`, html.EscapeString(k), html.EscapeString(vs[0]))
		}
		b.WriteString(`</form><script>document.forms[0].submit()</script></body></html>`)
		_, _ = io.WriteString(w, b.String())
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)

	ctx, cancel := context.WithTimeout(browsertest.Start(t), 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(evilURL), chromedp.WaitVisible(chromedp.CSS(`.error, #result`))); err != nil {
		t.Fatalf("attack page: %v", err)
	}
	got, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(`body`)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got, "nobody was signed in") {
		t.Fatalf("the cross-site post was not refused; the browser shows: %q", strings.TrimSpace(got))
	}
	// No session: the victim's next authorization asks her to sign in.
	if err := chromedp.Do(ctx, chromedp.Navigate(cfg.AuthCodeURL("victim", oauth2.S256ChallengeOption(oauth2.GenerateVerifier()))),
		chromedp.WaitVisible(chromedp.CSS(`input[name=password], #result`))); err != nil {
		t.Fatalf("victim's authorization: %v", err)
	}
	if got, err := chromedp.Run(ctx, chromedp.Location()); err != nil || strings.HasPrefix(got, rp.URL) {
		t.Fatalf("the victim's browser was signed in silently (now at %s, %v)", got, err)
	}
	// Mallory's request is still waiting for a sign-in.
	if p := get(t, browser(t), attack.target+"?authRequestID="+url.QueryEscape(attack.vals.Get("authRequestID"))); p.status != http.StatusOK || !strings.Contains(p.body, `name="password"`) {
		t.Fatalf("mallory's request was used: %d %s", p.status, p.body)
	}
}
