package connections_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/webhook"
)

// The lifecycle of a type: mcp connection outside lists and revocation:
// webhooks, keep-alive and offboarding. The rig is the demo OAuth-protected
// MCP server (internal/demomcp, as `broker dev` runs it) with the demo
// provider as its authorization server, both on one loopback server; the
// broker registers itself there dynamically and connects through the same
// functions the browser door calls (Open, AuthRequest, Complete). Beside it
// the demo provider is also an ordinary oauth2 entry ("demo"), for the
// connections an MCP connection must be handled like. The store publishes
// webhook events to a receiver on loopback through the real Dispatcher,
// and connection.refresh_failed is enqueued the way cmd/broker wires it
// (provider.Options.RefreshFailed → Publisher.Publish).

// mcpLifeOpts vary the rig: mcpExtra is added to the remote entry's mcp
// section (", resource_on_refresh: false"); refreshIdle is the demo
// provider's refresh token idle expiry (0: its default, 30 days).
type mcpLifeOpts struct {
	mcpExtra    string
	refreshIdle time.Duration
}

type mcpLife struct {
	t      *testing.T
	clock  *clock
	demo   *demoprovider.Provider
	up     *demomcp.Server
	mcpURL string
	store  *memstore.Store
	conns  *connections.Service
	audit  *logbuf.Buffer
	disp   *webhook.Dispatcher

	mu sync.Mutex // guards the fields below
	// tokenForms are the forms the authorization server's token
	// endpoint received, in order, with the client that authenticated
	// (HTTP basic) in tokenClients.
	tokenForms   []url.Values
	tokenClients []string
	// hooks are the webhook bodies the receiver got; seen how many of
	// them drain has handed out.
	hooks [][]byte
	seen  int
}

// mcpHookEvent is a received connection.* event.
type mcpHookEvent struct {
	Type string                 `json:"type"`
	Data webhook.ConnectionData `json:"data"`
}

const mcpLifeBroker = "https://broker.test"

