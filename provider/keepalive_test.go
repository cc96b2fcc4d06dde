package provider

import (
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

func TestKeepAliveCatalog(t *testing.T) {
	base := `providers:
  p:
    type: oauth2
    authorization_url: https://p.example/a
    token_url: https://p.example/t
    client_id: c
    client_secret: ${S}
    account: {url: https://p.example/u, id_field: id}
`
	env := func(string) string { return "s" }
	for _, tt := range []struct {
		extra       string
		window, due time.Duration
		err         string
	}{
		{"", 0, 0, ""},
		{"    keep_alive: 30d\n", 30 * 24 * time.Hour, DefaultKeepAliveRefresh, ""},
		{"    keep_alive: 12h\n    keep_alive_refresh: 90m\n", 12 * time.Hour, 90 * time.Minute, ""},
		{"    keep_alive: 6h\n", 6 * time.Hour, 6 * time.Hour, ""},
		{"    keep_alive: soon\n", 0, 0, `keep_alive "soon"`},
		{"    keep_alive: -1h\n", 0, 0, `keep_alive "-1h"`},
		{"    keep_alive_refresh: 1h\n", 0, 0, "keep_alive_refresh needs keep_alive"},
		{"    keep_alive: 1d\n    keep_alive_refresh: 2d\n", 0, 0, "longer than keep_alive"},
	} {
		reg, err := ParseProviders("p.yaml", []byte(base+tt.extra), env)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v, want %q", tt.extra, err, tt.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tt.extra, err)
		}
		p, _ := reg.Lookup("p")
		if p.KeepAlive.Window != tt.window || p.KeepAlive.Every != tt.due {
			t.Errorf("%q: keep-alive %+v, want %v every %v", tt.extra, p.KeepAlive, tt.window, tt.due)
		}
	}
}

// TestKeepAliveRefreshesFreshTokens: KeepAlive refreshes a connection
// whose access token is still fresh when its tokens are older than asked,
// and does nothing when they are not; concurrent calls refresh once.
func TestKeepAliveRefreshesFreshTokens(t *testing.T) {
	r := newDemoRig(t, "")
	c := r.connect(time.Now().Add(time.Hour))
	ctx := t.Context()
	refreshed, err := r.caller.KeepAlive(ctx, c.ID, c.Updated.Add(-time.Minute))
	if err != nil || !refreshed || len(r.events("token")) != 1 {
		t.Fatalf("tokens younger than asked: refreshed=%v err=%v, %d token requests (want only the code exchange)", refreshed, err, len(r.events("token")))
	}
	olderThan := time.Now()
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if ok, err := r.caller.KeepAlive(ctx, c.ID, olderThan); err != nil || !ok {
				t.Errorf("KeepAlive: %v, %v", ok, err)
			}
		})
	}
	wg.Wait()
	if n := len(r.events("token")); n != 2 {
		t.Fatalf("%d token requests, want the exchange and one refresh", n)
	}
	after, err := r.store.GetConnection(ctx, c.ID)
	if err != nil || after.Token.RefreshToken == c.Token.RefreshToken || RefreshedAt(after).Before(olderThan) {
		t.Fatalf("the store does not hold the refreshed tokens (%v)", err)
	}
	// A dead refresh token: the connection needs reconnecting.
	if _, err := r.store.UpdateConnection(ctx, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Token.RefreshToken = "never-issued"
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.caller.KeepAlive(ctx, c.ID, time.Now()); err == nil || !strings.Contains(err.Error(), "reconnected") {
		t.Fatalf("a refused keep-alive: %v", err)
	}
	if m, _ := r.store.GetConnection(ctx, c.ID); m.Status != vault.StatusNeedsReconnect {
		t.Fatalf("status %s after the provider refused the refresh token", m.Status)
	}
}
