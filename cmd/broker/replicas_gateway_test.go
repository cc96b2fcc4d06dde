package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/provider"
	"credbroker/vault"
)

// TestGatewayReplicas runs the gateway on two `broker serve` replicas of
// one PostgreSQL database, with the demo MCP server (rotating refresh
// tokens, reuse detection) as the upstream of /mcp/u/demo-mcp:
//
//   - the broker registers at the demo authorization server dynamically,
//     once: the registration is kept in the store, so the replica that did
//     not register refreshes as the same client;
//   - alice's host and browser reach only replica a: the call asks for the
//     link, she connects in the browser, the retried call answers;
//   - round 2 on replica b: the upstream's tools and a call with the
//     connection replica a stored, the same upstream token, no elicitation
//     and no token request;
//   - the upstream's 401, twice: the access token dies at the
//     authorization server (its clock moves on) while the broker still
//     thinks it good. A call on one replica gets the 401 and refreshes, its
//     refresh held at the authorization server until calls on the other
//     got their 401s with the same token: every call answers, the
//     authorization server sees exactly one refresh and no reuse of a
//     spent refresh token. Replica a leads the first time, b the second;
//   - alice disconnects through replica a: replica b asks for the link
//     again;
//   - no upstream token reaches a host, the browser or a replica's log.
func TestGatewayReplicas(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	var skew atomic.Int64 // the authorization server's clock, ahead of ours
	// While hold is set, a refresh request waits at the authorization
	// server until the channel gate points to is closed.
	var hold atomic.Bool
	var gate atomic.Pointer[chan struct{}]
	refreshes := make(chan struct{}, 64) // one per refresh request arriving at the authorization server
	s := newReplicaStackOpts(t, []string{"alice"}, replicaOptions{
		args: []string{"--upstream-allow-private"},
		demo: func(o *demoprovider.Options) {
			// Tokens outlive the test: the broker never refreshes one
			// before it expires, only when the upstream refuses it.
			o.AccessTTL = time.Hour
			o.Now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
		},
		wrap: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == devProviderPath+"/token" {
					body, _ := io.ReadAll(r.Body)
					r.Body = io.NopCloser(bytes.NewReader(body))
					if q, _ := url.ParseQuery(string(body)); q.Get("grant_type") == "refresh_token" {
						refreshes <- struct{}{}
						if hold.Load() {
							<-*gate.Load()
						}
					}
				}
				next.ServeHTTP(w, r)
			})
		},
	})
	ctx := testContext(t, 3*time.Minute)
	public := s.lb.srv.URL
	lbURL, _ := url.Parse(public)
	endpoint := public + "/mcp/u/demo-mcp"
	bearer, _, err := s.idp.MintAccessToken("alice", endpoint, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var seen logbuf.Buffer // every body a host or the browser received
	top := t
	host := func(t *testing.T, replica string, connect func(ctx context.Context, link string) error) *gwHost {
		t.Helper()
		hc := &http.Client{Timeout: time.Minute, Transport: bearerTransport{bearer,
			recording{&seen, pinTransport{host: lbURL.Host, replica: replica, next: s.lb.srv.Client().Transport}}}}
		h := newGWHost(t, ctx, endpoint, public, hc, connect)
		top.Cleanup(func() { h.cs.Close() }) // hosts serve later subtests too
		return h
	}
	errNoLink := errors.New("this host takes no link")
	refuse := func(context.Context, string) error { return errNoLink }
	sortedTools := func(t *testing.T, h *gwHost) []string {
		t.Helper()
		names := h.tools(t, ctx)
		slices.Sort(names)
		return names
	}
	fail := func(t *testing.T, format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nreplica a:\n%s\nreplica b:\n%s", append(args, grepLines(s.a.logs.String(), "{"), grepLines(s.b.logs.String(), "{"))...)
	}
	alice := vault.Principal{Issuer: s.idp.Issuer(), Subject: "alice"}
	connection := func(t *testing.T) vault.Connection {
		t.Helper()
		list, err := s.store.ListConnections(ctx, alice)
		if err != nil || len(list) != 1 {
			t.Fatalf("alice's connections: %v %v", list, err)
		}
		c, err := s.store.GetConnection(ctx, list[0].ID) // a listing carries no tokens
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	var tokens []string // every upstream token the store held

	// lastEcho is the fingerprint of the token of the upstream's last
	// answered echo.
	lastEcho := func() string {
		reqs := s.mcp.Requests()
		for i := len(reqs) - 1; i >= 0; i-- {
			if reqs[i].Tool == "echo" && reqs[i].Outcome == "ok" {
				return reqs[i].Token
			}
		}
		return ""
	}
	var hA, hB *gwHost
	var roundOne string
	t.Run("connect through replica a", func(t *testing.T) {
		br := &gwBrowser{c: s.browserOn("a")}
		br.c.Transport = recording{&seen, br.c.Transport}
		hA = host(t, "a", func(ctx context.Context, link string) error {
			_, err := br.connect(ctx, link, "alice")
			return err
		})
		if got := sortedTools(t, hA); !slices.Equal(got, []string{placeholderName}) {
			fail(t, "before connecting replica a lists %v", got)
		}
		text := hA.call(t, ctx, "echo", map[string]any{"text": "round 1"})
		if !strings.Contains(text, "round 1") || !strings.Contains(text, "alice-demo") || hA.asked() != 1 {
			fail(t, "echo answered %q after %d links; want alice-demo's echo after one", text, hA.asked())
		}
		if n := s.lb.hitsOf("b"); n != 0 {
			t.Fatalf("replica b served %d requests of round 1", n)
		}
		roundOne = lastEcho()
		c := connection(t)
		tokens = append(tokens, string(c.Token.AccessToken), string(c.Token.RefreshToken))
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("round 2 on replica b", func(t *testing.T) {
		hitsA, events := s.lb.hitsOf("a"), len(s.demo.Events())
		hB = host(t, "b", refuse)
		if got := sortedTools(t, hB); !slices.Equal(got, demoMCPTools) {
			fail(t, "replica b lists %v; want the demo server's %v", got, demoMCPTools)
		}
		text := hB.call(t, ctx, "echo", map[string]any{"text": "round 2"})
		if !strings.Contains(text, "round 2") || !strings.Contains(text, "alice-demo") || hB.asked() != 0 {
			fail(t, "echo on replica b answered %q after %d links", text, hB.asked())
		}
		if s.lb.hitsOf("a") != hitsA {
			t.Errorf("round 2 reached replica a")
		}
		if tok := lastEcho(); tok == "" || tok != roundOne {
			t.Errorf("round 2 reached the upstream with token %s; round 1 with %s: want the stored one", tok, roundOne)
		}
		for _, e := range s.demo.Events()[events:] {
			if e.Kind == "token" || e.Kind == "register" {
				t.Errorf("round 2 made a %s request (%s) at the authorization server", e.Kind, e.GrantType)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	// deadToken: the authorization server's clock moves past the access
	// token's expiry (the broker's record says it has most of an hour
	// left); a call on leader gets the 401 and refreshes, its refresh held
	// at the authorization server until three calls on other got their
	// 401s with the same token.
	deadToken := func(t *testing.T, leader, other *gwHost) {
		stale := connection(t)
		reqs, events := len(s.mcp.Requests()), len(s.demo.Events())
		skew.Add(int64(2 * time.Hour))
		release := make(chan struct{})
		gate.Store(&release)
		hold.Store(true)
		results := make(chan string, 8)
		call := func(h *gwHost, text string) {
			res, err := h.cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
			switch {
			case err != nil:
				results <- fmt.Sprintf("%s: %v", text, err)
			case res.IsError || !strings.Contains(resultText(res), text):
				results <- fmt.Sprintf("%s: answered %s", text, resultText(res))
			default:
				results <- ""
			}
		}
		go call(leader, "on the leader")
		select {
		case <-refreshes: // the leader got the 401 and is refreshing, held
		case <-time.After(time.Minute):
			hold.Store(false)
			close(release)
			fail(t, "no refresh reached the authorization server within a minute of the 401; the upstream saw %+v", s.mcp.Requests()[reqs:])
		}
		for i := range 3 {
			go call(other, fmt.Sprint("on the other ", i))
		}
		// The other replica's calls are refused with the same token while
		// the leader's refresh is held.
		deadline := time.Now().Add(time.Minute)
		for unauthorized(s.mcp.Requests()[reqs:]) < 4 {
			if time.Now().After(deadline) {
				hold.Store(false)
				close(release)
				fail(t, "the upstream refused %d calls, want 4 (one from the leader, three from the other replica)", unauthorized(s.mcp.Requests()[reqs:]))
			}
			time.Sleep(20 * time.Millisecond) // polling the upstream's record
		}
		hold.Store(false)
		close(release)
		for range 4 {
			select {
			case r := <-results:
				if r != "" {
					fail(t, "a call after the 401: %s", r)
				}
			case <-time.After(time.Minute):
				fail(t, "a call did not answer within a minute of the refresh")
			}
		}
		select {
		case <-refreshes:
			t.Errorf("a second refresh reached the authorization server")
		default:
		}
		var seenEvents []string
		okRefreshes := 0
		for _, e := range s.demo.Events()[events:] {
			if e.Kind != "token" {
				continue
			}
			seenEvents = append(seenEvents, fmt.Sprintf("%s/%d/%s", e.GrantType, e.Status, e.Error))
			if e.GrantType == "refresh_token" && e.Status == http.StatusOK {
				okRefreshes++
			} else {
				t.Errorf("token request %s/%d/%s at the authorization server (a spent refresh token presented again?)", e.GrantType, e.Status, e.Error)
			}
		}
		if okRefreshes != 1 {
			t.Errorf("the authorization server answered %d refreshes (%v), want 1", okRefreshes, seenEvents)
		}
		now := connection(t)
		if now.Status != vault.StatusActive || now.Token.RefreshToken == stale.Token.RefreshToken || now.Token.AccessToken == stale.Token.AccessToken {
			t.Errorf("after the refresh the store holds status %s, new access token %v, rotated refresh token %v", now.Status,
				now.Token.AccessToken != stale.Token.AccessToken, now.Token.RefreshToken != stale.Token.RefreshToken)
		}
		tokens = append(tokens, string(now.Token.AccessToken), string(now.Token.RefreshToken))
	}
	t.Run("a 401 on replica a: one refresh for both replicas", func(t *testing.T) { deadToken(t, hA, hB) })
	if t.Failed() {
		t.FailNow()
	}
	t.Run("a 401 on replica b: one refresh for both replicas", func(t *testing.T) { deadToken(t, hB, hA) })
	if t.Failed() {
		t.FailNow()
	}

	t.Run("disconnected on replica a, replica b asks again", func(t *testing.T) {
		a, err := mcpCall(s.client, public, "a", s.bearers["alice"], "disconnect_account", map[string]any{"provider": "demo-mcp"}, nil)
		if err != nil || a.Result.IsError || !strings.Contains(a.Raw, `"deleted":true`) {
			fail(t, "disconnect on replica a: %v %s", err, a.Raw)
		}
		fresh := host(t, "b", refuse) // a new session: hosts keep lists for their ttl
		if got := sortedTools(t, fresh); !slices.Equal(got, []string{placeholderName}) {
			fail(t, "after the disconnect replica b lists %v", got)
		}
		_, err = hB.cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "after"}})
		if !errors.Is(err, errNoLink) && (err == nil || !strings.Contains(err.Error(), errNoLink.Error())) || hB.asked() != 1 {
			fail(t, "a call on replica b after the disconnect: %v after %d links; want the connect link", err, hB.asked())
		}
	})

	for _, p := range []*serveProc{s.a, s.b} {
		seen.Write([]byte(p.logs.String()))
	}
	noTokenIn(t, seen.String(), tokens)
}

// unauthorized counts the upstream requests refused for their token.
func unauthorized(reqs []demomcp.Request) int {
	n := 0
	for _, r := range reqs {
		if r.Status == http.StatusUnauthorized {
			n++
		}
	}
	return n
}

// TestGatewayReplicasRegistrationDropped: two replicas on one PostgreSQL
// database, the demo MCP server as the upstream of /mcp/u/demo-mcp. Alice
// connects through replica a (one registration, stored); the demo
// provider forgets that client; alice's call through replica b meets
// invalid_client at the forced refresh, b deletes the registration in the
// database and asks alice to connect, and her connect through b registers
// anew; replica a then uses the new registration, with no link and no
// further registration.
func TestGatewayReplicasRegistrationDropped(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	s := newReplicaStackOpts(t, []string{"alice"}, replicaOptions{args: []string{"--upstream-allow-private"}})
	ctx := testContext(t, 3*time.Minute)
	public := s.lb.srv.URL
	lbURL, _ := url.Parse(public)
	endpoint := public + "/mcp/u/demo-mcp"
	bearer, _, err := s.idp.MintAccessToken("alice", endpoint, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	host := func(replica string) *gwHost {
		br := &gwBrowser{c: s.browserOn(replica)}
		hc := &http.Client{Timeout: time.Minute, Transport: bearerTransport{bearer, pinTransport{host: lbURL.Host, replica: replica, next: s.lb.srv.Client().Transport}}}
		h := newGWHost(t, ctx, endpoint, public, hc, func(ctx context.Context, link string) error {
			_, err := br.connect(ctx, link, "alice")
			return err
		})
		t.Cleanup(func() { h.cs.Close() })
		return h
	}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nreplica a:\n%s\nreplica b:\n%s", append(args, grepLines(s.a.logs.String(), "{"), grepLines(s.b.logs.String(), "{"))...)
	}
	registrations := func() []string {
		var ids []string
		for _, e := range s.demo.Events() {
			if e.Kind == "register" && e.Status < 300 {
				ids = append(ids, e.Client)
			}
		}
		return ids
	}
	key := provider.UpstreamClientKey(s.demo.Issuer(), public+"/oauth/demo-mcp/callback")
	stored := func() string {
		c, err := s.store.UpstreamClients().GetUpstreamClient(ctx, key)
		if err != nil {
			return err.Error()
		}
		return c.ClientID
	}

	hA := host("a")
	hA.call(t, ctx, "echo", map[string]any{"text": "one"})
	regs := registrations()
	if len(regs) != 1 || stored() != regs[0] || hA.asked() != 1 {
		fail("after the connect through a: registrations %v, stored %q, %d links", regs, stored(), hA.asked())
	}
	if !s.demo.ForgetClient(regs[0]) {
		t.Fatalf("the demo provider does not know %s", regs[0])
	}
	hB := host("b")
	hB.call(t, ctx, "echo", map[string]any{"text": "two"})
	regs = registrations()
	if len(regs) != 2 || regs[1] == regs[0] || stored() != regs[1] || hB.asked() != 1 {
		fail("after the call through b: registrations %v, stored %q, %d links on b; want a second registration, stored, after one link", regs, stored(), hB.asked())
	}
	if !s.b.logs.WaitFor(`"event":"upstream_registration_dropped"`, s.b.exited, 30*time.Second) {
		fail("replica b recorded no upstream_registration_dropped")
	}
	hA.call(t, ctx, "echo", map[string]any{"text": "three"})
	if n := len(registrations()); n != 2 || hA.asked() != 1 {
		fail("replica a after the new registration: %d registrations, %d links; want 2 and no new link", n, hA.asked())
	}
}
