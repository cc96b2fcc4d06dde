package authserver

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/internal/htmlform"
	"credbroker/internal/logbuf"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/web"
	"credbroker/webhook"
)

// The authorization server is tested in-process over loopback with a
// memory store. The broker's real sign-in (package oauthflow) is another
// front door, which this package's tests may not import; a hand-written
// stand-in gives the same two hooks: a browser is signed in when it holds
// the test_session cookie, and StartSignIn sends it to /test/login, which
// records the return path. The real sign-in is exercised end to end in
// cmd/broker's tests.

const testIdP = "https://idp.example.test"

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type harness struct {
	t      *testing.T
	as     *Server
	store  *memstore.Store
	keys   *vault.Keyring
	srv    *httptest.Server
	clock  *clock
	logs   *logbuf.Buffer
	opts   Options
	docs   *httptest.Server // an https host for Client ID Metadata Documents
	docMu  sync.Mutex
	bodies map[string]docAnswer
}

type docAnswer struct {
	status  int
	ctype   string
	body    string
	headers map[string]string
}

func newHarness(t *testing.T, mods ...func(*Options)) *harness {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, keys: kr, store: memstore.New(kr), clock: &clock{t: time.Now()}, logs: &logbuf.Buffer{},
		bodies: map[string]docAnswer{}}
	h.docs = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.docMu.Lock()
		a, ok := h.bodies[r.URL.Path]
		h.docMu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		for k, v := range a.headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", a.ctype)
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(h.docs.Close)
	pool := x509.NewCertPool()
	pool.AddCert(h.docs.Certificate())
	site := web.NewSite()
	h.srv = httptest.NewServer(site)
	t.Cleanup(h.srv.Close)
	h.opts = Options{
		PublicURL: h.srv.URL, Resource: h.srv.URL + "/mcp", IdPIssuer: testIdP, Store: h.store, Keys: kr,
		Person: func(r *http.Request) (Person, bool) {
			c, err := r.Cookie("test_session")
			if err != nil || c.Value == "" {
				return Person{}, false
			}
			return Person{Principal: vault.Principal{Issuer: h.opts.IdPIssuer, Subject: c.Value}, Display: c.Value + "@example.test", CSRF: "csrf-" + c.Value}, true
		},
		StartSignIn: func(w http.ResponseWriter, r *http.Request, returnTo string) {
			http.Redirect(w, r, "/test/login?return="+url.QueryEscape(returnTo), http.StatusFound)
		},
		Registration: true, AllowPrivateMetadata: true, MetadataTLS: &tls.Config{RootCAs: pool},
		Logger: slog.New(slog.NewTextHandler(h.logs, nil)), Now: h.clock.Now,
		// The JWT bearer grant is off until a test's Policy turns it on.
		IDJAG: IDJAGOptions{Ledger: h.store.Assertions()},
	}
	for _, m := range mods {
		m(&h.opts)
	}
	if st, ok := h.opts.Store.(*memstore.Store); ok {
		h.store = st
	}
	h.as, err = New(h.opts)
	if err != nil {
		t.Fatal(err)
	}
	h.as.Register(site)
	return h
}

// serveDoc publishes a metadata document at path on the https host and
// returns its URL.
func (h *harness) serveDoc(path string, a docAnswer) string {
	if a.status == 0 {
		a.status = 200
	}
	if a.ctype == "" {
		a.ctype = "application/json"
	}
	h.docMu.Lock()
	h.bodies[path] = a
	h.docMu.Unlock()
	return h.docs.URL + path
}

// cimdDoc is a valid metadata document for id with redirect URIs.
func cimdDoc(id string, redirects ...string) string {
	b, _ := json.Marshal(map[string]any{
		"client_id": id, "client_name": "Claude <i>Desktop</i>", "redirect_uris": redirects,
		"grant_types": []string{"authorization_code", "refresh_token"}, "response_types": []string{"code"},
		"token_endpoint_auth_method": "none",
	})
	return string(b)
}

// browser is a person's browser: a cookie jar, redirects not followed.
type browser struct {
	h *harness
	c *http.Client
}

