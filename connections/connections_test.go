package connections_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/demoprovider"
	"credbroker/internal/demoprovider/demotest"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// rig is the connections layer over the real demo provider (rotating
// refresh tokens, RFC 7009 revocation), an encrypted in-memory store and a
// telemetry recorder whose audit log is kept.
type rig struct {
	t     *testing.T
	demo  *demoprovider.Provider
	oauth demotest.Client
	store *memstore.Store
	keys  *vault.Keyring
	conns *connections.Service
	// grants and client are the ones conns uses; opts built conns.
	grants *binding.Service
	client *provider.Client
	opts   connections.Options
	audit  *bytes.Buffer
	rec    *telemetry.Recorder
	clock  *clock
	// broken answers 500 to every revocation request.
	broken *httptest.Server
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var alice = vault.Principal{Issuer: "https://idp.test", Subject: "alice"}

const redirect = "https://broker.test/oauth/demo/callback"

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{t: t, audit: &bytes.Buffer{}, clock: &clock{t: time.Now()}}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	var err error
	r.demo, err = demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/demo", ClientID: "demo-client",
		ClientSecret: "demo-secret-value", RedirectURIs: []string{redirect}})
	if err != nil {
		t.Fatal(err)
	}
	mux.Handle("/demo/", r.demo.Handler())
	r.oauth = demotest.Client{AuthURL: r.demo.AuthURL(), TokenURL: r.demo.TokenURL(), ClientID: "demo-client",
		ClientSecret: "demo-secret-value", RedirectURL: redirect}
	r.broken = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, `{"error":"server_error"}`, http.StatusInternalServerError)
	}))
	t.Cleanup(r.broken.Close)
	entry := func(name, revocation string) string {
		return `  ` + name + `:
    type: oauth2
    authorization_url: ` + r.demo.AuthURL() + `
    token_url: ` + r.demo.TokenURL() + `
    client_id: demo-client
    client_secret: ${S}
    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    account: {url: ` + r.demo.APIBase() + `/user, id_field: id, login_field: login}
    api: {base_url: ` + r.demo.APIBase() + `}
` + revocation
	}
	doc := "providers:\n" +
		entry("demo", "    revocation: {style: rfc7009, url: "+srv.URL+"/demo/revoke}\n") +
		entry("plain", "") +
		entry("broken", "    revocation: {style: rfc7009, url: "+r.broken.URL+"/revoke}\n") + demoKeysEntry(r.demo) +
		"  remote:\n    type: mcp\n    mcp: {url: " + r.broken.URL + "/mcp, offline_access: never}\n"
	reg, err := provider.ParseProviders("rig", []byte(doc), func(string) string { return "demo-secret-value" })
	if err != nil {
		t.Fatal(err)
	}
	r.keys, _ = vault.ParseKeys(vault.GenerateKey())
	r.store = memstore.New(r.keys)
	log := slog.New(slog.NewTextHandler(r.audit, nil))
	rec := telemetry.New(telemetry.Options{Providers: reg.Names(), Audit: log})
	r.rec = rec
	r.client, err = provider.New(provider.Options{Store: r.store, Providers: reg, Now: r.clock.Now, Telemetry: rec})
	if err != nil {
		t.Fatal(err)
	}
	r.grants = binding.New(r.store, binding.Options{Now: r.clock.Now})
	r.opts = connections.Options{Store: r.store, Grants: r.grants,
		Client: r.client, PublicURL: "https://broker.test", Telemetry: rec, Logger: log, Now: r.clock.Now}
	r.conns, err = connections.New(r.opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) req(p string) connections.Request {
	return connections.Request{Principal: alice, Provider: p, Via: "mcp", CanAsk: true}
}

