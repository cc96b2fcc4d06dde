package adminapi

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/internal/bearer"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// TestListApps: GET /admin/v1/apps lists a person's apps as the
// authorization server reports them, marking those the organisation's IdP
// let in (ID-JAG), for admins only, audited; without an authorization
// server (issuer mode) the route is a 404.
func TestListApps(t *testing.T) {
	conns := newConnections(t, nil)
	claim, _ := ParseClaim("groups=admins")
	verify := func(_ context.Context, raw string) (bearer.TokenInfo, error) {
		groups := map[string]string{"admin-token": `{"groups":["admins"]}`, "user-token": `{"groups":["staff"]}`}[raw]
		if groups == "" {
			return bearer.TokenInfo{}, bearer.ErrInvalidToken
		}
		return bearer.TokenInfo{Principal: vault.Principal{Issuer: "https://idp.example", Subject: "root"}, Claims: json.RawMessage(groups)}, nil
	}
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	used := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	list := func(_ context.Context, p vault.Principal) ([]apps.App, error) {
		if p != alice {
			return nil, nil
		}
		return []apps.App{
			{ID: "a1", ClientID: "xaa-host", Name: "Enterprise host", Authorized: used, LastUsed: used, Active: true, ByOrganisation: true},
			{ID: "a2", ClientID: "https://claude.ai/oauth/mcp.json", Name: "Claude", VerifiedDomain: "claude.ai", Authorized: used},
		}, nil
	}
	audit := &logbuf.Buffer{}
	rec := telemetry.New(telemetry.Options{Audit: slog.New(slog.NewJSONHandler(audit, nil))})
	get := func(api *Server, token string, q url.Values) (int, string) {
		srv := httptest.NewServer(api.Handler())
		defer srv.Close()
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/admin/v1/apps?"+q.Encode(), nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	api, err := New(Options{Connections: conns, Verify: verify, Claim: claim, Apps: list, Telemetry: rec})
	if err != nil {
		t.Fatal(err)
	}
	who := url.Values{"iss": {alice.Issuer}, "sub": {alice.Subject}}
	status, body := get(api, "admin-token", who)
	var out AppsJSON
	if err := json.Unmarshal([]byte(body), &out); status != 200 || err != nil {
		t.Fatalf("HTTP %d %s", status, body)
	}
	if out.Principal != (PrincipalJSON{alice.Issuer, alice.Subject}) || len(out.Apps) != 2 ||
		!out.Apps[0].ByOrganisation || out.Apps[1].ByOrganisation || out.Apps[1].VerifiedDomain != "claude.ai" || out.Apps[1].LastUsed != nil {
		t.Fatalf("apps %s", body)
	}
	if !strings.Contains(audit.String(), `"event":"admin_list"`) || !strings.Contains(audit.String(), `"outcome":"apps"`) {
		t.Errorf("the listing was not audited:\n%s", audit.String())
	}
	for _, tc := range []struct {
		name, token string
		q           url.Values
		status      int
	}{
		{"not an admin", "user-token", who, 403},
		{"no valid token", "nope", who, 401},
		{"no person", "admin-token", url.Values{"iss": {alice.Issuer}}, 400},
	} {
		if status, body := get(api, tc.token, tc.q); status != tc.status || strings.Contains(body, "Enterprise host") {
			t.Errorf("%s: HTTP %d %s, want %d", tc.name, status, body, tc.status)
		}
	}
	issuerMode, err := New(Options{Connections: conns, Verify: verify, Claim: claim})
	if err != nil {
		t.Fatal(err)
	}
	if status, _ := get(issuerMode, "admin-token", who); status != 404 {
		t.Errorf("without an authorization server: HTTP %d, want 404", status)
	}
}
