package authserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/vault"
)

// client is a resolved OAuth client: registered here (dynamic
// registration) or described by its Client ID Metadata Document.
type client struct {
	ID string
	Metadata
	// secretHash is SHA-256 of a registered confidential client's secret.
	secretHash []byte
	// host is, for a metadata-document client, the host of its client_id
	// URL: what the document's presence there verifies.
	host string
	// registered is true for a client of dynamic registration; used is
	// when it first redeemed a code.
	registered bool
	used       time.Time
}

// errUnknownClient: no such registered client.
var errUnknownClient = errors.New("unknown client_id")

// lookupClient resolves clientID. A metadata document failure is a
// *FetchError.
func (s *Server) lookupClient(ctx context.Context, clientID string) (*client, error) {
	if clientID == "" || len(clientID) > maxRedirectURILen {
		return nil, errUnknownClient
	}
	if isClientIDURL(clientID) {
		m, err := s.docs.get(ctx, clientID)
		if err != nil {
			return nil, err
		}
		u, _ := url.Parse(clientID)
		return &client{ID: clientID, Metadata: m, host: u.Host}, nil
	}
	if sc, ok := s.static[clientID]; ok {
		cp := *sc
		return &cp, nil
	}
	c, err := s.store.GetOAuthClient(ctx, clientID)
	if errors.Is(err, vault.ErrNotFound) {
		return nil, errUnknownClient
	}
	if err != nil {
		return nil, err
	}
	return &client{
		ID: c.ID, secretHash: c.SecretHash, registered: true, used: c.Used,
		Metadata: Metadata{
			RedirectURIs: c.RedirectURIs, GrantTypes: c.GrantTypes, AuthMethod: c.AuthMethod,
			Name: c.Name, URI: c.URI, ApplicationType: c.ApplicationType,
		},
	}, nil
}

// displayName is the client's self-asserted name, or a fallback.
func (c *client) displayName() string {
	if c.Name != "" {
		return c.Name
	}
	if c.host != "" {
		return c.host
	}
	return "An unnamed app"
}

// clientRequest reads a client's POST (to /token or /revoke): its form and
// the client it authenticates as.
func (s *Server) clientRequest(w http.ResponseWriter, r *http.Request) (url.Values, *client, *oauthError) {
	form, e := readForm(w, r)
	if e != nil {
		return nil, nil, e
	}
	c, e := s.authenticateClient(r, form)
	return form, c, e
}

// authenticateClient establishes which client makes a token or revocation
// request (RFC 6749 section 2.3): HTTP Basic, or client_id and
// client_secret in the body, or client_id alone for a public client; never
// two methods at once. The method must be the client's registered one.
func (s *Server) authenticateClient(r *http.Request, form url.Values) (*client, *oauthError) {
	id, secret, basic := r.BasicAuth()
	if basic {
		var err1, err2 error
		id, err1 = url.QueryUnescape(id)
		secret, err2 = url.QueryUnescape(secret)
		if err1 != nil || err2 != nil {
			return nil, oerr(http.StatusUnauthorized, "invalid_client", "the Basic credentials are not form-encoded")
		}
		if form.Get("client_secret") != "" || (form.Get("client_id") != "" && form.Get("client_id") != id) {
			return nil, oerr(http.StatusBadRequest, "invalid_request", "use one client authentication method per request")
		}
	} else {
		id, secret = form.Get("client_id"), form.Get("client_secret")
	}
	if id == "" {
		return nil, oerr(http.StatusUnauthorized, "invalid_client", "client_id is required")
	}
	c, err := s.lookupClient(r.Context(), id)
	var fe *FetchError
	switch {
	case errors.Is(err, errUnknownClient):
		return nil, oerr(http.StatusUnauthorized, "invalid_client", "unknown client_id")
	case errors.As(err, &fe):
		return nil, &oauthError{Status: http.StatusUnauthorized, Code: "invalid_client", Desc: fe.Reason, Err: fe.Err}
	case err != nil:
		return nil, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the client could not be looked up", Err: err}
	}
	method := authNone
	switch {
	case basic:
		method = authSecretBasic
	case secret != "":
		method = authSecretPost
	}
	if method != c.AuthMethod {
		return nil, oerr(http.StatusUnauthorized, "invalid_client", "this client authenticates with %s, not %s", c.AuthMethod, method)
	}
	if method != authNone {
		sum := sha256.Sum256([]byte(secret))
		if len(c.secretHash) != len(sum) || subtle.ConstantTimeCompare(sum[:], c.secretHash) != 1 {
			return nil, oerr(http.StatusUnauthorized, "invalid_client", "wrong client secret")
		}
	}
	return c, nil
}

// registrationResponse is RFC 7591's client information response.
type registrationResponse struct {
	ClientID                string   `json:"client_id"`
	ClientSecret            string   `json:"client_secret,omitempty"`
	ClientIDIssuedAt        int64    `json:"client_id_issued_at"`
	ClientSecretExpiresAt   *int64   `json:"client_secret_expires_at,omitempty"`
	RedirectURIs            []string `json:"redirect_uris"`
	GrantTypes              []string `json:"grant_types"`
	ResponseTypes           []string `json:"response_types"`
	TokenEndpointAuthMethod string   `json:"token_endpoint_auth_method"`
	ClientName              string   `json:"client_name,omitempty"`
	ClientURI               string   `json:"client_uri,omitempty"`
	ApplicationType         string   `json:"application_type"`
}

