package demoprovider

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

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

// serverMetadata is the RFC 8414 authorization server metadata.
type serverMetadata struct {
	Issuer                                 string   `json:"issuer"`
	AuthorizationEndpoint                  string   `json:"authorization_endpoint"`
	TokenEndpoint                          string   `json:"token_endpoint"`
	RegistrationEndpoint                   string   `json:"registration_endpoint"`
	RevocationEndpoint                     string   `json:"revocation_endpoint"`
	ResponseTypesSupported                 []string `json:"response_types_supported"`
	GrantTypesSupported                    []string `json:"grant_types_supported"`
	CodeChallengeMethodsSupported          []string `json:"code_challenge_methods_supported"`
	TokenEndpointAuthMethodsSupported      []string `json:"token_endpoint_auth_methods_supported"`
	RevocationEndpointAuthMethodsSupported []string `json:"revocation_endpoint_auth_methods_supported"`
	AuthorizationResponseIssParameter      bool     `json:"authorization_response_iss_parameter_supported"`
}

// metadata is GET /.well-known/oauth-authorization-server<path>.
func (p *Provider) metadata(w http.ResponseWriter, _ *http.Request) {
	methods := []string{authBasic, authPost, authNone}
	w.Header().Set("Access-Control-Allow-Origin", "*") // public, for browser-based clients
	writeJSON(w, http.StatusOK, serverMetadata{
		Issuer:                                 p.Issuer(),
		AuthorizationEndpoint:                  p.AuthURL(),
		TokenEndpoint:                          p.TokenURL(),
		RegistrationEndpoint:                   p.RegisterURL(),
		RevocationEndpoint:                     p.RevokeURL(),
		ResponseTypesSupported:                 []string{"code"},
		GrantTypesSupported:                    []string{"authorization_code", "refresh_token"},
		CodeChallengeMethodsSupported:          []string{"S256"},
		TokenEndpointAuthMethodsSupported:      methods,
		RevocationEndpointAuthMethodsSupported: methods,
		AuthorizationResponseIssParameter:      true,
	})
}

// Introspection is what the provider knows about a live access token: what
// a resource server needs to decide (RFC 7662's claims, in-process).
type Introspection struct {
	Account  Account
	ClientID string
	Scopes   []string
	// Resource is the RFC 8707 resource the token is bound to ("" for a
	// token of the demo API).
	Resource string
	Expiry   time.Time
}

// Introspect describes the access token tok, or reports false when it is
// unknown, a refresh token, revoked or expired.
func (p *Provider) Introspect(tok string) (Introspection, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.tokens[key(tok)]
	if !ok || t.refresh || t.revoked || !p.opts.Now().Before(t.expiry) {
		return Introspection{}, false
	}
	return Introspection{Account: t.account, ClientID: t.clientID, Scopes: strings.Fields(t.scope),
		Resource: t.resource, Expiry: t.expiry}, true
}
