package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/internal/testskip"
	"credbroker/provider"
)

// notesProvidersYAML is a gateway entry for the demo MCP server at {{URL}}
// with nothing configured about its client: the broker registers itself
// dynamically at the demo provider, its authorization server.
const notesProvidersYAML = `providers:
  notes:
    display_name: Notes
    type: mcp
    mcp:
      url: {{URL}}
`

// demoUpstream is the demo MCP server (internal/demomcp) and its
// authorization server (internal/demoprovider, with dynamic
// registration) on a loopback server of the test's own.
type demoUpstream struct {
	demo  *demoprovider.Provider
	mcp   *demomcp.Server
	host  string
	ahead atomic.Int64 // nanoseconds
}

// startDemoUpstream starts the upstream, its clock ahead of the real one
// by u.ahead (skip makes access tokens it issued expire).
func startDemoUpstream(t *testing.T) *demoUpstream {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	u := &demoUpstream{}
	demo, err := demoprovider.New(demoprovider.Options{BaseURL: srv.URL + "/as", ClientID: "static-unused",
		RedirectURIs: []string{srv.URL + "/unused"}, Resources: []string{srv.URL + "/mcp"},
		Now: func() time.Time { return time.Now().Add(time.Duration(u.ahead.Load())) }})
	if err != nil {
		t.Fatal(err)
	}
	up, err := demomcp.New(demomcp.Options{URL: srv.URL + "/mcp", AuthServer: demo})
	if err != nil {
		t.Fatal(err)
	}
	demo.Mount(mux)
	up.Mount(mux)
	su, _ := url.Parse(srv.URL)
	u.demo, u.mcp, u.host = demo, up, su.Host
	return u
}

// skip moves the upstream's clock on by d.
func (u *demoUpstream) skip(d time.Duration) { u.ahead.Add(int64(d)) }

// events returns the demo provider's successful events of kind (and
// grant type, for token events).
func (u *demoUpstream) events(kind, grantType string) []demoprovider.Event {
	var out []demoprovider.Event
	for _, e := range u.demo.Events() {
		if e.Kind == kind && e.GrantType == grantType && e.Status < 300 {
			out = append(out, e)
		}
	}
	return out
}

// TestGatewayRegistrationSurvivesRestart: the client the broker registers
// dynamically at an upstream MCP server's authorization server is kept in
// its store (vault.Store.UpstreamClients), its secret sealed, so a
// restarted broker goes on using it: it does not register again, a new
// person's connect names the same client, and a connection made before
// the restart refreshes its expired token as that client (the
// authorization server binds refresh tokens to the client they were
// issued to). Kept in memory, as before
// the store had it, the second broker registered again and the refresh
// of alice's token failed as another client's.
func TestGatewayRegistrationSurvivesRestart(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	ctx := testContext(t, 3*time.Minute)
	s := newGWStack(t)
	up := startDemoUpstream(t)
	s.start(strings.ReplaceAll(notesProvidersYAML, "{{URL}}", up.mcp.URL()))
	fail := func(format string, args ...any) {
		t.Helper()
		logs := ""
		for _, p := range s.procs {
			logs += p.logs.String()
		}
		t.Fatalf(format+"\nbroker logs:\n%s", append(args, logs)...)
	}
	browsers := map[string]*gwBrowser{}
	connect := func(user string) func(ctx context.Context, link string) error {
		return func(ctx context.Context, link string) error {
			b := s.browser()
			browsers[user] = b
			_, err := b.connect(ctx, link, user)
			return err
		}
	}
	neverAsked := func(context.Context, string) error { return errors.New("asked to connect again") }
	clientOf := func(user string) string {
		t.Helper()
		for _, u := range browsers[user].visited("/authorize") {
			if u.Host == up.host {
				return u.Query().Get("client_id")
			}
		}
		fail("%s's browser never reached the upstream's authorization endpoint", user)
		return ""
	}

	// alice connects: the broker registers at the demo provider once.
	s.host(t, ctx, "alice", "notes", connect("alice")).call(t, ctx, "echo", map[string]any{"n": 1})
	regs := up.events("register", "")
	if len(regs) != 1 || regs[0].Client == "" || clientOf("alice") != regs[0].Client {
		fail("after alice's connect: %d registrations (%+v), alice authorized as %q", len(regs), regs, clientOf("alice"))
	}
	client := regs[0].Client

	// Between the two runs the registration is in the bolt file, the
	// secret sealed: not in the file's bytes.
	s.restart(func() {
		st, err := openBolt(s.storePath(), s.keys)
		if err != nil {
			t.Fatal(err)
		}
		c, err := st.UpstreamClients().GetUpstreamClient(ctx, provider.UpstreamClientKey(up.demo.Issuer(), s.public()+"/oauth/notes/callback"))
		st.Close()
		if err != nil || c.ClientID != client || c.ClientSecret == "" || c.SealedWith != s.keys.Primary() {
			t.Fatalf("the stored registration: %+v, %v; want client %s with a sealed secret", c, err, client)
		}
		raw, err := os.ReadFile(s.storePath())
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(c.ClientSecret.Reveal())) {
			t.Fatal("the bolt file holds the upstream client secret in the clear")
		}
	})
	refreshes := len(up.events("token", "refresh_token"))

	// alice's connection works on the restarted broker. Her access token
	// has expired at the upstream: its 401 makes the broker refresh, as
	// the stored client.
	up.skip(time.Hour)
	s.host(t, ctx, "alice", "notes", neverAsked).call(t, ctx, "echo", map[string]any{"n": 2})
	after := up.events("token", "refresh_token")[refreshes:]
	if len(after) == 0 || after[len(after)-1].Client != client {
		fail("alice's refresh after the restart: %+v; want one as client %s", after, client)
	}
	// bob connects through the restarted broker: the same client, no new
	// registration.
	s.host(t, ctx, "bob", "notes", connect("bob")).call(t, ctx, "echo", map[string]any{"n": 3})
	if regs := up.events("register", ""); len(regs) != 1 {
		fail("%d registrations after the restart; want the one from before", len(regs))
	}
	if got := clientOf("bob"); got != client {
		fail("bob authorized as client %q after the restart; want the stored %q", got, client)
	}
}

