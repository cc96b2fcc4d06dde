package oauthflow

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/demoprovider"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// demoKeys starts the demo provider and describes its demo-keys service
// the way `broker dev` does.
func demoKeys(h *harness) (string, map[string]string) {
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	h.t.Cleanup(srv.Close)
	var err error
	h.demo, err = demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/demo", ClientID: "unused",
		RedirectURIs: []string{srv.URL + "/unused"}})
	if err != nil {
		h.t.Fatal(err)
	}
	mux.Handle("/demo/", h.demo.Handler())
	for _, a := range demoprovider.Accounts() {
		h.secret(h.demo.APIKey(a.Login))
	}
	return `providers:
  demo-keys:
    display_name: Demo keys
    type: api_key
    instructions: Copy the key of your demo account from the demo provider's key page.
    instructions_url: ` + h.demo.KeysURL() + `
    fields:
      - {name: api_key, label: API key, secret: true, pattern: '` + demoprovider.KeyPattern + `'}
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /login}
    api: {base_url: ` + h.demo.KeysAPIBase() + `, allowed_paths: [GET /me]}
`, nil
}

// keysAPICalls counts the demo-keys API's requests so far.
func (h *harness) keysAPICalls() int {
	n := 0
	for _, e := range h.demo.Events() {
		if e.Kind == "keys-api" {
			n++
		}
	}
	return n
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the agent's session CSRF token (from a page it can see).
func (a *agent) csrf() string {
	a.h.t.Helper()
	p := a.get(a.h.srv.URL + "/connections")
	m := csrfRE.FindStringSubmatch(p.body)
	if m == nil {
		a.h.t.Fatalf("no csrf token on /connections:\n%s", p.body)
	}
	return m[1]
}

// keyStores are the backends the key flows run on.
var keyStores = []struct {
	name string
	open func(testing.TB, *vault.Keyring) vault.Store
}{
	{"bolt", func(t testing.TB, kr *vault.Keyring) vault.Store {
		s, err := boltstore.Open(filepath.Join(t.TempDir(), "vault.db"), kr, boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"postgres", func(t testing.TB, kr *vault.Keyring) vault.Store {
		s, err := pgstore.Open(context.Background(), pgtest.Shared(t).Schema(t), kr, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}},
}

// TestKeyEntryFlows runs the API-key entry page end to end over HTTP on
// bolt and PostgreSQL: the form, every refusal that stores nothing (bob
// on alice's link, bob's session posting for alice's request, no CSRF
// token, a value failing the pattern, a wrong key, a replay after
// success), the stored connection, Replace key, a rejected key, and
// Disconnect. No key value reaches a page or the log.
func TestKeyEntryFlows(t *testing.T) {
	for _, st := range keyStores {
		t.Run(st.name, func(t *testing.T) { keyEntryFlows(t, st.open) })
	}
}

func keyEntryFlows(t *testing.T, open func(testing.TB, *vault.Keyring) vault.Store) {
	h := newHarnessStore(t, demoKeys, open)
	ctx := context.Background()
	aliceKey, bobKey := h.demo.APIKey("alice-demo"), h.demo.APIKey("bob-demo")
	aliceA, bobA := h.newAgent(), h.newAgent()
	g := h.grant("alice", "demo-keys", nil, "Key Agent")
	link := h.srv.URL + "/connect/" + g.ID
	stored := func() int { return len(h.connections("alice")) + len(h.connections("bob")) }

	t.Run("landing shows the key form", func(t *testing.T) {
		p := aliceA.openConnect(g, "alice")
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, `<input type="password" name="field.api_key" autocomplete="off" maxlength="1024"`,
			`name="csrf" value="`, `action="/connect/`+g.ID+`/key"`,
			`<button type="submit" name="decision" value="approve"`, `<button type="submit" name="decision" value="deny"`,
			`href="`+h.demo.KeysURL()+`"`, "Copy the key of your demo account", "Key Agent")
		if strings.Contains(p.body, "will be able to") {
			t.Error("the key page shows OAuth consent")
		}
	})

	t.Run("bob on alice's link never sees the form", func(t *testing.T) {
		p := bobA.openConnect(g, "bob")
		mustStatus(t, p, http.StatusForbidden)
		mustContain(t, p, "This link belongs to a different account")
		if strings.Contains(p.body, "field.api_key") {
			t.Fatal("the mismatch page carries the key form")
		}
	})

	t.Run("a post with bob's session for alice's request is refused", func(t *testing.T) {
		calls := h.keysAPICalls()
		p := bobA.post(link+"/key", url.Values{"csrf": {bobA.csrf()}, "decision": {"approve"}, "field.api_key": {bobKey}})
		mustStatus(t, p, http.StatusForbidden)
		mustContain(t, p, "This link belongs to a different account")
		if stored() != 0 || h.keysAPICalls() != calls || h.grantState(g.ID) != vault.GrantPending {
			t.Fatal("bob's post stored something, reached the provider or moved the request")
		}
	})

	t.Run("a post without the CSRF token is refused", func(t *testing.T) {
		calls := h.keysAPICalls()
		p := aliceA.post(link+"/key", url.Values{"decision": {"approve"}, "field.api_key": {aliceKey}})
		mustStatus(t, p, http.StatusForbidden)
		mustContain(t, p, "Form expired")
		p = aliceA.post(link+"/key", url.Values{"csrf": {"forged"}, "decision": {"approve"}, "field.api_key": {aliceKey}})
		mustStatus(t, p, http.StatusForbidden)
		if stored() != 0 || h.keysAPICalls() != calls {
			t.Fatal("a post without a valid CSRF token stored something or reached the provider")
		}
	})

	t.Run("a value failing the pattern never reaches the provider", func(t *testing.T) {
		calls := h.keysAPICalls()
		const typo = "demo-this-is-not-the-key-format-0123456789"
		h.secret(typo)
		p := aliceA.submit(aliceA.get(link), "/key", url.Values{"decision": {"approve"}, "field.api_key": {typo}})
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "API key: did not match the expected format. Nothing was sent to Demo keys", `name="field.api_key"`)
		if stored() != 0 || h.keysAPICalls() != calls {
			t.Fatal("a malformed key was stored or sent")
		}
	})

	t.Run("a wrong key is refused by the provider", func(t *testing.T) {
		wrong := "demo_" + strings.Repeat("W", 43)
		h.secret(wrong)
		calls := h.keysAPICalls()
		p := aliceA.submit(aliceA.get(link), "/key", url.Values{"decision": {"approve"}, "field.api_key": {wrong}})
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "The key was refused by Demo keys (401). Nothing was stored.")
		if stored() != 0 || h.keysAPICalls() != calls+1 {
			t.Fatalf("a wrong key: %d stored, %d calls", stored(), h.keysAPICalls()-calls)
		}
		if st := h.grantState(g.ID); st != vault.GrantPending {
			t.Fatalf("grant %s after a refused key, want pending (the person may try again)", st)
		}
	})

	var form url.Values
	var conn vault.Connection
	t.Run("the right key connects", func(t *testing.T) {
		page := aliceA.get(link)
		target, vals := findForm(t, page, "/key")
		vals.Set("decision", "approve")
		vals.Set("field.api_key", "  "+aliceKey+"\n") // pasted with white space
		form = vals
		p := aliceA.post(target, vals)
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, "Connected: return to your app", "alice-demo")
		gg, _ := h.store.GetGrant(ctx, g.ID)
		if gg.State != vault.GrantCompleted {
			t.Fatalf("grant %s", gg.State)
		}
		conn, _ = h.store.GetConnection(ctx, gg.ConnectionID)
		if conn.AccountID != "1001" || conn.AccountLogin != "alice-demo" || conn.Token.Fields["api_key"].Reveal() != aliceKey ||
			conn.Token.AccessToken != "" || conn.Status != vault.StatusActive || conn.Principal.Subject != "alice" {
			t.Fatalf("stored %+v", conn)
		}
	})

	t.Run("a replay of the form after success is refused", func(t *testing.T) {
		calls := h.keysAPICalls()
		p := aliceA.post(link+"/key", form)
		mustStatus(t, p, http.StatusGone)
		mustContain(t, p, "already used")
		if len(h.connections("alice")) != 1 || h.keysAPICalls() != calls {
			t.Fatal("the replay stored something or reached the provider")
		}
	})

	t.Run("API calls carry the key", func(t *testing.T) {
		resp, err := h.client.Do(ctx, conn.ID, provider.APIRequest{Method: http.MethodGet, Path: "/me"})
		if err != nil || resp.Status != 200 || !strings.Contains(string(resp.Body), `"login":"alice-demo"`) {
			t.Fatalf("GET /me: %+v %v", resp, err)
		}
		if _, err := h.conns.Call(ctx, conn, provider.APIRequest{Method: http.MethodGet, Path: "/me"}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("my connections shows the account, never the key", func(t *testing.T) {
		p := aliceA.get(h.srv.URL + "/connections")
		mustContain(t, p, "Demo keys", "alice-demo", "API key", `href="/connections/`+conn.ID+`/key"`, "Replace key",
			`action="/connections/`+conn.ID+`/disconnect"`, "Last used")
		if strings.Contains(p.body, ">never<") {
			t.Error("last use not shown after a call")
		}
	})

	t.Run("replace key keeps the connection", func(t *testing.T) {
		fresh, err := h.demo.RotateKey("alice-demo")
		if err != nil {
			t.Fatal(err)
		}
		h.secret(fresh)
		page := aliceA.get(h.srv.URL + "/connections/" + conn.ID + "/key")
		mustStatus(t, page, http.StatusOK)
		mustContain(t, page, "Replace your Demo keys key", "alice-demo", `type="password" name="field.api_key"`)
		// Bob's key is for another account: refused, nothing changed, and
		// the page names no account but alice's own.
		p := aliceA.submit(page, "/key", url.Values{"decision": {"approve"}, "field.api_key": {bobKey}})
		mustStatus(t, p, http.StatusBadRequest)
		mustContain(t, p, "was not accepted as a Demo keys key of")
		if strings.Contains(p.body, "bob-demo") {
			t.Fatal("the refusal names the account of the key")
		}
		if now, _ := h.store.GetConnection(ctx, conn.ID); now.Token.Fields["api_key"].Reveal() != aliceKey {
			t.Fatal("a key of another account replaced alice's")
		}
		p = aliceA.submit(page, "/key", url.Values{"decision": {"approve"}, "field.api_key": {fresh}})
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, "Key replaced")
		now, _ := h.store.GetConnection(ctx, conn.ID)
		if now.Token.Fields["api_key"].Reveal() != fresh || now.Status != vault.StatusActive || len(h.connections("alice")) != 1 {
			t.Fatalf("after replace: %d connections, status %s", len(h.connections("alice")), now.Status)
		}
		// Bob cannot even see alice's replace page.
		if p := bobA.get(h.srv.URL + "/connections/" + conn.ID + "/key"); p.status != http.StatusNotFound || strings.Contains(p.body, "field.api_key") {
			t.Fatalf("bob on alice's replace page: HTTP %d", p.status)
		}
	})

	t.Run("a rejected key asks for a new one", func(t *testing.T) {
		if _, err := h.demo.RotateKey("alice-demo"); err != nil {
			t.Fatal(err)
		}
		h.secret(h.demo.APIKey("alice-demo"))
		if _, err := h.client.Do(ctx, conn.ID, provider.APIRequest{Method: http.MethodGet, Path: "/me"}); !errors.Is(err, provider.ErrNeedsReconnect) {
			t.Fatalf("a revoked key: %v", err)
		}
		mustContain(t, aliceA.get(h.srv.URL+"/connections"), "Key rejected: replace it")
		g2 := h.grant("alice", "demo-keys", nil, "Key Agent")
		p := aliceA.openConnect(g2, "alice")
		mustContain(t, p, "Your stored Demo keys key was rejected")
		p = aliceA.submit(p, "/key", url.Values{"decision": {"approve"}, "field.api_key": {h.demo.APIKey("alice-demo")}})
		mustContain(t, p, "Connected")
		if cs := h.connections("alice"); len(cs) != 1 || cs[0].ID != conn.ID || cs[0].Status != vault.StatusActive {
			t.Fatalf("re-entering the key for the same account made %d connections", len(cs))
		}
	})

	t.Run("a request from a co-located server names it", func(t *testing.T) {
		gs := h.serverGrant("alice", "demo-keys", nil, "repo-helper", "Key Agent")
		p := aliceA.openConnect(gs, "alice")
		mustContain(t, p, `<strong class="server">repo-helper</strong>, a server your administrator configured`, "Through the app", `name="field.api_key"`)
	})

	t.Run("deny declines the request", func(t *testing.T) {
		g3 := h.grant("alice", "demo-keys", nil, "Key Agent")
		p := aliceA.submit(aliceA.openConnect(g3, "alice"), "/key", url.Values{"decision": {"deny"}})
		mustContain(t, p, "Not connected")
		if st := h.grantState(g3.ID); st != vault.GrantDenied {
			t.Fatalf("grant %s", st)
		}
	})

	t.Run("disconnect says where to revoke the key", func(t *testing.T) {
		p := aliceA.submit(aliceA.get(h.srv.URL+"/connections"), "/connections/"+conn.ID+"/disconnect", nil)
		mustStatus(t, p, http.StatusOK)
		mustContain(t, p, "The key was deleted from the broker", "revoke it at Demo keys too",
			`href="`+h.demo.KeysURL()+`"`, "Revoke it at Demo keys")
		if len(h.connections("alice")) != 0 {
			t.Fatal("the connection is still stored")
		}
	})
	h.finalCheck()
}

// findForm returns where p's form posting to actionPart goes, with its
// CSRF token.
func findForm(t *testing.T, p page, actionPart string) (string, url.Values) {
	t.Helper()
	m := regexp.MustCompile(`action="([^"]*` + regexp.QuoteMeta(actionPart) + `)"`).FindStringSubmatch(p.body)
	if m == nil {
		t.Fatalf("no form posting to %s on %s", actionPart, p.url)
	}
	vals := url.Values{}
	if c := csrfRE.FindStringSubmatch(p.body); c != nil {
		vals.Set("csrf", c[1])
	}
	target, _ := p.url.Parse(m[1])
	return target.String(), vals
}

// TestKeyEntryAttemptsLimited: one connect link checks at most five keys
// at the provider; the sixth is refused before anything is sent, so a
// link cannot be used to try keys at will. A new link works.
func TestKeyEntryAttemptsLimited(t *testing.T) {
	h := newHarnessStore(t, demoKeys, keyStores[0].open)
	a := h.newAgent()
	g := h.grant("alice", "demo-keys", nil, "Key Agent")
	mustStatus(t, a.openConnect(g, "alice"), http.StatusOK)
	link := h.srv.URL + "/connect/" + g.ID + "/key"
	wrong := "demo_" + strings.Repeat("A", 43)
	for i := range 5 {
		calls := h.keysAPICalls()
		p := a.post(link, url.Values{"csrf": {a.csrf()}, "decision": {"approve"}, "field.api_key": {wrong}})
		mustContain(t, p, "refused by")
		if h.keysAPICalls() != calls+1 {
			t.Fatalf("attempt %d did not reach the provider", i+1)
		}
	}
	calls := h.keysAPICalls()
	p := a.post(link, url.Values{"csrf": {a.csrf()}, "decision": {"approve"}, "field.api_key": {h.demo.APIKey("alice-demo")}})
	mustStatus(t, p, http.StatusTooManyRequests)
	mustContain(t, p, "Too many keys tried with this link", "Nothing was sent")
	if h.keysAPICalls() != calls || len(h.connections("alice")) != 0 {
		t.Fatal("the sixth attempt reached the provider or stored something")
	}
	g2 := h.grant("alice", "demo-keys", nil, "Key Agent")
	mustStatus(t, a.openConnect(g2, "alice"), http.StatusOK)
	p = a.post(h.srv.URL+"/connect/"+g2.ID+"/key", url.Values{"csrf": {a.csrf()}, "decision": {"approve"}, "field.api_key": {h.demo.APIKey("alice-demo")}})
	mustContain(t, p, "Connected")
	h.secret(h.demo.APIKey("alice-demo"))
	h.finalCheck()
}

// TestReplaceKeyAttemptsLimited: "Replace key" checks keys under a
// connect link's limit: 20 posts at once reach the key service 5 times;
// the others are refused (429) with nothing sent. A refused key and a
// valid key of another account get the same words, which name no
// account but the connection's own. On bolt and on PostgreSQL (where the
// count is a row many sessions update at once).
func TestReplaceKeyAttemptsLimited(t *testing.T) {
	for _, st := range keyStores {
		t.Run(st.name, func(t *testing.T) { replaceKeyAttemptsLimited(t, st.open) })
	}
}

func replaceKeyAttemptsLimited(t *testing.T, open func(testing.TB, *vault.Keyring) vault.Store) {
	h := newHarnessStore(t, demoKeys, open)
	a := h.newAgent()
	g := h.grant("alice", "demo-keys", nil, "Key Agent")
	mustStatus(t, a.openConnect(g, "alice"), http.StatusOK)
	mustContain(t, a.post(h.srv.URL+"/connect/"+g.ID+"/key", url.Values{"csrf": {a.csrf()}, "decision": {"approve"},
		"field.api_key": {h.demo.APIKey("alice-demo")}}), "Connected")
	conn := h.connections("alice")[0]
	replace := h.srv.URL + "/connections/" + conn.ID + "/key"
	wrong, bobKey := "demo_"+strings.Repeat("A", 43), h.demo.APIKey("bob-demo")
	// The count is per window of binding's TTL (10 minutes), aligned to
	// the clock: 20 posts that straddle a window's end would get two
	// windows' allowance. With less than a minute left, the clock moves
	// to 30 s into the next window.
	const window = 10 * time.Minute
	if now := h.clock.Now(); now.Truncate(window).Add(window).Sub(now) < time.Minute {
		h.clock.Advance(now.Truncate(window).Add(window + 30*time.Second).Sub(now))
	}
	calls := h.keysAPICalls()
	pages := make([]page, 20)
	var wg sync.WaitGroup
	for i := range pages {
		key := wrong
		if i%2 == 1 {
			key = bobKey
		}
		wg.Go(func() {
			pages[i] = a.post(replace, url.Values{"csrf": {a.csrf()}, "decision": {"approve"}, "field.api_key": {key}})
		})
	}
	wg.Wait()
	refused, limited := 0, 0
	for _, p := range pages {
		switch p.status {
		case http.StatusBadRequest:
			refused++
			mustContain(t, p, `was not accepted as a Demo keys key of &#34;alice-demo&#34;. Nothing was changed`)
			if strings.Contains(p.body, "bob-demo") || strings.Contains(p.body, "refused by") {
				t.Errorf("the refusal tells whose the key is, or that it works:\n%s", p.body)
			}
		case http.StatusTooManyRequests:
			limited++
			mustContain(t, p, "Too many keys were tried for this Demo keys connection. Nothing was sent")
		default:
			t.Errorf("a replacement answered HTTP %d:\n%s", p.status, p.body)
		}
	}
	if sent := h.keysAPICalls() - calls; sent != 5 || refused != 5 || limited != 15 {
		t.Fatalf("20 replacements at once: %d reached the key service, %d refused, %d limited; want 5, 5, 15", sent, refused, limited)
	}
	if now, _ := h.store.GetConnection(context.Background(), conn.ID); now.Token.Fields["api_key"].Reveal() != h.demo.APIKey("alice-demo") {
		t.Fatal("a refused replacement changed the key")
	}
	h.secret(h.demo.APIKey("alice-demo"))
	h.secret(bobKey)
	h.finalCheck()
}