func newMCPLife(t *testing.T, o mcpLifeOpts) *mcpLife {
	t.Helper()
	l := &mcpLife{t: t, clock: &clock{t: time.Now()}, audit: &logbuf.Buffer{}}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	l.mcpURL = srv.URL + "/mcp"
	var err error
	l.demo, err = demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/demo", ClientID: "demo-client",
		ClientSecret: "demo-secret-value", RedirectURIs: []string{mcpLifeBroker + "/oauth/demo/callback"},
		Resources: []string{l.mcpURL}, Now: l.clock.Now, RefreshIdleTTL: o.refreshIdle})
	if err != nil {
		t.Fatal(err)
	}
	l.demo.Mount(mux)
	// The token endpoint as the wire carried it: each form is recorded
	// before the demo provider reads it.
	mux.Handle("POST /demo/token", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		form, _ := url.ParseQuery(string(body))
		user, _, _ := r.BasicAuth()
		user, _ = url.QueryUnescape(user)
		l.mu.Lock()
		l.tokenForms = append(l.tokenForms, form)
		l.tokenClients = append(l.tokenClients, user)
		l.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		l.demo.Handler().ServeHTTP(w, r)
	}))
	l.up, err = demomcp.New(demomcp.Options{URL: l.mcpURL, AuthServer: l.demo})
	if err != nil {
		t.Fatal(err)
	}
	l.up.Mount(mux)

	doc := `providers:
  demo:
    type: oauth2
    authorization_url: ` + l.demo.AuthURL() + `
    token_url: ` + l.demo.TokenURL() + `
    client_id: demo-client
    client_secret: ${S}
    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    account: {url: ` + l.demo.APIBase() + `/user, id_field: id, login_field: login}
    api: {base_url: ` + l.demo.APIBase() + `}
    revocation: {style: rfc7009, url: ` + l.demo.RevokeURL() + `}
  remote:
    display_name: Remote notes
    type: mcp
    mcp: {url: ` + l.mcpURL + o.mcpExtra + `}
    keep_alive: 30d
    keep_alive_refresh: 1d
`
	reg, err := provider.ParseProviders("mcp-life", []byte(doc), func(string) string { return "demo-secret-value" })
	if err != nil {
		t.Fatal(err)
	}

	// Webhooks: every event to one endpoint on loopback.
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		l.mu.Lock()
		l.hooks = append(l.hooks, body)
		l.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	secret := make([]byte, 32)
	rand.Read(secret)
	ep, err := webhook.NewEndpoint("ops", recv.URL+"/hook", "whsec_"+base64.StdEncoding.EncodeToString(secret), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &webhook.Config{Endpoints: []webhook.Endpoint{ep}}
	pub := webhook.NewPublisher(cfg, l.clock.Now)
	keys, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	l.store = memstore.NewWith(keys, memstore.Options{Changes: pub.Hook()})

	log := slog.New(slog.NewTextHandler(l.audit, nil))
	rec := telemetry.New(telemetry.Options{Providers: reg.Names(), Audit: log, WebhookEndpoints: cfg.Names()})
	client, err := provider.New(provider.Options{Store: l.store, Providers: reg, Now: l.clock.Now, Telemetry: rec, Logger: log,
		BrokerURL: mcpLifeBroker,
		// As cmd/broker wires it (refreshFailedEvents).
		RefreshFailed: func(ctx context.Context, c vault.Connection) {
			if err := pub.Publish(context.WithoutCancel(ctx), l.store, webhook.ConnectionRefreshFailed, webhook.ConnectionEvent(c)); err != nil {
				t.Errorf("storing connection.refresh_failed: %v", err)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	l.conns, err = connections.New(connections.Options{Store: l.store, Client: client, PublicURL: mcpLifeBroker,
		Telemetry: rec, Logger: log, Now: l.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	l.disp, err = webhook.NewDispatcher(webhook.DispatchOptions{Config: cfg, Store: l.store, Timeout: 10 * time.Second,
		Telemetry: rec, Now: l.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var mcpConsentRequest = regexp.MustCompile(`name="request" value="([^"]+)"`)

// connect connects pr to provider name as the browser door does: a
// connect request (Ensure), its link opened (Open), the authorization
// request (AuthRequest), the provider's consent approved as account
// ("1001" alice-demo, "1002" bob-demo), and the answer at the callback
// (Complete).
func (l *mcpLife) connect(pr vault.Principal, name, account string) vault.Connection {
	l.t.Helper()
	ctx := context.Background()
	o, err := l.conns.Ensure(ctx, connections.Request{Principal: pr, Provider: name, Via: "mcp", CanAsk: true})
	need, ok := o.(connections.NeedsUser)
	if err != nil || !ok || need.Grant == nil {
		l.t.Fatalf("Ensure(%s) = %#v, %v; want a connect request", name, o, err)
	}
	cr, err := l.conns.Open(ctx, pr, need.Grant.ID, "consent")
	if err != nil {
		l.t.Fatal(err)
	}
	redirectURL := mcpLifeBroker + "/oauth/" + name + "/callback"
	ar, err := l.conns.AuthRequest(ctx, cr, redirectURL)
	if err != nil {
		l.t.Fatal(err)
	}
	noFollow := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(ar.URL)
	if err != nil {
		l.t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := mcpConsentRequest.FindSubmatch(page)
	if m == nil {
		l.t.Fatalf("%s: no consent page (HTTP %d): %s", name, resp.StatusCode, page)
	}
	resp, err = noFollow.PostForm(l.demo.AuthURL(), url.Values{"request": {string(m[1])}, "account": {account}, "decision": {"approve"}})
	if err != nil {
		l.t.Fatal(err)
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || !strings.HasPrefix(loc.String(), redirectURL+"?") || loc.Query().Get("code") == "" || loc.Query().Get("state") != ar.State {
		l.t.Fatalf("%s: consent answered HTTP %d %q", name, resp.StatusCode, resp.Header.Get("Location"))
	}
	q := loc.Query()
	c, _, err := l.conns.Complete(ctx, connections.Callback{Principal: pr, Grant: need.Grant.ID, Consent: pr, Provider: name,
		RedirectURL: redirectURL, Request: ar, Code: q.Get("code"), Iss: q.Get("iss")})
	if err != nil {
		l.t.Fatalf("Complete(%s): %v", name, err)
	}
	return c
}

// full is connection id as stored, tokens included.
func (l *mcpLife) full(id string) vault.Connection {
	l.t.Helper()
	c, err := l.store.GetConnection(context.Background(), id)
	if err != nil {
		l.t.Fatalf("connection %s: %v", id, err)
	}
	return c
}

// tokenRequests returns what the token endpoint received so far.
func (l *mcpLife) tokenRequests() ([]url.Values, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.tokenForms), slices.Clone(l.tokenClients)
}

// pass runs one keep-alive pass, counting its waits.
func (l *mcpLife) pass() (connections.KeepAliveReport, int) {
	l.t.Helper()
	waits := 0
	rep, err := l.conns.KeepAlivePass(context.Background(), func(context.Context) error { waits++; return nil })
	if err != nil {
		l.t.Fatalf("keep-alive pass: %v", err)
	}
	return rep, waits
}

// drain sends every due webhook delivery and returns the events received
// since the last drain.
func (l *mcpLife) drain() []mcpHookEvent {
	l.t.Helper()
	for i := 0; ; i++ {
		n, err := l.disp.RunOnce(context.Background())
		if err != nil {
			l.t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if i > 20 {
			l.t.Fatal("the outbox does not empty")
		}
	}
	if n, _, err := l.store.OutboxDepth(context.Background()); err != nil || n != 0 {
		l.t.Fatalf("%d deliveries left in the outbox (%v)", n, err)
	}
	l.mu.Lock()
	bodies := l.hooks[l.seen:]
	l.seen = len(l.hooks)
	l.mu.Unlock()
	var out []mcpHookEvent
	for _, b := range bodies {
		var ev mcpHookEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			l.t.Fatalf("webhook body %s: %v", b, err)
		}
		out = append(out, ev)
	}
	return out
}

// allHooks returns every webhook body received so far.
func (l *mcpLife) allHooks() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(bytes.Join(l.hooks, []byte("\n")))
}

// wantMCPEvent checks that evs is exactly one event of type typ about
// connection c (of person pr), with status.
func wantMCPEvent(t *testing.T, step string, evs []mcpHookEvent, typ string, c vault.Connection, pr vault.Principal, status vault.ConnectionStatus) {
	t.Helper()
	if len(evs) != 1 {
		t.Fatalf("%s: %d webhook events %+v, want one %s", step, len(evs), evs, typ)
	}
	d := evs[0].Data
	if evs[0].Type != typ || d.ConnectionID != c.ID || d.Provider != "remote" || d.AccountID != c.AccountID || d.AccountID == "" ||
		d.AccountLogin != c.AccountLogin || d.Status != string(status) ||
		d.Principal != (webhook.Principal{Issuer: pr.Issuer, Subject: pr.Subject}) {
		t.Fatalf("%s: event %+v, want %s of %s (provider remote, account %s, status %s, %s)", step, evs[0], typ, c.ID, c.AccountID, status, pr.Subject)
	}
}

// mcpStatus is what the demo MCP server answers an initialize request
// carrying token, and the outcome it recorded for it.
func (l *mcpLife) mcpStatus(token string) (int, string) {
	l.t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	req, _ := http.NewRequest(http.MethodPost, l.mcpURL, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		l.t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	reqs := l.up.Requests()
	if len(reqs) == 0 {
		l.t.Fatal("the MCP server recorded no request")
	}
	last := reqs[len(reqs)-1]
	if last.Token != demoprovider.Fingerprint(token) {
		l.t.Fatalf("the MCP server's last request is not this one: %+v", last)
	}
	return resp.StatusCode, last.Outcome
}

// wantMCPAccepts and wantMCPRefuses check the demo MCP server's answer
// to token.
func (l *mcpLife) wantMCPAccepts(what, token string) {
	l.t.Helper()
	if st, outcome := l.mcpStatus(token); st != http.StatusOK || outcome != "ok" {
		l.t.Fatalf("%s: the MCP server answers HTTP %d (%s), want 200 (ok)", what, st, outcome)
	}
}

func (l *mcpLife) wantMCPRefuses(what, token string) {
	l.t.Helper()
	if st, outcome := l.mcpStatus(token); st != http.StatusUnauthorized || outcome != "invalid_token" {
		l.t.Fatalf("%s: the MCP server answers HTTP %d (%s), want 401 (invalid_token)", what, st, outcome)
	}
}

// TestKeepAliveRefreshesMCPConnection: a type: mcp entry with keep_alive
// has its connection refreshed by the keep-alive pass once its tokens
// are older than keep_alive_refresh, though nobody used it: the server's
// authorization server gets grant_type=refresh_token from the client the
// broker registered there, with resource = mcp.url exactly once (none
// with resource_on_refresh: false), and the rotated tokens are stored,
// bound to the server, which takes the new access token. A pass right
// after refreshes nothing.
func TestKeepAliveRefreshesMCPConnection(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		resource    bool
	}{
		{"resource on refresh (default)", "", true},
		{"resource_on_refresh false", ", resource_on_refresh: false", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newMCPLife(t, mcpLifeOpts{mcpExtra: tc.extra})
			c := l.connect(alice, "remote", "1001")
			before := l.full(c.ID)
			if before.Provider != "remote" || before.Status != vault.StatusActive || before.Token.RefreshToken == "" {
				t.Fatalf("connected %+v, want an active remote connection with a refresh token", c)
			}
			l.wantMCPAccepts("the first access token", before.Token.AccessToken.Reveal())
			forms, clients := l.tokenRequests()
			if len(forms) != 1 || forms[0].Get("grant_type") != "authorization_code" || !slices.Equal(forms[0]["resource"], []string{l.mcpURL}) ||
				!strings.HasPrefix(clients[0], "dcr_") {
				t.Fatalf("token requests of the connect: %v by %v, want one code exchange with resource %s by a registered client", forms, clients, l.mcpURL)
			}

			// Not due yet: nothing is sent.
			l.clock.Advance(23 * time.Hour)
			if rep, waits := l.pass(); rep != (connections.KeepAliveReport{Checked: 1}) || waits != 0 {
				t.Fatalf("a pass before keep_alive_refresh: %+v (%d waits), want only checked", rep, waits)
			}
			l.clock.Advance(2 * time.Hour)
			rep, waits := l.pass()
			if rep != (connections.KeepAliveReport{Checked: 1, Refreshed: 1}) || waits != 1 {
				t.Fatalf("keep-alive pass: %+v (%d waits), want the one connection refreshed", rep, waits)
			}
			forms, clients = l.tokenRequests()
			if len(forms) != 2 {
				t.Fatalf("%d token requests, want the code exchange and one refresh", len(forms))
			}
			refresh := forms[1]
			if refresh.Get("grant_type") != "refresh_token" || refresh.Get("refresh_token") != before.Token.RefreshToken.Reveal() ||
				clients[1] != clients[0] {
				t.Fatalf("refresh request %v by %q, want grant_type=refresh_token with the stored refresh token by %q", refresh, clients[1], clients[0])
			}
			if tc.resource && !slices.Equal(refresh["resource"], []string{l.mcpURL}) || !tc.resource && refresh.Has("resource") {
				t.Fatalf("refresh request's resource %q; want [%s] with resource_on_refresh, none without (resource_on_refresh %v)",
					refresh["resource"], l.mcpURL, tc.resource)
			}
			after := l.full(c.ID)
			if after.Status != vault.StatusActive || !after.LastRefreshed.Equal(l.clock.Now()) ||
				after.Token.AccessToken == before.Token.AccessToken || after.Token.RefreshToken == before.Token.RefreshToken {
				t.Fatalf("after the pass: status %s, last refreshed %v (now %v), tokens rotated: %v/%v", after.Status, after.LastRefreshed,
					l.clock.Now(), after.Token.AccessToken != before.Token.AccessToken, after.Token.RefreshToken != before.Token.RefreshToken)
			}
			in, ok := l.demo.Introspect(after.Token.AccessToken.Reveal())
			if !ok || in.Resource != l.mcpURL {
				t.Fatalf("the refreshed access token: live %v, resource %q; want bound to %s", ok, in.Resource, l.mcpURL)
			}
			l.wantMCPAccepts("the refreshed access token", after.Token.AccessToken.Reveal())

			if rep, waits := l.pass(); rep != (connections.KeepAliveReport{Checked: 1}) || waits != 0 {
				t.Fatalf("a pass right after: %+v (%d waits), want nothing refreshed", rep, waits)
			}
			if forms, _ := l.tokenRequests(); len(forms) != 2 {
				t.Fatalf("a pass right after sent %d more token requests", len(forms)-2)
			}
		})
	}
}

// TestKeepAliveRefusedMCPRefreshNeedsReconnect: when the MCP server's
// authorization server refuses the refresh token the keep-alive pass
// sends (it expired while the broker was not running: idle expiry), the
// connection is marked needs_reconnect, the next request for it asks the
// person to reconnect, and later passes leave it alone.
func TestKeepAliveRefusedMCPRefreshNeedsReconnect(t *testing.T) {
	l := newMCPLife(t, mcpLifeOpts{refreshIdle: 48 * time.Hour})
	c := l.connect(alice, "remote", "1001")
	l.clock.Advance(72 * time.Hour)
	rep, _ := l.pass()
	if rep != (connections.KeepAliveReport{Checked: 1, Reconnect: 1}) {
		t.Fatalf("keep-alive pass: %+v, want the one connection refused", rep)
	}
	forms, _ := l.tokenRequests()
	if len(forms) != 2 || forms[1].Get("grant_type") != "refresh_token" || !slices.Equal(forms[1]["resource"], []string{l.mcpURL}) {
		t.Fatalf("token requests %v, want a refresh with resource %s", forms, l.mcpURL)
	}
	var refused bool
	for _, e := range l.demo.Events() {
		refused = refused || e.Kind == "token" && e.GrantType == "refresh_token" && e.Error == "invalid_grant"
	}
	if !refused {
		t.Fatalf("the authorization server did not refuse the refresh: %+v", l.demo.Events())
	}
	if got := l.full(c.ID); got.Status != vault.StatusNeedsReconnect {
		t.Fatalf("status after a refused refresh: %s, want needs_reconnect", got.Status)
	}
	o, err := l.conns.Ensure(context.Background(), connections.Request{Principal: alice, Provider: "remote", Via: "mcp", CanAsk: true})
	if need, ok := o.(connections.NeedsUser); err != nil || !ok || need.Why.Kind != connections.Reconnect {
		t.Fatalf("Ensure after the refusal = %#v, %v; want NeedsUser (reconnect)", o, err)
	}
	if rep, waits := l.pass(); rep != (connections.KeepAliveReport{Checked: 1}) || waits != 0 {
		t.Fatalf("a pass over a connection needing reconnection: %+v (%d waits), want it skipped", rep, waits)
	}
	if forms, _ := l.tokenRequests(); len(forms) != 2 {
		t.Fatalf("%d token requests after the skipping pass, want still 2", len(forms))
	}
	audited := false
	for _, line := range strings.Split(l.audit.String(), "\n") {
		audited = audited || strings.Contains(line, "audit: needs_reconnect") && strings.Contains(line, "provider=remote") &&
			strings.Contains(line, "connection="+c.ID) && strings.Contains(line, "invalid_grant")
	}
	if !audited {
		t.Fatalf("no needs_reconnect audit event for the remote connection:\n%s", l.audit.String())
	}
}

// TestWebhookEventsForMCPConnection: a type: mcp connection goes through
// every connection.* event, each delivered to the endpoint naming the
// remote provider, the connection, its account and its person, never a
// token: created on connecting; refresh_failed when the server's
// authorization server loses the answer to a keep-alive refresh (the
// connection stays active); needs_reconnect when the next pass re-sends
// the refresh token it had spent (reuse detection ends the grant);
// reconnected when the person connects the same account again (the same
// connection); deleted on disconnecting.
func TestWebhookEventsForMCPConnection(t *testing.T) {
	l := newMCPLife(t, mcpLifeOpts{})
	ctx := context.Background()
	var tokens []string
	keep := func(id string) {
		c := l.full(id)
		tokens = append(tokens, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal())
	}

	c := l.connect(alice, "remote", "1001")
	keep(c.ID)
	wantMCPEvent(t, "connect", l.drain(), webhook.ConnectionCreated, c, alice, vault.StatusActive)

	l.clock.Advance(25 * time.Hour)
	l.demo.LoseRefreshAnswers(1)
	if rep, _ := l.pass(); rep != (connections.KeepAliveReport{Checked: 1, Failed: 1}) {
		t.Fatalf("pass with the answer lost: %+v, want one failure", rep)
	}
	if got := l.full(c.ID); got.Status != vault.StatusActive {
		t.Fatalf("status after a failed refresh: %s, want active", got.Status)
	}
	wantMCPEvent(t, "refresh failed", l.drain(), webhook.ConnectionRefreshFailed, c, alice, vault.StatusActive)

	if rep, _ := l.pass(); rep != (connections.KeepAliveReport{Checked: 1, Reconnect: 1}) {
		t.Fatalf("pass re-sending the spent refresh token: %+v, want needs_reconnect", rep)
	}
	wantMCPEvent(t, "refused", l.drain(), webhook.ConnectionNeedsReconnect, c, alice, vault.StatusNeedsReconnect)

	again := l.connect(alice, "remote", "1001")
	if again.ID != c.ID || again.Status != vault.StatusActive {
		t.Fatalf("reconnecting stored %s (%s), want %s active", again.ID, again.Status, c.ID)
	}
	keep(c.ID)
	wantMCPEvent(t, "reconnect", l.drain(), webhook.ConnectionReconnected, c, alice, vault.StatusActive)

	d, err := l.conns.Disconnect(ctx, connections.Request{Principal: alice, Provider: "remote", Via: "mcp"})
	if err != nil || d.Revocation != provider.Revoked || d.Conn.ID != c.ID {
		t.Fatalf("Disconnect = %+v, %v; want %s revoked", d, err, c.ID)
	}
	wantMCPEvent(t, "disconnect", l.drain(), webhook.ConnectionDeleted, c, alice, vault.StatusActive)

	all := l.allHooks()
	for _, tok := range tokens {
		if tok == "" || strings.Contains(all, tok) {
			t.Fatalf("a webhook body carries a token (or a token was empty):\n%s", all)
		}
	}
}

// mcpAdmin is the operator offboarding people and disabling providers in
// these tests.
var mcpAdmin = connections.Admin{Principal: vault.Principal{Issuer: "https://idp.test", Subject: "root"}, Via: "cli"}

// TestOffboardMCPConnection: offboarding alice revokes her type: mcp
// connection at the server's authorization server (the server then
// refuses its access token) and deletes it, as it does her oauth2
// connection, with a connection.deleted event for each and the admin
// audited; bob's connection to the same MCP server is left working.
func TestOffboardMCPConnection(t *testing.T) {
	l := newMCPLife(t, mcpLifeOpts{})
	ctx := context.Background()
	mine := l.connect(alice, "remote", "1001")
	other := l.connect(alice, "demo", "1001")
	bobs := l.connect(bob, "remote", "1002")
	myToken, bobToken := l.full(mine.ID).Token.AccessToken.Reveal(), l.full(bobs.ID).Token.AccessToken.Reveal()
	l.wantMCPAccepts("alice's access token before offboarding", myToken)
	if n := len(l.drain()); n != 3 {
		t.Fatalf("%d events for three connections, want 3", n)
	}

	rep, err := l.conns.Offboard(ctx, mcpAdmin, alice)
	if err != nil || !rep.Complete() || len(rep.Connections) != 2 {
		t.Fatalf("Offboard = %+v, %v; want both of alice's connections, complete", rep, err)
	}
	for _, oc := range rep.Connections {
		want := map[string]string{mine.ID: "remote", other.ID: "demo"}[oc.ID]
		if oc.Provider != want || want == "" || oc.Revocation != provider.Revoked || oc.Pending || oc.Retry {
			t.Fatalf("offboarded %+v, want %s revoked", oc, want)
		}
		if oc.ID == mine.ID && oc.Account != connections.AccountName(mine) {
			t.Fatalf("offboarded MCP connection names account %q, want %q", oc.Account, connections.AccountName(mine))
		}
	}
	if left, _ := l.conns.List(ctx, alice); len(left) != 0 {
		t.Fatalf("alice still has %d connections", len(left))
	}
	if _, err := l.store.GetConnection(ctx, mine.ID); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("alice's MCP connection is still stored: %v", err)
	}
	l.wantMCPRefuses("alice's access token after offboarding", myToken)
	if got := l.full(bobs.ID); got.Status != vault.StatusActive {
		t.Fatalf("bob's MCP connection: %s, want active", got.Status)
	}
	l.wantMCPAccepts("bob's access token after offboarding alice", bobToken)

	evs := l.drain()
	if len(evs) != 2 {
		t.Fatalf("%d events after offboarding, want 2 connection.deleted: %+v", len(evs), evs)
	}
	var mcpEvents []mcpHookEvent
	for _, ev := range evs {
		if ev.Type != webhook.ConnectionDeleted || ev.Data.Principal.Subject != "alice" {
			t.Fatalf("event %+v, want connection.deleted of alice's", ev)
		}
		if ev.Data.Provider == "remote" {
			mcpEvents = append(mcpEvents, ev)
		}
	}
	wantMCPEvent(t, "offboard", mcpEvents, webhook.ConnectionDeleted, mine, alice, vault.StatusActive)

	revoked := false
	for _, line := range strings.Split(l.audit.String(), "\n") {
		if strings.Contains(line, "audit: revoke") && strings.Contains(line, "connection="+mine.ID) {
			revoked = strings.Contains(line, "outcome=revoked") && strings.Contains(line, "provider=remote") && strings.Contains(line, "admin.sub=root")
		}
	}
	if !revoked {
		t.Fatalf("no revoke audit event for the MCP connection by root:\n%s", l.audit.String())
	}
}

// TestOffboardRetriesMCPRevocation: when the MCP server's authorization
// server fails the revocation, offboarding deletes the connection all
// the same (connection.deleted) and keeps its sealed record; the token
// still works there until the next run revokes it from that record.
func TestOffboardRetriesMCPRevocation(t *testing.T) {
	l := newMCPLife(t, mcpLifeOpts{})
	ctx := context.Background()
	c := l.connect(alice, "remote", "1001")
	tok := l.full(c.ID).Token.AccessToken.Reveal()
	l.drain()
	l.demo.FailRevocations(1)

	first, err := l.conns.Offboard(ctx, mcpAdmin, alice)
	if err != nil || first.Complete() || len(first.Connections) != 1 {
		t.Fatalf("first run: %+v, %v; want one connection pending", first, err)
	}
	if oc := first.Connections[0]; oc.ID != c.ID || oc.Provider != "remote" || !oc.Pending || oc.Revocation != provider.NotConfirmed || oc.Error == "" {
		t.Fatalf("first run: %+v, want %s pending (not confirmed)", oc, c.ID)
	}
	if _, err := l.store.GetConnection(ctx, c.ID); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("the connection is still stored: %v", err)
	}
	wantMCPEvent(t, "first run", l.drain(), webhook.ConnectionDeleted, c, alice, vault.StatusActive)
	l.wantMCPAccepts("the token whose revocation failed", tok)

	second, err := l.conns.Offboard(ctx, mcpAdmin, alice)
	if err != nil || !second.Complete() || len(second.Connections) != 1 {
		t.Fatalf("second run: %+v, %v; want the retry, complete", second, err)
	}
	if oc := second.Connections[0]; oc.ID != c.ID || oc.Provider != "remote" || !oc.Retry || oc.Revocation != provider.Revoked {
		t.Fatalf("second run: %+v, want %s retried and revoked", oc, c.ID)
	}
	l.wantMCPRefuses("the token after the retried revocation", tok)
	if evs := l.drain(); len(evs) != 0 {
		t.Fatalf("the retry published %+v, want nothing more", evs)
	}
	third, err := l.conns.Offboard(ctx, mcpAdmin, alice)
	if err != nil || !third.Complete() || len(third.Connections) != 0 {
		t.Fatalf("third run: %+v, %v; want nothing left", third, err)
	}
}

// TestDisableMCPProvider: disabling a type: mcp provider marks every
// connection to it needs_reconnect (a connection.needs_reconnect event
// each), and with delete revokes each at the server's authorization
// server and deletes it (connection.deleted); another provider's
// connection is untouched.
func TestDisableMCPProvider(t *testing.T) {
	l := newMCPLife(t, mcpLifeOpts{})
	ctx := context.Background()
	conns := map[string]vault.Connection{"alice": l.connect(alice, "remote", "1001"), "bob": l.connect(bob, "remote", "1002")}
	plain := l.connect(alice, "demo", "1001")
	l.drain()

	rep, err := l.conns.DisableProvider(ctx, mcpAdmin, "remote", false)
	if err != nil || rep.Marked != 2 {
		t.Fatalf("disable: %+v, %v; want 2 marked", rep, err)
	}
	evs := l.drain()
	if len(evs) != 2 {
		t.Fatalf("%d events after disabling, want 2: %+v", len(evs), evs)
	}
	for _, ev := range evs {
		who := vault.Principal{Issuer: ev.Data.Principal.Issuer, Subject: ev.Data.Principal.Subject}
		wantMCPEvent(t, "disable "+who.Subject, []mcpHookEvent{ev}, webhook.ConnectionNeedsReconnect, conns[who.Subject], who, vault.StatusNeedsReconnect)
	}
	for who, c := range conns {
		if got := l.full(c.ID); got.Status != vault.StatusNeedsReconnect {
			t.Fatalf("%s's MCP connection: %s, want needs_reconnect", who, got.Status)
		}
	}
	if got := l.full(plain.ID); got.Status != vault.StatusActive {
		t.Fatalf("the oauth2 connection: %s, want active", got.Status)
	}

	tokens := map[string]string{}
	for who, c := range conns {
		tokens[who] = l.full(c.ID).Token.AccessToken.Reveal()
		l.wantMCPAccepts(who+"'s token before deleting", tokens[who])
	}
	rep, err = l.conns.DisableProvider(ctx, mcpAdmin, "remote", true)
	if err != nil || rep.Deleted != 2 || rep.Revocations[provider.Revoked] != 2 {
		t.Fatalf("delete: %+v, %v; want 2 deleted, revoked", rep, err)
	}
	for who, c := range conns {
		if _, err := l.store.GetConnection(ctx, c.ID); !errors.Is(err, vault.ErrNotFound) {
			t.Fatalf("%s's MCP connection is still stored: %v", who, err)
		}
		l.wantMCPRefuses(who+"'s token after deleting", tokens[who])
	}
	evs = l.drain()
	if len(evs) != 2 {
		t.Fatalf("%d events after deleting, want 2: %+v", len(evs), evs)
	}
	for _, ev := range evs {
		who := vault.Principal{Issuer: ev.Data.Principal.Issuer, Subject: ev.Data.Principal.Subject}
		wantMCPEvent(t, "delete "+who.Subject, []mcpHookEvent{ev}, webhook.ConnectionDeleted, conns[who.Subject], who, vault.StatusNeedsReconnect)
	}
	if got := l.full(plain.ID); got.Status != vault.StatusActive {
		t.Fatalf("the oauth2 connection after deleting: %s, want active", got.Status)
	}
}
