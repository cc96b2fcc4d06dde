package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"credbroker/apps"
	"credbroker/internal/bearer"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// errDown is what a store answers while its database is gone.
var errDown = vault.UnavailableError("postgres 127.0.0.1:5432", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))

// downStore is a store whose reads fail as a storage outage does (a
// database that went away): the connection listing, and the admin
// listings offboarding and disabling a provider start with.
type downStore struct{ vault.Store }

func (downStore) ListConnections(context.Context, vault.Principal) ([]vault.Connection, error) {
	return nil, errDown
}

func (s downStore) Admin() vault.AdminStore { return downAdmin{s.Store.Admin()} }

type downAdmin struct{ vault.AdminStore }

func (downAdmin) RetiredConnections(context.Context, vault.Principal) ([]vault.Connection, error) {
	return nil, errDown
}

func (downAdmin) ProviderConnections(context.Context, string, string, int) ([]vault.Connection, error) {
	return nil, errDown
}

// TestStorageOutage: while the store is unavailable every admin route
// answers as every door of the broker does: HTTP 503, Retry-After, a JSON
// error storage_unavailable saying the storage is unavailable and to
// retry, never a 500 nor the cause; the cause is logged and each refusal
// counted at the admin door.
func TestStorageOutage(t *testing.T) {
	conns := newConnections(t, func(s vault.Store) vault.Store { return downStore{s} })
	claim, _ := ParseClaim("groups=admins")
	verify := func(_ context.Context, raw string) (bearer.TokenInfo, error) {
		switch raw {
		case "admin-token":
			return bearer.TokenInfo{Principal: vault.Principal{Issuer: "https://idp.example", Subject: "root"},
				Claims: json.RawMessage(`{"groups":["admins"]}`)}, nil
		case "checked-in-the-store":
			return bearer.TokenInfo{}, errDown
		}
		return bearer.TokenInfo{}, bearer.ErrInvalidToken
	}
	logs := &logbuf.Buffer{}
	rec := telemetry.New(telemetry.Options{})
	api, err := New(Options{Connections: conns, Verify: verify, Claim: claim, Telemetry: rec,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Apps:   func(context.Context, vault.Principal) ([]apps.App, error) { return nil, errDown }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.Handler())
	t.Cleanup(srv.Close)
	person := url.Values{"iss": {"https://idp.example"}, "sub": {"alice"}}.Encode()
	for _, c := range []struct{ name, method, path, token, body string }{
		{"list connections", "GET", "/admin/v1/connections?" + person, "admin-token", ""},
		{"list apps", "GET", "/admin/v1/apps?" + person, "admin-token", ""},
		{"offboard", "POST", "/admin/v1/offboard", "admin-token", `{"iss":"https://idp.example","sub":"alice"}`},
		{"disable a provider", "POST", "/admin/v1/providers/demo/disable", "admin-token", `{"delete":true}`},
		{"the token check", "GET", "/admin/v1/connections?" + person, "checked-in-the-store", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer "+c.token)
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var e struct {
				Error string `json:"error"`
				Desc  string `json:"error_description"`
			}
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("HTTP %d, not a JSON error: %s", resp.StatusCode, b)
			}
			switch {
			case resp.StatusCode != http.StatusServiceUnavailable:
				t.Errorf("HTTP %d, want 503: %s", resp.StatusCode, b)
			case resp.Header.Get("Retry-After") != "2":
				t.Errorf("Retry-After %q, want 2", resp.Header.Get("Retry-After"))
			case !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json"):
				t.Errorf("Content-Type %q", resp.Header.Get("Content-Type"))
			case e.Error != "storage_unavailable":
				t.Errorf("error %q, want storage_unavailable", e.Error)
			case !strings.Contains(e.Desc, "storage is unavailable") || !strings.Contains(e.Desc, "Retry"):
				t.Errorf("error_description %q does not say the storage is unavailable and to retry", e.Desc)
			case strings.Contains(string(b), "5432") || strings.Contains(string(b), "refused"):
				t.Errorf("the answer shows the cause: %s", b)
			}
		})
	}
	if !strings.Contains(logs.String(), "connection refused") {
		t.Errorf("the log does not name the cause:\n%s", logs.String())
	}
	rr := httptest.NewRecorder()
	rec.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rr.Body.String(), `credbroker_store_unavailable_total{door="admin"} 5`) {
		t.Errorf("want 5 refusals counted at the admin door:\n%s", rr.Body.String())
	}
}
