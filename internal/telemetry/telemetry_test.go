package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/internal/logredact"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

func scrape(t *testing.T, r *Recorder) string {
	t.Helper()
	rr := httptest.NewRecorder()
	r.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	if rr.Code != 200 {
		t.Fatalf("/metrics: HTTP %d", rr.Code)
	}
	b, _ := io.ReadAll(rr.Body)
	return string(b)
}

func TestNilRecorderIsANoOp(t *testing.T) {
	var r *Recorder
	r.MCPRequest("tools/call", "connect_account", "2026-07-28", OutcomeComplete, time.Millisecond)
	r.Elicitation(ElicitationIssued)
	r.Refresh("github", RefreshOK)
	r.ProviderCall("github", 200, time.Millisecond)
	r.SidecarRequest("demorepos", SidecarRequire, 200)
	r.Audit(context.Background(), Event{Kind: EventConnect})
	s := memstore.New(mustKeys(t))
	if got := vault.Observe(s, r.StoreObserver()); got != vault.Store(s) {
		t.Errorf("nil Recorder wrapped the store")
	}
	if r.Registry() != nil {
		t.Errorf("nil Recorder has a registry")
	}
}

func mustKeys(t *testing.T) *vault.Keyring {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// TestLabelsAreBounded feeds attacker-chosen strings where labels come from
// requests: they all fold into "other".
func TestLabelsAreBounded(t *testing.T) {
	r := New(Options{Providers: []string{"github"}, SidecarServers: []string{"demorepos"}})
	hostile := []string{"evil/method", "alice@example.com", strings.Repeat("x", 300), "grant_0123456789"}
	for _, h := range hostile {
		r.MCPRequest(h, h, h, h, time.Millisecond)
		r.Elicitation(h)
		r.Refresh(h, h)
		r.ProviderCall(h, 999, time.Millisecond)
		r.SidecarRequest(h, h, 999)
		r.Audit(context.Background(), Event{Kind: h})
	}
	r.ProviderCall("github", 404, 10*time.Millisecond)
	r.SidecarRequest("demorepos", SidecarProxy, 200)
	r.SidecarRequest(vault.UnnamedServer, SidecarToken, 403)
	r.SidecarRequest("", SidecarRequire, 401)
	m := scrape(t, r)
	for _, h := range hostile {
		if strings.Contains(m, h) {
			t.Errorf("metrics contain the request-supplied value %q", h)
		}
	}
	tests := []string{
		`credbroker_mcp_requests_total{era="other",method="other",outcome="other",tool="other"} 4`,
		`credbroker_elicitations_total{event="other"} 4`,
		`credbroker_token_refreshes_total{outcome="other",provider="other"} 4`,
		`credbroker_provider_requests_total{provider="other",status="error"} 4`,
		`credbroker_provider_requests_total{provider="github",status="404"} 1`,
		`credbroker_audit_events_total{event="other"} 4`,
		`credbroker_sidecar_requests_total{route="other",server="other",status="other"} 4`,
		`credbroker_sidecar_requests_total{route="proxy",server="demorepos",status="200"} 1`,
		`credbroker_sidecar_requests_total{route="token",server="unnamed",status="403"} 1`,
		`credbroker_sidecar_requests_total{route="require",server="none",status="401"} 1`,
	}
	for _, want := range tests {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestStoreObserver times every operation by outcome, the authorization
// server's records too.
func TestStoreObserver(t *testing.T) {
	r := New(Options{})
	s := vault.Observe(memstore.New(mustKeys(t)), r.StoreObserver())
	ctx := context.Background()
	p := vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	now := time.Now()
	c, err := s.CreateConnection(ctx, vault.Connection{ID: "conn_1", Principal: p, Provider: "github", AccountID: "1",
		Status: vault.StatusActive, Created: now, Updated: now, Token: vault.TokenSet{AccessToken: "tok-value-123"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetConnection(ctx, "conn_missing"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("get missing: %v", err)
	}
	if _, err := s.UpdateConnection(ctx, c.ID, func(old vault.Connection) (vault.Connection, error) {
		old.Version++ // a stale write
		return old, nil
	}); !errors.Is(err, vault.ErrConflict) {
		t.Fatalf("stale update: %v", err)
	}
	if _, err := s.ListConnections(ctx, p); err != nil {
		t.Fatal(err)
	}
	// A grant refused by a person's limit is "limited", not a store error.
	lim := vault.GrantLimits{Since: now.Add(-time.Hour), Now: now, MaxOpen: 1}
	for i, want := range []error{nil, vault.ErrTooManyOpenGrants} {
		g := vault.Grant{ID: fmt.Sprintf("grant_%d", i), Principal: p, Provider: "github", Created: now, Expires: now.Add(time.Minute), State: vault.GrantPending}
		if _, err := s.CreateGrantLimited(ctx, g, lim); !errors.Is(err, want) {
			t.Fatalf("grant %d: %v, want %v", i, err, want)
		}
	}
	if _, err := s.Auth().GetOAuthClient(ctx, "client_missing"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("get missing client: %v", err)
	}
	m := scrape(t, r)
	for _, want := range []string{
		`credbroker_vault_operation_duration_seconds_count{op="get_oauth_client",outcome="not_found"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="create_connection",outcome="ok"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="get_connection",outcome="not_found"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="update_connection",outcome="conflict"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="list_connections",outcome="ok"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="create_grant_limited",outcome="ok"} 1`,
		`credbroker_vault_operation_duration_seconds_count{op="create_grant_limited",outcome="limited"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestAuditRecord checks the audit record's fields, level and counters.
func TestAuditRecord(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(logredact.New(slog.NewJSONHandler(&buf, nil)))
	r := New(Options{Providers: []string{"github"}, Audit: log})
	actor := vault.Principal{Issuer: "https://idp.test", Subject: "bob"}
	r.Audit(context.Background(), Event{Kind: EventIdentityMismatch, Principal: actor, Provider: "github",
		Grant: "g123", Via: "browser", Outcome: "refused_at_landing"})
	r.Audit(context.Background(), Event{Kind: EventRevoke, Principal: actor, Provider: "github", Account: "octocat",
		Connection: "conn_1", Outcome: "failed", Err: errors.New("revoke: POST https://x/revoke?token=abc123secret: HTTP 500")})
	r.Audit(context.Background(), Event{Kind: EventTokenExport, Principal: actor, Provider: "github", Account: "octocat",
		Connection: "conn_1", Via: "sidecar", Server: "demorepos"})
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want 2 records, got:\n%s", buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"level": "WARN", "audit": true, "event": "identity_mismatch", "provider": "github",
		"grant_ref": binding.Ref("g123"), "via": "browser", "outcome": "refused_at_landing",
		"principal": map[string]any{"iss": "https://idp.test", "sub": "bob"}}
	for k, v := range want {
		got, _ := json.Marshal(rec[k])
		exp, _ := json.Marshal(v)
		if !bytes.Equal(got, exp) {
			t.Errorf("%s = %s, want %s", k, got, exp)
		}
	}
	if strings.Contains(buf.String(), "g123") {
		t.Errorf("the grant id itself was logged: %s", lines[0])
	}
	if strings.Contains(lines[1], "abc123secret") || !strings.Contains(lines[1], `"level":"WARN"`) {
		t.Errorf("revoke failure record: %s", lines[1])
	}
	if !strings.Contains(lines[2], `"via":"sidecar","server":"demorepos"`) || strings.Contains(lines[0], `"server"`) {
		t.Errorf("the server name is not where it belongs: %s / %s", lines[2], lines[0])
	}
	m := scrape(t, r)
	for _, w := range []string{`credbroker_identity_mismatches_total 1`, `credbroker_audit_events_total{event="revoke"} 1`} {
		if !strings.Contains(m, w) {
			t.Errorf("metrics lack %s", w)
		}
	}
}
