package provider

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

// TestRedirectRechecksAllowList: a same-host redirect is followed
// only to a method and path the allow-list names; otherwise the caller
// gets the 3xx and the target never sees the token.
func TestRedirectRechecksAllowList(t *testing.T) {
	const token = "gho_REDIRECTTOKEN0123456789"
	var (
		mu   sync.Mutex
		hits []string // "METHOD /path" that reached a redirect target with the token
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if code := r.URL.Query().Get("redirect"); code != "" && strings.HasPrefix(r.URL.Path, "/api/user") {
			_, _ = io.ReadAll(r.Body)
			status, _ := strconv.Atoi(code)
			w.Header().Set("Location", r.URL.Query().Get("to"))
			w.WriteHeader(status)
			return
		}
		mu.Lock()
		hits = append(hits, r.Method+" "+r.URL.Path)
		mu.Unlock()
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	k, _ := singleConnClient(t, srv.URL, ", allowed_paths: [GET /user, POST /user/keys, GET /admin/read]", 0,
		vault.TokenSet{AccessToken: token, TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}, time.Now())
	for _, tc := range []struct {
		name, method, path string
		code               int
		to                 string
		wantStatus         int
		wantHit            string // the request the target must see ("" none)
	}{
		{"307 to a path not in the allow-list", "GET", "/user", 307, "/api/admin", 307, ""},
		{"308 to a path not in the allow-list", "GET", "/user", 308, "/api/admin/delete", 308, ""},
		{"302 to a path not in the allow-list", "GET", "/user", 302, "/api/orgs/x", 302, ""},
		{"307 replays POST to a GET-only path", "POST", "/user/keys", 307, "/api/admin/read", 307, ""},
		{"307 replays POST to a path allowing another method", "POST", "/user/keys", 307, "/api/user/emails", 307, ""},
		{"303 turns POST into an allowed GET", "POST", "/user/keys", 303, "/api/admin/read", 200, "GET /api/admin/read"},
		{"307 to an allowed path", "GET", "/user", 307, "/api/user/repos", 200, "GET /api/user/repos"},
		{"redirect escaping the base", "GET", "/user", 307, "/admin/read", 307, ""},
		{"redirect with dot segments", "GET", "/user", 307, "/api/user/../admin", 307, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			hits = nil
			mu.Unlock()
			resp, err := k.Do(context.Background(), "c1", APIRequest{Method: tc.method, Path: tc.path, Body: []byte(`{"k":1}`),
				Query: url.Values{"redirect": {strconv.Itoa(tc.code)}, "to": {tc.to}}})
			if err != nil || resp.Status != tc.wantStatus {
				t.Fatalf("Do = %d, %v; want %d", resp.Status, err, tc.wantStatus)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.wantHit == "" && len(hits) != 0 || tc.wantHit != "" && (len(hits) != 1 || hits[0] != tc.wantHit) {
				t.Fatalf("redirect targets reached with the token: %q, want %q", hits, tc.wantHit)
			}
		})
	}
}
