package connections_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/demoprovider"
	"credbroker/provider"
	"credbroker/vault"
)

// demoKeysEntry is the demo provider's API-key service, as broker dev
// configures it.
func demoKeysEntry(d *demoprovider.Provider) string {
	return `  demo-keys:
    display_name: Demo keys
    type: api_key
    instructions: Copy your demo account's key.
    instructions_url: ` + d.KeysURL() + `
    fields: [{name: api_key, label: API key, secret: true, pattern: '` + demoprovider.KeyPattern + `'}]
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /login}
    api: {base_url: ` + d.KeysAPIBase() + `}
`
}

// connectKey runs a whole key connect: a connect request (as Reconnect
// starts one), the entry page's work (VerifyKey), Save.
func (r *rig) connectKey(login string) vault.Connection {
	r.t.Helper()
	ctx := context.Background()
	o, err := r.conns.Reconnect(ctx, r.req("demo-keys"))
	if err != nil {
		r.t.Fatal(err)
	}
	need, ok := o.(connections.NeedsUser)
	if !ok || need.Grant == nil {
		r.t.Fatalf("Reconnect = %#v, want NeedsUser with a connect request", o)
	}
	ex := r.verify(login)
	g, err := r.grants.Authorize(ctx, need.Grant.ID, alice)
	if err != nil {
		r.t.Fatal(err)
	}
	c, err := r.conns.Save(ctx, alice, g, need.Provider, ex)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) verify(login string) provider.Exchanged {
	r.t.Helper()
	p, _ := r.conns.Providers().Lookup("demo-keys")
	ex, err := r.client.VerifyKey(context.Background(), p, map[string]string{"api_key": r.demo.APIKey(login)})
	if err != nil {
		r.t.Fatal(err)
	}
	return ex
}

// keyValues is what login's key entry form posts.
func (r *rig) keyValues(login string) map[string]string {
	return map[string]string{"api_key": r.demo.APIKey(login)}
}

// TestKeyConnections: a key connection is a connection like the others
// (Ensure finds it, one connection per account), it has no scopes, it is
// never exported, ReplaceKey keeps the connection and refuses another
// account's key or someone else's connection, and the words ask for a
// key in the browser, never in the app.
func TestKeyConnections(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	o, err := r.conns.Ensure(ctx, r.req("demo-keys"))
	if err != nil {
		t.Fatal(err)
	}
	if msg := o.(connections.NeedsUser).Message(); !strings.Contains(msg, "enter your Demo keys key there (never into this app)") {
		t.Errorf("message %q", msg)
	}
	c := r.connectKey("alice-demo")
	if o, err := r.conns.Ensure(ctx, r.req("demo-keys")); err != nil || o.(connections.Connected).Conn.ID != c.ID {
		t.Fatalf("Ensure after connecting: %#v %v", o, err)
	}
	if again := r.connectKey("alice-demo"); again.ID != c.ID {
		t.Fatalf("the same account connected twice: %s and %s", c.ID, again.ID)
	}
	req := r.req("demo-keys")
	req.Scopes = []string{"repos"}
	var se *connections.ScopeError
	if _, err := r.conns.Ensure(ctx, req); !errors.As(err, &se) || !strings.Contains(err.Error(), "no scopes") {
		t.Fatalf("scopes for a key: %v", err)
	}
	if _, err := r.conns.Export(ctx, r.req("demo-keys"), c); !errors.Is(err, connections.ErrExportDisabled) {
		t.Fatalf("export of a key: %v", err)
	}

	// Replace key: same connection, same account only.
	fresh, _ := r.demo.RotateKey("alice-demo")
	got, err := r.conns.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("alice-demo"))
	if err != nil || got.ID != c.ID || !got.Token.IsZero() {
		t.Fatalf("ReplaceKey: %+v %v", got, err)
	}
	if full, _ := r.store.GetConnection(ctx, c.ID); full.Token.Fields["api_key"].Reveal() != fresh {
		t.Fatal("the key was not replaced")
	}
	var ke *connections.KeyAccountError
	if _, err := r.conns.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("bob-demo")); !errors.As(err, &ke) ||
		strings.Contains(err.Error(), "bob-demo") || !strings.Contains(err.Error(), `enter a key of "alice-demo"`) {
		t.Fatalf("another account's key (refused, naming only the connection's own account): %v", err)
	}
	bob := r.req("demo-keys")
	bob.Principal = vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	if _, err := r.conns.ReplaceKey(ctx, bob, c.ID, r.keyValues("alice-demo")); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("bob replacing alice's key: %v", err)
	}
	oauth := r.connect("demo", "1001")
	if _, err := r.conns.ReplaceKey(ctx, r.req("demo"), oauth.ID, r.keyValues("alice-demo")); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("a key into an OAuth connection: %v", err)
	}
	if !strings.Contains(r.audit.String(), "outcome=key_replaced") {
		t.Error("no audit event for the replaced key")
	}
	d, err := r.conns.Disconnect(ctx, r.req("demo-keys"))
	if err != nil || d.Revocation != provider.NotSupported || d.Provider.Kind.Type() != provider.TypeAPIKey {
		t.Fatalf("disconnect: %+v %v", d, err)
	}
	for _, a := range demoprovider.Accounts() {
		if strings.Contains(r.audit.String(), r.demo.APIKey(a.Login)) {
			t.Error("the log holds a key")
		}
	}
}

