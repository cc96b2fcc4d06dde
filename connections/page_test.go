package connections_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/provider"
	"credbroker/vault"
)

// TestConnectFromPage: the connections page's Connect button. Offered
// lists every provider with a browser step that the person has no usable
// connection to; Connect starts a request for it (with the scopes a
// connection needing reconnection held), hands the same open request out
// again, answers Connected when there is nothing to connect, and refuses
// an unknown provider or one past the limits of every connect request,
// storing nothing.
func TestConnectFromPage(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	offered := func() []string {
		t.Helper()
		conns, err := r.conns.List(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, p := range r.conns.Offered(conns) {
			out = append(out, p.Name)
		}
		return out
	}
	grants := func() int {
		t.Helper()
		gs, err := r.store.ListGrants(ctx, alice, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return len(gs)
	}
	if got, want := offered(), []string{"broken", "demo", "demo-keys", "plain", "remote"}; !slices.Equal(got, want) {
		t.Fatalf("offered with no connections: %v, want %v", got, want)
	}

	// Not connected: a connect request of the person for the defaults.
	o, err := r.conns.Connect(ctx, alice, "demo")
	need, ok := o.(connections.NeedsUser)
	if err != nil || !ok || need.Grant == nil || need.URL != r.conns.ConnectURL(need.Grant.ID) {
		t.Fatalf("Connect(demo) = %#v, %v; want NeedsUser with a link", o, err)
	}
	if g := need.Grant; !g.Principal.Same(alice) || g.Provider != "demo" || !slices.Equal(g.Scopes, []string{"profile"}) || g.ClientName != "" || g.Server != "" {
		t.Fatalf("grant = %+v", g)
	}
	// The same open request is handed out again, not a new one.
	before := grants()
	if o, err := r.conns.Connect(ctx, alice, "demo"); err != nil || o.(connections.NeedsUser).Grant.ID != need.Grant.ID {
		t.Fatalf("second Connect(demo) = %#v, %v; want the open request again", o, err)
	}
	if grants() != before {
		t.Fatal("a second Connect stored another request")
	}

	// Connected with the defaults: not offered, and Connect starts nothing.
	c := r.connect("demo", "1001")
	if slices.Contains(offered(), "demo") {
		t.Fatal("demo offered while connected")
	}
	before = grants()
	if o, err := r.conns.Connect(ctx, alice, "demo"); err != nil {
		t.Fatal(err)
	} else if got, ok := o.(connections.Connected); !ok || got.Conn.ID != c.ID {
		t.Fatalf("Connect(demo) while connected = %#v", o)
	}
	if grants() != before {
		t.Fatal("Connect of a connected provider stored a request")
	}

	// Needs reconnecting: offered again, and the request keeps the scopes
	// the connection held.
	if _, err := r.store.UpdateConnection(ctx, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Status, c.Scopes = vault.StatusNeedsReconnect, []string{"profile", "repos"}
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(offered(), "demo") {
		t.Fatal("demo not offered while its connection needs reconnecting")
	}
	o, err = r.conns.Connect(ctx, alice, "demo")
	if need, ok := o.(connections.NeedsUser); err != nil || !ok || need.Why.Kind != connections.Reconnect || !slices.Equal(need.Scopes, []string{"profile", "repos"}) {
		t.Fatalf("Connect(demo) needing reconnection = %#v, %v", o, err)
	}

	// Refusals store nothing.
	before = grants()
	var up *connections.UnknownProviderError
	if _, err := r.conns.Connect(ctx, alice, "nope"); !errors.As(err, &up) || connections.Explain(err, nil).Class != connections.NotFound {
		t.Errorf("Connect(nope) = %v, want an unknown provider", err)
	}
	if _, err := r.conns.Connect(ctx, alice, ""); !errors.As(err, &up) {
		t.Errorf("Connect(\"\") = %v, want an unknown provider", err)
	}
	opts := r.opts
	opts.Grants = binding.New(r.store, binding.Options{Now: r.clock.Now, MaxPending: 1})
	limited, err := connections.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := limited.Connect(ctx, alice, "plain"); !errors.Is(err, connections.ErrTooManyPending) {
		t.Errorf("Connect past the open requests' limit = %v, want ErrTooManyPending", err)
	}
	if grants() != before {
		t.Error("a refused Connect stored a request")
	}
}

// TestNoLinkMessage: what a client that cannot open connect links tells
// the person names the connections page and its Connect button, and says
// when that button cannot grant what is missing.
func TestNoLinkMessage(t *testing.T) {
	p := &provider.Provider{Name: "github", DisplayName: "GitHub"}
	const page = "https://broker.test/connections"
	for _, tc := range []struct {
		why  connections.Reason
		want string
	}{
		{connections.Reason{Kind: connections.NotConnected}, "A GitHub connection is needed (it is not connected yet), but this client cannot open connect links (it did not declare the elicitation.url capability). Open the broker's connections page at https://broker.test/connections, choose Connect next to GitHub, then call again."},
		{connections.Reason{Kind: connections.Reconnect}, "choose Connect next to GitHub, then call again."},
		{connections.Reason{Kind: connections.MissingScopes, Missing: []string{"repo"}}, "The broker's connections page at https://broker.test/connections connects GitHub with its default scopes only; granting repo needs a client that can open connect links."},
	} {
		if got := (connections.NeedsUser{Provider: p, Why: tc.why}).NoLinkMessage(page); !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want it to contain %q", tc.why, got, tc.want)
		}
	}
}