// connect runs the whole connect: Ensure starts a request, the browser
// step is the demo provider's code flow, Save stores and completes it.
func (r *rig) connect(p, account string) vault.Connection {
	r.t.Helper()
	ctx := context.Background()
	o, err := r.conns.Ensure(ctx, r.req(p))
	if err != nil {
		r.t.Fatal(err)
	}
	need, ok := o.(connections.NeedsUser)
	if !ok || need.Grant == nil {
		r.t.Fatalf("Ensure = %#v, want NeedsUser with a connect request", o)
	}
	g, err := binding.New(r.store, binding.Options{Now: r.clock.Now}).Authorize(ctx, need.Grant.ID, alice)
	if err != nil {
		r.t.Fatal(err)
	}
	tok := r.oauth.CodeFlow(r.t, account, g.Scopes)
	login := map[string]string{"1001": "alice-demo", "1002": "bob-demo"}[account]
	c, err := r.conns.Save(ctx, alice, g, need.Provider, provider.Exchanged{
		Account: provider.Account{ID: account, Login: login}, Scopes: g.Scopes, Token: provider.TokenSet(tok)})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// TestReconnectSameAccountKeepsTheConnection: a refused refresh token marks
// the connection needs_reconnect; connecting the same provider account
// again (as the callback does) updates that connection in place, and calls
// work again on the same id.
func TestReconnectSameAccountKeepsTheConnection(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.connect("demo", "1001")
	full, _ := r.store.GetConnection(ctx, c.ID)
	if _, err := r.store.UpdateConnection(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
		old.Token.Expiry = time.Now().Add(-time.Minute)
		return old, nil
	}); err != nil {
		t.Fatal(err)
	}
	// Spend the refresh token behind the broker's back: the demo provider's
	// reuse detection then refuses the broker's refresh.
	r.oauth.Refresh(t, full.Token.RefreshToken.Reveal())
	if _, err := r.conns.Call(ctx, c, provider.APIRequest{Method: "GET", Path: "/user"}); !errors.Is(err, provider.ErrNeedsReconnect) {
		t.Fatalf("call with a dead grant: %v, want ErrNeedsReconnect", err)
	}
	o, err := r.conns.Ensure(ctx, r.req("demo"))
	if err != nil {
		t.Fatal(err)
	}
	if need, ok := o.(connections.NeedsUser); !ok || need.Why.Kind != connections.Reconnect {
		t.Fatalf("Ensure after the grant died = %#v, want NeedsUser (reconnect)", o)
	}
	again := r.connect("demo", "1001")
	if again.ID != c.ID || again.Status != vault.StatusActive {
		t.Fatalf("reconnect stored %s (%s), want %s active", again.ID, again.Status, c.ID)
	}
	list, _ := r.conns.List(ctx, alice)
	if len(list) != 1 {
		t.Fatalf("%d connections after reconnecting the same account, want 1", len(list))
	}
	resp, err := r.conns.Call(ctx, again, provider.APIRequest{Method: "GET", Path: "/user"})
	if err != nil || resp.Status != http.StatusOK || !strings.Contains(string(resp.Body), "alice-demo") {
		t.Fatalf("after reconnecting: %v %d %s", err, resp.Status, resp.Body)
	}
}

// TestDecryptsOnlyWhereUsed: listing and picking open no token set; a
// provider call opens exactly one, and recording its use re-seals nothing.
func TestDecryptsOnlyWhereUsed(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	var demo vault.Connection
	for _, p := range []string{"demo", "plain", "broken"} {
		c := r.connect(p, "1001")
		if p == "demo" {
			demo = c
		}
	}
	for _, id := range []string{"c4", "c5"} {
		if _, err := r.store.CreateConnection(ctx, vault.Connection{ID: id, Principal: alice, Provider: "plain", AccountID: id,
			Status: vault.StatusActive, Token: vault.TokenSet{AccessToken: "at-" + vault.Secret(id)}}); err != nil {
			t.Fatal(err)
		}
	}
	before := r.keys.Opens()
	list, err := r.conns.List(ctx, alice)
	if err != nil || len(list) != 5 {
		t.Fatalf("list: %d, %v", len(list), err)
	}
	o, err := r.conns.Pick(ctx, r.req("demo"))
	if _, ok := o.(connections.Connected); err != nil || !ok {
		t.Fatalf("pick: %#v %v", o, err)
	}
	if n := r.keys.Opens() - before; n != 0 {
		t.Fatalf("listing and picking opened %d token sets, want 0", n)
	}
	before = r.keys.Opens()
	if _, err := r.conns.Call(ctx, demo, provider.APIRequest{Method: "GET", Path: "/user"}); err != nil {
		t.Fatal(err)
	}
	if n := r.keys.Opens() - before; n != 1 {
		t.Fatalf("a provider call opened %d token sets, want exactly 1", n)
	}
	after, _ := r.store.GetConnection(ctx, demo.ID)
	if after.SealedWith != demo.SealedWith || after.LastUsed.IsZero() {
		t.Fatalf("recording the use: last used %v, sealed with %s (was %s)", after.LastUsed, after.SealedWith, demo.SealedWith)
	}
}

