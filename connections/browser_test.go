package connections_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// counter reads the counter name{label=value} of rec ("" label: the
// unlabelled counter).
func counter(t *testing.T, rec *telemetry.Recorder, name, label, value string) float64 {
	t.Helper()
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// startRequest starts a connect request of alice for provider p as the MCP
// door does, and returns it.
func (r *rig) startRequest(p string) vault.Grant {
	r.t.Helper()
	o, err := r.conns.Reconnect(context.Background(), r.req(p))
	need, ok := o.(connections.NeedsUser)
	if err != nil || !ok || need.Grant == nil {
		r.t.Fatalf("Reconnect(%s) = %#v, %v", p, o, err)
	}
	return *need.Grant
}

// problem returns err's *LinkError problem (0 when it is none).
func problem(err error) connections.LinkProblem {
	var le *connections.LinkError
	if errors.As(err, &le) {
		return le.Problem
	}
	return 0
}

// TestOpenOutcomes: a connect link's page asks connections.Open, which
// answers the open request or says why not, each outcome as its own
// *LinkError problem, and changes nothing (a link of another person is
// audited).
func TestOpenOutcomes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	grants := binding.New(r.store, binding.Options{Now: r.clock.Now})
	for _, tc := range []struct {
		name string
		// setup returns the link and who opens it.
		setup func(t *testing.T) (string, vault.Principal)
		want  connections.LinkProblem
	}{
		{"open", func(t *testing.T) (string, vault.Principal) { return r.startRequest("demo").ID, alice }, 0},
		{"unknown", func(t *testing.T) (string, vault.Principal) { return binding.NewID(), alice }, connections.LinkUnknown},
		{"malformed", func(t *testing.T) (string, vault.Principal) { return "not-a-link", alice }, connections.LinkUnknown},
		{"not yours", func(t *testing.T) (string, vault.Principal) { return r.startRequest("demo").ID, bob }, connections.LinkNotYours},
		{"expired", func(t *testing.T) (string, vault.Principal) {
			g := r.startRequest("demo")
			r.clock.Advance(11 * time.Minute)
			t.Cleanup(func() { r.clock.Advance(-11 * time.Minute) })
			return g.ID, alice
		}, connections.LinkExpired},
		{"already used", func(t *testing.T) (string, vault.Principal) {
			g := r.startRequest("demo-keys")
			cr, err := r.conns.Open(ctx, alice, g.ID, "landing")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.conns.EnterKey(ctx, alice, cr, r.keyValues("alice-demo")); err != nil {
				t.Fatal(err)
			}
			return g.ID, alice
		}, connections.LinkUsed},
		{"declined", func(t *testing.T) (string, vault.Principal) {
			g := r.startRequest("demo")
			if err := r.conns.Decline(ctx, alice, g.ID, "browser"); err != nil {
				t.Fatal(err)
			}
			return g.ID, alice
		}, connections.LinkDeclined},
		{"provider gone", func(t *testing.T) (string, vault.Principal) {
			g, err := grants.Create(ctx, alice, "removed-since", nil, "c")
			if err != nil {
				t.Fatal(err)
			}
			return g.ID, alice
		}, connections.LinkProviderGone},
		{"scope not allowed", func(t *testing.T) (string, vault.Principal) {
			g, err := grants.Create(ctx, alice, "demo", []string{"admin"}, "c")
			if err != nil {
				t.Fatal(err)
			}
			return g.ID, alice
		}, connections.LinkScopeNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, who := tc.setup(t)
			before, _ := r.store.GetGrant(ctx, id)
			mismatches := strings.Count(r.audit.String(), "event=identity_mismatch")
			cr, err := r.conns.Open(ctx, who, id, "landing")
			if got := problem(err); got != tc.want || tc.want == 0 && (err != nil || cr.Grant.ID != id || cr.Provider.Name != "demo") {
				t.Fatalf("Open = %+v, %v (problem %d), want problem %d", cr, err, got, tc.want)
			}
			if after, _ := r.store.GetGrant(ctx, id); after.Version != before.Version || after.State != before.State {
				t.Fatalf("Open changed the grant: %+v → %+v", before, after)
			}
			wantMismatch := 0
			if tc.want == connections.LinkNotYours {
				wantMismatch = 1
			}
			if got := strings.Count(r.audit.String(), "event=identity_mismatch") - mismatches; got != wantMismatch {
				t.Errorf("%d identity_mismatch audit events, want %d", got, wantMismatch)
			}
		})
	}
}

