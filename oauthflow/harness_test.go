package oauthflow

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/fakeprovider"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/web"
)

// testClock is real time plus an adjustable offset.
type testClock struct{ offset atomic.Int64 }

func (c *testClock) Now() time.Time          { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *testClock) Advance(d time.Duration) { c.offset.Add(int64(d)) }

// harness is a broker (Flow on an httptest server) with a real devidp as
// the organisation IdP, an in-memory encrypted store and providers given
// as providers.yaml text.
type harness struct {
	t      testing.TB
	idp    *devidp.IdP
	srv    *httptest.Server
	site   *web.Site
	flow   *Flow
	store  vault.Store
	client *provider.Client
	conns  *connections.Service
	clock  *testClock
	logs   *logbuf.Buffer
	rec    *telemetry.Recorder
	gh     *fakeprovider.GitHub
	google *fakeprovider.Google
	demo   *demoprovider.Provider // the demo-keys service (apikey_test.go)
	// hold makes the broker's server record provider callbacks in held
	// instead of serving them.
	hold   atomic.Bool
	heldMu sync.Mutex
	held   string
	// seen collects every page body and redirect URL the agents received.
	seenMu sync.Mutex
	seen   []string
	// secrets are token values that must never appear in pages or logs.
	secretsMu sync.Mutex
	secrets   []string
}

const brokerClientSecret = "broker-client-secret-value"

// newHarness starts the IdP and the broker; providers receives the harness
// (IdP and broker server running) and returns providers.yaml text plus the env for its references.
func newHarness(t testing.TB, providers func(h *harness) (string, map[string]string)) *harness {
	t.Helper()
	return newHarnessStore(t, providers, nil)
}

