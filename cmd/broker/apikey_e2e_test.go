package main

import (
	"context"
	"credbroker/internal/testskip"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// keyBrowser drives a person's browser through the demo-keys pages of a
// dev broker, remembering every broker page it saw (for the secret grep)
// and every key it read at the demo provider.
type keyBrowser struct {
	ctx context.Context

	mu    sync.Mutex
	pages []string
	keys  []string
}

func (b *keyBrowser) eval(ctx context.Context, js string) (string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[string](js))
}

// waitJS polls js (returning a string) until it answers something other
// than "", riding out navigations.
func (b *keyBrowser) waitJS(ctx context.Context, js string) (string, error) {
	for {
		v, err := b.eval(ctx, js)
		if err == nil && v != "" {
			return v, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %s: %w", js, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// keep records the current broker page's HTML.
func (b *keyBrowser) keep(ctx context.Context) {
	html, err := b.eval(ctx, `document.documentElement.outerHTML`)
	if err == nil {
		b.mu.Lock()
		b.pages = append(b.pages, html)
		b.mu.Unlock()
	}
}

// demoKey reads login's current key on the demo provider's key page.
func (b *keyBrowser) demoKey(ctx context.Context, keysURL, login string) (string, error) {
	if err := chromedp.Do(ctx, chromedp.Navigate(keysURL)); err != nil {
		return "", err
	}
	key, err := b.waitJS(ctx, fmt.Sprintf(`(document.querySelector('code.key[data-login=%s]') || {}).textContent || ""`, strconv.Quote(login)))
	if err == nil {
		b.mu.Lock()
		b.keys = append(b.keys, key)
		b.mu.Unlock()
	}
	return key, err
}

// rotate presses "Make a new key" for login on the demo key page and
// returns the new key.
func (b *keyBrowser) rotate(ctx context.Context, keysURL, login string) (string, error) {
	old, err := b.demoKey(ctx, keysURL, login)
	if err != nil {
		return "", err
	}
	// Mark the document, submit, and wait for the page the form leads to
	// (navigating away early would abort the post).
	if _, err := b.eval(ctx, `window.__leaving = "yes"`); err != nil {
		return "", err
	}
	if err := chromedp.Do(ctx, press(fmt.Sprintf(`button[name=rotate][value=%s]`, strconv.Quote(login)))); err != nil {
		return "", err
	}
	key, err := b.waitJS(ctx, fmt.Sprintf(`window.__leaving !== "yes" && document.readyState === "complete" && (document.querySelector('code.key[data-login=%s]') || {}).textContent || ""`, strconv.Quote(login)))
	if err != nil {
		return "", err
	}
	if key == old {
		return "", fmt.Errorf("the key of %s did not change", login)
	}
	b.mu.Lock()
	b.keys = append(b.keys, key)
	b.mu.Unlock()
	return key, nil
}

// enterKey does what a person does with a demo-keys connect link: open
// it (signing in at the dev IdP when asked), follow the page's link to
// the demo provider's key page, read the key of demo account login, come
// back, enter key (the one read when key is "") and submit. It returns
// the page's text once it shows want.
func (b *keyBrowser) enterKey(bctx context.Context, link, user, login, key, want string) (string, error) {
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(link)); err != nil {
		return "", err
	}
	at, err := b.waitJS(ctx, `document.querySelector('input[name=username]') ? "login" : document.querySelector('input[name="field.api_key"]') ? "key" : ""`)
	if err != nil {
		return "", err
	}
	if at == "login" {
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(chromedp.CSS(`input[name=username]`), user),
			chromedp.SendKeys(chromedp.CSS(`input[name=password]`), user),
			press(`form [type=submit]`),
			chromedp.WaitVisible(chromedp.CSS(`input[name="field.api_key"]`)),
		); err != nil {
			return "", err
		}
	}
	b.keep(ctx)
	typ, _ := b.eval(ctx, `[document.querySelector('input[name="field.api_key"]').type, document.querySelector('input[name="field.api_key"]').autocomplete].join(" ")`)
	if typ != "password off" {
		return "", fmt.Errorf("the key input is %q, want a password input with autocomplete off", typ)
	}
	keysURL, err := b.waitJS(ctx, `(document.querySelector('a.instructions-url') || {}).href || ""`)
	if err != nil {
		return "", err
	}
	if key == "" {
		if key, err = b.demoKey(ctx, keysURL, login); err != nil {
			return "", err
		}
		if err := chromedp.Do(ctx, chromedp.Navigate(link), chromedp.WaitVisible(chromedp.CSS(`input[name="field.api_key"]`))); err != nil {
			return "", err
		}
	}
	if err := chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`input[name="field.api_key"]`), key),
		press(`button[name=decision][value=approve]`),
	); err != nil {
		return "", err
	}
	if err := waitForText(ctx, want); err != nil {
		page, _ := b.eval(bctx, `document.body.innerText`)
		return "", fmt.Errorf("%v\npage now: %s", err, page)
	}
	b.keep(ctx)
	return b.eval(ctx, `document.body.innerText`)
}

