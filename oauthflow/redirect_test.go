package oauthflow

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/fakeprovider"
	"credbroker/provider"
	"credbroker/vault"
)

// recorder is an HTTP server counting what reaches it.
type recorder struct {
	srv  *httptest.Server
	hits atomic.Int32
	mu   sync.Mutex
	seen []string // method, path and body of each request
}

func newRecorder(t *testing.T) *recorder {
	rec := &recorder{}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rec.hits.Add(1)
		rec.mu.Lock()
		rec.seen = append(rec.seen, r.Method+" "+r.URL.Path+" "+string(b))
		rec.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"access_token":"stolen","token_type":"bearer"}`)
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (rec *recorder) check(t *testing.T) {
	t.Helper()
	if n := rec.hits.Load(); n != 0 {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		t.Fatalf("the redirect target received %d requests: %q", n, rec.seen)
	}
}

// redirectTransport answers 307 to another server for requests to trapURL
// while armed, and passes everything else on.
type redirectTransport struct {
	trapURL string
	to      string
	armed   atomic.Bool
}

func (rt *redirectTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt.armed.Load() && r.URL.String() == rt.trapURL {
		if r.Body != nil {
			r.Body.Close()
		}
		return &http.Response{StatusCode: http.StatusTemporaryRedirect, Status: "307 Temporary Redirect", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Location": {rt.to}}, Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	return http.DefaultTransport.RoundTrip(r)
}

// TestTokenRequestsNotRedirected: the broker's IdP code exchange,
// the provider code exchange and revocation carry codes, verifiers, client
// secrets and tokens; a 307 to another server must not replay them there.
func TestTokenRequestsNotRedirected(t *testing.T) {
	evil := newRecorder(t)
	var trap *httptest.Server
	h := newHarness(t, func(h *harness) (string, map[string]string) {
		trap = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, evil.srv.URL+r.URL.Path, http.StatusTemporaryRedirect)
		}))
		h.t.Cleanup(trap.Close)
		h.gh = fakeprovider.NewGitHub(h.t, fakeprovider.Options{ClientID: "gh-client", ClientSecret: "gh-secret-value",
			RedirectURIs: []string{h.srv.URL + "/oauth/trapped/callback"}, AutoApprove: true})
		return `providers:
  trapped:
    display_name: Trapped
    type: oauth2
    authorization_url: ` + h.gh.AuthURL() + `
    token_url: ` + trap.URL + `/token
    client_id: gh-client
    client_secret: ${SECRET}
    default_scopes: [read:user]
    account: {url: ` + h.gh.URL() + `/user, id_field: id, login_field: login}
    revocation: {style: rfc7009, url: ` + trap.URL + `/revoke}
`, map[string]string{"SECRET": "gh-secret-value"}
	})
	idpTrap := &redirectTransport{trapURL: h.flow.idpConf.Endpoint.TokenURL, to: evil.srv.URL + "/idp-token"}
	h.flow.client = &http.Client{Timeout: 20 * time.Second, Transport: idpTrap}

	t.Run("IdP code exchange", func(t *testing.T) {
		idpTrap.armed.Store(true)
		defer idpTrap.armed.Store(false)
		a := h.newAgent()
		p := a.openConnect(h.grant("alice", "trapped", nil, "c"), "alice")
		mustStatus(t, p, http.StatusBadGateway)
		mustContain(t, p, "Sign-in failed")
		evil.check(t)
	})
	t.Run("provider code exchange", func(t *testing.T) {
		a := h.newAgent()
		g := h.grant("alice", "trapped", nil, "c")
		p := a.get(a.toCallback(g, "alice").String())
		if p.status < 400 {
			t.Fatalf("callback answered %d, want an error page", p.status)
		}
		if cs := h.connections("alice"); len(cs) != 0 {
			t.Fatalf("%d connections stored", len(cs))
		}
		evil.check(t)
	})
	t.Run("revocation", func(t *testing.T) {
		rev, err := h.client.Revoke(context.Background(), vault.Connection{Provider: "trapped",
			Token: vault.TokenSet{AccessToken: "at-revoke-me", RefreshToken: "rt-revoke-me"}}, false)
		if rev != provider.NotConfirmed || err == nil || !strings.Contains(err.Error(), "307") {
			t.Fatalf("Revoke = %s, %v; want not_confirmed with an HTTP 307 error", rev, err)
		}
		evil.check(t)
	})
	h.finalCheck()
}