func (h *harness) browser(user string) *browser {
	jar, _ := cookiejar.New(nil)
	if user != "" {
		u, _ := url.Parse(h.srv.URL)
		jar.SetCookies(u, []*http.Cookie{{Name: "test_session", Value: user, Path: "/"}})
	}
	return &browser{h: h, c: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	status   int
	url      *url.URL
	location string
	body     string
	header   http.Header
}

func (b *browser) do(req *http.Request) page {
	b.h.t.Helper()
	resp, err := b.c.Do(req)
	if err != nil {
		b.h.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, url: req.URL, location: resp.Header.Get("Location"), body: string(body), header: resp.Header}
}

func (b *browser) get(u string) page {
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return b.do(req)
}

// submit posts the form of p whose action contains action, with extra.
func (b *browser) submit(p page, action string, extra url.Values) page {
	b.h.t.Helper()
	target, vals, err := htmlform.Find(p.url, p.body, action, extra)
	if err != nil {
		b.h.t.Fatalf("%v in HTTP %d page:\n%.1500s", err, p.status, p.body)
	}
	req, _ := http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.h.srv.URL)
	return b.do(req)
}

// pkce is a code verifier and its S256 challenge.
type pkce struct{ verifier, challenge string }

func newPKCE() pkce {
	v := randomID(32)
	sum := sha256.Sum256([]byte(v))
	return pkce{v, base64.RawURLEncoding.EncodeToString(sum[:])}
}

// authorizeURL builds an authorization request; params override the
// defaults (an empty value removes a parameter).
func (h *harness) authorizeURL(clientID, redirect string, pk pkce, params map[string]string) string {
	q := url.Values{
		"response_type": {"code"}, "client_id": {clientID}, "redirect_uri": {redirect}, "state": {"st-" + randomID(6)},
		"code_challenge": {pk.challenge}, "code_challenge_method": {"S256"}, "resource": {h.opts.Resource},
	}
	for k, v := range params {
		if v == "" {
			q.Del(k)
		} else {
			q.Set(k, v)
		}
	}
	return h.srv.URL + "/authorize?" + q.Encode()
}

// callback parses a redirect to the client: its query parameters.
func (h *harness) callback(p page, redirectPrefix string) url.Values {
	h.t.Helper()
	if p.status != http.StatusFound && p.status != http.StatusSeeOther {
		h.t.Fatalf("want a redirect to the client, got HTTP %d:\n%.1500s", p.status, p.body)
	}
	if !strings.HasPrefix(p.location, redirectPrefix) {
		h.t.Fatalf("redirected to %q, want the client's %q", p.location, redirectPrefix)
	}
	u, err := url.Parse(p.location)
	if err != nil {
		h.t.Fatal(err)
	}
	q := u.Query()
	if q.Get("iss") != h.srv.URL {
		h.t.Fatalf("redirect %q: iss = %q, want %q (RFC 9207)", p.location, q.Get("iss"), h.srv.URL)
	}
	return q
}

// approve runs an authorization request in b through consent and returns
// the code.
func (h *harness) approve(b *browser, authURL, redirect string) string {
	h.t.Helper()
	p := b.get(authURL)
	if p.status == http.StatusOK {
		p = b.submit(p, "/authorize/decision", url.Values{"decision": {"approve"}})
	}
	q := h.callback(p, redirect)
	if q.Get("error") != "" || q.Get("code") == "" {
		h.t.Fatalf("authorization answered %v", q)
	}
	return q.Get("code")
}

// tokenAnswer is a decoded token endpoint answer.
type tokenAnswer struct {
	Status       int
	AccessToken  string `json:"access_token"`
	TokenType    string `json:"token_type"`
	ExpiresIn    int    `json:"expires_in"`
	RefreshToken string `json:"refresh_token"`
	Scope        string `json:"scope"`
	Error        string `json:"error"`
	Desc         string `json:"error_description"`
	Header       http.Header
}

