package connections_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// The step-up limit (gateway.go): a 403 insufficient_scope opens a new
// connect request for the union of the held and the challenged scopes, at
// most three an hour per person, provider and scope set. The rig's
// providers are OAuth entries rather than MCP servers: StepUp decides the
// same for any kind, and an MCP entry would need an authorization server
// to discover before any request could be opened.

var bob = vault.Principal{Issuer: alice.Issuer, Subject: "bob"}

// stepUpOpens runs StepUp and checks that it opened a new, stored connect
// request for req's person at ready's provider asking for want, naming
// missing as the scopes the connection lacks.
func stepUpOpens(t *testing.T, r *rig, req connections.Request, ready connections.Ready, challenged, want, missing []string) vault.Grant {
	t.Helper()
	o, err := r.conns.StepUp(context.Background(), req, ready, challenged)
	if err != nil {
		t.Fatalf("StepUp(%v) for %s at %s: %v", challenged, req.Principal.Subject, ready.Provider.Name, err)
	}
	need, ok := o.(connections.NeedsUser)
	if !ok || need.Grant == nil {
		t.Fatalf("StepUp(%v) = %#v, want NeedsUser with a connect request", challenged, o)
	}
	if !slices.Equal(need.Scopes, want) || !slices.Equal(need.Grant.Scopes, want) {
		t.Errorf("StepUp(%v) asks for %v (request %v), want %v", challenged, need.Scopes, need.Grant.Scopes, want)
	}
	if need.Why.Kind != connections.MissingScopes || !slices.Equal(need.Why.Missing, missing) {
		t.Errorf("StepUp(%v) says %+v, want missing scopes %v", challenged, need.Why, missing)
	}
	if need.URL != r.conns.ConnectURL(need.Grant.ID) {
		t.Errorf("StepUp(%v) link %q, want %q", challenged, need.URL, r.conns.ConnectURL(need.Grant.ID))
	}
	g, err := r.store.GetGrant(context.Background(), need.Grant.ID)
	if err != nil {
		t.Fatalf("the step-up's connect request is not stored: %v", err)
	}
	if !g.Principal.Same(req.Principal) || g.Provider != ready.Provider.Name || !slices.Equal(g.Scopes, want) ||
		g.State != vault.GrantPending || !g.Created.Equal(r.clock.Now()) {
		t.Errorf("stored request %+v, want a pending one for %s at %s asking for %v, created now", g, req.Principal.Subject, ready.Provider.Name, want)
	}
	return g
}

