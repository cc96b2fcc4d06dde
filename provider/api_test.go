package provider

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/memstore"
)

func TestResolveAPIURLEscapes(t *testing.T) {
	const base = "https://api.example.test/v3"
	for _, tc := range []struct{ name, path string }{
		{"absolute URL", "https://evil.test/x"},
		{"scheme-relative", "//evil.test/x"},
		{"no leading slash", "user"},
		{"dot-dot", "/../admin"},
		{"dot-dot inside", "/repos/../../admin"},
		{"dot segment", "/./user"},
		{"encoded slash", "/repos%2f..%2fadmin"},
		{"encoded slash upper", "/repos%2F..%2Fadmin"},
		{"encoded dots", "/%2e%2e/admin"},
		{"encoded dots upper", "/%2E%2E/admin"},
		{"double-encoded dots", "/%252e%252e/admin"},
		{"double-encoded slash", "/a%252fb"},
		{"encoded backslash", "/a%5cb"},
		{"backslash", "/a\\..\\b"},
		{"at sign", "/@evil.test"},
		{"userinfo-like", "/x@evil.test/"},
		{"query in path", "/user?admin=1"},
		{"fragment", "/user#x"},
		{"space", "/us er"},
		{"control", "/user\n"},
		{"non-ASCII", "/usér"},
		{"empty", ""},
		{"empty segment", "/a//b"},
		{"encoded NUL", "/a%00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u, err := ResolveAPIURL(base, tc.path, nil)
			var re *RequestError
			if err == nil || !errors.As(err, &re) {
				t.Fatalf("ResolveAPIURL(%q) = %v, %v; want a RequestError", tc.path, u, err)
			}
		})
	}
	for _, tc := range []struct{ path, want string }{
		{"/user", "https://api.example.test/v3/user"},
		{"/repos/a/b/issues", "https://api.example.test/v3/repos/a/b/issues"},
		{"/search/code", "https://api.example.test/v3/search/code"},
		{"/files/a%20b", "https://api.example.test/v3/files/a%20b"},
	} {
		u, err := ResolveAPIURL(base, tc.path, nil)
		if err != nil || u.String() != tc.want {
			t.Errorf("ResolveAPIURL(%q) = %v, %v; want %s", tc.path, u, err, tc.want)
		}
	}
	u, err := ResolveAPIURL(base, "/search", url.Values{"q": {"a b&c=d"}})
	if err != nil || u.Host != "api.example.test" || u.Query().Get("q") != "a b&c=d" {
		t.Errorf("query: %v %v", u, err)
	}
}

func TestRequestPatterns(t *testing.T) {
	pats := []string{"/user", "GET /repos/*/*/issues", "GET,POST /gists/", "DELETE /user/keys/*"}
	var rps []RequestPattern
	for _, s := range pats {
		rp, err := ParseRequestPattern(s)
		if err != nil {
			t.Fatal(err)
		}
		rps = append(rps, rp)
	}
	p := APIBase{AllowedRequests: rps}
	for _, tc := range []struct {
		method, path string
		ok           bool
	}{
		{"GET", "/user", true}, {"PATCH", "/user", true}, {"GET", "/user/repos", true}, {"GET", "/users/x", false},
		{"GET", "/repos/a/b/issues", true}, {"POST", "/repos/a/b/issues", false}, {"GET", "/repos/a/issues", false},
		{"GET", "/gists/1", true}, {"POST", "/gists/1", true}, {"GET", "/gists", false}, {"DELETE", "/gists/1", false},
		{"DELETE", "/user/keys/7", true}, {"GET", "/orgs/x", false},
	} {
		if got := p.requestAllowed(tc.method, tc.path); got != tc.ok {
			t.Errorf("%s %s allowed = %v, want %v", tc.method, tc.path, got, tc.ok)
		}
	}
	for _, bad := range []string{"FETCH /x", "x", "GET /../x", "GET /a%2fb", "/a//b"} {
		if _, err := ParseRequestPattern(bad); err == nil {
			t.Errorf("ParseRequestPattern(%q) accepted", bad)
		}
	}
	if (APIBase{}).requestAllowed("DELETE", "/anything") != true {
		t.Error("an empty allow-list must allow everything under the base")
	}
}

// apiRig is an API host, a second ("evil") host recording what reaches it,
// and a Client with one connection whose token is known.
type apiRig struct {
	caller *Client
	mu     sync.Mutex // guards evilAuth, evilHits
	// evilAuth records Authorization headers that reached the other host.
	evilAuth []string
	evilHits int
}

const apiToken = "gho_APITOKENVALUE0123456789"

