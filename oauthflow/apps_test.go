package oauthflow

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/vault"
)

// fakeApps stands in for the authorization server behind "Apps with
// access": a fixed list per person, and a record of what was removed.
type fakeApps struct {
	mu      sync.Mutex
	apps    map[string][]apps.App // by subject
	removed []string
}

func (f *fakeApps) List(_ context.Context, p vault.Principal) ([]apps.App, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.apps[p.Subject]), nil
}

func (f *fakeApps) Remove(_ context.Context, p vault.Principal, id string, by apps.Actor) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.apps[p.Subject], func(a apps.App) bool { return a.ID == id })
	if i < 0 {
		return apps.ErrNoSuchApp
	}
	f.apps[p.Subject] = slices.Delete(f.apps[p.Subject], i, i+1)
	f.removed = append(f.removed, id+" via "+by.Via)
	return nil
}

// TestAppsWithAccess: /connections lists the apps a person allowed, marked
// verified or not and escaped, and removes one only by the person's own
// form (CSRF) and only among the person's own apps.
func TestAppsWithAccess(t *testing.T) {
	h := newHarness(t, fakeProviders)
	used := time.Date(2026, 7, 28, 9, 30, 0, 0, time.UTC)
	fa := &fakeApps{apps: map[string][]apps.App{
		"alice": {
			{ID: "app-claude", Name: "Claude <b>Desktop</b>", ClientID: "https://claude.ai/oauth/mcp.json", VerifiedDomain: "claude.ai", LastUsed: used, Active: true},
			{ID: "app-cursor", Name: "Cursor", ClientID: "abc123", Active: false},
			{ID: "app-xaa", Name: "Enterprise host", ClientID: "xaa", Active: true, ByOrganisation: true},
		},
		"bob": {{ID: "app-bob", Name: "Bob's host", ClientID: "def456"}},
	}}
	h.flow.opts.Apps = fa
	b := h.newAgent()
	base := h.srv.URL
	p := b.signInIfAsked(b.get(base+"/connections"), "alice")
	mustStatus(t, p, http.StatusOK)
	mustContain(t, p, `id="apps"`, "Claude &lt;b&gt;Desktop&lt;/b&gt;", "verified: <strong>claude.ai</strong>",
		"registered dynamically, not verified", "2026-07-28 09:30 UTC", "(no current token)", `action="/connections/apps/app-cursor/remove"`,
		`<span class="client">Enterprise host</span> <span class="org">let in by your organisation</span>`)
	if n := strings.Count(p.body, "let in by your organisation"); n != 1 {
		t.Fatalf("%d apps marked as let in by the organisation, want 1 (only the ID-JAG one)", n)
	}
	if strings.Contains(p.body, "Bob's host") {
		t.Fatal("alice sees bob's app")
	}

	// A forged form (no or wrong CSRF token) removes nothing.
	if got := b.post(base+"/connections/apps/app-claude/remove", url.Values{"csrf": {"forged"}}); got.status != http.StatusForbidden {
		t.Fatalf("forged removal: HTTP %d", got.status)
	}
	// Bob's app id in alice's session: looks like "no such app".
	csrf := p.body[strings.Index(p.body, `name="csrf" value="`)+len(`name="csrf" value="`):]
	csrf = csrf[:strings.IndexByte(csrf, '"')]
	got := b.post(base+"/connections/apps/app-bob/remove", url.Values{"csrf": {csrf}})
	mustContain(t, got, "That app has no access")
	if len(fa.removed) != 0 {
		t.Fatalf("removed %v", fa.removed)
	}

	p = b.submit(p, "/connections/apps/app-claude/remove", nil)
	mustContain(t, p, "Removed. The app&#39;s tokens are revoked")
	if fmt.Sprint(fa.removed) != "[app-claude via browser]" || strings.Contains(p.body, "Claude &lt;b&gt;") {
		t.Fatalf("after removal: removed %v, page lists Claude: %v", fa.removed, strings.Contains(p.body, "Claude"))
	}
	h.finalCheck()
}

// TestSignInHooks: another front door's page uses the session through
// SignedIn and StartSignIn, and comes back to its own path after sign-in.
func TestSignInHooks(t *testing.T) {
	h := newHarness(t, fakeProviders)
	h.site.Browser.HandleFunc("GET /probe", func(w http.ResponseWriter, r *http.Request) {
		p, ok := h.flow.SignedIn(r)
		if !ok {
			h.flow.StartSignIn(w, r, r.URL.RequestURI())
			return
		}
		fmt.Fprintf(w, "signed in as %s of %s, csrf %v, query %s", p.Principal.Subject, p.Principal.Issuer, p.CSRF != "", r.URL.RawQuery)
	})
	b := h.newAgent()
	p := b.signInIfAsked(b.get(h.srv.URL+"/probe?client_id=x&state=y"), "alice")
	mustStatus(t, p, http.StatusOK)
	mustContain(t, p, "signed in as alice of "+h.idp.Issuer()+", csrf true, query client_id=x&state=y")
	// StartSignIn never sends the browser off the broker.
	rec := &redirectRecorder{header: http.Header{}}
	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/probe", nil)
	h.flow.StartSignIn(rec, req, "https://evil.example/")
	ls := rec.header.Values("Set-Cookie")
	if len(ls) == 0 || rec.status != http.StatusFound || !strings.HasPrefix(rec.header.Get("Location"), h.idp.Issuer()) {
		t.Fatalf("StartSignIn answered %d to %q", rec.status, rec.header.Get("Location"))
	}
}

type redirectRecorder struct {
	header http.Header
	status int
}

func (r *redirectRecorder) Header() http.Header         { return r.header }
func (r *redirectRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *redirectRecorder) WriteHeader(s int)           { r.status = s }
