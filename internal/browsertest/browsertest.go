// Package browsertest starts headless Chromium for credbroker's browser
// tests, with the flags this kind of machine needs: no sandbox (tests run as
// root), no GPU, and no background networking (only loopback is reachable,
// so Chromium's own calls home would fail by the dozen).
//
// It is test support: it imports testing and is only used from _test files.
package browsertest

import (
	"context"
	"os/exec"
	"testing"

	"github.com/chromedp/chromedp"

	"credbroker/internal/testskip"
)

// Start launches Chromium and returns a chromedp context for its first tab;
// the browser stops when the test ends. Without Chromium the test fails, or
// skips when CREDBROKER_ALLOW_SKIP=1 (see internal/testskip).
func Start(tb testing.TB) context.Context {
	tb.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testskip.Missing(tb, "chromium", "no chromium on PATH; install it with: apt-get install -y chromium (.ci/deps does this)")
		return nil
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true), chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(tb.TempDir()), chromedp.WindowSize(1100, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	tb.Cleanup(func() { cancelBrowser(); cancelAlloc() })
	// The first run allocates the browser; it must use the long-lived
	// context, not a timeout child whose end would stop the browser.
	if err := chromedp.Do(browser); err != nil {
		tb.Fatalf("start chromium: %v", err)
	}
	return browser
}

// NewPerson returns a context for a fresh browser context in the running
// browser: its own cookies and storage, like a separate browser profile, so
// two people can use one Chromium at once.
func NewPerson(tb testing.TB, browser context.Context) context.Context {
	tb.Helper()
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	tb.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		tb.Fatalf("new browser context: %v", err)
	}
	return ctx
}