// TestLastUsedRecordedAtMostOncePerMinute: a provider call records the
// connection's last use, but a busy connection is written at most once a
// minute.
func TestLastUsedRecordedAtMostOncePerMinute(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.connect("demo", "1001")
	use := func() vault.Connection {
		t.Helper()
		cur, err := r.store.ListConnections(ctx, alice)
		if err != nil || len(cur) != 1 {
			t.Fatal(err)
		}
		if _, err := r.conns.Call(ctx, cur[0], provider.APIRequest{Method: "GET", Path: "/user"}); err != nil {
			t.Fatal(err)
		}
		got, err := r.store.GetConnection(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := use()
	if !first.LastUsed.Equal(r.clock.Now()) {
		t.Fatalf("LastUsed = %v, want %v", first.LastUsed, r.clock.Now())
	}
	r.clock.Advance(30 * time.Second)
	if again := use(); again.Version != first.Version || !again.LastUsed.Equal(first.LastUsed) {
		t.Fatalf("a second use within a minute wrote the record (version %d → %d)", first.Version, again.Version)
	}
	r.clock.Advance(31 * time.Second)
	if later := use(); later.Version != first.Version+1 || !later.LastUsed.Equal(r.clock.Now()) {
		t.Fatalf("a use a minute later: version %d, LastUsed %v", later.Version, later.LastUsed)
	}
}

// TestDisconnectOutcomes: one disconnect for every front door, with a
// three-way revocation outcome, each audited the same way, and the
// connection deleted whatever the outcome.
func TestDisconnectOutcomes(t *testing.T) {
	for _, tt := range []struct {
		provider string
		want     provider.Revocation
	}{
		{"demo", provider.Revoked},
		{"plain", provider.NotSupported},
		{"broken", provider.NotConfirmed},
	} {
		t.Run(string(tt.want), func(t *testing.T) {
			r := newRig(t)
			ctx := context.Background()
			c := r.connect(tt.provider, "1001")
			full, _ := r.store.GetConnection(ctx, c.ID)
			d, err := r.conns.Disconnect(ctx, r.req(tt.provider))
			if err != nil || d.Revocation != tt.want || d.Conn.ID != c.ID {
				t.Fatalf("Disconnect = %+v, %v; want %s", d, err, tt.want)
			}
			if !d.Conn.Token.IsZero() {
				t.Fatal("the outcome carries token material")
			}
			if _, err := r.store.GetConnection(ctx, c.ID); !errors.Is(err, vault.ErrNotFound) {
				t.Fatalf("still stored: %v", err)
			}
			if tt.want == provider.Revoked && demotest.APIStatus(t, r.demo.APIBase(), full.Token.AccessToken.Reveal()) != http.StatusUnauthorized {
				t.Fatal("the demo provider still honours the token")
			}
			audit := r.audit.String()
			for _, want := range []string{"event=revoke", "outcome=" + string(tt.want), "event=disconnect", "connection=" + c.ID, "via=mcp"} {
				if !strings.Contains(audit, want) {
					t.Errorf("audit log lacks %q:\n%s", want, audit)
				}
			}
			for _, secret := range []string{full.Token.AccessToken.Reveal(), full.Token.RefreshToken.Reveal()} {
				if strings.Contains(audit, secret) {
					t.Fatal("a token appears in the audit log")
				}
			}
		})
	}
	t.Run("by id: another person's connection is not found", func(t *testing.T) {
		r := newRig(t)
		c := r.connect("demo", "1001")
		bob := connections.Request{Principal: vault.Principal{Issuer: alice.Issuer, Subject: "bob"}, Via: "browser"}
		if _, err := r.conns.DisconnectID(context.Background(), bob, c.ID); !errors.Is(err, vault.ErrNotFound) {
			t.Fatalf("bob disconnecting alice's connection: %v, want ErrNotFound", err)
		}
		if _, err := r.store.GetConnection(context.Background(), c.ID); err != nil {
			t.Fatalf("alice's connection was touched: %v", err)
		}
	})
}

// TestResumeOutcomes: a connect request resumed with each answer.
func TestResumeOutcomes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	start := func() *vault.Grant {
		o, err := r.conns.Ensure(ctx, r.req("demo"))
		if err != nil {
			t.Fatal(err)
		}
		return o.(connections.NeedsUser).Grant
	}
	g := start()
	if o, err := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.Cancel); err != nil {
		t.Fatal(err)
	} else if c, ok := o.(connections.Cancelled); !ok || !c.Until.Equal(g.Expires) {
		t.Fatalf("cancel = %#v", o)
	}
	if o, err := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.Accept); err != nil {
		t.Fatal(err)
	} else if n, ok := o.(connections.NeedsUser); !ok || n.Grant.ID != g.ID || !n.Why.Accepted {
		t.Fatalf("accept before the browser step = %#v, want the same request, pending", o)
	}
	if o, _ := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.Decline); o != (connections.Declined{Provider: o.(connections.Declined).Provider}) {
		t.Fatalf("decline = %#v", o)
	}
	if o, _ := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.NoAnswer); func() bool { _, ok := o.(connections.Declined); return !ok }() {
		t.Fatalf("a declined request resumed = %#v, want Declined", o)
	}
	other := r.req("demo")
	other.Principal.Subject = "mallory"
	if _, err := r.conns.Resume(ctx, other, start().ID, connections.Accept); !errors.Is(err, connections.ErrUnknownRequest) {
		t.Fatalf("another person's request: %v, want ErrUnknownRequest", err)
	}
	if _, err := r.conns.Resume(ctx, r.req("plain"), start().ID, connections.Accept); !errors.Is(err, connections.ErrUnknownRequest) {
		t.Fatalf("a request for another provider: %v, want ErrUnknownRequest", err)
	}
	g = start()
	r.clock.Advance(11 * time.Minute)
	if _, err := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.Accept); !errors.Is(err, connections.ErrRequestExpired) {
		t.Fatalf("expired request: %v, want ErrRequestExpired", err)
	}
}