// TestBrowserStepOutcomes: the steps after Open answer their own
// outcomes: a form's key entry is limited per link; the callback needs
// this person's consent for this link and provider, and a provider's
// access_denied declines the request while another error leaves it open.
func TestBrowserStepOutcomes(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	t.Run("too many keys", func(t *testing.T) {
		g := r.startRequest("demo-keys")
		cr, err := r.conns.Open(ctx, alice, g.ID, "key_submit")
		if err != nil {
			t.Fatal(err)
		}
		wrong := map[string]string{"api_key": strings.Repeat("x", 10)}
		for i := range 5 {
			if _, err := r.conns.EnterKey(ctx, alice, cr, wrong); problem(err) != 0 || err == nil {
				t.Fatalf("attempt %d: %v, want the key refused", i+1, err)
			}
		}
		if _, err := r.conns.EnterKey(ctx, alice, cr, r.keyValues("alice-demo")); problem(err) != connections.LinkTooManyAttempts {
			t.Fatalf("sixth attempt: %v, want LinkTooManyAttempts", err)
		}
		if list, _ := r.conns.List(ctx, alice); len(list) != 0 {
			t.Fatalf("a connection was stored: %+v", list)
		}
	})
	callback := func(g vault.Grant, consent vault.Principal, p string) connections.Callback {
		return connections.Callback{Principal: alice, Grant: g.ID, Consent: consent, Provider: p,
			RedirectURL: redirect, Request: provider.AuthRequest{Scopes: g.Scopes}, Code: "unused"}
	}
	for _, tc := range []struct {
		name    string
		consent vault.Principal
		p       string
	}{
		{"consent of another person", bob, "demo"},
		{"answer for another provider", alice, "plain"},
		{"consent naming no one for a request never approved", vault.Principal{}, "demo"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := r.startRequest("demo")
			if _, _, err := r.conns.Complete(ctx, callback(g, tc.consent, tc.p)); problem(err) != connections.LinkNotConsented {
				t.Fatalf("Complete: %v, want LinkNotConsented", err)
			}
			if after, _ := r.store.GetGrant(ctx, g.ID); after.State != vault.GrantPending || after.Version != 1 {
				t.Fatalf("the grant changed: %+v", after)
			}
		})
	}
	t.Run("provider error", func(t *testing.T) {
		g := r.startRequest("demo")
		cb := callback(g, alice, "demo")
		cb.Code, cb.Error, cb.ErrorDescription = "", "temporarily_unavailable", "later"
		var pe *connections.ProviderError
		if _, _, err := r.conns.Complete(ctx, cb); !errors.As(err, &pe) || pe.Denied || pe.Code != "temporarily_unavailable" {
			t.Fatalf("Complete: %v, want a *ProviderError, not denied", err)
		}
		if after, _ := r.store.GetGrant(ctx, g.ID); after.State != vault.GrantPending {
			t.Fatalf("a provider error closed the request: %s", after.State)
		}
		cb.Error = "access_denied"
		if _, _, err := r.conns.Complete(ctx, cb); !errors.As(err, &pe) || !pe.Denied {
			t.Fatalf("Complete: %v, want a *ProviderError, denied", err)
		}
		if after, _ := r.store.GetGrant(ctx, g.ID); after.State != vault.GrantDenied {
			t.Fatalf("access_denied left the request %s, want denied", after.State)
		}
	})
}

// TestDeclineRecordedOnce: Decline is the one place a decline is
// recorded, with the declined metric and the connect_declined audit
// event; a request already closed is a *LinkError and records nothing;
// the client's retry that reads the decline records nothing again.
func TestDeclineRecordedOnce(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	declined := func() float64 {
		return counter(t, r.rec, "credbroker_elicitations_total", "event", telemetry.ElicitationDeclined)
	}
	g := r.startRequest("demo")
	if err := r.conns.Decline(ctx, alice, g.ID, "browser"); err != nil {
		t.Fatal(err)
	}
	if declined() != 1 || strings.Count(r.audit.String(), "event=connect_declined") != 1 ||
		!strings.Contains(r.audit.String(), "grant_ref="+binding.Ref(g.ID)) {
		t.Fatalf("after one decline: metric %v, audit:\n%s", declined(), r.audit)
	}
	if err := r.conns.Decline(ctx, alice, g.ID, "browser"); problem(err) != connections.LinkDeclined {
		t.Fatalf("declining again: %v, want LinkDeclined", err)
	}
	if o, err := r.conns.Resume(ctx, r.req("demo"), g.ID, connections.NoAnswer); err != nil {
		t.Fatal(err)
	} else if _, ok := o.(connections.Declined); !ok {
		t.Fatalf("Resume after the decline = %#v, want Declined", o)
	}
	if declined() != 1 || strings.Count(r.audit.String(), "event=connect_declined") != 1 {
		t.Fatalf("recorded again: metric %v, audit:\n%s", declined(), r.audit)
	}
}
