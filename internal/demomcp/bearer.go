package demomcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"credbroker/internal/demoprovider"
	"credbroker/internal/telemetry"
)

// call is what serveMCP hands the tools through the request: the token's
// introspection, and where to note the tool that ran.
type call struct {
	in  demoprovider.Introspection
	ran *atomic.Pointer[string]
}

type callKey struct{}

// serveMCP checks the bearer token and the scope a tools/call needs, then
// hands the request to the go-sdk.
func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) {
	rec := Request{HTTPMethod: r.Method, ProtocolVersion: r.Header.Get("Mcp-Protocol-Version")}
	sw := &telemetry.StatusWriter{ResponseWriter: w}
	defer func() {
		rec.Status = sw.Status
		if rec.Status == 0 { // nothing written: net/http answers 200
			rec.Status = http.StatusOK
		}
		s.remember(rec)
	}()
	scheme, cred, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	cred = strings.TrimSpace(cred)
	rec.AuthScheme, rec.Token = scheme, demoprovider.Fingerprint(cred)
	if !strings.EqualFold(scheme, "Bearer") || cred == "" {
		rec.Outcome = "missing_token"
		s.challenge(sw, http.StatusUnauthorized, "", "", ScopeRead)
		return
	}
	in, ok := s.authServer.Introspect(cred)
	switch {
	case !ok:
		rec.Outcome = "invalid_token"
		s.challenge(sw, http.StatusUnauthorized, "invalid_token", "The access token is invalid, expired or revoked", ScopeRead)
		return
	case in.Resource != s.url:
		rec.Outcome = "wrong_resource"
		s.challenge(sw, http.StatusUnauthorized, "invalid_token", "The access token was not issued for this resource", ScopeRead)
		return
	}
	rec.Account = in.Account.Login
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(sw, r.Body, maxBody))
		if err != nil {
			rec.Outcome = "too_large"
			http.Error(sw, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		if rec.Method, rec.Tool, err = peek(body); err != nil {
			rec.Outcome = "bad_body"
			sw.Header().Set("Content-Type", "application/json")
			sw.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(sw).Encode(map[string]any{"jsonrpc": "2.0", "id": nil,
				"error": map[string]any{"code": -32600, "message": "Invalid request: " + err.Error()}})
			return
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	}
	if need := toolScopes[rec.Tool]; rec.Method == "tools/call" && need != "" && !slices.Contains(in.Scopes, need) {
		rec.Outcome = "insufficient_scope"
		s.challenge(sw, http.StatusForbidden, "insufficient_scope", rec.Tool+" needs the "+need+" scope", need)
		return
	}
	rec.Outcome = "ok"
	ran := new(atomic.Pointer[string])
	s.mcp.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), callKey{}, call{in: in, ran: ran})))
	if name := ran.Load(); name != nil {
		rec.Ran = *name
	}
}

// challenge answers 401 or 403 with an RFC 6750 Bearer challenge naming
// the protected resource metadata (RFC 9728 section 5.1).
func (s *Server) challenge(w http.ResponseWriter, status int, code, desc, scope string) {
	params := []string{}
	if code != "" {
		params = append(params, fmt.Sprintf("error=%q", code))
	}
	params = append(params, fmt.Sprintf("scope=%q", scope), fmt.Sprintf("resource_metadata=%q", s.metadataURL))
	if desc != "" {
		params = append(params, fmt.Sprintf("error_description=%q", desc))
	}
	w.Header().Set("WWW-Authenticate", "Bearer "+strings.Join(params, ", "))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if code == "" {
		code, desc = "invalid_request", "A bearer token is required"
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
}

func (s *Server) remember(rec Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	rec.Seq = s.seq
	if len(s.requests) >= maxRequests {
		s.requests = slices.Delete(s.requests, 0, len(s.requests)-maxRequests+1)
	}
	s.requests = append(s.requests, rec)
	s.log.Debug("demomcp: request", "method", rec.Method, "tool", rec.Tool, "account", rec.Account, "outcome", rec.Outcome, "status", rec.Status)
}