// post sends a form to endpoint (with Basic credentials when basic is
// set: id, secret).
func (h *harness) post(endpoint string, form url.Values, basic ...string) tokenAnswer {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+endpoint, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if len(basic) == 2 {
		req.SetBasicAuth(url.QueryEscape(basic[0]), url.QueryEscape(basic[1]))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := tokenAnswer{Status: resp.StatusCode, Header: resp.Header}
	if len(b) > 0 {
		if err := json.Unmarshal(b, &a); err != nil {
			h.t.Fatalf("%s answered HTTP %d, not JSON: %s", endpoint, resp.StatusCode, b)
		}
	}
	return a
}

// exchange redeems code for client with the verifier.
func (h *harness) exchange(clientID, code, redirect string, pk pkce, extra map[string]string) tokenAnswer {
	h.t.Helper()
	f := url.Values{"grant_type": {"authorization_code"}, "code": {code}, "redirect_uri": {redirect},
		"code_verifier": {pk.verifier}, "client_id": {clientID}, "resource": {h.opts.Resource}}
	for k, v := range extra {
		if v == "" {
			f.Del(k)
		} else {
			f.Set(k, v)
		}
	}
	return h.post("/token", f)
}

func (h *harness) refresh(clientID, rt string) tokenAnswer {
	h.t.Helper()
	return h.post("/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {rt}, "client_id": {clientID}})
}

// register registers a client through dynamic registration.
func (h *harness) register(meta map[string]any) (int, map[string]any) {
	h.t.Helper()
	b, _ := json.Marshal(meta)
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/register", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// publicClient registers a public native client with a loopback redirect
// and the refresh grant; it returns the client id and the redirect URI.
func (h *harness) publicClient() (string, string) {
	h.t.Helper()
	redirect := "http://127.0.0.1:41234/callback"
	status, out := h.register(map[string]any{"redirect_uris": []string{redirect}, "token_endpoint_auth_method": "none",
		"grant_types": []string{"authorization_code", "refresh_token"}, "client_name": "Test host", "application_type": "native"})
	if status != http.StatusCreated {
		h.t.Fatalf("register: HTTP %d %v", status, out)
	}
	return out["client_id"].(string), redirect
}

// verify runs the broker's verifier on an access token.
func (h *harness) verify(token string) error {
	_, err := h.as.Verifier()(h.t.Context(), token)
	return err
}

// apps returns user's app access records straight from the store.
func (h *harness) apps(user string) []vault.AppAccess {
	h.t.Helper()
	list, err := h.store.ListAppAccess(h.t.Context(), vault.Principal{Issuer: testIdP, Subject: user})
	if err != nil {
		h.t.Fatal(err)
	}
	return list
}

// mustApps builds an apps core for a harness option.
func mustApps(t *testing.T, o apps.Options) *apps.Service {
	t.Helper()
	a, err := apps.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// withAppEvents gives the harness's server a store whose app changes write
// webhook deliveries (one endpoint, every event) into its outbox, as
// cmd/broker wires it; appEvents reads them.
func withAppEvents(o *Options) {
	ep, err := webhook.NewEndpoint("test", "https://hooks.example.test/", "whsec_"+base64.StdEncoding.EncodeToString(make([]byte, 32)), nil)
	if err != nil {
		panic(err)
	}
	pub := webhook.NewPublisher(&webhook.Config{Endpoints: []webhook.Endpoint{ep}}, o.Now)
	st := memstore.NewWith(o.Keys, memstore.Options{AppChanges: pub.AppHook()})
	o.Store = st
	o.Apps = nil
}

// appEvents returns the events in the store's outbox, oldest first, as
// "type subject client_id".
func (h *harness) appEvents() []string {
	h.t.Helper()
	ob, ok := h.as.store.(vault.Outbox)
	if !ok {
		h.t.Fatalf("%T keeps no outbox", h.as.store)
	}
	ds, err := ob.ClaimDeliveries(h.t.Context(), h.clock.Now().Add(time.Hour), 0, time.Minute)
	if err != nil {
		h.t.Fatal(err)
	}
	slices.SortStableFunc(ds, func(a, b vault.Delivery) int { return a.Created.Compare(b.Created) })
	var out []string
	for _, d := range ds {
		var p struct {
			Data webhook.AppData `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &p); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, d.Type+" "+p.Data.Principal.Subject+" "+p.Data.ClientID)
	}
	return out
}
