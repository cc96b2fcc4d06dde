package connections_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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
		!strings.Contains(err.Error(), `account "bob-demo", not "alice-demo"`) {
		t.Fatalf("another account's key: %v", err)
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