// newHarnessStore is newHarness on the store openStore opens with the
// harness's key ring (nil: an encrypted in-memory store).
func newHarnessStore(t testing.TB, providers func(h *harness) (string, map[string]string), openStore func(testing.TB, *vault.Keyring) vault.Store) *harness {
	t.Helper()
	h := &harness{t: t, clock: &testClock{}, logs: &logbuf.Buffer{}}
	h.idp = devidptest.Start(t, nil, nil)
	h.site = web.NewSite()
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/oauth/") && h.hold.Load() {
			// Test-only interception: the provider's answer is recorded and
			// never reaches the broker, as if the browser stopped there.
			h.heldMu.Lock()
			h.held = r.URL.String()
			h.heldMu.Unlock()
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			io.WriteString(w, "<!doctype html><title>held</title><h1 id=held>held by the test</h1>")
			return
		}
		h.site.ServeHTTP(w, r)
	}))
	t.Cleanup(h.srv.Close)
	if err := h.idp.AddClient(devidp.Client{ID: "broker", Secret: brokerClientSecret, RedirectURIs: []string{h.srv.URL + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	doc, envm := providers(h)
	reg, err := provider.ParseProviders("test-providers.yaml", []byte(doc), func(k string) string { return envm[k] })
	if err != nil {
		t.Fatalf("providers: %v", err)
	}
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	if openStore == nil {
		h.store = memstore.New(kr)
	} else {
		h.store = openStore(t, kr)
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := telemetry.New(telemetry.Options{Providers: reg.Names(), Audit: log})
	h.rec = rec
	h.client, err = provider.New(provider.Options{Store: h.store, Providers: reg, Now: h.clock.Now, Logger: log, Telemetry: rec, BrokerURL: h.srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	h.conns, err = connections.New(connections.Options{Store: h.store, Client: h.client,
		PublicURL: h.srv.URL, Now: h.clock.Now, Logger: log, Telemetry: rec})
	if err != nil {
		t.Fatal(err)
	}
	h.flow, err = New(context.Background(), Options{
		PublicURL: h.srv.URL, Issuer: h.idp.Issuer(), ClientID: "broker", ClientSecret: vault.Secret(brokerClientSecret),
		Connections: h.conns, CookieKeys: kr.Derive("cookies"),
		Logger: log, Now: h.clock.Now, DevMode: true, Telemetry: rec,
	})
	if err != nil {
		t.Fatalf("oauthflow.New: %v", err)
	}
	h.flow.Register(h.site)
	h.secret(brokerClientSecret)
	for _, v := range envm {
		if strings.Contains(strings.ToLower(v), "secret") {
			h.secret(v)
		}
	}
	return h
}

// secret records a value that must never be shown or logged.
func (h *harness) secret(v string) {
	if v == "" {
		return
	}
	h.secretsMu.Lock()
	defer h.secretsMu.Unlock()
	h.secrets = append(h.secrets, v)
}

// takeHeld returns the last held callback (absolute URL) and stops holding.
func (h *harness) takeHeld() string {
	h.hold.Store(false)
	h.heldMu.Lock()
	defer h.heldMu.Unlock()
	if h.held == "" {
		h.t.Fatal("no provider callback was held")
	}
	u := h.srv.URL + h.held
	h.held = ""
	return u
}

// finalCheck fails when any recorded secret (client secrets, every token
// the providers issued) appears in a page, a URL or the log.
func (h *harness) finalCheck() {
	h.t.Helper()
	if h.gh != nil {
		for _, e := range h.gh.Events() {
			h.secret(e.Token)
		}
	}
	if h.google != nil {
		for _, e := range h.google.Events() {
			h.secret(e.Token)
		}
	}
	h.seenMu.Lock()
	all := strings.Join(h.seen, "\n")
	h.seenMu.Unlock()
	h.checkNoSecrets("pages and URLs", all)
	h.checkNoSecrets("log", h.logs.String())
}

// checkNoSecrets fails when a recorded secret appears in text.
func (h *harness) checkNoSecrets(where, text string) {
	h.t.Helper()
	h.secretsMu.Lock()
	defer h.secretsMu.Unlock()
	for _, s := range h.secrets {
		if strings.Contains(text, s) {
			h.t.Errorf("%s contains a secret value (%d bytes)", where, len(s))
		}
	}
}

var (
	alice = vault.Principal{Subject: "alice"}
	bob   = vault.Principal{Subject: "bob"}
)

// grant puts a pending connect request of user ("alice"/"bob") for
// provider into the store, as the MCP endpoint's connect_account starts
// one (whatever user has connected: a link may be stale, or for another
// account).
func (h *harness) grant(user, provider string, scopes []string, client string) vault.Grant {
	h.t.Helper()
	return h.serverGrant(user, provider, scopes, "", client)
}

// serverGrant is grant for a request asked by the co-located server (""
// for an MCP client), as the sidecar's /v1/require starts one.
func (h *harness) serverGrant(user, provider string, scopes []string, server, client string) vault.Grant {
	h.t.Helper()
	var id [16]byte
	rand.Read(id[:])
	now := h.clock.Now()
	g, err := h.store.CreateGrant(context.Background(), vault.Grant{ID: base64.RawURLEncoding.EncodeToString(id[:]),
		Principal: vault.Principal{Issuer: h.idp.Issuer(), Subject: user}, Provider: provider, Scopes: slices.Clone(scopes),
		ClientName: client, Server: server, State: vault.GrantPending, Created: now, Expires: now.Add(10 * time.Minute)})
	if err != nil {
		h.t.Fatalf("create grant: %v", err)
	}
	if !connections.ValidLinkID(g.ID) {
		h.t.Fatalf("grant id %q is not a connect link's", g.ID)
	}
	return g
}

// connections returns user's connections with their token sets opened
// (a listing is metadata only).
func (h *harness) connections(user string) []vault.Connection {
	h.t.Helper()
	cs, err := h.store.ListConnections(context.Background(), vault.Principal{Issuer: h.idp.Issuer(), Subject: user})
	if err != nil {
		h.t.Fatal(err)
	}
	for i, c := range cs {
		if cs[i], err = h.store.GetConnection(context.Background(), c.ID); err != nil {
			h.t.Fatal(err)
		}
	}
	return cs
}

func (h *harness) grantState(id string) vault.GrantState {
	h.t.Helper()
	g, err := h.store.GetGrant(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	return g.State
}

// untouched reports what differs from a grant that is still open and was
// never written since it was created: the consent form writes nothing (the
// consent travels in the flow cookie) and a refused callback must not
// either, so the person's real callback can still complete it.
func (h *harness) untouched(id string) string {
	h.t.Helper()
	g, err := h.store.GetGrant(context.Background(), id)
	if err != nil {
		h.t.Fatal(err)
	}
	if g.State != vault.GrantPending || g.Version != 1 || g.ConnectionID != "" {
		return fmt.Sprintf("grant is %s, version %d, connection %q; want pending, version 1, none", g.State, g.Version, g.ConnectionID)
	}
	return ""
}

// page is one HTTP response as a browser would see it.
type page struct {
	status int
	url    *url.URL
	body   string
	header http.Header
}

// agent is a cookie-keeping HTTP client playing a browser. It follows
// redirects, except into the broker's provider callback when stopAtCallback
// is set, so tests can tamper with it.
type agent struct {
	h              *harness
	c              *http.Client
	stopAtCallback bool
}

func (h *harness) newAgent() *agent {
	jar, _ := cookiejar.New(nil)
	a := &agent{h: h}
	a.c = &http.Client{Jar: jar, Timeout: 20 * time.Second}
	a.c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) > 15 {
			return fmt.Errorf("too many redirects")
		}
		if a.stopAtCallback && strings.HasPrefix(req.URL.Path, "/oauth/") && strings.HasSuffix(req.URL.Path, "/callback") {
			return http.ErrUseLastResponse
		}
		return nil
	}
	return a
}

func (a *agent) do(req *http.Request) page {
	a.h.t.Helper()
	resp, err := a.c.Do(req)
	if err != nil {
		a.h.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	p := page{status: resp.StatusCode, url: resp.Request.URL, body: string(b), header: resp.Header}
	a.h.seenMu.Lock()
	a.h.seen = append(a.h.seen, req.URL.String(), resp.Header.Get("Location"), p.body)
	a.h.seenMu.Unlock()
	return p
}

func (a *agent) get(u string) page {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return a.do(req)
}

func (a *agent) post(u string, form url.Values) page {
	req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return a.do(req)
}

// submit posts the page's form whose action contains actionPart, with its
// hidden inputs plus extra.
func (a *agent) submit(p page, actionPart string, extra url.Values) page {
	a.h.t.Helper()
	target, vals, err := htmlform.Find(p.url, p.body, actionPart, extra)
	if err != nil {
		a.h.t.Fatalf("%v on %s:\n%s", err, p.url, p.body)
	}
	return a.post(target.String(), vals)
}

// signInIfAsked completes the devidp sign-in form when p is it.
func (a *agent) signInIfAsked(p page, user string) page {
	a.h.t.Helper()
	if !strings.Contains(p.body, `name="password"`) {
		return p
	}
	return a.submit(p, "login", url.Values{"username": {user}, "password": {user}})
}

// openConnect opens the connect link and signs in as user when asked.
func (a *agent) openConnect(g vault.Grant, user string) page {
	a.h.t.Helper()
	return a.signInIfAsked(a.get(a.h.srv.URL+"/connect/"+g.ID), user)
}

func mustContain(t testing.TB, p page, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(p.body, w) {
			t.Errorf("page %s (HTTP %d) does not contain %q:\n%s", p.url.Path, p.status, w, p.body)
		}
	}
}

func mustStatus(t testing.TB, p page, want int) {
	t.Helper()
	if p.status != want {
		t.Fatalf("page %s: HTTP %d, want %d:\n%s", p.url, p.status, want, p.body)
	}
}

// fakeProviders starts fake GitHub and Google and describes them the way
// providers.yaml describes the real ones.
func fakeProviders(h *harness) (string, map[string]string) {
	h.gh = fakeprovider.NewGitHub(h.t, fakeprovider.Options{
		ClientID: "gh-client", ClientSecret: "gh-secret-value", RedirectURIs: []string{h.srv.URL + "/oauth/github/callback"},
	})
	h.google = fakeprovider.NewGoogle(h.t, fakeprovider.Options{
		ClientID: "google-client", ClientSecret: "google-secret-value", RedirectURIs: []string{h.srv.URL + "/oauth/google/callback"},
		Email: "alice.g@example.test",
	})
	gh, gg := h.gh.URL(), h.google.Issuer()
	return `providers:
  github:
    display_name: GitHub
    type: oauth2
    authorization_url: ` + gh + `/login/oauth/authorize
    token_url: ` + gh + `/login/oauth/access_token
    client_id: ${GITHUB_CLIENT_ID}
    client_secret: ${GITHUB_CLIENT_SECRET}
    token_endpoint_auth: client_secret_post
    default_scopes: [read:user]
    scope_descriptions: {read:user: Read your profile information, repo: Full access to your repositories}
    account: {url: ` + gh + `/user, id_field: id, login_field: login}
    api: {base_url: ` + gh + `}
    revocation: {style: github_grant, url: "` + gh + `/applications/{client_id}/grant"}
  google:
    display_name: Google
    type: oidc
    issuer: ` + gg + `
    client_id: ${GOOGLE_CLIENT_ID}
    client_secret: ${GOOGLE_CLIENT_SECRET}
    default_scopes: [openid, email]
    extra_auth_params: {access_type: offline, prompt: consent}
    revocation: {style: rfc7009, url: ` + gg + `/revoke}
`, map[string]string{
			"GITHUB_CLIENT_ID": "gh-client", "GITHUB_CLIENT_SECRET": "gh-secret-value",
			"GOOGLE_CLIENT_ID": "google-client", "GOOGLE_CLIENT_SECRET": "google-secret-value",
		}
}