// stepUpRefused runs StepUp and checks that it is refused with
// ErrTooManyStepUps, storing no connect request and auditing no step-up
// but one refused step-up naming the scopes it would have added.
func stepUpRefused(t *testing.T, r *rig, req connections.Request, ready connections.Ready, challenged []string) {
	t.Helper()
	before, audited, refused := grantIDs(t, r, req.Principal), stepUpsAudited(r), stepUpsRefused(r)
	o, err := r.conns.StepUp(context.Background(), req, ready, challenged)
	if !errors.Is(err, connections.ErrTooManyStepUps) || o != nil {
		t.Fatalf("StepUp(%v) for %s at %s = %#v, %v; want ErrTooManyStepUps", challenged, req.Principal.Subject, ready.Provider.Name, o, err)
	}
	if after := grantIDs(t, r, req.Principal); !slices.Equal(after, before) {
		t.Errorf("a refused step-up stored connect requests: %v, before %v", after, before)
	}
	if n := stepUpsAudited(r); n != audited {
		t.Errorf("a refused step-up was audited as one: %d step_up events, before %d", n, audited)
	}
	if n := stepUpsRefused(r); n != refused+1 {
		t.Errorf("%d step_up_refused events, before %d; want one more", n, refused)
	}
	missing := ready.Provider.MissingScopes(ready.Conn.Scopes, ready.Provider.UnionScopes(ready.Conn.Scopes, challenged))
	want := "outcome=" + strings.Join(missing, " ")
	if len(missing) > 1 {
		want = `outcome="` + strings.Join(missing, " ") + `"`
	}
	lines := strings.Split(strings.TrimSpace(r.audit.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, "event=step_up_refused ") || !strings.Contains(last+" ", want+" ") ||
		!strings.Contains(last, "principal.sub="+req.Principal.Subject+" ") || !strings.Contains(last, "connection="+ready.Conn.ID+" ") {
		t.Errorf("the refused step-up's audit event %q does not name the person, the connection and the scopes %v", last, missing)
	}
}

// grantIDs lists the ids of every connect request stored for pr.
func grantIDs(t *testing.T, r *rig, pr vault.Principal) []string {
	t.Helper()
	list, err := r.store.ListGrants(context.Background(), pr, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, g := range list {
		ids = append(ids, g.ID)
	}
	return ids
}

func stepUpsAudited(r *rig) int { return strings.Count(r.audit.String(), "event=step_up ") }

func stepUpsRefused(r *rig) int { return strings.Count(r.audit.String(), "event=step_up_refused ") }

// heldReady connects alice to provider p (its default scope, profile) and
// returns what a relayed call would have run with.
func heldReady(t *testing.T, r *rig, p string) connections.Ready {
	t.Helper()
	c := r.connect(p, "1001")
	if !slices.Equal(c.Scopes, []string{"profile"}) {
		t.Fatalf("connected %s with %v, want [profile]", p, c.Scopes)
	}
	prov, _ := r.conns.Providers().Lookup(p)
	return connections.Ready{Provider: prov, Conn: c}
}

// The challenge most tests use, and what a step-up for it asks for over
// a connection holding profile.
var (
	repos        = []string{"repos"}
	profileRepos = []string{"profile", "repos"}
)

// TestStepUpCapped: the first three step-ups for one person, provider and
// scope set each open a new connect request for the union of the held and
// the challenged scopes (even for a caller that would reuse an open one);
// the fourth within the hour is refused with ErrTooManyStepUps and stores
// nothing, also when the challenge names the same set differently or
// comes through UpstreamRefused (the door's 403 insufficient_scope path).
func TestStepUpCapped(t *testing.T) {
	r := newRig(t)
	ready := heldReady(t, r, "demo")
	req := r.req("demo")
	req.ReuseOpen = true
	var opened []string
	for i := range 3 {
		g := stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
		if slices.Contains(opened, g.ID) {
			t.Fatalf("step-up %d handed out request %s again, want a new one", i+1, g.ID)
		}
		opened = append(opened, g.ID)
		r.clock.Advance(time.Minute)
	}
	if n := stepUpsAudited(r); n != 3 {
		t.Fatalf("%d step_up audit events, want 3", n)
	}
	stepUpRefused(t, r, req, ready, repos)
	// The scope set is the union asked for, whatever the challenge repeats
	// or already holds, in any order.
	stepUpRefused(t, r, req, ready, []string{"repos", "profile", "repos"})
	for range 3 {
		stepUpOpens(t, r, req, ready, []string{"repos", "admin"}, []string{"profile", "repos", "admin"}, []string{"repos", "admin"})
	}
	stepUpRefused(t, r, req, ready, []string{"admin", "repos"})

	before := grantIDs(t, r, alice)
	o, err := r.conns.UpstreamRefused(context.Background(), req, ready, &mcpup.NeedScope{Scopes: repos})
	if !errors.Is(err, connections.ErrTooManyStepUps) || o != nil {
		t.Fatalf("UpstreamRefused(insufficient_scope) = %#v, %v; want ErrTooManyStepUps", o, err)
	}
	if after := grantIDs(t, r, alice); !slices.Equal(after, before) {
		t.Errorf("a refused step-up stored connect requests: %v, before %v", after, before)
	}
}

// TestStepUpCapKey: once alice's step-ups at demo for [profile repos] are
// capped, another scope set, another person and another provider are each
// still allowed, and the capped one stays refused.
func TestStepUpCapKey(t *testing.T) {
	r := newRig(t)
	ready := heldReady(t, r, "demo")
	plain := heldReady(t, r, "plain")
	bobs, err := r.store.CreateConnection(context.Background(), vault.Connection{ID: "bob-demo", Principal: bob, Provider: "demo",
		AccountID: "1002", Scopes: []string{"profile"}, Status: vault.StatusActive, Token: vault.TokenSet{AccessToken: "at-bob"}})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		stepUpOpens(t, r, r.req("demo"), ready, repos, profileRepos, repos)
	}
	stepUpRefused(t, r, r.req("demo"), ready, repos)

	for _, tt := range []struct {
		name       string
		req        connections.Request
		ready      connections.Ready
		challenged []string
		want       []string
	}{
		{"another scope set", r.req("demo"), ready, []string{"admin"}, []string{"profile", "admin"}},
		{"another person", connections.Request{Principal: bob, Provider: "demo", Via: "mcp", CanAsk: true},
			connections.Ready{Provider: ready.Provider, Conn: bobs}, repos, profileRepos},
		{"another provider", r.req("plain"), plain, repos, profileRepos},
	} {
		t.Run(tt.name, func(t *testing.T) {
			stepUpOpens(t, r, tt.req, tt.ready, tt.challenged, tt.want, tt.challenged)
		})
	}
	stepUpRefused(t, r, r.req("demo"), ready, repos)
}

// TestStepUpWindowSlides: the hour slides: a step-up is refused until the
// oldest of the three is an hour old, then one is allowed; each older one
// leaving the hour allows one more.
func TestStepUpWindowSlides(t *testing.T) {
	r := newRig(t)
	ready := heldReady(t, r, "demo")
	req := r.req("demo")
	t0 := r.clock.Now()
	for i := range 3 { // at t0, t0+1m, t0+2m
		if i > 0 {
			r.clock.Advance(time.Minute)
		}
		stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
	}
	stepUpRefused(t, r, req, ready, repos)

	r.clock.Advance(t0.Add(time.Hour - time.Nanosecond).Sub(r.clock.Now()))
	stepUpRefused(t, r, req, ready, repos)
	r.clock.Advance(time.Nanosecond) // the first is an hour old
	stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
	stepUpRefused(t, r, req, ready, repos)

	r.clock.Advance(2 * time.Minute) // the second and third are over an hour old
	if got := r.clock.Now().Sub(t0); got != time.Hour+2*time.Minute {
		t.Fatalf("the clock is %v past the first step-up, want 1h2m", got)
	}
	stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
	stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
	stepUpRefused(t, r, req, ready, repos)
}

// TestStepUpNothingMissing: a challenge naming only scopes the connection
// holds (a server answering 403 for a reason of its own, with its scopes
// in the challenge) opens no connect request, whose consent would ask for
// the same scopes: ErrScopesHeld, explained as the server's refusal,
// nothing stored or audited, and no step-up counted.
func TestStepUpNothingMissing(t *testing.T) {
	r := newRig(t)
	ready := heldReady(t, r, "demo")
	req := r.req("demo")
	before, audited, refused := grantIDs(t, r, req.Principal), stepUpsAudited(r), stepUpsRefused(r)
	for _, challenged := range [][]string{{"profile"}, nil} {
		o, err := r.conns.StepUp(context.Background(), req, ready, challenged)
		if !errors.Is(err, connections.ErrScopesHeld) || o != nil {
			t.Fatalf("StepUp(%v) over a connection holding profile = %#v, %v; want ErrScopesHeld", challenged, o, err)
		}
		if f := connections.Explain(err, ready.Provider); f.Class != connections.Refused || !strings.Contains(f.Message, "already grants every permission it named") {
			t.Errorf("explained as %+v", f)
		}
	}
	if after := grantIDs(t, r, req.Principal); !slices.Equal(after, before) || stepUpsAudited(r) != audited || stepUpsRefused(r) != refused {
		t.Fatalf("stored %v (before %v), %d step_up and %d step_up_refused events (before %d and %d)", after, before, stepUpsAudited(r), stepUpsRefused(r), audited, refused)
	}
	// Not counted: three real step-ups for the set are still allowed.
	for range 3 {
		stepUpOpens(t, r, req, ready, repos, profileRepos, repos)
	}
}

// TestStepUpWithoutAsking: a step-up for a caller that cannot send the
// person to a link (a host without url elicitation) is a NeedsUser naming
// the missing scopes, with no connect request: nothing is stored,
// audited or counted, so the person's step-ups are still there for a
// host that can ask.
func TestStepUpWithoutAsking(t *testing.T) {
	r := newRig(t)
	ready := heldReady(t, r, "demo")
	quiet := r.req("demo")
	quiet.CanAsk = false
	before := grantIDs(t, r, alice)
	for range 5 {
		o, err := r.conns.StepUp(context.Background(), quiet, ready, repos)
		need, ok := o.(connections.NeedsUser)
		if err != nil || !ok || need.Grant != nil || !slices.Equal(need.Why.Missing, repos) {
			t.Fatalf("StepUp without asking = %#v, %v; want NeedsUser for %v with no connect request", o, err, repos)
		}
	}
	if after := grantIDs(t, r, alice); !slices.Equal(after, before) || stepUpsAudited(r) != 0 || stepUpsRefused(r) != 0 {
		t.Fatalf("stored %v (before %v), %d step_up and %d step_up_refused events", after, before, stepUpsAudited(r), stepUpsRefused(r))
	}
	for range 3 {
		stepUpOpens(t, r, r.req("demo"), ready, repos, profileRepos, repos)
	}
}

// TestStepUpNeverAskedScope: a challenge naming only a scope the entry
// never asks for (offline_access, under mcp.offline_access: never) is no
// step-up (ErrScopesHeld): a grant would leave the scope out again, and
// each 403 would start another consent round until the cap. Nothing is
// stored, audited or counted.
func TestStepUpNeverAskedScope(t *testing.T) {
	r := newRig(t)
	p, _ := r.conns.Providers().Lookup("remote")
	ready := connections.Ready{Provider: p, Conn: vault.Connection{ID: "conn-remote", Principal: alice, Provider: "remote", Scopes: []string{"tools"}}}
	req := r.req("remote")
	before := grantIDs(t, r, alice)
	for range 4 {
		if o, err := r.conns.StepUp(context.Background(), req, ready, []string{"offline_access"}); !errors.Is(err, connections.ErrScopesHeld) || o != nil {
			t.Fatalf("StepUp(offline_access) under offline_access: never = %#v, %v; want ErrScopesHeld", o, err)
		}
	}
	if after := grantIDs(t, r, alice); !slices.Equal(after, before) || stepUpsAudited(r) != 0 || stepUpsRefused(r) != 0 {
		t.Fatalf("stored %v (before %v), %d step_up and %d step_up_refused events", after, before, stepUpsAudited(r), stepUpsRefused(r))
	}
}
