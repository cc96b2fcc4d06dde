// What makes the provider the authorization server of an MCP server
// (internal/demomcp), as hosted MCP servers' are: dynamic client
// registration and client authentication, resource indicators bound to
// the grant, RFC 8414 metadata, and introspection for the resource server.

package demoprovider

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/loopback"
)

// Token endpoint authentication methods (RFC 7591 section 2).
const (
	authBasic = "client_secret_basic"
	authPost  = "client_secret_post"
	authNone  = "none"
)

const (
	maxClients    = 1000 // registered clients a long-running `broker dev` keeps
	maxClientName = 200
	maxRedirects  = 10
)

// client is an OAuth client of the provider: the static one of Options,
// or one registered at /register.
type client struct {
	id        string
	secretKey string // key(secret); "" for a public client
	// method is how the client authenticates at the token and revocation
	// endpoints; "" for the static client, which may use basic or the
	// form (as before registration existed).
	method       string
	redirectURIs []string
	name         string // self-asserted (registered clients)
	refresh      bool   // may use (and is issued) refresh tokens
}

// registration is the client metadata a registration request may carry
// (RFC 7591 section 2); other members are ignored, as the RFC allows.
type registration struct {
	RedirectURIs            []string `json:"redirect_uris"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method,omitempty"`
	GrantTypes              []string `json:"grant_types,omitempty"`
	ResponseTypes           []string `json:"response_types,omitempty"`
	ClientName              string   `json:"client_name,omitempty"`
}

// registered is the answer to a successful registration (RFC 7591
// section 3.2.1).
type registered struct {
	ClientID              string `json:"client_id"`
	ClientSecret          string `json:"client_secret,omitempty"`
	ClientIDIssuedAt      int64  `json:"client_id_issued_at"`
	ClientSecretExpiresAt *int64 `json:"client_secret_expires_at,omitempty"`
	registration
}

// registrationError is a refused registration's error code and why.
type registrationError struct{ code, desc string }

func (e *registrationError) Error() string { return e.code + ": " + e.desc }

// checkRegistration validates the metadata and fills in the RFC 7591
// defaults.
func checkRegistration(m *registration) error {
	bad := func(code, format string, args ...any) error {
		return &registrationError{code, fmt.Sprintf(format, args...)}
	}
	if len(m.RedirectURIs) == 0 || len(m.RedirectURIs) > maxRedirects {
		return bad("invalid_redirect_uri", "redirect_uris must list 1 to %d URIs", maxRedirects)
	}
	for _, r := range m.RedirectURIs {
		if err := checkRedirectURI(r); err != nil {
			return bad("invalid_redirect_uri", "%v", err)
		}
	}
	if m.TokenEndpointAuthMethod == "" {
		m.TokenEndpointAuthMethod = authBasic
	}
	if !slices.Contains([]string{authBasic, authPost, authNone}, m.TokenEndpointAuthMethod) {
		return bad("invalid_client_metadata", "token_endpoint_auth_method must be client_secret_basic, client_secret_post or none")
	}
	if len(m.GrantTypes) == 0 {
		m.GrantTypes = []string{"authorization_code"}
	}
	for _, g := range m.GrantTypes {
		if g != "authorization_code" && g != "refresh_token" {
			return bad("invalid_client_metadata", "grant_types may hold authorization_code and refresh_token only")
		}
	}
	if !slices.Contains(m.GrantTypes, "authorization_code") {
		return bad("invalid_client_metadata", "grant_types must include authorization_code")
	}
	if len(m.ResponseTypes) == 0 {
		m.ResponseTypes = []string{"code"}
	}
	if len(m.ResponseTypes) != 1 || m.ResponseTypes[0] != "code" {
		return bad("invalid_client_metadata", "response_types must be [code]")
	}
	if len(m.ClientName) > maxClientName {
		return bad("invalid_client_metadata", "client_name is longer than %d bytes", maxClientName)
	}
	return nil
}

// checkRedirectURI accepts https, or http on a loopback host, without a
// fragment (RFC 6749 section 3.1.2; OAuth 2.1 for native clients).
func checkRedirectURI(r string) error {
	u, err := url.Parse(r)
	switch {
	case err != nil || !u.IsAbs() || u.Host == "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("%q is not an absolute URI with a host, without fragment or user info", r)
	case u.Scheme == "https", u.Scheme == "http" && loopback.Host(u.Hostname()):
		return nil
	}
	return fmt.Errorf("%q must use https (http on a loopback host only)", r)
}

// register is POST /register: RFC 7591 dynamic client registration, open
// to anyone (as the MCP authorization specification expects), public and
// confidential clients alike.
func (p *Provider) register(w http.ResponseWriter, r *http.Request) {
	ev := Event{Kind: "register", Method: r.Method, Path: r.URL.Path, Status: http.StatusCreated}
	fail := func(status int, err error) {
		var re *registrationError
		if !errors.As(err, &re) {
			re = &registrationError{"invalid_client_metadata", err.Error()}
		}
		ev.Status, ev.Error = status, re.code
		p.recordLocked(ev)
		oauthError(w, status, re.code, re.desc)
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		fail(http.StatusBadRequest, errors.New("the registration request must be application/json"))
		return
	}
	var m registration
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := dec.Decode(&m); err != nil || dec.More() {
		fail(http.StatusBadRequest, errors.New("the body is not one JSON object of client metadata"))
		return
	}
	if err := checkRegistration(&m); err != nil {
		fail(http.StatusBadRequest, err)
		return
	}
	now := p.opts.Now()
	c := &client{id: "dcr_" + randomToken(16), method: m.TokenEndpointAuthMethod, redirectURIs: slices.Clone(m.RedirectURIs),
		name: m.ClientName, refresh: slices.Contains(m.GrantTypes, "refresh_token")}
	out := registered{ClientID: c.id, ClientIDIssuedAt: now.Unix(), registration: m}
	if c.method != authNone {
		secret := randomToken(32)
		c.secretKey = key(secret)
		never := int64(0)
		out.ClientSecret, out.ClientSecretExpiresAt = secret, &never
	}
	p.mu.Lock()
	if len(p.clients) > maxClients {
		p.mu.Unlock()
		fail(http.StatusBadRequest, &registrationError{"invalid_client_metadata", "too many registered clients; restart the demo provider"})
		return
	}
	p.clients[c.id] = c
	ev.Client = c.id
	p.record(ev)
	p.mu.Unlock()
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, out)
}