// TestServerNameCarried: a connect request asked by a co-located server
// stores the server's configured name with the grant (next to the host's
// self-asserted name), and the connect audit event names it; requests of
// MCP clients name no server.
func TestServerNameCarried(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	req := r.req("demo")
	req.Via, req.Server, req.ClientName = "sidecar", "demorepos", "Claude"
	o, err := r.conns.Ensure(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	need, ok := o.(connections.NeedsUser)
	if !ok || need.Grant == nil || need.Grant.Server != "demorepos" || need.Grant.ClientName != "Claude" {
		t.Fatalf("Ensure = %#v, want a connect request by demorepos for Claude", o)
	}
	stored, err := r.store.GetGrant(ctx, need.Grant.ID)
	if err != nil || stored.Server != "demorepos" {
		t.Fatalf("stored grant %+v %v", stored, err)
	}
	g, err := binding.New(r.store, binding.Options{Now: r.clock.Now}).Authorize(ctx, need.Grant.ID, alice)
	if err != nil {
		t.Fatal(err)
	}
	tok := r.oauth.CodeFlow(t, "1001", g.Scopes)
	if _, err := r.conns.Save(ctx, alice, g, need.Provider, provider.Exchanged{
		Account: provider.Account{ID: "1001", Login: "alice-demo"}, Scopes: g.Scopes, Token: provider.TokenSet(tok)}); err != nil {
		t.Fatal(err)
	}
	var connectLine string
	for _, l := range strings.Split(r.audit.String(), "\n") {
		if strings.Contains(l, "event=connect ") {
			connectLine = l
		}
	}
	if !strings.Contains(connectLine, "server=demorepos") {
		t.Fatalf("connect audit event does not name the server: %q", connectLine)
	}
	o, err = r.conns.Ensure(ctx, connections.Request{Principal: alice, Provider: "demo", Scopes: []string{"repos"}, Via: "mcp", CanAsk: true, ClientName: "Claude"})
	if err != nil {
		t.Fatal(err)
	}
	if need, ok := o.(connections.NeedsUser); !ok || need.Grant == nil || need.Grant.Server != "" {
		t.Fatalf("an MCP client's request names a server: %#v", o)
	}
}

// noConnector hides the store's vault.GrantConnector, as a store without
// one-transaction connects would.
type noConnector struct{ vault.Store }

func (noConnector) Connector() vault.GrantConnector { return nil }

// TestSaveWithoutGrantConnector: on a store that cannot write the
// connection and complete the grant in one transaction, Save approves the
// (pending) grant, stores the connection and completes the grant in
// separate writes; a declined or expired grant stores nothing.
func TestSaveWithoutGrantConnector(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	opts := r.opts
	opts.Store = noConnector{r.store}
	cs, err := connections.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	demo, _ := r.client.Providers().Lookup("demo")
	ex := func(account string) provider.Exchanged {
		return provider.Exchanged{Account: provider.Account{ID: account, Login: "alice-demo"}, Scopes: []string{"profile"},
			Token: vault.TokenSet{AccessToken: vault.Secret("at-" + account), TokenType: "bearer", Expiry: r.clock.Now().Add(time.Hour)}}
	}
	o, err := cs.Ensure(ctx, r.req("demo"))
	if err != nil {
		t.Fatal(err)
	}
	need, ok := o.(connections.NeedsUser)
	if !ok || need.Grant == nil || need.Grant.State != vault.GrantPending {
		t.Fatalf("Ensure = %#v, want NeedsUser with a pending connect request", o)
	}
	c, err := cs.Save(ctx, alice, *need.Grant, demo, ex("1001"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.store.GetGrant(ctx, need.Grant.ID)
	if err != nil || g.State != vault.GrantCompleted || g.ConnectionID != c.ID {
		t.Fatalf("grant after Save: %+v %v, want completed with %s", g, err, c.ID)
	}
	if c.Token.AccessToken != "" {
		t.Fatal("Save returned the token")
	}

	declined, _ := r.grants.Create(ctx, alice, "demo", nil, "")
	r.grants.Deny(ctx, declined.ID, alice)
	expired, _ := r.grants.Create(ctx, alice, "demo", nil, "")
	r.clock.Advance(time.Hour)
	for name, g := range map[string]vault.Grant{"declined": declined, "expired": expired} {
		if _, err := cs.Save(ctx, alice, g, demo, ex("1002")); !errors.Is(err, connections.ErrRequestExpired) {
			t.Fatalf("%s grant: %v, want ErrRequestExpired", name, err)
		}
	}
	list, err := r.store.ListConnections(ctx, alice)
	if err != nil || len(list) != 1 || list[0].ID != c.ID {
		t.Fatalf("connections: %d %v, want only %s", len(list), err, c.ID)
	}
}

// TestScopesNotGranted: a person who grants fewer scopes than a connect
// request asked for (a granular consent screen) gets a connection holding
// what was granted, the request's scopes recorded beside them, and
// NotGranted naming the difference: in the completed request's answer, in
// the list, and no longer once a later request is granted in full. A
// connection that recorded no request (an API key, an older record) names
// nothing.
func TestScopesNotGranted(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	demo, _ := r.conns.Providers().Lookup("demo")
	req := r.req("demo")
	req.Scopes = []string{"profile", "repos"}
	// connectGranting runs a connect request for scopes and stores what the
	// provider granted: granted, a part of what was asked.
	connectGranting := func(scopes, granted []string) (vault.Grant, vault.Connection) {
		t.Helper()
		req := req
		req.Scopes = scopes
		o, err := r.conns.Ensure(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		need, ok := o.(connections.NeedsUser)
		if !ok || need.Grant == nil {
			t.Fatalf("Ensure = %#v, want a connect request", o)
		}
		g, err := r.grants.Authorize(ctx, need.Grant.ID, alice)
		if err != nil {
			t.Fatal(err)
		}
		tok := r.oauth.CodeFlow(t, "1001", granted)
		c, err := r.conns.Save(ctx, alice, g, demo, provider.Exchanged{
			Account: provider.Account{ID: "1001", Login: "alice-demo"}, Scopes: granted, Token: provider.TokenSet(tok)})
		if err != nil {
			t.Fatal(err)
		}
		return g, c
	}
	// A new connection records what its request asked for.
	if _, c := connectGranting([]string{"profile"}, []string{"profile"}); !slices.Equal(c.Requested, []string{"profile"}) || connections.NotGranted(demo, c) != nil {
		t.Fatalf("first connection: requested %v, not granted %v; want [profile], nothing", c.Requested, connections.NotGranted(demo, c))
	}
	// Asking for more updates it; the person unchecks repos.
	g, c := connectGranting(req.Scopes, []string{"profile"})
	if !slices.Equal(c.Scopes, []string{"profile"}) || !slices.Equal(c.Requested, []string{"profile", "repos"}) {
		t.Fatalf("stored scopes %v, requested %v; want [profile], [profile repos]", c.Scopes, c.Requested)
	}
	if got := connections.NotGranted(demo, c); !slices.Equal(got, []string{"repos"}) {
		t.Fatalf("NotGranted = %v, want [repos]", got)
	}
	words := connections.NotGrantedWords(demo, []string{"repos"})
	for _, want := range []string{`"repos"`, "was not granted", "refuses requests that need it"} {
		if !strings.Contains(words, want) {
			t.Errorf("NotGrantedWords = %q, want it to say %q", words, want)
		}
	}
	if w := connections.NotGrantedWords(demo, nil); w != "" {
		t.Errorf("NotGrantedWords(nothing) = %q, want empty", w)
	}
	// The client's retry of the completed request: connected, narrower.
	o, err := r.conns.Resume(ctx, req, g.ID, connections.Accept)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := o.(connections.Connected); !ok || !slices.Equal(connections.NotGranted(got.Provider, got.Conn), []string{"repos"}) {
		t.Fatalf("Resume = %#v, want Connected with repos not granted", o)
	}
	// The list reads metadata only, and carries the request's scopes.
	list, err := r.conns.List(ctx, alice)
	if err != nil || len(list) != 1 || !slices.Equal(connections.NotGranted(demo, list[0]), []string{"repos"}) {
		t.Fatalf("List = %+v (%v), want one connection with repos not granted", list, err)
	}
	// The next call needing repos asks again, for both scopes.
	if _, c2 := connectGranting(req.Scopes, req.Scopes); c2.ID != c.ID || connections.NotGranted(demo, c2) != nil {
		t.Fatalf("after a full grant: %s, not granted %v; want %s with nothing missing", c2.ID, connections.NotGranted(demo, c2), c.ID)
	}
	c.Requested = nil
	if got := connections.NotGranted(demo, c); got != nil {
		t.Errorf("a connection without a recorded request: NotGranted = %v, want nil", got)
	}
	if got := connections.NotGranted(nil, list[0]); got != nil {
		t.Errorf("a provider no longer configured: NotGranted = %v, want nil", got)
	}
}

// TestNeedsUserMessage: the words that go with a connect link name the
// scopes to approve, and say no "for scopes" when there are none (an MCP
// server whose defaults the broker leaves to it).
func TestNeedsUserMessage(t *testing.T) {
	p := &provider.Provider{Name: "linear", DisplayName: "Linear", Kind: &provider.MCP{}}
	for _, tc := range []struct {
		scopes []string
		want   string
	}{
		{[]string{"read", "write"}, "Connect your Linear account to continue: it is not connected yet. Open the link, sign in to the broker and approve access for scopes read write."},
		{nil, "Connect your Linear account to continue: it is not connected yet. Open the link, sign in to the broker and approve access."},
	} {
		n := connections.NeedsUser{Provider: p, Scopes: tc.scopes, Why: connections.Reason{Kind: connections.NotConnected}}
		if got := n.Message(); got != tc.want {
			t.Errorf("scopes %v: %q, want %q", tc.scopes, got, tc.want)
		}
	}
}
