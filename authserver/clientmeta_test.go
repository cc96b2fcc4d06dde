package authserver

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"credbroker/internal/egress"
)

func TestCheckClientIDURL(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"https://app.example/client.json", true},
		{"https://app.example:8443/oauth/client?v=1", true},
		{"http://app.example/client.json", false},
		{"https://app.example", false},
		{"https://app.example/", false},
		{"https://user@app.example/c.json", false},
		{"https://app.example/c.json#x", false},
		{"https://app.example/a/../c.json", false},
		{"https://app.example/./c.json", false},
		{"https://app.example/%2e%2e/c.json", false},
		{"https:///c.json", false},
		{"https://app.example/" + strings.Repeat("a", 3000), false},
	} {
		if err := checkClientIDURL(tc.url); (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok %v", tc.url, err, tc.ok)
		}
	}
}

func TestRedirectRules(t *testing.T) {
	for _, tc := range []struct {
		uri string
		ok  bool
	}{
		{"https://app.example/cb", true},
		{"http://127.0.0.1:3000/cb", true},
		{"http://[::1]/cb", true},
		{"http://localhost:8080/callback", true},
		{"cursor://anysphere.cursor-mcp/oauth/callback", true},
		{"com.example.app:/oauth2redirect", true},
		{"http://app.example/cb", false},
		{"http://127.0.0.1.nip.io/cb", false},
		{"https://app.example/cb#x", false},
		{"javascript:alert(1)", false},
		{"JavaScript:alert(1)", false},
		{"data:text/html,x", false},
		{"file:///etc/passwd", false},
		{"/relative", false},
		{"https://user:pw@app.example/cb", false},
		{"https://app.example/c b", false},
	} {
		if err := checkRedirectURI(tc.uri); (err == nil) != tc.ok {
			t.Errorf("%q: err %v, want ok %v", tc.uri, err, tc.ok)
		}
	}
	reg := []string{"http://127.0.0.1:3000/cb", "https://app.example/cb"}
	for _, tc := range []struct {
		uri string
		ok  bool
	}{
		{"http://127.0.0.1:3000/cb", true},
		{"http://127.0.0.1:51234/cb", true},
		{"http://127.0.0.1/cb", true},
		{"http://127.0.0.1:51234/cb?x=1", false},
		{"http://127.0.0.1:51234/other", false},
		{"http://localhost:3000/cb", false},
		{"http://127.0.0.1:99999/cb", false},
		{"https://app.example/cb", true},
		{"https://app.example:444/cb", false},
		{"https://APP.example/cb", false},
		{"https://app.example/cb/", false},
	} {
		if got := redirectAllowed(reg, tc.uri); got != tc.ok {
			t.Errorf("redirect %q allowed %v, want %v", tc.uri, got, tc.ok)
		}
	}
}

// TestSpecialUseAddresses: the metadata client's dialer is egress's, so
// an address is refused exactly when egress.IsSpecialUse says so, and a
// fetch from one is refused with egress.ErrSpecialAddress before anything
// is dialled (nothing listens on these addresses; nothing is reached).
func TestSpecialUseAddresses(t *testing.T) {
	client := newMetadataClient(false, nil)
	for _, tc := range []struct {
		addr    string
		special bool
	}{
		{"127.0.0.1", true}, {"10.1.2.3", true}, {"172.16.0.1", true}, {"192.168.1.1", true}, {"169.254.169.254", true},
		{"100.64.0.1", true}, {"0.0.0.0", true}, {"198.18.0.1", true}, {"224.0.0.1", true}, {"240.0.0.1", true},
		{"255.255.255.255", true}, {"192.0.2.1", true},
		{"::1", true}, {"fe80::1", true}, {"fc00::1", true}, {"::", true}, {"::ffff:127.0.0.1", true}, {"::ffff:10.0.0.1", true},
		{"64:ff9b::7f00:1", true}, {"2001:db8::1", true}, {"2002:7f00:1::", true},
		{"3fff::1", true}, {"::8.8.8.8", true}, {"5f00::1", true}, {"4000::1", true},
		{"93.184.215.14", false}, {"8.8.8.8", false}, {"2606:4700::1111", false}, {"::ffff:8.8.8.8", false},
	} {
		a := netip.MustParseAddr(tc.addr)
		if got := egress.IsSpecialUse(a); got != tc.special {
			t.Errorf("%s: special %v, want %v", tc.addr, got, tc.special)
		}
		if !tc.special {
			continue
		}
		u := "https://" + netip.AddrPortFrom(a, 443).String() + "/client.json"
		resp, err := client.Get(u)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, egress.ErrSpecialAddress) {
			t.Errorf("%s: fetch %v, want egress.ErrSpecialAddress", u, err)
		}
	}
}

