package mcpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/loopback"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// Options configures a Server.
type Options struct {
	// PublicURL is the broker's external base URL (https://broker.example.com).
	PublicURL string
	// ResourceURI is the required JWT audience (default PublicURL + "/mcp").
	ResourceURI string
	// Issuer is the IdP's issuer URL (OIDC discovery finds its keys).
	Issuer string
	// AuthorizationServers for RFC 9728 metadata (default [Issuer]; the
	// broker's own public URL when it is the authorization server).
	AuthorizationServers []string
	// RequiredScope, when set, must be among the token's scopes (else 403).
	RequiredScope string
	// AllowedOrigins are accepted Origin values besides PublicURL's origin;
	// DevMode adds loopback origins.
	AllowedOrigins []string
	DevMode        bool

	// Connections makes every decision about connections.
	Connections *connections.Service
	StateKeys   *vault.Keyring // derived for requestState by the caller
	StateTTL    time.Duration  // requestState lifetime (default 10 minutes)

	MaxBodyBytes int64 // default 1 MiB
	Logger       *slog.Logger
	Now          func() time.Time
	HTTPClient   *http.Client // for OIDC discovery and JWKS
	// Verifier overrides the default verifier of the IdP's JWTs: the broker's
	// own authorization server's tokens (--mcp-auth broker), tests. It is
	// used as is, on every request: it does its own caching (bearer.Cached)
	// where a cached answer is acceptable.
	Verifier bearer.Verifier
	// ServerVersion is reported in serverInfo (default "dev").
	ServerVersion string
	// Telemetry receives request metrics (nil: none).
	Telemetry *telemetry.Recorder
	// Upstreams is the gateway's client of upstream MCP servers
	// (/mcp/u/{provider}); nil: the gateway answers 404.
	Upstreams *mcpup.Pool
	// VerifierFor verifies the bearer tokens of a gateway endpoint (tokens
	// must name resource); default: the IdP's JWTs, as for /mcp.
	VerifierFor func(resource string) bearer.Verifier
	// Tracing, when set, traces each request (an "mcp.request" span with
	// method, tool, era and outcome), continuing the trace context of
	// _meta (traceparent, tracestate) or the traceparent header. Nil: off.
	Tracing trace.TracerProvider
}

// Supported protocol versions, newest first.
const (
	versionModern = "2026-07-28"
	versionLegacy = "2025-11-25"
)

var supportedVersions = []string{versionModern, versionLegacy}

// Server is the MCP endpoint and protected-resource metadata.
type Server struct {
	opts    Options
	log     *slog.Logger
	origins map[string]bool
	// main is /mcp as a protected resource.
	main     *endpoint
	impl     *mcp.Implementation
	tools    map[string]toolFunc
	implJSON json.RawMessage

	// Pre-encoded static results.
	discoverJSON  []byte
	toolsListJSON []byte

	legacy http.Handler
	tracer trace.Tracer // nil: tracing off

	gw *gateway // /mcp/u/{provider}

	caps bytesMemo[capsInfo] // decoded _meta clientCapabilities, by their bytes

	// done is closed by EndStreams: long-lived streams end.
	done     chan struct{}
	doneOnce sync.Once
}

// EndStreams ends the long-lived streams (the gateway's
// subscriptions/listen) gracefully, each with its final result: for a
// server shutting down (http.Server.RegisterOnShutdown), whose Shutdown
// would otherwise wait for them.
func (s *Server) EndStreams() { s.doneOnce.Do(func() { close(s.done) }) }

