package connections_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/testskip"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

// listReads counts the listings that reach the store (vault.Observe).
type listReads struct{ n atomic.Int64 }

func (l *listReads) Begin(ctx context.Context, op string) context.Context {
	if op == "list_connections" {
		l.n.Add(1)
	}
	return ctx
}
func (l *listReads) End(context.Context, string, time.Duration, error) {}

// replica is one broker replica's connections core on a PostgreSQL
// store the replicas share, its listing cache following the store's feed
// through feed (which can be cut).
type replica struct {
	store  *pgstore.Store // the store as another process writes it
	writes vault.Store    // the store as this replica's own parts write it
	conns  *connections.Service
	reads  *listReads
	feed   *cuttableFeed
}

// cuttableFeed passes the store's connection changes on until cut, then
// nothing (a feed that has gone silent without noticing: no Lost).
type cuttableFeed struct {
	vault.AppWatch
	cut atomic.Bool
	// held passes the heartbeats on but not the changes: the cache stays
	// trusted while it hears of no other write.
	held atomic.Bool
}

func (f *cuttableFeed) WatchConnections(ctx context.Context, w vault.AppWatcher) error {
	return f.AppWatch.WatchConnections(ctx, vault.AppWatcher{
		Changed: func(k string) {
			if !f.cut.Load() && !f.held.Load() {
				w.Changed(k)
			}
		},
		Fresh: func(at time.Time) {
			if !f.cut.Load() {
				w.Fresh(at)
			}
		},
		Lost: w.Lost,
	})
}

func newReplica(t *testing.T, url string, kr *vault.Keyring) *replica {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url, kr, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	reg, err := provider.ParseProviders("replica", []byte(`providers:
  github:
    type: oauth2
    authorization_url: https://github.test/authorize
    token_url: https://github.test/token
    client_id: c
    client_secret: ${S}
    account: {url: https://api.github.test/user, id_field: id, login_field: login}
    default_scopes: [repo]
    allowed_scopes: [repo, read:user]
    api: {base_url: https://api.github.test}
`), func(string) string { return "secret" })
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{store: s, reads: &listReads{}, feed: &cuttableFeed{AppWatch: s.AppWatch()}}
	// As serve wires it: this process's own writes of a connection, the
	// provider client's included, reach its listing cache at once.
	var late connections.LateWrites
	r.writes = vault.Announced(s, &late)
	observed := vault.Observe(r.writes, r.reads)
	client, err := provider.New(provider.Options{Store: observed, Providers: reg})
	if err != nil {
		t.Fatal(err)
	}
	r.conns, err = connections.New(connections.Options{Store: observed, Client: client, PublicURL: "https://broker.test", Watch: r.feed})
	if err != nil {
		t.Fatal(err)
	}
	late.Set(r.conns)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := r.conns.Follow(ctx); err != nil {
			t.Errorf("Follow: %v", err)
		}
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// person has a NUL and a non-ASCII letter: the trigger's key and
// vault.Principal.Key must agree on every byte.
var person = vault.Principal{Issuer: "https://idp.test/é", Subject: "al\x00ice"}

// personConn is person's GitHub connection id, covering the default scope.
func personConn(id string) vault.Connection {
	return vault.Connection{ID: id, Principal: person, Provider: "github", AccountID: "1", AccountLogin: "alice",
		Scopes: []string{"repo"}, Status: vault.StatusActive, Created: time.Now(), Updated: time.Now(),
		Token: vault.TokenSet{AccessToken: "at-secret", TokenType: "Bearer"}}
}

// state is what Ensure on r says of person's GitHub connection:
// "connected", "reconnect" (needs_reconnect) or "none".
func (r *replica) state(t *testing.T) string {
	t.Helper()
	return stateOf(t, r.conns, person, "github")
}

// stateOf is what conns.Ensure says of p's connection to prov.
func stateOf(t *testing.T, conns *connections.Service, p vault.Principal, prov string) string {
	t.Helper()
	o, err := conns.Ensure(context.Background(), connections.Request{Principal: p, Provider: prov, Via: "mcp"})
	if err != nil {
		t.Fatal(err)
	}
	switch o := o.(type) {
	case connections.Connected:
		return "connected"
	case connections.NeedsUser:
		if o.Why.Kind == connections.Reconnect {
			return "reconnect"
		}
		return "none"
	}
	t.Fatalf("Ensure = %#v", o)
	return ""
}

// cached waits until r answers Ensure without reading the store (its
// feed is current and the listing cached) and says so.
func (r *replica) cached(t *testing.T, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		before := r.reads.n.Load()
		got := r.state(t)
		if got != want {
			t.Fatalf("waiting for the cache: Ensure says %q, want %q", got, want)
		}
		if r.reads.n.Load() == before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the listing is never answered from the cache")
		}
	}
}