func TestParseClientIDMetadataDocument(t *testing.T) {
	id := "https://app.example/client.json"
	m, err := ParseClientIDMetadataDocument(id, []byte(cimdDoc(id, "http://127.0.0.1/cb")))
	if err != nil || m.AuthMethod != "none" || !slices.Equal(m.GrantTypes, []string{"authorization_code", "refresh_token"}) || m.Name != "Claude <i>Desktop</i>" {
		t.Fatalf("%+v, %v", m, err)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"not an object", `[]`, "not a JSON object"},
		{"trailing data", `{"client_id":"` + id + `"} {}`, "after its JSON object"},
		{"client_id differs", cimdDoc("https://app.example/other.json", "https://x.example/cb"), "differs from the URL"},
		{"client_id differs by a trailing slash", cimdDoc(id+"/", "https://x.example/cb"), "differs from the URL"},
		{"no client_id", `{"client_name":"x","redirect_uris":["https://x.example/cb"]}`, "no client_id"},
		{"no name", `{"client_id":"` + id + `","redirect_uris":["https://x.example/cb"]}`, "no client_name"},
		{"no redirect", `{"client_id":"` + id + `","client_name":"x"}`, "redirect_uris is required"},
		{"secret method", `{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"token_endpoint_auth_method":"client_secret_basic"}`, "must be none"},
		{"private key jwt", `{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"token_endpoint_auth_method":"private_key_jwt"}`, "private_key_jwt is not supported"},
		{"private key", `{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"jwks":{"keys":[{"kty":"EC","d":"x"}]}}`, "private key material"},
		{"implicit", `{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"response_types":["token"]}`, "only code"},
		{"wrong type", `{"client_id":"` + id + `","client_name":7,"redirect_uris":["https://x.example/cb"]}`, "client_name must be a string"},
		{"wrong type of a list", `{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"grant_types":"authorization_code"}`, "grant_types must be an array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseClientIDMetadataDocument(id, []byte(tc.doc))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseRegistration(t *testing.T) {
	m, err := ParseRegistration([]byte(`{"redirect_uris":["http://localhost:9/cb"],"client_name":" Host ","unknown":{"x":1}}`))
	if err != nil || m.AuthMethod != authSecretBasic || m.Name != "Host" || !slices.Equal(m.GrantTypes, []string{"authorization_code"}) || m.ApplicationType != "web" {
		t.Fatalf("defaults: %+v, %v", m, err)
	}
	for _, tc := range []struct{ doc, code string }{
		{`{"redirect_uris":["https://x.example/cb"],"client_secret":"mine"}`, "invalid_client_metadata"},
		{`{"redirect_uris":["https://x.example/cb"],"grant_types":["client_credentials"]}`, "invalid_client_metadata"},
		{`{"redirect_uris":["https://x.example/cb"],"grant_types":["refresh_token"]}`, "invalid_client_metadata"},
		{`{"redirect_uris":["https://x.example/cb"],"token_endpoint_auth_method":"private_key_jwt"}`, "invalid_client_metadata"},
		{`{"redirect_uris":["https://x.example/cb"],"application_type":"desktop"}`, "invalid_client_metadata"},
		{`{"redirect_uris":["https://x.example/cb"],"client_uri":"javascript:x"}`, "invalid_client_metadata"},
		{`{"redirect_uris":[]}`, "invalid_redirect_uri"},
		{`{"redirect_uris":"https://x.example/cb"}`, "invalid_redirect_uri"},
		{`{"redirect_uris":["http://x.example/cb"]}`, "invalid_redirect_uri"},
		{`{}`, "invalid_redirect_uri"},
		{`nope`, "invalid_client_metadata"},
	} {
		_, err := ParseRegistration([]byte(tc.doc))
		me, ok := err.(*MetadataError)
		if !ok || me.Code != tc.code {
			t.Errorf("%s: %v, want %s", tc.doc, err, tc.code)
		}
	}
}

// FuzzParseRegistration: any body either fails with an RFC 7591 error code
// or yields metadata that keeps every rule.
func FuzzParseRegistration(f *testing.F) {
	for _, s := range []string{
		`{"redirect_uris":["http://127.0.0.1:3000/cb"],"token_endpoint_auth_method":"none","grant_types":["authorization_code","refresh_token"]}`,
		`{"redirect_uris":["cursor://anysphere.cursor-mcp/oauth/callback","https://www.cursor.com/agents/mcp/oauth/callback"],"client_name":"Cursor"}`,
		`{"redirect_uris":["javascript:alert(1)"]}`, `{"redirect_uris":null}`, `{"a":` + strings.Repeat("[", 50), `{} {}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ParseRegistration(body)
		if err != nil {
			me, ok := err.(*MetadataError)
			if !ok || (me.Code != "invalid_client_metadata" && me.Code != "invalid_redirect_uri") {
				t.Fatalf("error %T %v is not an RFC 7591 refusal", err, err)
			}
			return
		}
		checkMetadata(t, m)
	})
}

// FuzzParseClientIDMetadataDocument: a document is accepted only with its
// URL as client_id, for a public client, within every rule.
func FuzzParseClientIDMetadataDocument(f *testing.F) {
	id := "https://app.example/client.json"
	for _, s := range []string{
		cimdDoc(id, "http://127.0.0.1/cb", "https://app.example/cb"),
		cimdDoc(id+"#", "https://app.example/cb"),
		`{"client_id":"` + id + `","client_name":"x","redirect_uris":["https://x.example/cb"],"client_secret":"s"}`,
		`{"client_id":"` + id + `","client_id":"https://evil.example/c.json","client_name":"x","redirect_uris":["https://x.example/cb"]}`,
		"{\"client_id\":\"" + id + "\",\"client_name\":\"\xff\",\"redirect_uris\":[\"https://x.example/cb\"]}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ParseClientIDMetadataDocument(id, body)
		if err != nil {
			if _, ok := err.(*MetadataError); !ok {
				t.Fatalf("error %T %v", err, err)
			}
			return
		}
		var doc struct {
			ClientID string `json:"client_id"`
		}
		if json.Unmarshal(body, &doc) != nil || doc.ClientID != id || m.AuthMethod != authNone || m.Name == "" {
			t.Fatalf("accepted %q as %+v", body, m)
		}
		checkMetadata(t, m)
	})
}

func checkMetadata(t *testing.T, m Metadata) {
	t.Helper()
	if len(m.RedirectURIs) == 0 || len(m.RedirectURIs) > maxRedirectURIs {
		t.Fatalf("%d redirect URIs accepted", len(m.RedirectURIs))
	}
	for _, u := range m.RedirectURIs {
		if err := checkRedirectURI(u); err != nil {
			t.Fatalf("accepted redirect %q: %v", u, err)
		}
		if strings.HasPrefix(strings.ToLower(u), "javascript:") || strings.Contains(u, "#") {
			t.Fatalf("accepted redirect %q", u)
		}
	}
	if !slices.Contains(m.GrantTypes, grantCode) {
		t.Fatalf("grant types %v", m.GrantTypes)
	}
	for _, g := range m.GrantTypes {
		if g != grantCode && g != grantRefresh {
			t.Fatalf("grant type %q accepted", g)
		}
	}
	switch m.AuthMethod {
	case authNone, authSecretBasic, authSecretPost:
	default:
		t.Fatalf("auth method %q accepted", m.AuthMethod)
	}
}