// TestDevAPIKeyEndToEnd is the API-key walkthrough in Chromium against
// broker dev: alice connects demo-keys by entering the key shown at the
// demo provider (after a wrong key is refused), the go-sdk client's MRTR
// retry completes, provider_request reaches the keys API as alice; the key
// is replaced at the provider, so the next call re-elicits ("your key was
// rejected") and a new key keeps the same connection; Replace key and
// Disconnect on the connections page. No key appears in a tool result, a
// broker page or the broker's log.
func TestDevAPIKeyEndToEnd(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	d := startDev(t, freeAddr(t), t.TempDir())
	bctx := browserPerson(t)
	ctx := testContext(t, 3*time.Minute)
	b := &keyBrowser{ctx: bctx}
	keysURL := d.BaseURL + "/dev/provider/keys"
	var results strings.Builder
	var messages []string
	handler := func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		if req.Params.Mode != "url" {
			return nil, fmt.Errorf("asked in %s mode for an API key", req.Params.Mode)
		}
		messages = append(messages, req.Params.Message)
		if len(messages) == 1 {
			// A wrong key first: refused by the provider, nothing stored.
			text, err := b.enterKey(bctx, req.Params.URL, "alice", "alice-demo", "demo_"+strings.Repeat("W", 43), "refused by Demo keys (401)")
			if err != nil {
				return nil, err
			}
			if !strings.Contains(text, "Nothing was stored") {
				return nil, fmt.Errorf("wrong key page: %s", text)
			}
		}
		if _, err := b.enterKey(bctx, req.Params.URL, "alice", "alice-demo", "", "Connected"); err != nil {
			return nil, err
		}
		return &mcp.ElicitResult{Action: "accept"}, nil
	}
	cs := mcpSession(t, ctx, d.BaseURL+"/mcp", d.Token("alice"), handler)
	call := func(tool string, args map[string]any) map[string]any {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		got := structured(t, res)
		results.WriteString(fmt.Sprint(got))
		if res.IsError {
			t.Fatalf("%s: tool error %v", tool, got)
		}
		return got
	}

	connected := call("connect_account", map[string]any{"provider": "demo-keys"})
	conn, _ := connected["connection"].(map[string]any)
	if connected["status"] != "connected" || conn["account"] != "alice-demo" || len(messages) != 1 {
		t.Fatalf("connect_account: %v after %d elicitations", connected, len(messages))
	}
	me := map[string]any{"provider": "demo-keys", "method": "GET", "path": "/me"}
	if got := call("provider_request", me); got["status"] != float64(200) || !strings.Contains(fmt.Sprint(got["body"]), `"login":"alice-demo"`) {
		t.Fatalf("provider_request: %v", got)
	}

	// alice makes a new key at the provider: the stored one is refused.
	if _, err := b.rotate(bctx, keysURL, "alice-demo"); err != nil {
		t.Fatal(err)
	}
	if got := call("provider_request", me); got["status"] != float64(200) || !strings.Contains(fmt.Sprint(got["body"]), "alice-demo") {
		t.Fatalf("provider_request after re-entering the key: %v", got)
	}
	if len(messages) != 2 || !strings.Contains(messages[1], "key was rejected; enter a new one") {
		t.Fatalf("re-elicitation messages %q", messages)
	}
	list := call("list_connections", map[string]any{})
	if conns := list["connections"].([]any); len(conns) != 1 || conns[0].(map[string]any)["id"] != conn["id"] {
		t.Fatalf("after a new key: %v (want the same connection %v)", list, conn["id"])
	}

	t.Run("replace key and disconnect on the connections page", func(t *testing.T) {
		bctx, cancel := context.WithTimeout(bctx, time.Minute)
		defer cancel()
		fresh, err := b.rotate(bctx, keysURL, "alice-demo")
		if err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(bctx, chromedp.Navigate(d.BaseURL+"/connections"), chromedp.WaitVisible(chromedp.CSS(`a.replace-key`))); err != nil {
			t.Fatal(err)
		}
		b.keep(bctx)
		if err := chromedp.Do(bctx, press(`a.replace-key`), chromedp.WaitVisible(chromedp.CSS(`input[name="field.api_key"]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name="field.api_key"]`), fresh),
			press(`button[name=decision][value=approve]`)); err != nil {
			t.Fatal(err)
		}
		if err := waitForText(bctx, "Key replaced"); err != nil {
			t.Fatal(err)
		}
		b.keep(bctx)
		if got := call("provider_request", me); got["status"] != float64(200) || len(messages) != 2 {
			t.Fatalf("after Replace key: %v (%d elicitations)", got, len(messages))
		}
		if err := chromedp.Do(bctx, press(`form[action$="/disconnect"] button`)); err != nil {
			t.Fatal(err)
		}
		if err := waitForText(bctx, "revoke it at Demo keys too"); err != nil {
			t.Fatal(err)
		}
		b.keep(bctx)
		href, _ := b.eval(bctx, `(document.querySelector('.notice a') || {}).href || ""`)
		if href != keysURL {
			t.Errorf("the notice links to %q, want the demo key page %s", href, keysURL)
		}
		if got := call("list_connections", map[string]any{}); len(got["connections"].([]any)) != 0 {
			t.Fatalf("after Disconnect: %v", got)
		}
	})

	// The secret grep: every key read at the demo provider, and the wrong
	// one typed, in no tool result, broker page or broker log line.
	secrets := append([]string{"demo_" + strings.Repeat("W", 43)}, b.keys...)
	if len(b.keys) < 3 {
		t.Fatalf("only %d keys were read; the grep would prove little", len(b.keys))
	}
	b.mu.Lock()
	pages := strings.Join(b.pages, "\n")
	b.mu.Unlock()
	for _, where := range []struct{ name, text string }{{"tool results", results.String()}, {"broker pages", pages}, {"broker log", d.Stderr()}} {
		for _, k := range secrets {
			if strings.Contains(where.text, k) {
				t.Errorf("the %s hold an API key", where.name)
			}
		}
	}
	if !d.WaitStderr("needs_reconnect", time.Minute) {
		t.Error("the broker log has no needs_reconnect audit event")
	}
}

// browserPerson starts Chromium and returns a fresh person's browser.
func browserPerson(t *testing.T) context.Context {
	return personBrowser(t, newBrowser(t))
}