// seenWithin asks r until it says want, and fails when a question asked
// more than bound after ack (when the write was acknowledged) gets
// another answer, or when r goes back to the old answer after saying want
// once. It returns how long after ack the first question answered want
// was asked.
func (r *replica) seenWithin(t *testing.T, want string, ack time.Time, bound time.Duration) time.Duration {
	t.Helper()
	var seen time.Duration = -1
	for {
		since := time.Since(ack)
		got := r.state(t)
		switch {
		case got == want && seen < 0:
			seen = since
		case got != want && seen >= 0:
			t.Fatalf("said %q %v after the write, having said %q at %v", got, since, want, seen)
		case got != want && since > bound:
			t.Fatalf("still says %q %v after the write was acknowledged (bound %v)", got, since, bound)
		}
		if seen >= 0 && since > bound {
			return seen
		}
	}
}

// TestReplicasListingBound: two replicas on one PostgreSQL database, each
// caching each person's connection listing for Ensure. A connection
// created on a, marked needs_reconnect on a, made active again and
// deleted on a is seen by b, whose listing was cached, within
// connections.ListBound of a's acknowledgement, and b never goes back.
func TestReplicasListingBound(t *testing.T) {
	testskip.Short(t, "PostgreSQL")
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	a, b := newReplica(t, url, kr), newReplica(t, url, kr)
	ctx := context.Background()
	var slowest time.Duration
	for round := range 5 {
		id := "conn-" + string(rune('a'+round))
		b.cached(t, "none")
		if _, err := a.store.CreateConnection(ctx, personConn(id)); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, b.seenWithin(t, "connected", time.Now(), connections.ListBound))
		b.cached(t, "connected")

		mark := func(st vault.ConnectionStatus) {
			if _, err := a.store.UpdateConnectionMeta(ctx, id, func(c vault.Connection) (vault.Connection, error) {
				c.Status = st
				return c, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		mark(vault.StatusNeedsReconnect)
		slowest = max(slowest, b.seenWithin(t, "reconnect", time.Now(), connections.ListBound))
		b.cached(t, "reconnect")
		mark(vault.StatusActive)
		slowest = max(slowest, b.seenWithin(t, "connected", time.Now(), connections.ListBound))
		b.cached(t, "connected")

		if err := a.store.DeleteConnection(ctx, id); err != nil {
			t.Fatal(err)
		}
		slowest = max(slowest, b.seenWithin(t, "none", time.Now(), connections.ListBound))
	}
	t.Logf("a's write to b's Ensure, 5 rounds of 4 writes: slowest %v (bound %v)", slowest, connections.ListBound)
}

// TestListingFailsClosed: when b's feed goes silent (no change and no
// heartbeat comes through, and nothing says it broke), b stops trusting
// its cached listing once ListBound has passed since the feed was last
// current, and reads the store: a connection a creates meanwhile is seen
// within ListBound of the cut, without a word from the feed.
func TestListingFailsClosed(t *testing.T) {
	testskip.Short(t, "PostgreSQL")
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	a, b := newReplica(t, url, kr), newReplica(t, url, kr)
	b.cached(t, "none")
	b.feed.cut.Store(true)
	cut := time.Now()
	if _, err := a.store.CreateConnection(context.Background(), personConn("conn-1")); err != nil {
		t.Fatal(err)
	}
	took := b.seenWithin(t, "connected", cut, connections.ListBound)
	t.Logf("feed cut to the new connection seen by reading the store: %v (bound %v)", took, connections.ListBound)
	before := b.reads.n.Load()
	b.state(t)
	if b.reads.n.Load() == before {
		t.Fatal("with its feed silent, b answered from its cache")
	}
}

// TestListingSeesOwnWritesAtOnce: on PostgreSQL, a write of a connection
// made by this replica's own parts outside the connections core (the
// provider client marking it needs_reconnect after invalid_grant, a
// refresh) is seen by the replica's next Ensure at once, not when its own
// notification comes back: here the feed passes heartbeats but no change,
// so only the announcement can tell the cache.
func TestListingSeesOwnWritesAtOnce(t *testing.T) {
	testskip.Short(t, "PostgreSQL")
	url := pgtest.Shared(t).Schema(t)
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	a := newReplica(t, url, kr)
	ctx := context.Background()
	if _, err := a.writes.CreateConnection(ctx, personConn("conn-1")); err != nil {
		t.Fatal(err)
	}
	a.cached(t, "connected")
	a.feed.held.Store(true)
	if _, err := a.writes.UpdateConnection(ctx, "conn-1", func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := a.state(t); got != "reconnect" {
		t.Fatalf("right after its own write, Ensure says %q, want reconnect", got)
	}
}

// TestListingSoleWriter: on a store this process alone writes (memory
// here, bolt in serve), announced to the listing cache (vault.Announced),
// Ensure answers from the cache, and every write of the person's
// connections (create, needs_reconnect, active again, delete) is seen by
// the next Ensure.
func TestListingSoleWriter(t *testing.T) {
	r := newRig(t)
	reads := &listReads{}
	conns, store := soleWriter(t, r, reads, false)
	ctx := context.Background()
	state := func() string { return stateOf(t, conns, alice, "demo") }
	expect := func(want string) {
		t.Helper()
		if got := state(); got != want {
			t.Fatalf("Ensure right after the write says %q, want %q", got, want)
		}
		before := reads.n.Load()
		if got := state(); got != want || reads.n.Load() != before {
			t.Fatalf("Ensure again: %q, %d store reads; want %q from the cache", got, reads.n.Load()-before, want)
		}
	}
	expect("none")
	c := vault.Connection{ID: "c1", Principal: alice, Provider: "demo", AccountID: "1001", AccountLogin: "alice-demo",
		Scopes: []string{"profile"}, Status: vault.StatusActive, Created: time.Now(), Updated: time.Now(),
		Token: vault.TokenSet{AccessToken: "at-secret", TokenType: "Bearer"}}
	if _, err := store.CreateConnection(ctx, c); err != nil {
		t.Fatal(err)
	}
	expect("connected")
	for _, st := range []vault.ConnectionStatus{vault.StatusNeedsReconnect, vault.StatusActive} {
		if _, err := store.UpdateConnectionMeta(ctx, "c1", func(c vault.Connection) (vault.Connection, error) {
			c.Status = st
			return c, nil
		}); err != nil {
			t.Fatal(err)
		}
		expect(map[vault.ConnectionStatus]string{vault.StatusNeedsReconnect: "reconnect", vault.StatusActive: "connected"}[st])
	}
	if err := store.DeleteConnection(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	expect("none")
}

// storeOps counts the store operations that reach the store, by name
// (vault.Observe).
type storeOps struct {
	mu sync.Mutex
	n  map[string]int
}

func (o *storeOps) Begin(ctx context.Context, op string) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n[op]++
	return ctx
}
func (o *storeOps) End(context.Context, string, time.Duration, error) {}

// take returns the counts since the last take.
func (o *storeOps) take() map[string]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := o.n
	o.n = map[string]int{}
	return n
}

// TestPerformReadsOnlyItsToken: a provider call (Perform) on a warm
// listing cache reads the store once, for the token it uses: the
// connection is picked from the cache and its last use is not written
// again within the minute. When the cached listing is behind the store
// (a change another replica made within ListBound; here written behind
// the announcing store's back), the call still reads the connection
// afresh: one marked needs_reconnect asks the person to reconnect, and
// one deleted is picked again from the store, asking the person to
// connect instead of failing.
func TestPerformReadsOnlyItsToken(t *testing.T) {
	r := newRig(t)
	c := r.connect("demo", "1001")
	ops := &storeOps{n: map[string]int{}}
	conns, _ := soleWriter(t, r, ops, true)
	ctx := context.Background()
	api := provider.APIRequest{Method: "GET", Path: "/user"}
	perform := func() connections.Outcome {
		t.Helper()
		o, err := conns.Perform(ctx, r.req("demo"), api, connections.Continuation{})
		if err != nil {
			t.Fatalf("Perform: %v", err)
		}
		return o
	}
	// The first call records the last use (a write, which drops the
	// listing); the one after it fills the cache.
	for range 2 {
		if o, ok := perform().(connections.Response); !ok || o.Resp.Status != http.StatusOK {
			t.Fatalf("Perform = %#v", o)
		}
	}
	ops.take()
	for range 3 {
		if o, ok := perform().(connections.Response); !ok || o.Conn.ID != c.ID {
			t.Fatalf("Perform = %#v", o)
		}
		if got := ops.take(); len(got) != 1 || got["get_connection"] != 1 {
			t.Fatalf("a call on a warm cache reached the store with %v, want get_connection once", got)
		}
	}

	if _, err := r.store.UpdateConnectionMeta(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
		old.Status = vault.StatusNeedsReconnect
		return old, nil
	}); err != nil {
		t.Fatal(err)
	}
	if o, ok := perform().(connections.NeedsUser); !ok || o.Why.Kind != connections.Reconnect || o.Grant == nil {
		t.Fatalf("Perform with needs_reconnect behind the cache = %#v, want NeedsUser (reconnect) with a connect request", o)
	}
	if err := r.store.DeleteConnection(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	ops.take()
	if o, ok := perform().(connections.NeedsUser); !ok || o.Why.Kind != connections.NotConnected || o.Grant == nil {
		t.Fatalf("Perform with the connection deleted behind the cache = %#v, want NeedsUser (not connected) with a connect request", o)
	}
	if got := ops.take(); got["list_connections"] != 1 {
		t.Fatalf("after the deleted connection the call read the listing %d times, want once from the store", got["list_connections"])
	}
}

// TestResumeReadsTheListingCache: the retry that finds its connect
// request completed takes the connection from the listing cache, filling
// it, so the person's next call reads no listing; a connection the cache
// has not seen (made on another replica within ListBound; here behind the
// announcing store's back) is found in the store.
func TestResumeReadsTheListingCache(t *testing.T) {
	r := newRig(t)
	ops := &storeOps{n: map[string]int{}}
	conns, _ := soleWriter(t, r, ops, false)
	ctx := context.Background()
	asked := func(prov string) *vault.Grant {
		t.Helper()
		o, err := conns.Ensure(ctx, r.req(prov))
		need, ok := o.(connections.NeedsUser)
		if err != nil || !ok || need.Grant == nil {
			t.Fatalf("Ensure(%s) = %#v, %v; want NeedsUser with a connect request", prov, o, err)
		}
		return need.Grant
	}
	resume := func(prov string, g *vault.Grant) {
		t.Helper()
		o, err := conns.Resume(ctx, r.req(prov), g.ID, connections.Accept)
		if c, ok := o.(connections.Connected); err != nil || !ok || c.Conn.Provider != prov {
			t.Fatalf("Resume(%s) = %#v, %v; want Connected", prov, o, err)
		}
	}

	g := asked("demo")
	tok := r.oauth.CodeFlow(t, "1001", g.Scopes)
	p, _ := conns.Providers().Lookup("demo")
	if _, err := conns.Save(ctx, alice, *g, p, provider.Exchanged{Account: provider.Account{ID: "1001", Login: "alice-demo"},
		Scopes: g.Scopes, Token: provider.TokenSet(tok)}); err != nil {
		t.Fatal(err)
	}
	resume("demo", g)
	ops.take()
	if got := stateOf(t, conns, alice, "demo"); got != "connected" {
		t.Fatalf("Ensure after the retry: %q", got)
	}
	if n := ops.take()["list_connections"]; n != 0 {
		t.Fatalf("the call after the retry read the listing %d times, want none (cached by the retry)", n)
	}

	g = asked("plain") // the listing is cached again
	if _, err := r.store.CreateConnection(ctx, vault.Connection{ID: "c-plain", Principal: alice, Provider: "plain", AccountID: "1001",
		Scopes: []string{"profile"}, Status: vault.StatusActive, Token: vault.TokenSet{AccessToken: "at-secret"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.grants.Approve(ctx, g.ID, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := r.grants.Complete(ctx, g.ID, alice, "c-plain"); err != nil {
		t.Fatal(err)
	}
	resume("plain", g)
}

// soleWriter is r's connections core as serve builds it on a bolt file:
// the store announced to the listing cache (the process its only writer),
// observed by obs, and that store. With ownClient its provider client
// reads through the same store, so obs sees the token reads too.
func soleWriter(t *testing.T, r *rig, obs vault.Observer, ownClient bool) (*connections.Service, vault.Store) {
	t.Helper()
	var late connections.LateWrites
	store := vault.Observe(vault.Announced(r.store, &late), obs)
	opts := r.opts
	opts.Store, opts.SoleWriter, opts.Grants = store, true, nil
	if ownClient {
		client, err := provider.New(provider.Options{Store: store, Providers: r.client.Providers(), Now: r.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		opts.Client = client
	}
	conns, err := connections.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	late.Set(conns)
	return conns, store
}