// authenticate finds the client a token or revocation request comes from
// (HTTP basic or the form) and checks its credentials the way it
// registered; callers hold p.mu and have parsed the form.
func (p *Provider) authenticate(r *http.Request) (*client, bool) {
	id, secret, basic := r.BasicAuth()
	method := authBasic
	if basic {
		var err error
		if id, err = url.QueryUnescape(id); err != nil {
			return nil, false
		}
		if secret, err = url.QueryUnescape(secret); err != nil {
			return nil, false
		}
	} else {
		id, secret = r.PostForm.Get("client_id"), r.PostForm.Get("client_secret")
		method = authPost
		if _, sent := r.PostForm["client_secret"]; !sent {
			method = authNone
		}
	}
	c, ok := p.clients[id]
	if !ok {
		return nil, false
	}
	if c.method != "" && c.method != method && !(c.method == authNone && method == authPost && secret == "") {
		return nil, false
	}
	want := c.secretKey
	if want == "" {
		return c, secret == ""
	}
	return c, subtle.ConstantTimeCompare([]byte(key(secret)), []byte(want)) == 1
}

// label is how the consent page names a client: its registered
// name (self-asserted, shown as such) or its id.
func (c *client) label() string {
	if c.name == "" {
		return c.id
	}
	return strings.TrimSpace(c.name)
}

// checkResource accepts what RFC 8707 section 2 allows as a resource: an
// absolute URI without a fragment.
func checkResource(r string) error {
	u, err := url.Parse(r)
	if err != nil || !u.IsAbs() || u.Fragment != "" || strings.Contains(r, "#") {
		return fmt.Errorf("%q is not an absolute URI without a fragment", r)
	}
	return nil
}

// requestedResource reads /authorize's resource parameters: none, or one
// of Options.Resources.
func (p *Provider) requestedResource(values []string) (string, error) {
	switch {
	case len(values) == 0:
		return "", nil
	case len(values) > 1:
		return "", errors.New("one resource at a time")
	}
	if err := checkResource(values[0]); err != nil {
		return "", err
	}
	if !slices.Contains(p.opts.Resources, values[0]) {
		return "", fmt.Errorf("%q is not a resource of this authorization server", values[0])
	}
	return values[0], nil
}

// sameResource reports whether a token request's resource parameters
// (none, or one) name the grant's resource.
func sameResource(sent []string, granted string) bool {
	return len(sent) == 0 || len(sent) == 1 && sent[0] != "" && sent[0] == granted
}

// serverMetadata is the RFC 8414 authorization server metadata: the
// go-sdk's type (the one the broker reads it with), without the jwks_uri
// that type always writes: this server signs nothing.
type serverMetadata struct {
	oauthex.AuthServerMeta
	JWKSURI string `json:"jwks_uri,omitempty"`
}

// metadata is GET /.well-known/oauth-authorization-server<path>.
func (p *Provider) metadata(w http.ResponseWriter, _ *http.Request) {
	methods := []string{authBasic, authPost, authNone}
	w.Header().Set("Access-Control-Allow-Origin", "*") // public, for browser-based clients
	writeJSON(w, http.StatusOK, serverMetadata{AuthServerMeta: oauthex.AuthServerMeta{
		Issuer:                                     p.Issuer(),
		AuthorizationEndpoint:                      p.AuthURL(),
		TokenEndpoint:                              p.TokenURL(),
		RegistrationEndpoint:                       p.RegisterURL(),
		RevocationEndpoint:                         p.RevokeURL(),
		ResponseTypesSupported:                     []string{"code"},
		GrantTypesSupported:                        []string{"authorization_code", "refresh_token"},
		CodeChallengeMethodsSupported:              []string{"S256"},
		TokenEndpointAuthMethodsSupported:          methods,
		RevocationEndpointAuthMethodsSupported:     methods,
		AuthorizationResponseIssParameterSupported: true,
	}})
}

// ForgetClient deletes registered client id, as an authorization server
// does when a registration is deleted or expires (RFC 7592 section 2.3:
// the client id and secret stop working, and the server SHOULD invalidate
// the client's grants and tokens): its tokens are revoked, its pending
// authorizations and codes dropped, and a token request as it is answered
// invalid_client. The configured client is never forgotten; false when id
// is not a registered client.
func (p *Provider) ForgetClient(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.clients[id]
	if !ok || id == p.opts.ClientID {
		return false
	}
	delete(p.clients, id)
	for _, t := range p.tokens {
		if t.clientID == id {
			t.revoked = true
		}
	}
	for k, a := range p.pending {
		if a.client == c {
			delete(p.pending, k)
		}
	}
	for k, g := range p.codes {
		if g.req.client == c {
			delete(p.codes, k)
		}
	}
	return true
}
