package provider

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/tracing"
	"credbroker/vault"
	"credbroker/vault/memstore"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestUserAgent: every request the broker makes to a provider (token
// requests for a code and for a refresh, the account lookup, API calls and
// the redirects they follow, API-key verification, revocation) names the
// broker in User-Agent, with tracing on or off.
func TestUserAgent(t *testing.T) {
	var (
		mu   sync.Mutex
		seen = map[string][]string{} // path -> User-Agents
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path] = append(seen[r.URL.Path], r.Header.Get("User-Agent"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/token":
			_ = json.NewEncoder(w).Encode(map[string]any{"access_token": "gho_fresh" + time.Now().Format("150405.000000000"),
				"token_type": "bearer", "expires_in": 3600, "refresh_token": "ghr_next"})
		case "/api/redirect":
			http.Redirect(w, r, "/api/user", http.StatusFound)
		case "/revoke":
			w.WriteHeader(http.StatusOK)
		default:
			io.WriteString(w, `{"id":"1","login":"octocat"}`)
		}
	}))
	t.Cleanup(srv.Close)
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv.URL + `/authorize
    token_url: ` + srv.URL + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv.URL + `/account, id_field: id}
    api: {base_url: ` + srv.URL + `/api}
    revocation: {style: rfc7009, url: "` + srv.URL + `/revoke"}
  k:
    type: api_key
    instructions: Copy your key.
    instructions_url: https://k.example/keys
    fields:
      - {name: api_key, label: Key, secret: true}
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /verify, account_id: /id}
    api: {base_url: ` + srv.URL + `/keyapi}
`
	reg, err := ParseProviders("t", []byte(doc), func(string) string { return "s" })
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ua, want string
		tracing        bool
	}{
		{"default", "", DefaultUserAgent(), false},
		{"configured", "credbroker-test/1.2", "credbroker-test/1.2", false},
		{"configured, traced", "credbroker-test/1.2", "credbroker-test/1.2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mu.Lock()
			clear(seen)
			mu.Unlock()
			ctx := t.Context()
			kr, _ := vault.ParseKeys(vault.GenerateKey())
			st := memstore.New(kr)
			opts := Options{Store: st, Providers: reg, UserAgent: tc.ua, RetryBackoff: time.Millisecond}
			if tc.tracing {
				opts.Tracing = tracing.NewSyncProvider(tracetest.NewInMemoryExporter())
			}
			k, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			p, _ := reg.Lookup("p")
			ex, err := k.Exchange(ctx, p, vault.Principal{Issuer: "i", Subject: "s"}, "https://broker.test/callback", "code", AuthRequest{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := st.CreateConnection(ctx, vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
				Provider: "p", AccountID: ex.Account.ID, Status: vault.StatusActive, Token: ex.Token, Updated: time.Now()})
			if err != nil {
				t.Fatal(err)
			}
			for _, path := range []string{"/user", "/redirect"} {
				if resp, err := k.Do(ctx, "c1", APIRequest{Method: http.MethodGet, Path: path}); err != nil || resp.Status != http.StatusOK {
					t.Fatalf("Do %s = %d, %v", path, resp.Status, err)
				}
			}
			if _, err := k.ForceRefresh(ctx, "c1", c.Token.AccessToken); err != nil {
				t.Fatal(err)
			}
			if c, err = st.GetConnection(ctx, "c1"); err != nil {
				t.Fatal(err)
			}
			if rev, err := k.Revoke(ctx, c, false); rev != Revoked || err != nil {
				t.Fatalf("Revoke = %s, %v", rev, err)
			}
			kp, _ := reg.Lookup("k")
			kex, err := k.VerifyKey(ctx, kp, map[string]string{"api_key": "key-0123456789abcdef"})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.CreateConnection(ctx, vault.Connection{ID: "c2", Principal: vault.Principal{Issuer: "i", Subject: "s"},
				Provider: "k", AccountID: kex.Account.ID, Status: vault.StatusActive, Token: kex.Token, Updated: time.Now()}); err != nil {
				t.Fatal(err)
			}
			if resp, err := k.Do(ctx, "c2", APIRequest{Method: http.MethodGet, Path: "/data"}); err != nil || resp.Status != http.StatusOK {
				t.Fatalf("Do on the key connection = %d, %v", resp.Status, err)
			}

			mu.Lock()
			defer mu.Unlock()
			var paths []string
			for path, uas := range seen {
				paths = append(paths, path)
				for _, ua := range uas {
					if ua != tc.want {
						t.Errorf("%s: User-Agent %q, want %q", path, ua, tc.want)
					}
				}
			}
			slices.Sort(paths)
			want := []string{"/account", "/api/redirect", "/api/user", "/keyapi/data", "/keyapi/verify", "/revoke", "/token"}
			if !slices.Equal(paths, want) {
				t.Errorf("requests to %s, want %s", strings.Join(paths, " "), strings.Join(want, " "))
			}
			if n := len(seen["/api/user"]); n != 2 {
				t.Errorf("/api/user reached %d times, want 2 (once directly, once redirected)", n)
			}
			if n := len(seen["/token"]); n != 2 {
				t.Errorf("/token reached %d times, want 2 (code, refresh)", n)
			}
		})
	}
}