// keyChecks counts the key checks the demo key service has answered.
func (r *rig) keyChecks() int {
	n := 0
	for _, e := range r.demo.Events() {
		if e.Kind == "keys-api" {
			n++
		}
	}
	return n
}

// TestReplaceKeyLimited: Replace key is no key-checking oracle. It is
// limited as a connect link's key entry is: 20 keys posted at once for
// one connection reach the key service 5 times, the others are refused
// with nothing sent (even the right key, until the window ends); another
// connection has a count of its own; a person's hourly budget of connect
// requests bounds the windows; and a valid key of another account is
// refused naming no account but the connection's own.
func TestReplaceKeyLimited(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	c := r.connectKey("alice-demo")
	before := r.keyChecks()
	errs := make([]error, 20)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = r.conns.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("bob-demo")) })
	}
	wg.Wait()
	sent, refused, other := r.keyChecks()-before, 0, 0
	for _, err := range errs {
		var ke *connections.KeyAccountError
		switch {
		case errors.Is(err, connections.ErrTooManyKeys):
			refused++
		case errors.As(err, &ke):
			other++
			if strings.Contains(err.Error(), "bob-demo") || strings.Contains(err.Error(), "1002") {
				t.Errorf("the refusal names the key's account: %v", err)
			}
		default:
			t.Errorf("a replacement with another account's key: %v", err)
		}
	}
	if sent != 5 || other != 5 || refused != 15 {
		t.Fatalf("20 parallel replacements: %d key checks at the provider, %d refused as another account's, %d as too many; want 5, 5, 15", sent, other, refused)
	}
	if _, err := r.conns.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("alice-demo")); !errors.Is(err, connections.ErrTooManyKeys) ||
		r.keyChecks()-before != 5 {
		t.Fatalf("the right key past the limit: %v, %d checks", err, r.keyChecks()-before)
	}
	// Another connection of alice's has its own count.
	second := r.connectKey("bob-demo")
	if _, err := r.conns.ReplaceKey(ctx, r.req("demo-keys"), second.ID, r.keyValues("bob-demo")); err != nil {
		t.Fatalf("replacing the key of another connection: %v", err)
	}
	// The next window allows as many again.
	r.clock.Advance(10 * time.Minute)
	if _, err := r.conns.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("alice-demo")); err != nil {
		t.Fatalf("a replacement in the next window: %v", err)
	}
	// The person's budget: each window of each connection is a connect
	// request of theirs.
	now := r.clock.Now()
	created, _, err := r.store.CountGrants(ctx, alice, now.Add(-time.Hour), now)
	if err != nil {
		t.Fatal(err)
	}
	opts := r.opts
	opts.Grants = binding.New(r.store, binding.Options{Now: r.clock.Now, MaxPerHour: created + 1})
	limited, err := connections.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(10 * time.Minute)
	if _, err := limited.ReplaceKey(ctx, r.req("demo-keys"), c.ID, r.keyValues("alice-demo")); err != nil {
		t.Fatalf("a replacement within the person's budget: %v", err)
	}
	checks := r.keyChecks()
	if _, err := limited.ReplaceKey(ctx, r.req("demo-keys"), second.ID, r.keyValues("bob-demo")); !errors.Is(err, connections.ErrRateLimited) ||
		r.keyChecks() != checks {
		t.Fatalf("a replacement past the person's budget: %v (%d checks sent)", err, r.keyChecks()-checks)
	}
}
