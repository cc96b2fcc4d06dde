package mcpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"credbroker/internal/bearer"
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

// authenticate validates the request's bearer token. On failure it writes
// the 401/403 answer and returns false.
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (bearer.TokenInfo, bool) {
	raw, err := bearer.FromHeader(r.Header.Values("Authorization"))
	switch {
	case errors.Is(err, bearer.ErrMissing):
		s.challenge(w, http.StatusUnauthorized, "", "missing bearer token")
		return bearer.TokenInfo{}, false
	case err != nil:
		s.challenge(w, http.StatusUnauthorized, "invalid_request", "the Authorization header must be one \"Bearer <token>\"")
		return bearer.TokenInfo{}, false
	}
	info, err := s.verifier(r.Context(), raw)
	if err != nil {
		if errors.Is(err, bearer.ErrInvalidToken) {
			s.log.Info("mcpapi: bearer token rejected", "reason", err.Error())
			s.challenge(w, http.StatusUnauthorized, "invalid_token", "invalid or expired bearer token")
		} else {
			s.log.Error("mcpapi: bearer token verification failed", "err", err.Error())
			writeRPCError(w, http.StatusServiceUnavailable, nil, codeInternal, "cannot verify bearer tokens right now", nil)
		}
		return bearer.TokenInfo{}, false
	}
	if s.opts.RequiredScope != "" && !slices.Contains(info.Scopes, s.opts.RequiredScope) {
		s.challenge(w, http.StatusForbidden, "insufficient_scope", "the bearer token lacks the required scope")
		return bearer.TokenInfo{}, false
	}
	return info, true
}

// challenge writes a 401/403 with the RFC 6750 / RFC 9728 WWW-Authenticate
// header and a JSON-RPC error body.
func (s *Server) challenge(w http.ResponseWriter, status int, errCode, msg string) {
	parts := []string{fmt.Sprintf("resource_metadata=%q", s.metadataURL)}
	if s.opts.RequiredScope != "" {
		parts = append(parts, fmt.Sprintf("scope=%q", s.opts.RequiredScope))
	}
	if errCode != "" {
		parts = append([]string{fmt.Sprintf("error=%q", errCode)}, parts...)
	}
	w.Header().Set("WWW-Authenticate", "Bearer "+strings.Join(parts, ", "))
	writeRPCError(w, status, nil, codeInvalidRequest, msg, nil)
}

// protectedResourceMetadata is the RFC 9728 document.
type protectedResourceMetadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported,omitempty"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name,omitempty"`
}

func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.Write(s.metadataJSON)
}
