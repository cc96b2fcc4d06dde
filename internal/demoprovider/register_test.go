package demoprovider

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
)

// FuzzRegister: whatever the body, registration answers 201 with metadata
// that passes every check (and stores exactly that client) or 400 with an
// RFC 7591 error code (and stores nothing); never anything else.
func FuzzRegister(f *testing.F) {
	for _, s := range []string{
		`{"redirect_uris":["http://127.0.0.1:3/cb"]}`,
		`{"redirect_uris":["https://host.example/cb"],"token_endpoint_auth_method":"none","grant_types":["authorization_code","refresh_token"],"client_name":"x"}`,
		`{"redirect_uris":["http://[::1]:3/cb"],"token_endpoint_auth_method":"client_secret_post","response_types":["code"]}`,
		`{"redirect_uris":["javascript:alert(1)"]}`, `{"redirect_uris":[]}`, `[]`, `null`, `{"redirect_uris":["https://a/b"]} {}`,
	} {
		f.Add([]byte(s))
	}
	p, err := New(Options{BaseURL: "http://127.0.0.1:1/p", ClientID: "static", RedirectURIs: []string{"http://127.0.0.1:1/cb"}})
	if err != nil {
		f.Fatal(err)
	}
	count := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.clients)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := count()
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/p/register", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		p.Handler().ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusCreated:
			var out registered
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if len(out.RedirectURIs) == 0 || !slices.Contains([]string{authBasic, authPost, authNone}, out.TokenEndpointAuthMethod) ||
				(out.TokenEndpointAuthMethod == authNone) != (out.ClientSecret == "") || !slices.Equal(out.ResponseTypes, []string{"code"}) ||
				!slices.Contains(out.GrantTypes, "authorization_code") || len(out.ClientName) > maxClientName {
				t.Fatalf("accepted %s", rec.Body.Bytes())
			}
			for _, r := range out.RedirectURIs {
				if checkRedirectURI(r) != nil {
					t.Fatalf("accepted redirect URI %q", r)
				}
			}
			p.mu.Lock()
			c := p.clients[out.ClientID]
			p.mu.Unlock()
			if c == nil || !slices.Equal(c.redirectURIs, out.RedirectURIs) || c.method != out.TokenEndpointAuthMethod || count() != before+1 {
				t.Fatalf("stored %+v for %s", c, rec.Body.Bytes())
			}
		case http.StatusBadRequest:
			var out struct{ Error string }
			if json.Unmarshal(rec.Body.Bytes(), &out) != nil || out.Error != "invalid_redirect_uri" && out.Error != "invalid_client_metadata" {
				t.Fatalf("refusal %s", rec.Body.Bytes())
			}
			if count() != before {
				t.Fatal("a refused registration stored a client")
			}
		default:
			t.Fatalf("HTTP %d %s", rec.Code, rec.Body.Bytes())
		}
	})
}
