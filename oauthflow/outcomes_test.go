package oauthflow

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/connections"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// linkProviders is fake GitHub and Google, the demo-keys service, and a
// GitHub entry that allows one scope only.
func linkProviders(h *harness) (string, map[string]string) {
	doc, env := fakeProviders(h)
	keys, _ := demoKeys(h)
	gh := h.gh.URL()
	return doc + strings.TrimPrefix(keys, "providers:\n") + `  limited:
    display_name: Limited GitHub
    type: oauth2
    authorization_url: ` + gh + `/login/oauth/authorize
    token_url: ` + gh + `/login/oauth/access_token
    client_id: ${GITHUB_CLIENT_ID}
    client_secret: ${GITHUB_CLIENT_SECRET}
    allowed_scopes: [read:user]
    account: {url: ` + gh + `/user, id_field: id, login_field: login}
`, env
}

// counter reads the counter name{label=value} of the harness's recorder.
func (h *harness) counter(name, label, value string) float64 {
	h.t.Helper()
	mfs, err := h.rec.Registry().Gather()
	if err != nil {
		h.t.Fatal(err)
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

// TestLinkOutcomesOnThePage: every outcome of opening a connect link
// (connections.Open) has its page, and none changes the request.
func TestLinkOutcomesOnThePage(t *testing.T) {
	h := newHarness(t, linkProviders)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// setup returns the link's id.
		setup  func(t *testing.T, a *agent) string
		user   string
		status int
		want   []string
	}{
		{"open: consent before the redirect", func(t *testing.T, a *agent) string { return h.grant("alice", "github", nil, "c").ID },
			"alice", http.StatusOK, []string{`name="decision" value="approve"`, "GitHub"}},
		{"open: the form of a form step", func(t *testing.T, a *agent) string { return h.grant("alice", "demo-keys", nil, "c").ID },
			"alice", http.StatusOK, []string{`name="field.api_key"`}},
		{"unknown", func(t *testing.T, a *agent) string {
			g := h.grant("alice", "github", nil, "c")
			return g.ID[:len(g.ID)-2] + "AA"
		}, "alice", http.StatusNotFound, []string{"Unknown connect link"}},
		{"not yours", func(t *testing.T, a *agent) string { return h.grant("alice", "github", nil, "c").ID },
			"bob", http.StatusForbidden, []string{"This link belongs to a different account"}},
		{"expired", func(t *testing.T, a *agent) string {
			g := h.grant("alice", "github", nil, "c")
			h.clock.Advance(11 * time.Minute)
			t.Cleanup(func() { h.clock.Advance(-11 * time.Minute) })
			return g.ID
		}, "alice", http.StatusGone, []string{"This connect link has expired"}},
		{"already used", func(t *testing.T, a *agent) string {
			g := h.grant("alice", "github", nil, "c")
			mustContain(t, a.get(a.toCallback(g, "alice").String()), "Connected")
			return g.ID
		}, "alice", http.StatusGone, []string{"This connect link was already used"}},
		{"declined", func(t *testing.T, a *agent) string {
			g := h.grant("alice", "github", nil, "c")
			if err := h.conns.Decline(ctx, h.principal("alice"), g.ID, "mcp"); err != nil {
				t.Fatal(err)
			}
			return g.ID
		}, "alice", http.StatusGone, []string{"This connect request was declined"}},
		{"provider gone", func(t *testing.T, a *agent) string { return h.grant("alice", "removed-since", nil, "c").ID },
			"alice", http.StatusNotFound, []string{"Provider not available"}},
		{"scope not allowed", func(t *testing.T, a *agent) string { return h.grant("alice", "limited", []string{"repo"}, "c").ID },
			"alice", http.StatusBadRequest, []string{"Permission not allowed", "Limited GitHub"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := h.newAgent()
			id := tc.setup(t, a)
			var before vault.Grant
			if g, err := h.store.GetGrant(ctx, id); err == nil {
				before = g
			}
			if tc.user != "alice" {
				a = h.newAgent()
			}
			p := a.signInIfAsked(a.get(h.srv.URL+"/connect/"+id), tc.user)
			mustStatus(t, p, tc.status)
			mustContain(t, p, tc.want...)
			if after, err := h.store.GetGrant(ctx, id); err == nil && (after.Version != before.Version || after.State != before.State) {
				t.Fatalf("opening the link changed the request: %+v → %+v", before, after)
			}
		})
	}
}

// TestDeclineEverywhere: declining a connect request records the same
// metric and audit event whichever of the four places the person said no:
// the consent page, a form's Deny, the provider's access_denied, their
// client's answer.
func TestDeclineEverywhere(t *testing.T) {
	h := newHarness(t, linkProviders)
	ctx := context.Background()
	for _, tc := range []struct {
		name, provider, via string
		decline             func(t *testing.T, g vault.Grant)
	}{
		{"consent page", "github", "browser", func(t *testing.T, g vault.Grant) {
			a := h.newAgent()
			p := a.submit(a.openConnect(g, "alice"), "/connect/", url.Values{"decision": {"deny"}})
			mustStatus(t, p, http.StatusOK)
		}},
		{"form step", "demo-keys", "browser", func(t *testing.T, g vault.Grant) {
			a := h.newAgent()
			p := a.submit(a.openConnect(g, "alice"), "/key", url.Values{"decision": {"deny"}})
			mustStatus(t, p, http.StatusOK)
		}},
		{"provider access_denied", "github", "browser", func(t *testing.T, g vault.Grant) {
			h.gh.SetAuthorizeError("access_denied", "no")
			defer h.gh.SetAuthorizeError("", "")
			a := h.newAgent()
			mustStatus(t, a.get(a.toCallback(g, "alice").String()), http.StatusForbidden)
		}},
		{"the client's answer", "github", "mcp", func(t *testing.T, g vault.Grant) {
			o, err := h.conns.Resume(ctx, connections.Request{Principal: h.principal("alice"), Provider: "github", Via: "mcp"}, g.ID, connections.Decline)
			if _, ok := o.(connections.Declined); err != nil || !ok {
				t.Fatalf("Resume = %#v, %v", o, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := h.grant("alice", tc.provider, nil, "c")
			metric := h.counter("credbroker_elicitations_total", "event", telemetry.ElicitationDeclined)
			events := strings.Count(h.logs.String(), "event=connect_declined")
			tc.decline(t, g)
			if got := h.counter("credbroker_elicitations_total", "event", telemetry.ElicitationDeclined) - metric; got != 1 {
				t.Errorf("declined metric rose by %v, want 1", got)
			}
			logs := h.logs.String()
			if got := strings.Count(logs, "event=connect_declined") - events; got != 1 {
				t.Errorf("%d connect_declined audit events, want 1", got)
			}
			line := ""
			for l := range strings.Lines(logs) {
				if strings.Contains(l, "event=connect_declined") && strings.Contains(l, "grant_ref="+connections.Ref(g.ID)) {
					line = l
				}
			}
			if !strings.Contains(line, "provider="+tc.provider) || !strings.Contains(line, "via="+tc.via) || !strings.Contains(line, "principal.sub=alice") {
				t.Errorf("audit event %q: want provider=%s via=%s principal.sub=alice", line, tc.provider, tc.via)
			}
			if st := h.grantState(g.ID); st != vault.GrantDenied {
				t.Errorf("grant is %s, want denied", st)
			}
		})
	}
}
