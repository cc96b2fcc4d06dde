package oauthflow

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/provider"
)

// ClientMetadataPath is where the broker serves its Client ID Metadata
// Document: the broker as the OAuth client of upstream MCP servers'
// authorization servers that identify clients by such a URL.
const ClientMetadataPath = "/oauth/client-metadata.json"

// clientMetadata is the document (draft-ietf-oauth-client-id-metadata-
// document: client_id is the document's own URL; a public client): its
// client_id and the RFC 7591 client metadata, of the type the broker
// registers with where an authorization server takes dynamic registration.
type clientMetadata struct {
	ClientID string `json:"client_id"`
	oauthex.ClientRegistrationMetadata
}

// handleClientMetadata is GET /oauth/client-metadata.json. It is served
// only when the document's URL is this very https URL (a client_id must be
// the URL it is fetched from, and authorization servers fetch https only):
// the redirect URIs are the callbacks of every type: mcp provider.
func (f *Flow) handleClientMetadata(w http.ResponseWriter, r *http.Request) {
	self := f.opts.PublicURL + ClientMetadataPath
	if f.opts.ClientMetadataURL != self || !strings.HasPrefix(self, "https://") {
		http.NotFound(w, r)
		return
	}
	doc := clientMetadata{ClientID: self, ClientRegistrationMetadata: oauthex.ClientRegistrationMetadata{
		ClientName: "credbroker", ClientURI: f.opts.PublicURL,
		RedirectURIs: []string{}, GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"},
		TokenEndpointAuthMethod: "none"}}
	for _, name := range f.providers.Names() {
		p, _ := f.providers.Lookup(name)
		if _, ok := p.Kind.(provider.RedirectStep); ok {
			if _, gw := p.Kind.(provider.Gateway); gw {
				doc.RedirectURIs = append(doc.RedirectURIs, f.opts.PublicURL+"/oauth/"+name+"/callback")
			}
		}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=300")
	_, _ = w.Write(b)
}
