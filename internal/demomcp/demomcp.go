// Package demomcp is the demo OAuth-protected MCP server of `broker dev`: a
// go-sdk server with three tools, protected by bearer tokens of the demo
// provider (internal/demoprovider), which is its authorization server. It
// stands in for a hosted MCP server (Linear, Notion, …) so the gateway can
// be tried and tested against something real without leaving the machine.
//
// Routes, for Options.URL = http://127.0.0.1:8080/dev/mcp-upstream:
//
//	POST /dev/mcp-upstream    MCP, both eras on one endpoint (2026-07-28
//	                          stateless; 2025-11-25 through initialize), JSON
//	                          answers; GET and DELETE answer 405 (stateless)
//	GET  /.well-known/oauth-protected-resource/dev/mcp-upstream
//	                          RFC 9728 metadata: resource = URL exactly,
//	                          authorization_servers = [the demo provider's
//	                          issuer], scopes_supported = [notes:read, notes:write]
//
// Mount registers both (mux.Handle(path, …) for each); Handler serves both
// and expects full request paths.
//
// Every request to the MCP endpoint needs `Authorization: Bearer <token>`,
// where the token is a live access token of the demo provider whose
// resource (RFC 8707) is exactly URL:
//
//   - none, or another scheme: 401 `WWW-Authenticate: Bearer
//     resource_metadata="<metadata URL>", scope="notes:read"`;
//   - unknown, expired, revoked, a refresh token, or a token for another
//     resource (the demo API's, another MCP server's): 401 with
//     error="invalid_token" as well;
//   - a tools/call of a tool whose scope the token lacks: 403
//     `Bearer error="insufficient_scope", scope="<the tool's scope>",
//     resource_metadata="…"` (RFC 6750 section 3.1; clients add the scope
//     to the ones they hold, as MCP step-up asks).
//
// The scope is decided from the body before the go-sdk reads it, so a body
// the two could read differently gets 400 (-32600): not one JSON object, or
// method, params or params.name repeated or spelled in another case (the
// go-sdk matches member names case-sensitively, encoding/json does not).
// The tools check their scope once more, whatever reached them.
//
// Tools:
//
//	echo        (no scope)   answers what it was sent: the arguments, the
//	                         request's _meta, every request header except
//	                         Authorization, and the token's account and scopes
//	list_notes  notes:read   the account's notes
//	add_note    notes:write  adds {text} to the account's notes (20 kept)
//
// echo never shows the Authorization header, so a test can grep what a host
// sees for the upstream token; what the server received is in Requests,
// which names the credential by demoprovider.Fingerprint for the test to
// compare with the upstream token it expects. State lives in memory.
package demomcp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"credbroker/internal/demoprovider"
)

// The scopes the server knows.
const (
	ScopeRead  = "notes:read"
	ScopeWrite = "notes:write"
)

const (
	maxBody     = 1 << 20
	maxNotes    = 20
	maxNoteLen  = 500
	maxRequests = 1000 // the log a long-running `broker dev` keeps
)

// AuthServer is what the server needs of its authorization server;
// *demoprovider.Provider is one.
type AuthServer interface {
	// Issuer is named in the protected resource metadata.
	Issuer() string
	// Resources are the resources it issues tokens for; the server's URL
	// must be one.
	Resources() []string
	// Introspect describes a live access token.
	Introspect(token string) (demoprovider.Introspection, bool)
}

var _ AuthServer = (*demoprovider.Provider)(nil)

// Options configure the server.
type Options struct {
	// URL is the MCP endpoint's absolute URL, and the resource its tokens
	// must be bound to, e.g. "http://127.0.0.1:8080/dev/mcp-upstream" (a
	// path, no trailing slash, query or fragment).
	URL        string
	AuthServer AuthServer
	Logger     *slog.Logger // nil: discard
}

// Request is one request the MCP endpoint received, for tests.
type Request struct {
	Seq        int
	HTTPMethod string
	// Method and Tool are the JSON-RPC method and, for tools/call, the
	// tool's name (read once the token is accepted).
	Method string
	Tool   string
	// ProtocolVersion is the MCP-Protocol-Version header.
	ProtocolVersion string
	// AuthScheme is the Authorization header's scheme as sent ("" when
	// there is none) and Token the demoprovider.Fingerprint of the
	// credential after it: never the credential itself.
	AuthScheme string
	Token      string
	Account    string // the token's account, when it was accepted
	// Ran is the tool the go-sdk ran for the request ("" none).
	Ran string
	// Outcome is "ok", "missing_token", "invalid_token", "wrong_resource",
	// "insufficient_scope", "too_large" or "bad_body" (not one JSON-RPC
	// message the server reads one way only); Status the HTTP status
	// answered.
	Outcome string
	Status  int
}

// Server is the demo MCP server. Its methods are safe for concurrent use.
type Server struct {
	url, path     string
	metadataPath  string
	metadataURL   string
	authServer    AuthServer
	log           *slog.Logger
	mcp, metadata http.Handler
	handler       http.Handler

	mu       sync.Mutex // guards the fields below
	notes    map[string][]string
	requests []Request
	seq      int
}

// toolScopes are the server's tools and the scope each needs.
var toolScopes = map[string]string{"echo": "", "list_notes": ScopeRead, "add_note": ScopeWrite}

// New validates opts and builds the server.
func New(opts Options) (*Server, error) {
	var problems []error
	u, err := url.Parse(opts.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" ||
		u.Path == "" || u.Path == "/" || strings.HasSuffix(u.Path, "/") {
		problems = append(problems, fmt.Errorf("URL %q must be an absolute http(s) URL with a path, without trailing slash, query or fragment", opts.URL))
	}
	if opts.AuthServer == nil {
		problems = append(problems, errors.New("AuthServer is required"))
	} else if !slices.Contains(opts.AuthServer.Resources(), opts.URL) {
		problems = append(problems, fmt.Errorf("the authorization server does not issue tokens for %q: add it to its resources", opts.URL))
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("demomcp: %w", errors.Join(problems...))
	}
	s := &Server{url: opts.URL, path: u.Path, metadataPath: "/.well-known/oauth-protected-resource" + u.Path,
		authServer: opts.AuthServer, log: opts.Logger, notes: map[string][]string{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	mu := *u
	mu.Path = s.metadataPath
	s.metadataURL = mu.String()
	s.metadata = auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               s.url,
		AuthorizationServers:   []string{opts.AuthServer.Issuer()},
		ScopesSupported:        []string{ScopeRead, ScopeWrite},
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Demo MCP server (broker dev)",
	})
	s.mcp = s.newMCPHandler()
	mux := http.NewServeMux()
	mux.Handle(s.metadataPath, s.metadata)
	mux.HandleFunc(s.path, s.serveMCP)
	s.handler = mux
	return s, nil
}

// Handler serves the MCP endpoint and the metadata; it expects full
// request paths.
func (s *Server) Handler() http.Handler { return s.handler }

// Mount registers the MCP endpoint and the metadata on mux.
func (s *Server) Mount(mux *http.ServeMux) {
	mux.Handle(s.path, s.handler)
	mux.Handle(s.metadataPath, s.handler)
}

// URL is the MCP endpoint (the resource); MetadataURL its protected
// resource metadata.
func (s *Server) URL() string         { return s.url }
func (s *Server) MetadataURL() string { return s.metadataURL }

// Requests returns what the MCP endpoint received, oldest first.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}