// New validates opts and builds a Server. It performs no I/O: the IdP's
// keys are fetched on the first request that needs them.
func New(opts Options) (*Server, error) {
	var errs []error
	pu, err := url.Parse(opts.PublicURL)
	if err != nil || pu.Scheme == "" || pu.Host == "" || pu.RawQuery != "" || pu.Fragment != "" {
		errs = append(errs, fmt.Errorf("PublicURL %q must be an absolute http(s) URL", opts.PublicURL))
	} else if pu.Scheme != "https" && !(pu.Scheme == "http" && loopback.Host(pu.Hostname())) {
		errs = append(errs, fmt.Errorf("PublicURL %q must use https (plain http only on loopback)", opts.PublicURL))
	}
	opts.PublicURL = strings.TrimSuffix(opts.PublicURL, "/")
	if opts.Verifier == nil && opts.Issuer == "" {
		errs = append(errs, errors.New("Issuer is required (or a Verifier)"))
	}
	if opts.Connections == nil {
		errs = append(errs, errors.New("Connections is required"))
	}
	if opts.StateKeys == nil {
		errs = append(errs, errors.New("StateKeys is required"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("mcpapi: %w", errors.Join(errs...))
	}
	if opts.ResourceURI == "" {
		opts.ResourceURI = opts.PublicURL + "/mcp"
	}
	if len(opts.AuthorizationServers) == 0 && opts.Issuer != "" {
		opts.AuthorizationServers = []string{opts.Issuer}
	}
	if opts.StateTTL <= 0 {
		opts.StateTTL = 10 * time.Minute
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.ServerVersion == "" {
		opts.ServerVersion = "dev"
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{done: make(chan struct{}),
		opts:    opts,
		log:     log,
		origins: map[string]bool{pu.Scheme + "://" + pu.Host: true},
		impl:    &mcp.Implementation{Name: "credbroker", Title: "credbroker", Version: opts.ServerVersion},
	}
	if s.implJSON, err = json.Marshal(s.impl); err != nil {
		return nil, err
	}
	for _, o := range opts.AllowedOrigins {
		s.origins[strings.TrimSuffix(o, "/")] = true
	}
	verify := opts.Verifier
	if verify == nil {
		if verify, err = s.issuerVerifier(opts.ResourceURI); err != nil {
			return nil, err
		}
	}
	if s.main, err = s.newEndpoint(opts.ResourceURI, opts.PublicURL+"/.well-known/oauth-protected-resource/mcp", verify); err != nil {
		return nil, err
	}
	s.tools = s.toolFuncs()
	s.tracer = tracing.Tracer(opts.Tracing)
	if s.opts.VerifierFor == nil {
		s.opts.VerifierFor = s.verifierFor
	}
	s.gw = newGateway(s)
	if err := s.encodeStatic(); err != nil {
		return nil, err
	}
	s.legacy = s.newLegacyHandler()
	return s, nil
}

// issuerVerifier verifies the IdP's JWTs for resource (cached).
func (s *Server) issuerVerifier(resource string) (bearer.Verifier, error) {
	verify, err := bearer.NewJWTVerifier(s.opts.Issuer, []string{resource}, s.opts.HTTPClient, s.opts.Now)
	if err != nil {
		return nil, fmt.Errorf("mcpapi: %w", err)
	}
	return bearer.Cached(verify, 10000, s.opts.Now), nil
}

// serverMeta is the _meta every modern result carries (serverInfo
// pre-encoded).
func (s *Server) serverMeta() mcp.Meta {
	return mcp.Meta{mcp.MetaKeyServerInfo: s.implJSON}
}

// withResultType prefixes an SDK result's encoding with resultType: the SDK's
// types keep it in an unexported field.
func withResultType(rt string, b []byte) []byte {
	if len(b) < 2 || b[0] != '{' {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	out = append(out, `{"resultType":"`...)
	out = append(out, rt...)
	out = append(out, '"')
	if len(b) > 2 {
		out = append(out, ',')
	}
	return append(out, b[1:]...)
}

const listTTL = 5 * time.Minute

func (s *Server) encodeStatic() error {
	disc := &mcp.DiscoverResult{
		Meta:              s.serverMeta(),
		Cacheable:         mcp.Cacheable{TTLMs: int(listTTL / time.Millisecond), CacheScope: "public"},
		SupportedVersions: supportedVersions,
		Capabilities:      &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		Instructions:      "credbroker connects the user's accounts at OAuth providers and keeps their tokens: call connect_account before acting on a provider; tokens are never returned.",
	}
	b, err := json.Marshal(disc)
	if err != nil {
		return err
	}
	s.discoverJSON = withResultType("complete", b)
	list := &mcp.ListToolsResult{
		Meta:      s.serverMeta(),
		Cacheable: mcp.Cacheable{TTLMs: int(listTTL / time.Millisecond), CacheScope: "public"},
		Tools:     toolDefs(),
	}
	if b, err = json.Marshal(list); err != nil {
		return err
	}
	s.toolsListJSON = withResultType("complete", b)
	return nil
}

// Routes is where Register mounts the routes: an *http.ServeMux, or the
// API side of the broker's site (web.Site.API), which keeps page headers
// and cookies away from them.
type Routes interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// Register mounts the MCP endpoint and the metadata routes on mux.
func (s *Server) Register(mux Routes) {
	mux.HandleFunc("POST /mcp", s.serveMCP)
	mux.HandleFunc("GET /mcp", s.methodNotAllowed)
	mux.HandleFunc("DELETE /mcp", s.methodNotAllowed)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource", s.serveMetadata)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp", s.serveMetadata)
	if s.opts.Upstreams != nil {
		s.gw.register(mux)
	}
}

// ServeHTTP serves the MCP endpoint alone (POST; other methods get 405).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.methodNotAllowed(w, r)
		return
	}
	s.serveMCP(w, r)
}

func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", "POST")
	writeRPCError(w, http.StatusMethodNotAllowed, nil, codeInvalidRequest,
		"Method not allowed: this server is stateless and answers POST only (no SSE stream, no sessions)", nil)
}

// originAllowed reports whether a request's Origin (if any) is acceptable.
func (s *Server) originAllowed(origin string) bool {
	if origin == "" || s.origins[origin] {
		return true
	}
	if !s.opts.DevMode {
		return false
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Path != "" {
		return false
	}
	return loopback.Host(u.Hostname())
}

// envelopeOK checks that body is one JSON-RPC request or notification:
// msg as the one-pass parser decoded it (fast), else decoded here with
// encoding/json. Otherwise it answers the error and is false.
func envelopeOK(w http.ResponseWriter, body []byte, msg *rpcMessage, fast bool) bool {
	if !fast {
		*msg = rpcMessage{}
		if err := json.Unmarshal(body, msg); err != nil {
			writeRPCError(w, http.StatusBadRequest, nil, codeParse, "Parse error: the body is not one JSON-RPC message", nil)
			return false
		}
	}
	if msg.JSONRPC != "2.0" || msg.Method == "" {
		writeRPCError(w, http.StatusBadRequest, validOrNull(msg.ID), codeInvalidRequest, `Invalid Request: want "jsonrpc":"2.0" and a method`, nil)
		return false
	}
	if !msg.isNotification() && !validID(msg.ID) {
		writeRPCError(w, http.StatusBadRequest, nil, codeInvalidRequest, "Invalid Request: id must be a string or a number", nil)
		return false
	}
	return true
}

func (s *Server) serveMCP(w http.ResponseWriter, r *http.Request) {
	w, ow := s.observeStart(w, r)
	defer s.observeEnd(ow)
	info, body, ok := s.admit(w, r, s.main)
	if !ok {
		return
	}
	// One decode serves routing and, for modern requests, the method.
	var msg rpcMessage
	var p modernParams
	fast := fastParse(body, &msg, &p)
	if !fast {
		p = modernParams{}
	}
	if !envelopeOK(w, body, &msg, fast) {
		return
	}
	metaV := p.Meta.Version
	if !fast && len(msg.Params) > 0 && string(msg.Params) != "null" {
		if perr := json.Unmarshal(msg.Params, &p); perr == nil {
			metaV = p.Meta.Version
		} else {
			var env struct {
				Meta struct {
					Version     *string `json:"io.modelcontextprotocol/protocolVersion"`
					TraceParent string  `json:"traceparent"`
					TraceState  string  `json:"tracestate"`
				} `json:"_meta"`
			}
			if err := json.Unmarshal(msg.Params, &env); err != nil {
				writeRPCError(w, http.StatusBadRequest, validOrNull(msg.ID), codeInvalidParams, "Invalid params: params must be an object with an optional _meta object", nil)
				return
			}
			p.Meta.TraceParent, p.Meta.TraceState = env.Meta.TraceParent, env.Meta.TraceState
			if metaV = env.Meta.Version; metaV != nil && *metaV == versionModern {
				writeRPCError(w, http.StatusBadRequest, msg.ID, codeInvalidParams, "Invalid params: "+paramsProblem(msg.Params, perr), nil)
				return
			}
		}
	}
	note(w, func(o *observedWriter) { o.method, o.tool = msg.Method, p.Name })
	header := canonical(r.Header, "Mcp-Protocol-Version")
	ctx := s.traceStart(r.Context(), w, p.Meta.TraceParent, p.Meta.TraceState)
	switch chooseEra(w, &msg, metaV, header) {
	case eraLegacy:
		// The SDK's handler learns the principal from the context.
		s.serveLegacy(w, r.WithContext(withPrincipal(ctx, info.Principal)), body, &msg, info)
	case eraModern:
		// The modern path hands info on itself: no copy of r for ctx.
		s.serveModern(ctx, w, r, &msg, &p, header, info)
	}
}

// admit applies the transport's checks to a request to ep: Origin,
// Content-Type, the bearer token (for ep's resource), the body (capped,
// no batch). On failure it writes the answer and ok is false.
func (s *Server) admit(w http.ResponseWriter, r *http.Request, ep *endpoint) (info bearer.TokenInfo, body []byte, ok bool) {
	if !s.originAllowed(canonical(r.Header, "Origin")) {
		writeRPCError(w, http.StatusForbidden, nil, codeInvalidRequest, "Forbidden: Origin not allowed", nil)
		return info, nil, false
	}
	if ct := canonical(r.Header, "Content-Type"); ct == "" || !isJSONType(ct) {
		writeRPCError(w, http.StatusUnsupportedMediaType, nil, codeInvalidRequest, "Content-Type must be application/json", nil)
		return info, nil, false
	}
	info, ok, failed := s.authenticate(w, r, ep)
	if failed != nil {
		body, _ := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
		s.verifyFailed(w, body, failed)
		return info, nil, false
	}
	if !ok {
		return info, nil, false
	}
	body, err := readBody(w, r, s.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, nil, codeInvalidRequest,
				fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), nil)
			return info, nil, false
		}
		writeRPCError(w, http.StatusBadRequest, nil, codeInvalidRequest, "cannot read request body", nil)
		return info, nil, false
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		writeRPCError(w, http.StatusBadRequest, nil, codeInvalidRequest, "batch requests are not supported", nil)
		return info, nil, false
	}
	return info, body, true
}

