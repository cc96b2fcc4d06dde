package mcpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/bearer"
	"credbroker/internal/outage"
	"credbroker/vault"
)

type principalKey struct{}

// PrincipalFromContext returns the principal of the validated bearer token
// of the request being served.
func PrincipalFromContext(ctx context.Context) (vault.Principal, bool) {
	p, ok := ctx.Value(principalKey{}).(vault.Principal)
	return p, ok && !p.IsZero()
}

func withPrincipal(ctx context.Context, p vault.Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// endpoint is one MCP endpoint of the broker as a protected resource:
// /mcp, or a gateway endpoint /mcp/u/{provider}. Tokens must name its
// resource.
type endpoint struct {
	resource    string
	metadataURL string
	verifier    bearer.Verifier
	// metadataJSON is its RFC 9728 document.
	metadataJSON []byte
}

// authenticate validates the request's bearer token for ep. On failure it
// writes the 401/403 answer and returns false, except when the verifier
// could not check the token (its store unavailable, the IdP's keys out of
// reach): then nothing is written and failed is why, so the caller can
// answer with the request's id.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, ep *endpoint) (info bearer.TokenInfo, ok bool, failed error) {
	raw, err := bearer.FromHeader(r.Header["Authorization"])
	switch {
	case errors.Is(err, bearer.ErrMissing):
		s.challenge(w, ep, http.StatusUnauthorized, "", "missing bearer token")
		return bearer.TokenInfo{}, false, nil
	case err != nil:
		s.challenge(w, ep, http.StatusUnauthorized, "invalid_request", "the Authorization header must be one \"Bearer <token>\"")
		return bearer.TokenInfo{}, false, nil
	}
	info, err = ep.verifier(r.Context(), raw)
	switch {
	case errors.Is(err, bearer.ErrInvalidToken):
		s.log.Info("mcpapi: bearer token rejected", "reason", err.Error())
		s.challenge(w, ep, http.StatusUnauthorized, "invalid_token", "invalid or expired bearer token")
		return bearer.TokenInfo{}, false, nil
	case err != nil:
		return bearer.TokenInfo{}, false, err
	}
	if s.opts.RequiredScope != "" && !slices.Contains(info.Scopes, s.opts.RequiredScope) {
		s.challenge(w, ep, http.StatusForbidden, "insufficient_scope", "the bearer token lacks the required scope")
		return bearer.TokenInfo{}, false, nil
	}
	return info, true, nil
}

// verifyFailed answers a request whose bearer token could not be checked
// (err, not a verdict on the token): a storage outage as one, anything
// else (the IdP's keys out of reach) a 503 of its own; both with Retry-After
// and the id of the request, read from body when it has one.
func (s *Server) verifyFailed(w http.ResponseWriter, body []byte, err error) {
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	_ = json.Unmarshal(body, &msg)
	id := validOrNull(msg.ID)
	if errors.Is(err, vault.ErrUnavailable) {
		s.storageUnavailable(w, id, err)
		return
	}
	s.log.Error("mcpapi: bearer token verification failed", "err", err.Error())
	outage.SetRetryAfter(w.Header())
	writeRPCError(w, http.StatusServiceUnavailable, id, codeInternal, "cannot verify bearer tokens right now; retry in a few seconds", nil)
}

// challenge writes a 401/403 with the RFC 6750 / RFC 9728 WWW-Authenticate
// header naming ep's metadata, and a JSON-RPC error body.
func (s *Server) challenge(w http.ResponseWriter, ep *endpoint, status int, errCode, msg string) {
	parts := []string{fmt.Sprintf("resource_metadata=%q", ep.metadataURL)}
	if s.opts.RequiredScope != "" {
		parts = append(parts, fmt.Sprintf("scope=%q", s.opts.RequiredScope))
	}
	if errCode != "" {
		parts = append([]string{fmt.Sprintf("error=%q", errCode)}, parts...)
	}
	w.Header().Set("WWW-Authenticate", "Bearer "+strings.Join(parts, ", "))
	writeRPCError(w, status, nil, codeInvalidRequest, msg, nil)
}

func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	writeMetadata(w, s.main.metadataJSON)
}

func writeMetadata(w http.ResponseWriter, doc []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Write(doc)
}

// newEndpoint describes the protected resource at resource (its RFC 9728
// document).
func (s *Server) newEndpoint(resource, metadataURL string, verify bearer.Verifier) (*endpoint, error) {
	md := oauthex.ProtectedResourceMetadata{
		Resource: resource, AuthorizationServers: s.opts.AuthorizationServers,
		BearerMethodsSupported: []string{"header"}, ResourceName: "credbroker",
	}
	if s.opts.RequiredScope != "" {
		md.ScopesSupported = []string{s.opts.RequiredScope}
	}
	b, err := json.Marshal(md)
	if err != nil {
		return nil, err
	}
	return &endpoint{resource: resource, metadataURL: metadataURL, verifier: verify, metadataJSON: b}, nil
}
