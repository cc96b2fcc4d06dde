package connections_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/demoprovider/demotest"
	"credbroker/provider"
	"credbroker/vault"
)

// TestOffboardResumes: alice's two connections (one at a provider
// without revocation) are revoked and deleted
// and her open connect request goes; the revocation that fails once is
// retried by the next run from the kept record, which then goes too; a
// third run finds nothing. Every run runs the extension steps.
func TestOffboardResumes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	a := r.connect("demo", "1001")
	b := r.connect("plain", "1002")
	var tokens []string
	for _, c := range []vault.Connection{a, b} {
		full, err := r.store.GetConnection(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, full.Token.AccessToken.Reveal())
	}
	if _, err := r.conns.Ensure(ctx, r.req("broken")); err != nil { // an open connect request
		t.Fatal(err)
	}
	steps := 0
	admin := connections.Admin{Principal: vault.Principal{Issuer: "https://idp.test", Subject: "root"}, Via: "cli"}
	r.demo.FailRevocations(1)
	opts := r.opts
	opts.Offboard = []connections.OffboardStep{{Name: "app grants",
		Remove: func(_ context.Context, p vault.Principal, got connections.Admin) (int, error) {
			if p != alice || got != admin {
				t.Errorf("step called for %v by %v", p, got)
			}
			steps++
			return 0, nil
		}}}
	conns, err := connections.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	first, err := conns.Offboard(ctx, admin, alice)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Connections) != 2 || first.Grants != 3 || first.Complete() {
		t.Fatalf("first run: %+v", first)
	}
	pending := ""
	for _, c := range first.Connections {
		if c.Pending {
			pending = c.ID
			if c.Revocation != provider.NotConfirmed || c.Error == "" {
				t.Fatalf("pending connection reported as %+v", c)
			}
		} else if c.Revocation != provider.NotSupported {
			t.Fatalf("connection %+v", c)
		}
	}
	if left, _ := r.conns.List(ctx, alice); len(left) != 0 {
		t.Fatalf("after the first run alice still has %d connections", len(left))
	}
	if g, _ := r.store.ListGrants(ctx, alice, time.Time{}); len(g) != 0 {
		t.Fatalf("alice still has %d connect requests", len(g))
	}
	second, err := conns.Offboard(ctx, admin, alice)
	if err != nil {
		t.Fatal(err)
	}
	if len(second.Connections) != 1 || !second.Connections[0].Retry || second.Connections[0].ID != pending ||
		second.Connections[0].Revocation != provider.Revoked || !second.Complete() {
		t.Fatalf("second run: %+v", second)
	}
	third, err := conns.Offboard(ctx, admin, alice)
	if err != nil || len(third.Connections) != 0 || !third.Complete() {
		t.Fatalf("third run: %+v, %v", third, err)
	}
	for i, tok := range tokens[:1] {
		if st := demotest.APIStatus(t, r.demo.APIBase(), tok); st != 401 {
			t.Fatalf("connection %d's access token still works (HTTP %d)", i, st)
		}
	}
	if steps != 3 {
		t.Fatalf("the extension step ran %d times, want 3", steps)
	}
	log := r.audit.String()
	for _, want := range []string{"audit: offboard", "revocation_pending=1", "revocation_pending=0", "outcome=not_confirmed", "admin.sub=root"} {
		if !strings.Contains(log, want) {
			t.Fatalf("audit log lacks %q:\n%s", want, log)
		}
	}
}

// TestDisableProviderEveryPage: disabling a provider reaches every one of
// its connections across the store's pages (200 a page; 450 here), and
// none of another provider's; deleting does as well, and a second run
// finds nothing left to do.
func TestDisableProviderEveryPage(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	const n = 450
	for i := range n {
		for _, p := range []string{"plain", "broken"} {
			c := vault.Connection{ID: fmt.Sprintf("%s-%04d", p, i), Principal: vault.Principal{Issuer: "https://idp.test", Subject: fmt.Sprintf("u%04d", i)},
				Provider: p, AccountID: "1", Status: vault.StatusActive, Created: r.clock.Now(),
				Token: vault.TokenSet{AccessToken: "at", TokenType: "bearer", Expiry: r.clock.Now().Add(time.Hour)}}
			if _, err := r.store.CreateConnection(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
	}
	admin := connections.Admin{Principal: vault.Principal{Issuer: "https://idp.test", Subject: "root"}, Via: "cli"}
	count := func(p string, status vault.ConnectionStatus) int {
		got := 0
		for i := range n {
			c, err := r.store.GetConnection(ctx, fmt.Sprintf("%s-%04d", p, i))
			if err == nil && c.Status == status {
				got++
			}
		}
		return got
	}
	rep, err := r.conns.DisableProvider(ctx, admin, "plain", false)
	if err != nil || rep.Marked != n {
		t.Fatalf("disable: %+v, %v; want %d marked", rep, err, n)
	}
	if got := count("plain", vault.StatusNeedsReconnect); got != n {
		t.Errorf("%d of %d plain connections need reconnecting", got, n)
	}
	if got := count("broken", vault.StatusActive); got != n {
		t.Errorf("%d of %d connections of another provider still active", got, n)
	}
	if rep, err := r.conns.DisableProvider(ctx, admin, "plain", false); err != nil || rep.Marked != 0 {
		t.Errorf("a second run: %+v, %v; want nothing marked", rep, err)
	}
	rep, err = r.conns.DisableProvider(ctx, admin, "plain", true)
	if err != nil || rep.Deleted != n {
		t.Fatalf("delete: %+v, %v; want %d deleted", rep, err, n)
	}
	if got := count("plain", vault.StatusNeedsReconnect); got != 0 {
		t.Errorf("%d plain connections left after deleting", got)
	}
	if rep, err := r.conns.DisableProvider(ctx, admin, "plain", true); err != nil || rep.Deleted != 0 {
		t.Errorf("a second deletion: %+v, %v; want nothing deleted", rep, err)
	}
}