// BenchmarkClientDo is one provider_request's work in the provider layer:
// an API call through Client to a local server, the answer read and
// scrubbed of the token.
func BenchmarkClientDo(b *testing.B) {
	for _, bc := range []struct {
		name   string
		body   []byte
		length bool // announce Content-Length (a 4 KiB answer is chunked otherwise)
	}{
		{"small", []byte(`{"login":"octocat","id":583231,"node_id":"MDQ6VXNlcjU4MzIzMQ==","type":"User","site_admin":false}`), false},
		{"4KiB", benchBody(10), false},
		{"4KiB-length", benchBody(10), true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.Header().Set("Etag", `W/"7a3ab0f5b5ad8e8c"`)
				w.Header().Set("X-Ratelimit-Limit", "5000")
				w.Header().Set("X-Ratelimit-Remaining", "4999")
				w.Header().Set("X-Ratelimit-Reset", "1767225600")
				w.Header().Set("X-Github-Request-Id", "C0DE:1F2E:3D4C:5B6A:7988")
				w.Header().Set("Link", `<https://api.github.com/repositories/1/issues?page=2>; rel="next"`)
				if bc.length {
					w.Header().Set("Content-Length", strconv.Itoa(len(bc.body)))
				}
				w.Write(bc.body)
			}))
			b.Cleanup(srv.Close)
			k, _ := singleConnClientB(b, srv.URL, vault.TokenSet{AccessToken: benchToken, TokenType: "bearer",
				Expiry: time.Now().Add(time.Hour)})
			ctx := context.Background()
			req := APIRequest{Method: http.MethodGet, Path: "/repos/acme/widgets/issues", Header: http.Header{"Accept": {"application/vnd.github+json"}}}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := k.Do(ctx, "c1", req)
				if err != nil || resp.Status != http.StatusOK {
					b.Fatal(resp.Status, err)
				}
			}
		})
	}
}

// singleConnClientB is singleConnClient for a benchmark.
func singleConnClientB(b *testing.B, srv string, ts vault.TokenSet) (*Client, *memstore.Store) {
	b.Helper()
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv + `/authorize
    token_url: ` + srv + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv + `/api/user, id_field: id}
    api: {base_url: ` + srv + `/api}
`
	reg, err := ParseProviders("bench", []byte(doc), func(string) string { return "s" })
	if err != nil {
		b.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	st := memstore.New(kr)
	if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
		Provider: "p", AccountID: "1", Status: vault.StatusActive, Token: ts, Updated: time.Now()}); err != nil {
		b.Fatal(err)
	}
	k, err := New(Options{Store: st, Providers: reg})
	if err != nil {
		b.Fatal(err)
	}
	return k, st
}