// TestGatewayRegistrationDropped: the upstream's authorization server
// forgets the broker's dynamic registration (the demo provider deletes
// it, with its tokens, as RFC 7592 §2.3 describes); the broker drops the
// stored registration at the first invalid_client and the next connect
// registers anew:
//
//   - alice's call after the server forgot the client: the upstream
//     refuses her token, the forced refresh gets invalid_client, the
//     connection needs reconnecting and the call asks her to connect,
//     saying why; her connect registers anew and the retried call works;
//   - bob's first connect, the server forgetting the client between its
//     authorization and the broker's callback: the code exchange gets
//     invalid_client and his page says the server no longer knows the
//     broker's registration; opening the link again registers anew and
//     connects.
//
// Before the fix the broker kept the dead client: alice's call ended in
// a tool error for every call, and every connect was sent to the
// server's authorization endpoint as a client it does not know.
func TestGatewayRegistrationDropped(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	ctx := testContext(t, 3*time.Minute)
	s := newGWStack(t)
	up := startDemoUpstream(t)
	s.start(strings.ReplaceAll(notesProvidersYAML, "{{URL}}", up.mcp.URL()))
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nbroker logs:\n%s", append(args, s.proc.logs.String())...)
	}
	registered := func(want int) string {
		t.Helper()
		regs := up.events("register", "")
		if len(regs) != want {
			fail("%d registrations at the upstream, want %d", len(regs), want)
		}
		return regs[want-1].Client
	}
	var asked atomic.Int64
	connect := func(user string) func(ctx context.Context, link string) error {
		return func(ctx context.Context, link string) error {
			asked.Add(1)
			_, err := s.browser().connect(ctx, link, user)
			return err
		}
	}

	alice := s.host(t, ctx, "alice", "notes", connect("alice"))
	alice.call(t, ctx, "echo", map[string]any{"n": 1})
	first := registered(1)

	// The server forgets the client, and with it alice's tokens.
	if !up.demo.ForgetClient(first) {
		t.Fatalf("the demo provider does not know %s", first)
	}
	seen := len(s.seen.String())
	alice.call(t, ctx, "echo", map[string]any{"n": 2})
	if asked.Load() != 2 {
		fail("alice was asked to connect %d times, want 2 (once more after the server forgot the client)", asked.Load())
	}
	second := registered(2)
	if second == first {
		fail("registered anew as the forgotten client %s", first)
	}
	if !strings.Contains(s.seen.String()[seen:], "no longer knows the broker's registration") {
		fail("the call's connect request does not say the server forgot the broker's registration:\n%s", s.seen.String()[seen:])
	}
	dropped := func(logs string) bool {
		return strings.Contains(logs, `"event":"upstream_registration_dropped"`) && strings.Contains(logs, `"client":"`+first+`"`)
	}
	if !s.proc.logs.WaitUntil(dropped, s.proc.exited, 30*time.Second) {
		fail("no upstream_registration_dropped audit event naming %s", first)
	}

	// bob's connect: the server forgets the client right before the
	// broker's callback gets the code.
	var forgot atomic.Bool
	var page string
	bob := s.host(t, ctx, "bob", "notes", func(ctx context.Context, link string) error {
		b := s.browser()
		inner := b.c.CheckRedirect
		b.c.CheckRedirect = func(req *http.Request, via []*http.Request) error {
			if strings.HasSuffix(req.URL.Path, "/oauth/notes/callback") && forgot.CompareAndSwap(false, true) {
				up.demo.ForgetClient(second)
			}
			return inner(req, via)
		}
		_, err := b.connect(ctx, link, "bob")
		if err == nil {
			return errors.New("connected though the server forgot the client before the callback")
		}
		page = err.Error()
		// The person opens the link again.
		_, err = b.connect(ctx, link, "bob")
		return err
	})
	bob.call(t, ctx, "echo", map[string]any{"n": 3})
	if !strings.Contains(page, "Notes no longer knows the broker") || !strings.Contains(page, "HTTP 502") {
		fail("bob's first attempt ended on %s; want the page saying Notes no longer knows the broker's registration", page)
	}
	if third := registered(3); third == second || third == first {
		fail("bob's second attempt registered as %s (forgotten: %s, %s)", third, first, second)
	}
}