// readBody reads r's body, at most max bytes (more: an
// *http.MaxBytesError). A body whose length the request declares, within
// max, is read into a buffer of that size (net/http ends it there).
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	rd := http.MaxBytesReader(w, r.Body, max)
	if n := r.ContentLength; n > 0 && n <= max {
		b := make([]byte, n)
		if _, err := io.ReadFull(rd, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(rd)
}

// era is how a request is served.
type era int

const (
	eraRefused era = iota // answered already (an error)
	eraModern
	eraLegacy
)

// chooseEra picks the era of msg from its _meta protocolVersion (metaV,
// nil when absent) and its MCP-Protocol-Version header, answering what
// neither era takes.
func chooseEra(w http.ResponseWriter, msg *rpcMessage, metaV *string, header string) era {
	switch {
	case msg.Method == "initialize":
		if metaV != nil {
			// A request that claims a modern version is in the modern era,
			// where initialize no longer exists.
			writeRPCError(w, http.StatusNotFound, msg.ID, codeMethodNotFound,
				"Method not found: \"initialize\" is not part of protocol "+versionModern+"; send server/discover instead", nil)
			return eraRefused
		}
		return eraLegacy
	case metaV != nil && header != "" && header != *metaV:
		writeRPCError(w, http.StatusBadRequest, msg.ID, codeHeaderMismatch,
			fmt.Sprintf("Header mismatch: MCP-Protocol-Version header %s does not match _meta protocolVersion %s", quote(header), quote(*metaV)), nil)
		return eraRefused
	case metaV != nil && *metaV == versionModern, metaV == nil && header == versionModern:
		return eraModern
	case metaV != nil && *metaV != versionLegacy:
		writeRPCError(w, http.StatusBadRequest, msg.ID, codeUnsupportedVersion, "Unsupported protocol version",
			mcp.UnsupportedProtocolVersionData{Supported: supportedVersions, Requested: *metaV})
		return eraRefused
	case metaV == nil && header != "" && header != versionLegacy:
		writeRPCError(w, http.StatusBadRequest, msg.ID, codeUnsupportedVersion, "Unsupported protocol version",
			mcp.UnsupportedProtocolVersionData{Supported: supportedVersions, Requested: header})
		return eraRefused
	}
	return eraLegacy
}

// canonical is h.Get(key) for a key in canonical form, as net/http
// stores the headers it parsed, without canonicalizing key on every call
// (Get does; Values too, which a key in canonical form indexes directly).
func canonical(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func validOrNull(id json.RawMessage) json.RawMessage {
	if validID(id) {
		return id
	}
	return nil
}

func isJSONType(ct string) bool {
	if ct == "application/json" {
		return true // what hosts send, without parsing it
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}
