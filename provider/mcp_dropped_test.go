package provider

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// forget makes the rig's authorization server forget client id, as one
// whose registration was deleted or expired (RFC 7592 §2.3): its token
// requests answer invalid_client from now on.
func (a *upstreamAS) forget(id string) {
	a.with(func() { delete(a.clients, id) })
}

// auditTo is a Recorder whose audit events go to buf as JSON.
func auditTo(buf *logbuf.Buffer) *telemetry.Recorder {
	return telemetry.New(telemetry.Options{Providers: []string{"linear"}, Audit: slog.New(slog.NewJSONHandler(buf, nil))})
}

// TestMCPRegistrationDroppedOnInvalidClient: when the upstream's
// authorization server no longer knows the broker's dynamic registration
// (invalid_client at its token endpoint), the broker deletes that
// registration (audited as upstream_registration_dropped) and the next
// connect registers anew and works:
//
//   - a refresh that meets it marks the connection needs_reconnect (its
//     tokens were the forgotten client's) and answers ErrNeedsReconnect
//     and ErrRegistrationDropped;
//   - a code exchange that meets it answers ErrRegistrationDropped; the
//     same person's next attempt registers anew and connects.
//
// Before the fix the registration stayed, every refresh failed as the
// dead client ("token refresh refused", the connection left active) and
// every new connect was sent to the authorization server as it.
func TestMCPRegistrationDroppedOnInvalidClient(t *testing.T) {
	ctx := context.Background()
	r := newMCPRig(t, "127.0.0.1")
	reg := r.registry("", "")
	var audit logbuf.Buffer
	k := r.client(reg, func(o *Options) { o.Telemetry = auditTo(&audit) })
	p, _ := reg.Lookup("linear")
	key := r.as.base + " " + mcpRedirect
	stored := func() string {
		t.Helper()
		c, err := r.clients.GetUpstreamClient(ctx, key)
		if errors.Is(err, vault.ErrNotFound) {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return c.ClientID
	}

	// The refresh.
	r.connect(k, alice, "conn-1", nil)
	first := stored()
	if !strings.HasPrefix(first, "dcr-client-") {
		t.Fatalf("after the first connect the store holds %q", first)
	}
	r.as.forget(first)
	_, err := k.Token(ctx, "conn-1")
	if !errors.Is(err, ErrNeedsReconnect) || !errors.Is(err, ErrRegistrationDropped) {
		t.Fatalf("refresh as the forgotten client: %v; want ErrNeedsReconnect and ErrRegistrationDropped", err)
	}
	if got := stored(); got != "" {
		t.Fatalf("the forgotten client %s is still stored (%q)", first, got)
	}
	if c, err := r.store.GetConnection(ctx, "conn-1"); err != nil || c.Status != vault.StatusNeedsReconnect {
		t.Fatalf("the connection after the refresh: %v, %v; want needs_reconnect", c.Status, err)
	}
	droppedFor(t, audit.String(), alice, "conn-1", first, "background")
	// The next connect registers anew, and its connection refreshes.
	r.connect(k, alice, "conn-2", nil)
	second := stored()
	if second == "" || second == first || len(r.as.requests("/register")) != 2 {
		t.Fatalf("after the reconnect the store holds %q (the forgotten one was %q), %d registrations", second, first, len(r.as.requests("/register")))
	}
	if c, err := k.Token(ctx, "conn-2"); err != nil || c.Status != vault.StatusActive {
		t.Fatalf("refresh as the new registration: %v, %v", c.Status, err)
	}

	// The code exchange: the server forgets the client between the
	// authorization and the token request.
	a, code := r.authorize(k, nil)
	r.as.forget(second)
	if _, err := k.Exchange(ctx, p, bob, mcpRedirect, code, a); !errors.Is(err, ErrRegistrationDropped) {
		t.Fatalf("code exchange as the forgotten client: %v; want ErrRegistrationDropped", err)
	}
	if got := stored(); got != "" {
		t.Fatalf("the forgotten client %s is still stored (%q)", second, got)
	}
	droppedFor(t, audit.String(), bob, "", second, "browser")
	a, code = r.authorize(k, nil)
	u, _ := url.Parse(a.URL)
	third := u.Query().Get("client_id")
	if third == second || third != stored() {
		t.Fatalf("the next connect authorized as %q (the forgotten one was %q, the store holds %q)", third, second, stored())
	}
	if _, err := k.Exchange(ctx, p, bob, mcpRedirect, code, a); err != nil {
		t.Fatalf("code exchange after registering anew: %v", err)
	}
}

// TestMCPRegistrationDropKeepsNewer: a replica that saw the forgotten
// client refused while another replica already registered anew leaves
// the new registration in place (the delete names the refused client).
func TestMCPRegistrationDropKeepsNewer(t *testing.T) {
	ctx := context.Background()
	r := newMCPRig(t, "127.0.0.1")
	reg := r.registry("", "")
	k := r.client(reg, nil)
	r.connect(k, alice, "conn-1", nil)
	old, _ := r.clients.GetUpstreamClient(ctx, r.as.base+" "+mcpRedirect)
	r.as.forget(old.ClientID)
	// Another replica drops the client and registers anew while this
	// one's refresh, as the old client, is at the token endpoint.
	newer := old
	newer.ClientID, newer.ClientSecret = "dcr-client-elsewhere", "elsewhere-secret"
	r.as.with(func() {
		r.as.tokenHook = func() {
			r.as.tokenHook = nil
			r.clients.with(func(m map[string]UpstreamClient) { m[old.Key] = newer })
		}
	})
	if _, err := k.Token(ctx, "conn-1"); !errors.Is(err, ErrRegistrationDropped) {
		t.Fatalf("refresh as the forgotten client: %v; want ErrRegistrationDropped", err)
	}
	got, err := r.clients.GetUpstreamClient(ctx, old.Key)
	if err != nil || got.ClientID != newer.ClientID {
		t.Fatalf("the registration after the late drop: %+v, %v; want the other replica's %s", got, err, newer.ClientID)
	}
}

// TestMCPClientRefusedNeverDropped: a pre-registered client, or the
// broker's Client ID Metadata Document, that the token endpoint refuses
// with invalid_client is an operator's to fix: the answer says so (an
// *UpstreamError of kind client_refused), the connection stays as it
// is, and nothing is deleted or registered.
func TestMCPClientRefusedNeverDropped(t *testing.T) {
	for _, c := range []struct {
		name, entry, client, want string
		cimd                      bool
	}{
		{name: "static", entry: "    client_id: static-client\n    client_secret: ${LINEAR_SECRET}\n", client: "static-client",
			want: `pre-registered client "static-client" (invalid_client): the entry's client_id or client secret is wrong`},
		{name: "cimd", cimd: true, client: mcpClientMeta, want: `Client ID Metadata Document "` + mcpClientMeta + `" (invalid_client): an operator must check`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			r := newMCPRig(t, "127.0.0.1")
			if c.cimd {
				r.as.set("client_id_metadata_document_supported", true)
			}
			reg := r.registry("", c.entry)
			var audit logbuf.Buffer
			k := r.client(reg, func(o *Options) { o.Telemetry = auditTo(&audit) })
			r.connect(k, alice, "conn-1", nil)
			// The server refuses the client from now on (a wrong secret,
			// an unreachable document).
			r.as.with(func() { r.as.refuseClient = c.client })
			_, err := k.Token(ctx, "conn-1")
			var ue *UpstreamError
			if !errors.As(err, &ue) || ue.Kind != UpstreamClientRefused || !strings.Contains(ue.Error(), c.want) || errors.Is(err, ErrNeedsReconnect) {
				t.Fatalf("refresh as a refused %s client: %v; want a client_refused *UpstreamError saying %q", c.name, err, c.want)
			}
			if conn, err := r.store.GetConnection(ctx, "conn-1"); err != nil || conn.Status != vault.StatusActive {
				t.Fatalf("the connection: %v, %v; want it left active", conn.Status, err)
			}
			if gets, puts := r.clients.counts(); puts != 0 || len(r.as.requests("/register")) != 0 {
				t.Fatalf("%d gets, %d puts, %d registrations: a refused %s client led to a registration", gets, puts, len(r.as.requests("/register")), c.name)
			}
			if strings.Contains(audit.String(), "upstream_registration_dropped") || !strings.Contains(audit.String(), `"outcome":"client_refused"`) {
				t.Fatalf("audit: %s; want upstream_error client_refused and no drop", audit.String())
			}
		})
	}
}

// droppedFor fails unless the audit log holds exactly one
// upstream_registration_dropped event for client, and that event names
// the person pr whose refresh (of connection) or code exchange met the
// server's invalid_client, and what asked (via).
func droppedFor(t *testing.T, audit string, pr vault.Principal, connection, client, via string) {
	t.Helper()
	var found []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(audit), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if e["event"] == "upstream_registration_dropped" && e["client"] == client {
			found = append(found, e)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d upstream_registration_dropped events naming %s, want 1:\n%s", len(found), client, audit)
	}
	e := found[0]
	who, _ := e["principal"].(map[string]any)
	if who["iss"] != pr.Issuer || who["sub"] != pr.Subject {
		t.Fatalf("upstream_registration_dropped for %s names principal %v, want %s %s:\n%s", client, e["principal"], pr.Issuer, pr.Subject, audit)
	}
	if conn, _ := e["connection"].(string); conn != connection || e["via"] != via || e["provider"] != "linear" {
		t.Fatalf("upstream_registration_dropped for %s: connection %v, via %v, provider %v; want %q, %q, linear", client, e["connection"], e["via"], e["provider"], connection, via)
	}
}