// handleRegister is POST /register: dynamic client registration.
func (s *Server) handleRegister(w http.ResponseWriter, r *http.Request) {
	if !s.opts.Registration {
		s.writeError(w, r, oerr(http.StatusForbidden, "access_denied",
			"dynamic client registration is turned off on this broker; identify the client with a Client ID Metadata Document (an https client_id)"))
		return
	}
	if mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";"); strings.TrimSpace(strings.ToLower(mt)) != "application/json" {
		s.writeError(w, r, oerr(http.StatusBadRequest, "invalid_client_metadata", "the registration request must be application/json"))
		return
	}
	if !s.limiter.allow(s.opts.ClientAddr(r)) {
		w.Header().Set("Retry-After", "60")
		s.writeError(w, r, oerr(http.StatusTooManyRequests, "invalid_request", "too many registrations from this address; try again in a minute"))
		return
	}
	body, err := readBody(w, r, 16<<10)
	if err != nil {
		s.writeError(w, r, oerr(http.StatusBadRequest, "invalid_client_metadata", "the registration request is too large or unreadable"))
		return
	}
	m, err := ParseRegistration(body)
	if err != nil {
		var me *MetadataError
		errors.As(err, &me)
		s.writeError(w, r, oerr(http.StatusBadRequest, me.Code, "%s", me.Description))
		return
	}
	now := s.now()
	c := vault.OAuthClient{
		ID: randomID(16), AuthMethod: m.AuthMethod, Name: m.Name, URI: m.URI, RedirectURIs: m.RedirectURIs,
		GrantTypes: m.GrantTypes, ApplicationType: m.ApplicationType, Created: now,
	}
	var secret string
	if m.AuthMethod != authNone {
		secret = randomID(32)
		sum := sha256.Sum256([]byte(secret))
		c.SecretHash = sum[:]
	}
	if _, err := s.store.CreateOAuthClient(r.Context(), c, s.opts.MaxClients); err != nil {
		if errors.Is(err, vault.ErrTooManyClients) {
			s.writeError(w, r, oerr(http.StatusServiceUnavailable, "temporarily_unavailable", "this broker holds the most registered clients it accepts; try again later"))
			return
		}
		s.writeError(w, r, &oauthError{Status: http.StatusInternalServerError, Code: "server_error", Desc: "the client could not be registered", Err: err})
		return
	}
	s.log.Info("authserver: client registered", "client_id", c.ID, "auth_method", c.AuthMethod, "remote", s.opts.ClientAddr(r))
	resp := registrationResponse{
		ClientID: c.ID, ClientSecret: secret, ClientIDIssuedAt: now.Unix(), RedirectURIs: c.RedirectURIs,
		GrantTypes: c.GrantTypes, ResponseTypes: []string{"code"}, TokenEndpointAuthMethod: c.AuthMethod,
		ClientName: c.Name, ClientURI: c.URI, ApplicationType: c.ApplicationType,
	}
	if secret != "" {
		never := int64(0)
		resp.ClientSecretExpiresAt = &never
	}
	writeJSON(w, http.StatusCreated, resp)
}

// readBody reads at most max bytes of r's body.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

// StaticClient is a client configured rather than registered: broker
// dev's host client, which the development IdP's token exchange names in
// the ID-JAGs it issues. Its secret is given in the clear and kept only as
// SHA-256.
type StaticClient struct {
	ID     string
	Secret string // empty: a public client
	Name   string
	// RedirectURIs follow the registration rules (loopback: any port).
	RedirectURIs []string
}

// staticClients validates the configured clients.
func staticClients(list []StaticClient) (map[string]*client, error) {
	out := map[string]*client{}
	for _, sc := range list {
		switch {
		case sc.ID == "" || isClientIDURL(sc.ID) || len(sc.ID) > 200:
			return nil, fmt.Errorf("configured client %q: the id must be a short name that is not an https URL", sc.ID)
		case out[sc.ID] != nil:
			return nil, fmt.Errorf("configured client %q appears twice", sc.ID)
		case len(sc.RedirectURIs) == 0:
			return nil, fmt.Errorf("configured client %q has no redirect URI", sc.ID)
		}
		for _, u := range sc.RedirectURIs {
			if err := checkRedirectURI(u); err != nil {
				return nil, fmt.Errorf("configured client %q: %v", sc.ID, err)
			}
		}
		c := &client{ID: sc.ID, Metadata: Metadata{RedirectURIs: slices.Clone(sc.RedirectURIs),
			GrantTypes: []string{grantCode, grantRefresh}, AuthMethod: authNone, Name: sc.Name, ApplicationType: "native"}}
		if sc.Secret != "" {
			sum := sha256.Sum256([]byte(sc.Secret))
			c.secretHash, c.AuthMethod = sum[:], authSecretBasic
		}
		out[sc.ID] = c
	}
	return out, nil
}