func newAPIRig(t *testing.T, api http.HandlerFunc, allowed string, maxResp int64) (*apiRig, string) {
	t.Helper()
	r := &apiRig{}
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.evilHits++
		r.evilAuth = append(r.evilAuth, req.Header.Get("Authorization"))
		r.mu.Unlock()
		io.WriteString(w, "evil")
	}))
	t.Cleanup(evil.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Authorization") != "Bearer "+apiToken {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		if req.URL.Path == "/api/redirect-away" {
			http.Redirect(w, req, evil.URL+"/steal", http.StatusFound)
			return
		}
		if req.URL.Path == "/api/redirect-out-of-base" {
			http.Redirect(w, req, "/elsewhere", http.StatusFound)
			return
		}
		if req.URL.Path == "/api/redirect-within" {
			http.Redirect(w, req, "/api/user", http.StatusFound)
			return
		}
		api(w, req)
	}))
	t.Cleanup(srv.Close)
	doc := `providers:
  p:
    type: oauth2
    authorization_url: ` + srv.URL + `/authorize
    token_url: ` + srv.URL + `/token
    client_id: c
    client_secret: ${S}
    account: {url: ` + srv.URL + `/api/user, id_field: id}
    api: {base_url: ` + srv.URL + `/api` + allowed + `}
`
	reg, err := ParseProviders("t", []byte(doc), func(string) string { return "s" })
	if err != nil {
		t.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	st := memstore.New(kr)
	if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "i", Subject: "s"},
		Provider: "p", AccountID: "1", Status: vault.StatusActive,
		Token: vault.TokenSet{AccessToken: apiToken, TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	r.caller, err = New(Options{Store: st, Providers: reg, MaxResponseBody: maxResp, MaxRequestBody: 1024})
	if err != nil {
		t.Fatal(err)
	}
	return r, evil.URL
}

func TestAPICallSafety(t *testing.T) {
	r, _ := newAPIRig(t, func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/api/big":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, strings.Repeat("x", 5000))
		case "/api/ro/a b/\u00e9":
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, req.RequestURI)
		case "/api/echo":
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("X-RateLimit-Remaining", "42")
			w.Header().Set("Set-Cookie", "session=1")
			io.WriteString(w, "you sent "+req.Header.Get("Authorization")+" accept="+req.Header.Get("Accept"))
		default:
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":1}`)
		}
	}, ", allowed_paths: [/user, /big, /echo, /redirect-away, /redirect-out-of-base, /redirect-within, GET /ro/]", 1000)
	ctx := context.Background()

	t.Run("cross-host redirect is not followed with the token", func(t *testing.T) {
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/redirect-away"})
		if err != nil || resp.Status != http.StatusFound {
			t.Fatalf("got %+v, %v; want the 302 itself", resp, err)
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.evilHits != 0 {
			t.Fatalf("the other host received %d requests (Authorization %q)", r.evilHits, r.evilAuth)
		}
	})
	t.Run("redirect out of the base path is not followed", func(t *testing.T) {
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/redirect-out-of-base"})
		if err != nil || resp.Status != http.StatusFound {
			t.Fatalf("got %+v, %v", resp, err)
		}
	})
	t.Run("redirect within the base is followed", func(t *testing.T) {
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/redirect-within"})
		if err != nil || resp.Status != 200 || string(resp.Body) != `{"id":1}` {
			t.Fatalf("got %+v, %v", resp, err)
		}
	})
	t.Run("the checked URL is the one sent", func(t *testing.T) {
		// The API sees the path and query, escapes included, exactly as
		// the broker resolved and checked them.
		q := url.Values{"q": {"a b&c=d"}, "x": {"\u00e9", "2"}}
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/ro/a%20b/%C3%A9", Query: q})
		if err != nil || resp.Status != 200 {
			t.Fatalf("got %+v, %v", resp, err)
		}
		want, err := ResolveAPIURL("https://api.invalid/api", "/ro/a%20b/%C3%A9", q)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(resp.Body); got != want.RequestURI() || got != "/api/ro/a%20b/%C3%A9?q=a+b%26c%3Dd&x=%C3%A9&x=2" {
			t.Errorf("the API saw %q; resolved %q", got, want.RequestURI())
		}
	})
	t.Run("oversized response is truncated", func(t *testing.T) {
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/big"})
		if err != nil || !resp.Truncated || len(resp.Body) != 1000 {
			t.Fatalf("truncated=%v len=%d err=%v", resp.Truncated, len(resp.Body), err)
		}
	})
	t.Run("echoed token is redacted, headers selected", func(t *testing.T) {
		resp, err := r.caller.Do(ctx, "c1", APIRequest{Method: "GET", Path: "/echo", Header: http.Header{"Accept": {"text/plain"}}})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(resp.Body), apiToken) || !strings.Contains(string(resp.Body), "REDACTED") || !strings.Contains(string(resp.Body), "accept=text/plain") {
			t.Errorf("body %q", resp.Body)
		}
		if resp.Header.Get("X-Ratelimit-Remaining") != "42" || resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("Content-Type") != "text/plain" {
			t.Errorf("headers %v", resp.Header)
		}
	})
	for _, tc := range []struct {
		name string
		req  APIRequest
	}{
		{"oversized request body", APIRequest{Method: "POST", Path: "/user", Body: make([]byte, 2000)}},
		{"not in allow-list", APIRequest{Method: "GET", Path: "/admin"}},
		{"method not in allow-list", APIRequest{Method: "POST", Path: "/ro/x"}},
		{"unknown method", APIRequest{Method: "TRACE", Path: "/user"}},
		{"authorization header", APIRequest{Method: "GET", Path: "/user", Header: http.Header{"Authorization": {"Bearer x"}}}},
		{"cookie header", APIRequest{Method: "GET", Path: "/user", Header: http.Header{"Cookie": {"a=b"}}}},
		{"header injection", APIRequest{Method: "GET", Path: "/user", Header: http.Header{"Accept": {"a\r\nX: y"}}}},
		{"path escape", APIRequest{Method: "GET", Path: "/%2e%2e/token"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.caller.Do(ctx, "c1", tc.req)
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("err = %v, want a RequestError", err)
			}
			if strings.Contains(re.Msg, apiToken) {
				t.Error("error names the token")
			}
		})
	}
}
