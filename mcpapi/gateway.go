package mcpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/requeststate"
	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// The gateway: POST /mcp/u/{provider} is a remote MCP server (a provider
// of kind mcp) relayed as the person, with the connection's upstream token
// the host never sees. Each endpoint is a protected resource of its own
// (its RFC 9728 metadata at /.well-known/oauth-protected-resource/mcp/u/
// {provider}; tokens must name it). Until the person is connected, the
// endpoint lists one tool, connect_account, and every call asks the person
// to connect (url elicitation, as connect_account on /mcp does); then it
// lists the upstream's tools (filtered by tools.allow/deny, sanitised) and
// relays calls, prompts, resources and completion, cursors verbatim. An
// upstream's input_required reaches the host as it is, its requestState
// sealed inside the gateway's own (internal/requeststate Gateway), and only
// when the host declared the input's kind. What runs as whom, and what
// happens when the upstream refuses (401: reconnect; 403
// insufficient_scope: step up), is decided by the connections layer.

// placeholderTool is the one tool of an endpoint whose person is not
// connected.
const placeholderTool = "connect_account"

// Limits of a relayed call.
const (
	maxInFlight      = 8
	maxPerMinute     = 600
	maxToolSchema    = 64 << 10
	maxDescription   = 4 << 10
	maxTitle         = 200
	maxInstructions  = 8 << 10
	maxUpstreamError = 1 << 10
	maxToolsListTTL  = 300_000 // ms
	// maxTools bounds one relayed tools/list page; the rest is dropped
	// (and logged).
	maxTools = 1000
	// maxAnswerOverhead is what an upstream's answer to a call may hold
	// beyond the result the gateway relays (the JSON-RPC envelope, the
	// upstream's own _meta): a larger answer is not read at all.
	maxAnswerOverhead = 1 << 20
)

// gateway serves the /mcp/u/{provider} endpoints of a Server.
type gateway struct {
	s *Server

	mu        sync.Mutex // guards the fields below
	endpoints map[string]*endpoint
	limits    map[limitKey]*limiter
	toolHash  map[toolHashKey][32]byte
	listeners map[listenKey]map[*listener]bool
	tools     map[toolsKey]cachedTools
	// toolsEpoch counts forgetTools calls: a list fetched before one is
	// not cached after it.
	toolsEpoch uint64

	// hostCaps are hosts' clientCapabilities objects as members.
	hostCaps bytesMemo[map[string]json.RawMessage]
}

func newGateway(s *Server) *gateway {
	return &gateway{s: s, endpoints: map[string]*endpoint{}, limits: map[limitKey]*limiter{}, toolHash: map[toolHashKey][32]byte{}}
}

// register mounts the gateway's routes.
func (g *gateway) register(mux Routes) {
	mux.HandleFunc("POST /mcp/u/{provider}", g.serve)
	mux.HandleFunc("GET /mcp/u/{provider}", g.s.methodNotAllowed)
	mux.HandleFunc("DELETE /mcp/u/{provider}", g.s.methodNotAllowed)
	mux.HandleFunc("GET /.well-known/oauth-protected-resource/mcp/u/{provider}", g.serveMetadata)
}

// endpoint returns provider name's endpoint (nil when name is not an MCP
// provider).
func (g *gateway) endpoint(name string) (*endpoint, error) {
	if _, _, err := g.s.opts.Connections.Gateway(name); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if ep := g.endpoints[name]; ep != nil {
		return ep, nil
	}
	resource := g.s.opts.Connections.GatewayEndpoint(name)
	verify := g.s.opts.VerifierFor(resource)
	ep, err := g.s.newEndpoint(resource, g.s.opts.PublicURL+"/.well-known/oauth-protected-resource/mcp/u/"+name, verify)
	if err != nil {
		return nil, err
	}
	g.endpoints[name] = ep
	return ep, nil
}

func (g *gateway) serveMetadata(w http.ResponseWriter, r *http.Request) {
	ep, err := g.endpoint(r.PathValue("provider"))
	if err != nil {
		writeRPCError(w, http.StatusNotFound, nil, codeInvalidRequest, "Not found: no MCP provider "+quote(r.PathValue("provider")), nil)
		return
	}
	writeMetadata(w, ep.metadataJSON)
}

// gwParams is the union of the params the gateway reads.
type gwParams struct {
	Meta           reqMeta                    `json:"_meta"`
	Name           string                     `json:"name"`
	Arguments      json.RawMessage            `json:"arguments"`
	InputResponses map[string]json.RawMessage `json:"inputResponses"`
	RequestState   string                     `json:"requestState"`
	Cursor         *string                    `json:"cursor"`
	URI            string                     `json:"uri"`
}

// gwFastParse decodes body's envelope into msg and its params into p in
// one pass (fastParse), exactly as encoding/json would; false (msg and p
// untouched) for a retry's inputResponses, which the gateway keeps as
// sent, and for anything fastParse leaves to encoding/json.
func gwFastParse(body []byte, msg *rpcMessage, p *gwParams) bool {
	var m rpcMessage
	var mp modernParams
	if !fastParse(body, &m, &mp) || mp.InputResponses != nil {
		return false
	}
	*msg = m
	*p = gwParams{Meta: mp.Meta, Name: mp.Name, Arguments: mp.Arguments, RequestState: mp.RequestState, Cursor: mp.Cursor, URI: mp.URI}
	return true
}

// gwCall is one request to a gateway endpoint.
type gwCall struct {
	id        json.RawMessage
	principal vault.Principal
	p         *provider.Provider
	up        provider.Upstream
	method    string
	raw       json.RawMessage // params as sent
	params    gwParams
	modern    bool
	// caps are the host's declared capabilities (raw for modern hosts).
	caps       capsInfo
	rawCaps    json.RawMessage
	clientName string
	// sse: the host accepts an event stream (progress is relayed).
	sse bool
	// header is the request's (its Mcp-Param headers are checked).
	header http.Header
	// digest is the arguments' digest, once computed (argDigest).
	digest []byte
}

func (g *gateway) serve(w http.ResponseWriter, r *http.Request) {
	s := g.s
	w, ow := s.observeStart(w, r)
	defer s.observeEnd(ow)
	name := r.PathValue("provider")
	ep, err := g.endpoint(name)
	if err != nil {
		writeRPCError(w, http.StatusNotFound, nil, codeInvalidRequest, "Not found: no MCP provider "+quote(name)+" at this broker", nil)
		return
	}
	info, body, ok := s.admit(w, r, ep)
	if !ok {
		return
	}
	c := &gwCall{}
	// One pass over the common shape (fastParse decodes exactly what
	// encoding/json would); a retry's inputResponses, which the gateway
	// keeps as sent, and anything unusual go through encoding/json.
	var msg rpcMessage
	fast := gwFastParse(body, &msg, &c.params)
	if !envelopeOK(w, body, &msg, fast) {
		return
	}
	c.id, c.principal, c.method, c.raw, c.sse = msg.ID, info.Principal, msg.Method, msg.Params, acceptsJSONAndSSE(r.Header.Values("Accept"))
	c.header = r.Header
	c.p, c.up, _ = s.opts.Connections.Gateway(name)
	var metaV *string
	if fast {
		metaV = c.params.Meta.Version
	} else if len(msg.Params) > 0 && string(msg.Params) != "null" {
		if err := json.Unmarshal(msg.Params, &c.params); err != nil {
			writeRPCError(w, http.StatusBadRequest, msg.ID, codeInvalidParams, "Invalid params: "+paramsProblem(msg.Params, err), nil)
			return
		}
		metaV = c.params.Meta.Version
	}
	note(w, func(o *observedWriter) { o.method, o.tool = msg.Method, c.params.Name })
	header := r.Header.Get("Mcp-Protocol-Version")
	ctx := withPrincipal(s.traceStart(r.Context(), w, c.params.Meta.TraceParent, c.params.Meta.TraceState), info.Principal)
	switch chooseEra(w, &msg, metaV, header) {
	case eraModern:
		cc, ok := s.modernChecks(w, r, &msg, &c.params.Meta, header)
		if !ok {
			return
		}
		c.modern, c.caps, c.rawCaps = true, cc, c.params.Meta.Capabilities
		if c.params.Meta.ClientInfo != nil {
			c.clientName = clientName(c.params.Meta.ClientInfo)
		}
		if msg.Method == "tools/call" || msg.Method == "prompts/get" || msg.Method == "resources/read" {
			if !g.nameHeaderOK(w, r, c) {
				return
			}
		}
		g.dispatch(ctx, w, c)
	case eraLegacy:
		note(w, func(o *observedWriter) { o.era = versionLegacy })
		g.serveLegacy(ctx, w, r, c)
	}
}

// nameHeaderOK checks Mcp-Name against the call's name (tool, prompt) or
// URI (resource).
func (g *gateway) nameHeaderOK(w http.ResponseWriter, r *http.Request, c *gwCall) bool {
	want := c.params.Name
	if c.method == "resources/read" {
		want = c.params.URI
	}
	got, ok := decodeHeaderValue(r.Header.Get("Mcp-Name"))
	switch {
	case r.Header.Get("Mcp-Name") == "":
		writeRPCError(w, http.StatusBadRequest, c.id, codeHeaderMismatch, "Header mismatch: the Mcp-Name header is required for "+c.method, nil)
		return false
	case !ok || got != want:
		writeRPCError(w, http.StatusBadRequest, c.id, codeHeaderMismatch, fmt.Sprintf("Header mismatch: Mcp-Name header does not match %s", quote(want)), nil)
		return false
	}
	return true
}

// serveLegacy serves a 2025-11-25 host: initialize (a sealed session id
// recording what it declared), then the same methods in that era's shapes.
func (g *gateway) serveLegacy(ctx context.Context, w http.ResponseWriter, r *http.Request, c *gwCall) {
	s := g.s
	if c.method == "initialize" {
		var ip struct {
			Capabilities *mcp.ClientCapabilities `json:"capabilities"`
			ClientInfo   *mcp.Implementation     `json:"clientInfo"`
		}
		_ = json.Unmarshal(c.raw, &ip)
		ls := legacySession{Issuer: c.principal.Issuer, Subject: c.principal.Subject, Expires: s.opts.Now().Add(legacySessionTTL).Unix()}
		if ip.Capabilities != nil && ip.Capabilities.Elicitation != nil && ip.Capabilities.Elicitation.URL != nil {
			ls.URLCapable = true
		}
		if ip.ClientInfo != nil {
			ls.ClientName = clientName(ip.ClientInfo)
		}
		w.Header().Set("Mcp-Session-Id", sealSession(s.opts.StateKeys, ls))
		ctx, cancel := context.WithTimeout(ctx, c.up.CallTimeout) // for the upstream's instructions
		defer cancel()
		res := &mcp.InitializeResult{ProtocolVersion: versionLegacy, ServerInfo: g.serverInfo(c.p),
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Prompts: &mcp.PromptCapabilities{},
				Resources: &mcp.ResourceCapabilities{}, Completions: &mcp.CompletionCapabilities{}},
			Instructions: g.instructions(ctx, c)}
		g.writeResult(w, c, res)
		return
	}
	if c.id == nil {
		w.WriteHeader(http.StatusAccepted) // notifications/initialized and the like
		return
	}
	if ls, ok := openSession(s.opts.StateKeys, r.Header.Get("Mcp-Session-Id"), c.principal, s.opts.Now()); ok {
		c.caps.urlCapable, c.clientName = ls.URLCapable, ls.ClientName
	}
	g.dispatch(ctx, w, c)
}

func (g *gateway) serverInfo(p *provider.Provider) *mcp.Implementation {
	return &mcp.Implementation{Name: "credbroker-" + p.Name, Title: p.DisplayName + " (through credbroker)", Version: g.s.opts.ServerVersion}
}

// dispatch answers one method.
func (g *gateway) dispatch(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	switch c.method {
	case "ping":
		if c.modern {
			g.methodNotFound(w, c) // removed in 2026-07-28
			return
		}
		g.writeResult(w, c, struct{}{})
	case "server/discover":
		if !c.modern {
			g.methodNotFound(w, c)
			return
		}
		g.discover(ctx, w, c)
	case "tools/list":
		g.listTools(ctx, w, c)
	case "tools/call", "prompts/get", "resources/read":
		g.call(ctx, w, c)
	case "prompts/list", "resources/list", "resources/templates/list", "completion/complete":
		g.list(ctx, w, c)
	case "subscriptions/listen":
		if !c.modern {
			g.methodNotFound(w, c)
			return
		}
		g.listen(ctx, w, c)
	default:
		g.methodNotFound(w, c)
	}
}

func (g *gateway) methodNotFound(w http.ResponseWriter, c *gwCall) {
	status := http.StatusNotFound
	if !c.modern {
		status = http.StatusOK // 2025-11-25 carries JSON-RPC errors in a 200 response
	}
	writeRPCError(w, status, c.id, codeMethodNotFound, "Method not found: "+quote(c.method), nil)
}

// request is the connections request of c.
func (g *gateway) request(c *gwCall, canAsk bool) connections.Request {
	return connections.Request{Principal: c.principal, Provider: c.p.Name, ClientName: c.clientName, Via: "mcp",
		CanAsk: canAsk && c.caps.urlCapable, ReuseOpen: !c.modern}
}

// quietly answers whether c's person is ready, starting no connect
// request (listing must never ask). down is the storage outage that kept
// it from knowing (nil otherwise): never answered as "not connected".
func (g *gateway) quietly(ctx context.Context, c *gwCall) (r connections.Ready, ok bool, down error) {
	o, err := g.s.opts.Connections.Upstream(ctx, g.request(c, false), "", connections.NoAnswer)
	if errors.Is(err, vault.ErrUnavailable) {
		return r, false, err
	}
	r, ok = o.(connections.Ready)
	return r, err == nil && ok, nil
}

// discover declares tools with listChanged (the gateway's own list changes
// when the person connects), and, for a connected person, the upstream's
// prompts, resources (without subscribe: resource subscriptions are not
// relayed) and completions.
func (g *gateway) discover(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	// The upstream's session (its capabilities, its instructions) is
	// waited for at most the entry's call timeout, in all.
	ctx, cancel := context.WithTimeout(ctx, c.up.CallTimeout)
	defer cancel()
	caps := &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}}
	_, up, down := g.upstreamCapabilities(ctx, c)
	if down != nil {
		g.failed(w, c, down)
		return
	}
	if up != nil {
		caps.Prompts, caps.Completions = up.Prompts, up.Completions
		if up.Resources != nil {
			res := *up.Resources
			res.Subscribe = false
			caps.Resources = &res
		}
	}
	res := &mcp.DiscoverResult{Meta: g.s.serverMeta(), Cacheable: mcp.Cacheable{TTLMs: 0, CacheScope: "private"},
		SupportedVersions: supportedVersions, Capabilities: caps, Instructions: g.instructions(ctx, c)}
	g.writeResult(w, c, res)
}

// upstreamCapabilities are the capabilities of the upstream session of c's
// person (nil when the person is not connected or it cannot be opened),
// and the person's connection; down is the store being unavailable (as
// quietly says).
func (g *gateway) upstreamCapabilities(ctx context.Context, c *gwCall) (r connections.Ready, caps *mcp.ServerCapabilities, down error) {
	r, ok, down := g.quietly(ctx, c)
	if !ok {
		return r, nil, down
	}
	cs, err := g.s.opts.Upstreams.Session(ctx, r.Target)
	if err != nil || cs.InitializeResult() == nil {
		return r, nil, nil
	}
	return r, cs.InitializeResult().Capabilities, nil
}

// instructions are the upstream's, sanitised and capped (or dropped), or
// the gateway's own while the person is not connected.
func (g *gateway) instructions(ctx context.Context, c *gwCall) string {
	own := fmt.Sprintf("This is %s through credbroker: the broker keeps the %s account's tokens. Until the account is connected, call connect_account.", c.p.DisplayName, c.p.DisplayName)
	if !c.up.RelayInstructions {
		return own
	}
	r, ok, _ := g.quietly(ctx, c)
	if !ok {
		return own
	}
	cs, err := g.s.opts.Upstreams.Session(ctx, r.Target)
	if err != nil || cs.InitializeResult() == nil || cs.InitializeResult().Instructions == "" {
		return own
	}
	return sanitizeText(cs.InitializeResult().Instructions, maxInstructions)
}

// placeholder is the tool of an endpoint whose person is not connected.
func placeholder(p *provider.Provider) *mcp.Tool {
	return &mcp.Tool{Name: placeholderTool, Title: "Connect " + p.DisplayName,
		Description: fmt.Sprintf("Connect your %s account to credbroker. %s's own tools are listed once it is connected; the broker keeps the account's tokens and never shows them.", p.DisplayName, p.DisplayName),
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{Title: "Connect " + p.DisplayName, ReadOnlyHint: false, DestructiveHint: boolPtr(false), IdempotentHint: true, OpenWorldHint: boolPtr(true)}}
}

func (g *gateway) listTools(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	r, ok := g.listable(ctx, w, c)
	if !ok {
		return
	}
	page, ok, err := g.toolsPage(ctx, w, c, r, false)
	switch {
	case err != nil:
		g.relayFailed(ctx, w, c, r, err)
	case ok:
		writeRPCResult(w, c.id, page.body)
	}
}

// toolsPage returns the page of the upstream's tools c asks for,
// sanitised and encoded in c's era: a first page from the cache while it
// is fresh (unless relist), else relayed (and then cached with its
// tools' x-mcp-header bindings). A relay that failed is err; an answer
// that cannot be relayed (too large) was answered on w instead (when w is
// not nil) and ok is false.
func (g *gateway) toolsPage(ctx context.Context, w http.ResponseWriter, c *gwCall, r connections.Ready, relist bool) (cachedTools, bool, error) {
	first := c.params.Cursor == nil
	key := toolsKey{principal: c.principal, conn: r.Conn.ID, gen: toolsGeneration(r.Conn), modern: c.modern, provider: c.p.Name}
	if first && !relist {
		if e, ok := g.cachedToolsList(key); ok {
			e.cached = true
			return e, true, nil
		}
	}
	epoch := g.toolsEpochNow()
	params := &mcp.ListToolsParams{Meta: g.upstreamMeta(c)}
	if !first {
		params.Cursor = *c.params.Cursor
	}
	up, _, err := relayAs(ctx, g, c, r, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.ListToolsResult, error) {
		return g.s.opts.Upstreams.ListTools(ctx, cs, params)
	})
	if err != nil {
		return cachedTools{}, false, err
	}
	// up may be the session's cached result (the go-sdk keeps lists for
	// their ttl): a copy is changed, never it.
	res := *up
	res.Tools = g.sanitizeTools(ctx, c, r, up.Tools)
	// The host may keep the list as long as the upstream allows, at most
	// maxToolsListTTL (0, the go-sdk's default and a 2025-11-25 server's
	// only value, says ask again each time). This replica keeps it for
	// that long too, or maxToolsListTTL when the upstream gave none: the
	// cache key changes with the connection and its grant, and a
	// list_changed the broker hears empties it.
	ttl := min(max(res.TTLMs, 0), maxToolsListTTL)
	keep := ttl
	if keep == 0 {
		keep = maxToolsListTTL
	}
	res.Meta, res.Cacheable = g.s.serverMeta(), mcp.Cacheable{TTLMs: ttl, CacheScope: "private"}
	b, ok := g.encodeResult(w, c, &res)
	if !ok {
		return cachedTools{}, false, nil
	}
	e := cachedTools{body: b, until: g.s.opts.Now().Add(time.Duration(keep) * time.Millisecond),
		bindings: make(map[string][]paramBinding, len(res.Tools)), whole: res.NextCursor == ""}
	for _, t := range res.Tools {
		e.bindings[t.Name] = toolParamBindings(t.InputSchema)
	}
	if first {
		g.cacheToolsList(key, e, epoch)
	}
	return e, true, nil
}

// toolsEpochNow is how often lists were forgotten.
func (g *gateway) toolsEpochNow() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.toolsEpoch
}

// listedTools is the first page of the upstream's tools as c's person
// sees them (listed for the purpose when the cache holds none, or
// relist); ok is false when the list cannot be had, err the relay's
// failure when it failed.
func (g *gateway) listedTools(ctx context.Context, c *gwCall, r connections.Ready, relist bool) (page cachedTools, ok bool, err error) {
	lc := *c
	lc.method, lc.params = "tools/list", gwParams{Meta: c.params.Meta}
	page, _, err = g.toolsPage(ctx, nil, &lc, r, relist)
	return page, err == nil && page.bindings != nil, err
}

// callable is the first page of the person's tools and whether c's tool
// may be called: it is on that page, or the page cannot tell (the list
// could not be had, or it has more pages). A name missing from a cached
// page is looked for once more in a list fetched now: the upstream may
// have added the tool since, and the host may have seen it listed by
// another replica.
func (g *gateway) callable(ctx context.Context, c *gwCall, r connections.Ready) (cachedTools, bool) {
	page, listed, _ := g.listedTools(ctx, c, r, false)
	if _, known := page.bindings[c.params.Name]; known || !listed || !page.whole {
		return page, true
	}
	if !page.cached {
		return page, false
	}
	page, listed, _ = g.listedTools(ctx, c, r, true)
	_, known := page.bindings[c.params.Name]
	return page, known || !listed || !page.whole
}

// The tools/list cache: per replica, per person, connection and grant
// (a step-up or a reconnect for other scopes is another list), for the
// list's ttl (at most maxToolsListTTL), first pages only.
type toolsKey struct {
	principal      vault.Principal
	provider, conn string
	gen            toolsGen
	modern         bool
}

type cachedTools struct {
	body  []byte
	until time.Time
	// bindings are the listed tools' x-mcp-header bindings, by tool: a
	// key for every tool listed, nil when it binds none.
	bindings map[string][]paramBinding
	// whole: the page is the whole list (no nextCursor), so a name it
	// lacks is no tool of the upstream's that the host may call.
	whole bool
	// cached: this copy came from the cache (set on the copy returned).
	cached bool
}

// maxCachedLists bounds the cache; beyond it the cache starts over.
const maxCachedLists = 10000

// toolsGen names what the upstream's answer to tools/list may depend on:
// the connection (when it was made) and the scopes it was granted.
type toolsGen struct {
	created      int64 // Unix seconds
	createdNanos int
	scopes       string
}

func toolsGeneration(c vault.Connection) toolsGen {
	return toolsGen{created: c.Created.Unix(), createdNanos: c.Created.Nanosecond(), scopes: strings.Join(c.Scopes, " ")}
}

func (g *gateway) cachedToolsList(k toolsKey) (cachedTools, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.tools[k]
	if !ok || !g.s.opts.Now().Before(e.until) {
		return cachedTools{}, false
	}
	return e, true
}

// cacheToolsList caches e under k unless lists were forgotten since
// epoch (toolsEpochNow) was read: e may be the list before a change. One
// counter for everyone: a change is rare, and a list left uncached is
// only fetched again.
func (g *gateway) cacheToolsList(k toolsKey, e cachedTools, epoch uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.toolsEpoch != epoch {
		return
	}
	if g.tools == nil || len(g.tools) >= maxCachedLists {
		g.tools = map[toolsKey]cachedTools{}
	}
	g.tools[k] = e
}

// forgetTools drops a person's cached lists of provider (their connection
// changed).
func (g *gateway) forgetTools(pr vault.Principal, provider string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.toolsEpoch++
	for k := range g.tools {
		if k.principal == pr && k.provider == provider {
			delete(g.tools, k)
		}
	}
}

// listable is c's person's connection for a list; when there is none
// (the list of a person who must connect first) or the store is
// unavailable, the answer is written and ok is false.
func (g *gateway) listable(ctx context.Context, w http.ResponseWriter, c *gwCall) (r connections.Ready, ok bool) {
	r, ok, down := g.quietly(ctx, c)
	switch {
	case down != nil:
		g.failed(w, c, down)
		return r, false
	case !ok:
		g.unconnectedList(w, c)
		return r, false
	}
	return r, true
}

// unconnectedList answers a list of a person who must connect first:
// tools/list the placeholder (private, not to be kept: ttlMs 0), the
// other lists, and completion, empty.
func (g *gateway) unconnectedList(w http.ResponseWriter, c *gwCall) {
	var res any
	switch c.method {
	case "tools/list":
		res = &mcp.ListToolsResult{Meta: g.s.serverMeta(), Cacheable: mcp.Cacheable{TTLMs: 0, CacheScope: "private"}, Tools: []*mcp.Tool{placeholder(c.p)}}
	case "prompts/list":
		res = &mcp.ListPromptsResult{Prompts: []*mcp.Prompt{}}
	case "resources/list":
		res = &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	case "resources/templates/list":
		res = &mcp.ListResourceTemplatesResult{ResourceTemplates: []*mcp.ResourceTemplate{}}
	default: // completion/complete
		res = &mcp.CompleteResult{Completion: mcp.CompletionResultDetails{Values: []string{}}}
	}
	g.writeResult(w, c, res)
}

// list relays the listing methods (prompts, resources, templates) and
// completion; unconnected, they are empty.
func (g *gateway) list(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	r, ok := g.listable(ctx, w, c)
	if !ok {
		return
	}
	meta := g.upstreamMeta(c)
	res, _, err := g.relay(ctx, c, r, func(ctx context.Context, cs *mcp.ClientSession) (any, error) {
		switch c.method {
		case "prompts/list":
			var p mcp.ListPromptsParams
			return decodeInto(c.raw, &p, func() (any, error) { p.Meta = meta; return cs.ListPrompts(ctx, &p) })
		case "resources/list":
			var p mcp.ListResourcesParams
			return decodeInto(c.raw, &p, func() (any, error) { p.Meta = meta; return cs.ListResources(ctx, &p) })
		case "resources/templates/list":
			var p mcp.ListResourceTemplatesParams
			return decodeInto(c.raw, &p, func() (any, error) { p.Meta = meta; return cs.ListResourceTemplates(ctx, &p) })
		}
		var p mcp.CompleteParams
		return decodeInto(c.raw, &p, func() (any, error) { p.Meta = meta; return cs.Complete(ctx, &p) })
	})
	if err != nil {
		g.relayFailed(ctx, w, c, r, err)
		return
	}
	g.writeResult(w, c, sanitizeListed(res))
}

// sanitizeListed is a relayed list of prompts, resources or resource
// templates, or a prompt, with their titles and descriptions cleaned and
// capped as tools' are: copies, since the go-sdk hands out the lists it keeps
// cached. Other results are returned as they are.
func sanitizeListed(res any) any {
	switch r := res.(type) {
	case *mcp.ListPromptsResult:
		v := *r
		v.Prompts = cleaned(r.Prompts, func(p *mcp.Prompt) {
			p.Title, p.Description = sanitizeText(p.Title, maxTitle), sanitizeText(p.Description, maxDescription)
			p.Arguments = cleaned(p.Arguments, func(a *mcp.PromptArgument) {
				a.Title, a.Description = sanitizeText(a.Title, maxTitle), sanitizeText(a.Description, maxDescription)
			})
		})
		return &v
	case *mcp.ListResourcesResult:
		v := *r
		v.Resources = cleaned(r.Resources, func(x *mcp.Resource) {
			x.Title, x.Description = sanitizeText(x.Title, maxTitle), sanitizeText(x.Description, maxDescription)
		})
		return &v
	case *mcp.ListResourceTemplatesResult:
		v := *r
		v.ResourceTemplates = cleaned(r.ResourceTemplates, func(x *mcp.ResourceTemplate) {
			x.Title, x.Description = sanitizeText(x.Title, maxTitle), sanitizeText(x.Description, maxDescription)
		})
		return &v
	case *mcp.GetPromptResult:
		// The prompt's description (its messages are its content, relayed
		// as they are).
		v := *r
		v.Description = sanitizeText(r.Description, maxDescription)
		return &v
	}
	return res
}

// cleaned is a copy of list (nil elements dropped) whose elements are
// copies that clean changed.
func cleaned[T any](list []*T, clean func(*T)) []*T {
	if list == nil {
		return nil
	}
	out := make([]*T, 0, len(list))
	for _, x := range list {
		if x != nil {
			x = new(*x)
			clean(x)
			out = append(out, x)
		}
	}
	return out
}

// decodeInto decodes the host's params into p (its _meta dropped: the
// upstream gets the broker's) and runs do.
func decodeInto[P any](raw json.RawMessage, p *P, do func() (any, error)) (any, error) {
	if len(raw) > 0 && string(raw) != "null" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, hostParamsError{&rpcError{Code: codeInvalidParams, Message: "Invalid params: params must be an object"}}
		}
		delete(m, "_meta")
		b, _ := json.Marshal(m)
		if err := json.Unmarshal(b, p); err != nil {
			return nil, hostParamsError{&rpcError{Code: codeInvalidParams, Message: "Invalid params: " + paramsProblem(b, err)}}
		}
	}
	return do()
}

// hostParamsError: the host's own params were refused before anything was
// relayed.
type hostParamsError struct{ e *rpcError }

func (h hostParamsError) Error() string { return h.e.Message }

// call answers tools/call, prompts/get and resources/read: the person
// connects first when they must; then the call is relayed, and an
// upstream's input_required reaches the host wrapped in the gateway's
// sealed state.
func (g *gateway) call(ctx context.Context, w http.ResponseWriter, c *gwCall) {
	s := g.s
	var st requeststate.Gateway
	if c.params.RequestState != "" {
		digest, ok := g.argDigest(w, c)
		if !ok {
			return
		}
		want := requeststate.Gateway{Principal: c.principal, Provider: c.p.Name, Method: c.method, Name: c.callName(), ArgDigest: digest}
		var err error
		if st, err = requeststate.OpenGateway(s.opts.StateKeys, c.params.RequestState, want, s.opts.Now()); err != nil {
			writeRPCError(w, g.errStatus(c), c.id, codeInvalidParams, invalidState, nil)
			return
		}
	}
	answer := connections.NoAnswer
	if st.Grant != "" {
		a, bad := g.answer(c, connectKey(c.p))
		if bad != nil {
			writeRPCErrorValue(w, g.errStatus(c), c.id, bad)
			return
		}
		answer = a
	}
	o, err := s.opts.Connections.Upstream(ctx, g.request(c, true), st.Grant, answer)
	if err != nil {
		g.failed(w, c, err)
		return
	}
	r, ready := o.(connections.Ready)
	if !ready {
		if digest, ok := g.argDigest(w, c); ok {
			g.notReady(w, c, o, digest)
		}
		return
	}
	if st.Upstream != "" && st.Conn != r.Conn.ID {
		// The connection was replaced since the upstream asked.
		writeRPCError(w, g.errStatus(c), c.id, codeInvalidParams, invalidState, nil)
		return
	}
	if st.Grant != "" {
		// The person just connected (or was upgraded): the endpoint's
		// tools changed.
		g.changed(c, r)
	}
	if c.method == "tools/call" && c.params.Name == placeholderTool {
		if r.Conn.ID != "" {
			// The connection is ready, yet a list may have met the
			// upstream's refusal (403 insufficient_scope, 401) and
			// answered the placeholder, or an empty list of prompts or
			// resources: the upstream is asked first (its tools listed,
			// then the other lists it says it has, within the call's
			// limits; a refused list is never cached), and a refusal asks
			// the person to step up or reconnect here, where the link can
			// be given, rather than saying connected while a list stays
			// the placeholder or empty.
			release, busy := g.admitCall(c)
			if busy != "" {
				g.toolError(w, c, busy)
				return
			}
			lctx, cancel := context.WithTimeout(ctx, c.up.CallTimeout)
			_, _, err := g.listedTools(lctx, c, r, false)
			if err == nil {
				err = g.otherLists(lctx, c, r)
			}
			cancel()
			release()
			if refused(err) {
				g.relayFailed(ctx, w, c, r, err)
				return
			}
		}
		g.connected(w, c, r)
		return
	}
	unknown := func() {
		writeRPCError(w, g.errStatus(c), c.id, codeInvalidParams, "Invalid params: unknown tool "+quote(c.params.Name), nil)
	}
	if c.method == "tools/call" && !c.up.Tools.Allowed(c.params.Name) {
		unknown()
		return
	}
	release, busy := g.admitCall(c)
	if busy != "" {
		g.toolError(w, c, busy)
		return
	}
	defer release()
	// The call's time covers the session and the list it may need first:
	// an upstream that does not answer those answers within it too. What
	// a refusal starts (a connect request, a reconnect by ID-JAG) runs on
	// the host's own time (hostCtx), not what the upstream left of it.
	hostCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, c.up.CallTimeout)
	defer cancel()
	if c.method == "tools/call" {
		// A tool the person's list does not have (never listed, or
		// dropped as the upstream's tools were sanitised) is not called.
		// The list is had within the call's admission: a list the call
		// needs is one more upstream request.
		page, ok := g.callable(ctx, c, r)
		if !ok {
			unknown()
			return
		}
		if c.modern {
			// SEP-2243: the host's Mcp-Param headers must say what the
			// body says; the upstream's are written from the body.
			want, problem := checkParamHeaders(c.header, c.params.Arguments, page.bindings[c.params.Name])
			if problem != "" {
				writeRPCError(w, http.StatusBadRequest, c.id, codeHeaderMismatch, "Header mismatch: "+problem, nil)
				return
			}
			ctx = mcpup.WithParamHeaders(ctx, want)
		}
	}
	upstreamState, relink := "", st.Upstream == relinkState
	if st.Grant == "" && !relink {
		upstreamState = st.Upstream
	}
	meta := g.upstreamMeta(c)
	extendDeadline(w, c)
	w, progressToken, stop := g.progressRelay(w, c)
	defer stop()
	if progressToken != "" {
		meta["progressToken"] = progressToken
	}
	// The upstream's exchange ends once the host's answer was written
	// (flushRPCResult): reading what the upstream sends after
	// its answer does not compete with writing the host's.
	var tr mcpup.ToolResult
	defer func() { tr.Finish() }()
	// sent is the upstream's result as it was sent when it asks for input
	// through the go-sdk (mcpup.InputResult; the pool's own exchange has
	// it in tr.Raw): its input requests are relayed verbatim.
	var sent json.RawMessage
	res, _, err := g.relay(ctx, c, r, func(ctx context.Context, cs *mcp.ClientSession) (any, error) {
		defer func() { sent = mcpup.InputResult(ctx) }()
		responses := g.upstreamResponses(c)
		if relink {
			// The upstream asked for links (-32042): the retry is the call
			// again, without the answers it could not read.
			responses = nil
		}
		switch c.method {
		case "prompts/get":
			var p mcp.GetPromptParams
			return decodeInto(c.raw, &p, func() (any, error) {
				p.Meta, p.InputResponses, p.RequestState = meta, responses, upstreamState
				return cs.GetPrompt(ctx, &p)
			})
		case "resources/read":
			var p mcp.ReadResourceParams
			return decodeInto(c.raw, &p, func() (any, error) {
				p.Meta, p.InputResponses, p.RequestState = meta, responses, upstreamState
				return cs.ReadResource(ctx, &p)
			})
		}
		var err error
		tr, err = g.s.opts.Upstreams.CallTool(ctx, cs, r.Target, &mcp.CallToolParams{Meta: meta, Name: c.params.Name, Arguments: c.callArgs(),
			InputResponses: responses, RequestState: upstreamState}, c.up.MaxResultBytes+maxAnswerOverhead)
		if err != nil {
			return nil, err
		}
		return relayedToolResult(tr, c.modern)
	})
	if err != nil {
		g.relayFailed(hostCtx, w, c, r, err)
		return
	}
	if in := inputRequestsOf(res); in != nil {
		in.sent = tr.Raw
		if in.sent == nil && sameInputs(in, res, sent) {
			in.sent = sent
		}
		if digest, ok := g.argDigest(w, c); ok {
			g.upstreamInput(w, c, r, digest, in)
		}
		return
	}
	if b, ok := g.encodeResult(w, c, sanitizeListed(res)); ok {
		flushRPCResult(w, c.id, b)
	}
}

// upstreamInput relays an upstream's input_required to the host: verbatim,
// its state sealed inside the gateway's; never an input kind the host did
// not declare, nor to a 2025-11-25 host (which cannot answer it).
func (g *gateway) upstreamInput(w http.ResponseWriter, c *gwCall, r connections.Ready, digest []byte, in *upstreamInputs) {
	if !c.modern {
		g.toolError(w, c, fmt.Sprintf("%s asks for more input before it can answer, which needs a 2026-07-28 client; this client speaks 2025-11-25. Nothing was done.", c.p.DisplayName))
		return
	}
	var cc hostCapabilities
	_ = json.Unmarshal(c.rawCaps, &cc)
	for key, req := range in.requests {
		if missing := missingCapability(req, cc, c.up.InputRequests); missing != "" {
			g.toolError(w, c, fmt.Sprintf("%s asks for input this client cannot give: it did not declare the capability %s (input %s). Nothing was done.",
				c.p.DisplayName, missing, quote(key)))
			return
		}
		// A link the person is asked to open is held to what the -32042
		// path relays, whatever era the upstream asked in.
		if e, ok := req.(*mcp.ElicitParams); ok && elicitMode(e) == "url" && !safeElicitURL(e.URL) {
			g.toolError(w, c, fmt.Sprintf("%s asked the person to open a link the broker does not relay (only https links of at most 2 KiB without user info). Nothing was done.", c.p.DisplayName))
			return
		}
	}
	st, err := requeststate.SealGateway(g.s.opts.StateKeys, requeststate.Gateway{Principal: c.principal, Provider: c.p.Name, Method: c.method,
		Name: c.callName(), ArgDigest: digest, Conn: r.Conn.ID, Upstream: in.state, Expires: g.s.opts.Now().Add(g.stateTTL())})
	if err != nil {
		g.toolError(w, c, fmt.Sprintf("%s answered with a continuation larger than the broker relays (%d bytes at most). Nothing was done.", c.p.DisplayName, requeststate.MaxUpstreamState))
		return
	}
	note(w, func(o *observedWriter) { o.outcome = telemetry.OutcomeInputRequired })
	res := inputRequiredResult{ResultType: "input_required", Meta: g.s.serverMeta(), InputRequests: in.requests, RequestState: st}
	var b []byte
	if sent := verbatimRequests(in.sent, in.requests); sent != nil {
		b, err = json.Marshal(struct {
			inputRequiredResult
			InputRequests map[string]json.RawMessage `json:"inputRequests"` // in place of res's
		}{res, sent})
	} else {
		b, err = json.Marshal(res)
	}
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
		return
	}
	writeRPCResult(w, c.id, b)
}

// upstreamInputs is an upstream's input_required.
type upstreamInputs struct {
	requests mcp.InputRequestMap
	state    string
	// sent is the upstream's result as it sent it, when the gateway read
	// it (mcpup.ToolResult.Raw; nil when the go-sdk's client decoded it).
	sent json.RawMessage
}

// verbatimRequests are an upstream's input requests as it sent them (in
// sent, its result), members the go-sdk does not know included, so that
// the host gets them verbatim; but every member the go-sdk read (a
// request's method and params, and each member of its decoded params) is
// written as decoded, an elicitation's mode as elicitMode infers it, so
// that the host reads what missingCapability checked, whatever the
// upstream wrote twice or in other letter cases (which encoding/json
// folds). Nil when sent is not at hand or cannot be read: the requests
// are then relayed as decoded.
func verbatimRequests(sent json.RawMessage, checked mcp.InputRequestMap) map[string]json.RawMessage {
	var res struct {
		InputRequests map[string]map[string]json.RawMessage `json:"inputRequests"`
	}
	if sent == nil || json.Unmarshal(sent, &res) != nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(checked))
	for key, req := range checked {
		var method string
		switch r := req.(type) {
		case *mcp.ElicitParams:
			e := *r
			e.Mode = elicitMode(r)
			method, req = "elicitation/create", &e
		case *mcp.CreateMessageParams, *mcp.CreateMessageWithToolsParams:
			method = "sampling/createMessage"
		case *mcp.ListRootsParams:
			method = "roots/list"
		default:
			return nil
		}
		var params, sentParams map[string]json.RawMessage
		if b, err := json.Marshal(req); err != nil || json.Unmarshal(b, &params) != nil {
			return nil
		}
		_ = json.Unmarshal(res.InputRequests[key]["params"], &sentParams)
		p, err := json.Marshal(withUnknown(params, sentParams))
		if err != nil {
			return nil
		}
		m, _ := json.Marshal(method)
		if out[key], err = json.Marshal(withUnknown(map[string]json.RawMessage{"method": m, "params": p}, res.InputRequests[key])); err != nil {
			return nil
		}
	}
	return out
}

// sameInputs reports whether raw, decoded as res was (the go-sdk's type
// of it), asks for exactly in's input requests with in's request state:
// the result the go-sdk decoded, and not another answer the stream held.
func sameInputs(in *upstreamInputs, res any, raw json.RawMessage) (same bool) {
	if raw == nil || res == nil {
		return false
	}
	defer func() {
		if recover() != nil { // the go-sdk's decoder (see decodeToolResult)
			same = false
		}
	}()
	t := reflect.TypeOf(res)
	if t.Kind() != reflect.Pointer {
		return false
	}
	v := reflect.New(t.Elem())
	if json.Unmarshal(raw, v.Interface()) != nil {
		return false
	}
	again := inputRequestsOf(v.Interface())
	if again == nil || again.state != in.state {
		return false
	}
	a, err1 := json.Marshal(again.requests)
	b, err2 := json.Marshal(in.requests)
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}

// withUnknown adds to known the members of sent whose names are none of
// known's in any letter case.
func withUnknown(known, sent map[string]json.RawMessage) map[string]json.RawMessage {
next:
	for k, v := range sent {
		for name := range known {
			if strings.EqualFold(k, name) {
				continue next
			}
		}
		known[k] = v
	}
	return known
}

// elicitMode is an elicitation's mode as a host reads it relayed: as
// sent, else url when it has a URL or an elicitation id, else form (the
// go-sdk's inference, which its encoding writes).
func elicitMode(e *mcp.ElicitParams) string {
	switch {
	case e.Mode != "":
		return e.Mode
	case e.URL != "" || e.ElicitationID != "":
		return "url"
	}
	return "form"
}

// inputRequestsOf returns res's input_required part, nil when res is a
// complete result.
func inputRequestsOf(res any) *upstreamInputs {
	var reqs mcp.InputRequestMap
	var state string
	switch r := res.(type) {
	case *mcp.CallToolResult:
		reqs, state = r.InputRequests, r.RequestState
	case *mcp.GetPromptResult:
		reqs, state = r.InputRequests, r.RequestState
	case *mcp.ReadResourceResult:
		reqs, state = r.InputRequests, r.RequestState
	}
	if reqs == nil && state == "" {
		return nil
	}
	return &upstreamInputs{requests: reqs, state: state}
}

// hostCapabilities are the capabilities a 2026-07-28 host declared. Roots
// is read as present or not: the go-sdk's ClientCapabilities keeps
// "roots": {} only as a zero ListChanged, which cannot be told from no
// roots at all.
type hostCapabilities struct {
	mcp.ClientCapabilities
	Roots *json.RawMessage `json:"roots"`
}

// missingCapability names the capability an input request needs that the
// host did not declare, or the entry does not let through ("" when
// none).
func missingCapability(req mcp.InputRequest, host hostCapabilities, allowed []string) string {
	cc := &host.ClientCapabilities
	switch r := req.(type) {
	case *mcp.ElicitParams:
		switch {
		case !slices.Contains(allowed, "elicitation"):
			return "elicitation (not relayed for this server)"
		case elicitMode(r) == "url" && (cc.Elicitation == nil || cc.Elicitation.URL == nil):
			return "elicitation.url"
		case elicitMode(r) != "url" && !formCapable(cc.Elicitation):
			return "elicitation.form"
		}
	case *mcp.CreateMessageParams, *mcp.CreateMessageWithToolsParams:
		// (an upstream's sampling/createMessage decodes as the latter)
		if !slices.Contains(allowed, "sampling") || cc.Sampling == nil {
			return "sampling"
		}
	case *mcp.ListRootsParams:
		if !slices.Contains(allowed, "roots") || host.Roots == nil {
			return "roots"
		}
	default:
		return "an input the broker does not relay"
	}
	return ""
}

// formCapable reports whether elicitation capabilities e include form
// mode: declared, or implied by an empty object (the specification's
// backwards-compatible reading).
func formCapable(e *mcp.ElicitationCapabilities) bool {
	return e != nil && (e.Form != nil || e.URL == nil)
}

// upstreamMeta is the _meta of a request relayed for c: a 2026-07-28
// host's capabilities as upstreamCaps has them (the upstream's session
// declares its own otherwise: url elicitation only).
func (g *gateway) upstreamMeta(c *gwCall) mcp.Meta {
	meta := mcp.Meta{}
	if c.modern {
		meta[mcp.MetaKeyClientCapabilities] = g.upstreamCaps(c)
	}
	return meta
}

// upstreamCaps are the capabilities the upstream may rely on: the host's,
// within what the entry relays. When that is all the host declared (the
// usual call), they are the memo's members themselves, which nobody
// changes: they are only encoded.
func (g *gateway) upstreamCaps(c *gwCall) map[string]json.RawMessage {
	host := g.hostCaps.get(c.rawCaps, capsMembers)
	within := host != nil
	for k := range host {
		within = within && slices.Contains(c.up.InputRequests, k)
	}
	if within {
		return host
	}
	out := make(map[string]json.RawMessage, len(c.up.InputRequests))
	for _, k := range c.up.InputRequests {
		if v, ok := host[k]; ok {
			out[k] = v
		}
	}
	return out
}

// capsMembers are a clientCapabilities object's members (nil when raw is
// not an object).
func capsMembers(raw []byte) map[string]json.RawMessage {
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	return m
}

// upstreamResponses are the host's answers to the upstream's input
// requests (the broker's own connect answer left out).
func (g *gateway) upstreamResponses(c *gwCall) mcp.InputResponseMap {
	if len(c.params.InputResponses) == 0 {
		return nil
	}
	raw := map[string]json.RawMessage{}
	for k, v := range c.params.InputResponses {
		if k != connectKey(c.p) {
			raw[k] = v
		}
	}
	if len(raw) == 0 {
		return nil
	}
	b, _ := json.Marshal(raw)
	var m mcp.InputResponseMap
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// callArgs are what the continuation's digest covers: a tool's or a
// prompt's arguments, a resource's URI.
func (c *gwCall) callArgs() json.RawMessage {
	if c.method == "resources/read" {
		b, _ := json.Marshal(map[string]string{"uri": c.params.URI})
		return b
	}
	return c.params.Arguments
}

// argDigest is the digest of c's arguments a continuation binds, computed
// when a continuation is opened or sealed (a call relayed at once needs
// none); on invalid arguments the error is written and ok is false.
func (g *gateway) argDigest(w http.ResponseWriter, c *gwCall) ([]byte, bool) {
	if c.digest == nil {
		d, err := requeststate.Digest(c.callArgs())
		if err != nil {
			writeRPCError(w, g.errStatus(c), c.id, codeInvalidParams, "Invalid params: arguments are not valid JSON", nil)
			return nil, false
		}
		c.digest = d
	}
	return c.digest, true
}

func (c *gwCall) callName() string {
	if c.method == "resources/read" {
		return c.params.URI
	}
	return c.params.Name
}

func connectKey(p *provider.Provider) string { return "connect_" + p.Name }

// answer reads the person's answer to the broker's connect request.
func (g *gateway) answer(c *gwCall, key string) (connections.Answer, *rpcError) {
	raw, ok := c.params.InputResponses[key]
	if !ok {
		return connections.NoAnswer, nil
	}
	var er mcp.ElicitResult
	if json.Unmarshal(raw, &er) != nil {
		return "", &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("inputResponses[%q] must be an elicitation result", key)}
	}
	a, ok := connections.ParseAnswer(er.Action)
	if !ok {
		return "", &rpcError{Code: codeInvalidParams, Message: fmt.Sprintf("inputResponses[%q].action must be accept, decline or cancel", key)}
	}
	return a, nil
}

// notReady answers a call whose person must connect first.
func (g *gateway) notReady(w http.ResponseWriter, c *gwCall, o connections.Outcome, digest []byte) {
	switch o := o.(type) {
	case connections.NeedsUser:
		g.askToConnect(w, c, o, digest)
	case connections.Declined:
		g.toolError(w, c, o.Message())
	case connections.Cancelled:
		g.toolError(w, c, o.Message(c.callName()))
	case connections.Ready:
		// The organisation's IdP connected (or upgraded) the person with
		// no browser step (mcp.auth: enterprise): the lists change, and
		// the call is the host's to make again on the new connection.
		r := o
		g.changed(c, r)
		if c.method == "tools/call" && c.params.Name == placeholderTool {
			g.connected(w, c, r)
			return
		}
		g.toolError(w, c, fmt.Sprintf("%s needed the connection renewed, which your organisation's identity provider just did. Nothing was done: call again.", c.p.DisplayName))
	default:
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
	}
}

// askToConnect is the url elicitation of a connect request, as /mcp's
// connect_account gives it.
func (g *gateway) askToConnect(w http.ResponseWriter, c *gwCall, n connections.NeedsUser, digest []byte) {
	s := g.s
	if re, text, done := linkWithoutMRTR(c.modern, n, s.opts.Connections.PageURL()); done {
		switch {
		case re == nil:
			g.toolError(w, c, text)
		case re.Code == codeMissingCapability:
			writeRPCErrorValue(w, http.StatusBadRequest, c.id, re)
		default:
			writeRPCErrorValue(w, http.StatusOK, c.id, re)
		}
		return
	}
	msg := n.Message()
	st, err := requeststate.SealGateway(s.opts.StateKeys, requeststate.Gateway{Principal: c.principal, Provider: c.p.Name, Method: c.method,
		Name: c.callName(), ArgDigest: digest, Grant: n.Grant.ID, Expires: n.Until(s.opts.Now(), g.stateTTL())})
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
		return
	}
	note(w, func(o *observedWriter) { o.outcome = telemetry.OutcomeInputRequired })
	b, err := json.Marshal(inputRequiredResult{ResultType: "input_required", Meta: s.serverMeta(),
		InputRequests: mcp.InputRequestMap{connectKey(c.p): &mcp.ElicitParams{Mode: "url", Message: msg, URL: n.URL}}, RequestState: st})
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
		return
	}
	writeRPCResult(w, c.id, b)
}

// changed: c's person has a new or upgraded connection; their cached tool
// lists are stale and listening hosts are told.
func (g *gateway) changed(c *gwCall, r connections.Ready) {
	g.s.opts.Upstreams.Forget(r.Target)
	g.forgetTools(c.principal, c.p.Name)
	g.toolsChanged(c.principal, c.p.Name)
}

// connected answers the placeholder tool once the person is connected.
func (g *gateway) connected(w http.ResponseWriter, c *gwCall, r connections.Ready) {
	text := fmt.Sprintf("Connected to %s.", c.p.DisplayName)
	if !r.Conn.Created.IsZero() {
		// The account's name may be the broker's own for it ("Linear
		// account 1f2e3d4c") when the server names none.
		text = fmt.Sprintf("Connected to %s as %s. %s's own tools are listed now: list the tools again to see them.",
			c.p.DisplayName, connections.AccountName(r.Conn), c.p.DisplayName)
	}
	g.writeResult(w, c, &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}})
}

// relay runs op on the upstream within the entry's call timeout, and
// records it.
func relayAs[T any](ctx context.Context, g *gateway, c *gwCall, r connections.Ready, op func(context.Context, *mcp.ClientSession) (T, error)) (T, string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.up.CallTimeout)
	defer cancel()
	start := time.Now()
	out, era, err := mcpup.Do(ctx, g.s.opts.Upstreams, r.Target, op)
	outcome := telemetry.UpstreamOK
	var ns *mcpup.NeedScope
	var we *jsonrpc.Error
	switch {
	case err == nil && inputRequestsOf(out) != nil:
		outcome = telemetry.UpstreamInputRequired
	case err == nil:
	case errors.As(err, &ns):
		outcome = telemetry.UpstreamScope
	case errors.Is(err, mcpup.ErrUnauthorized):
		outcome = telemetry.UpstreamUnauthorized
	case errors.Is(err, context.DeadlineExceeded):
		outcome = telemetry.UpstreamTimeout
	case errors.As(err, &we):
		outcome = telemetry.UpstreamRPCError
	default:
		outcome = telemetry.UpstreamFailed
	}
	g.s.opts.Telemetry.Upstream(c.p.Name, c.method, era, outcome, time.Since(start))
	return out, era, err
}

func (g *gateway) relay(ctx context.Context, c *gwCall, r connections.Ready, op func(context.Context, *mcp.ClientSession) (any, error)) (any, string, error) {
	return relayAs(ctx, g, c, r, op)
}

// relayFailed answers a relay that did not come back with a result: the
// upstream's refusal (reconnect, step up) as the connections layer
// decides it, a relayed JSON-RPC error, or a tool error.
func (g *gateway) relayFailed(ctx context.Context, w http.ResponseWriter, c *gwCall, r connections.Ready, err error) {
	if errors.Is(err, vault.ErrUnavailable) { // the connection's token could not be read
		g.failed(w, c, err)
		return
	}
	var hp hostParamsError
	if errors.As(err, &hp) {
		writeRPCErrorValue(w, g.errStatus(c), c.id, hp.e)
		return
	}
	if refused(err) {
		g.s.log.Info("mcpapi: the upstream refused the connection's token", "provider", c.p.Name, "method", c.method, "err", err.Error())
		if !c.asks() {
			g.refusedList(ctx, w, c, r, err)
			return
		}
		o, rerr := g.s.opts.Connections.UpstreamRefused(ctx, g.request(c, true), r, err)
		if rerr != nil {
			g.failed(w, c, rerr)
			return
		}
		if digest, ok := g.argDigest(w, c); ok {
			g.notReady(w, c, o, digest)
		}
		return
	}
	var re *rpcError
	// An error the upstream answered is relayed; the transport's own
	// rejection (its code -32005) is a failure to reach it.
	if errors.As(err, &re) && re.Code != transportRejected {
		re.Message = sanitizeText(untrusted.ClipBytes(re.Message, maxUpstreamError), maxUpstreamError)
		if re.Code == mcp.CodeURLElicitationRequired && !c.asks() {
			// Only a call can carry the link; a list answers no link.
			writeRPCError(w, g.errStatus(c), c.id, codeInternal, c.p.DisplayName+" asked for a browser step before it lists anything; call one of its tools to be given the link", nil)
			return
		}
		if re.Code == mcp.CodeURLElicitationRequired && !c.modern {
			g.legacyLinks(w, c, re)
			return
		}
		if re.Code == mcp.CodeURLElicitationRequired {
			g.upstreamLinks(w, c, r, re)
			return
		}
		relayed := &rpcError{Code: re.Code, Message: re.Message}
		if len(re.Data) <= maxUpstreamError && json.Valid(re.Data) {
			// Small structured data goes with it (a missing resource's
			// uri, the capabilities a -32021 requires); larger is dropped.
			relayed.Data = re.Data
		}
		writeRPCErrorValue(w, g.errStatus(c), c.id, relayed)
		return
	}
	if errors.Is(err, mcpup.ErrTooLarge) {
		g.tooLarge(w, c)
		return
	}
	if errors.Is(err, context.DeadlineExceeded) {
		g.toolError(w, c, fmt.Sprintf("%s did not answer within %s s. Nothing is known of the call's outcome; check before calling again.",
			c.p.DisplayName, strconv.FormatFloat(c.up.CallTimeout.Seconds(), 'f', -1, 64)))
		return
	}
	g.s.log.Warn("mcpapi: upstream request failed", "provider", c.p.Name, "method", c.method, "err", err.Error())
	var ue *provider.UpstreamError
	if errors.As(err, &ue) {
		g.toolError(w, c, ue.Error())
		return
	}
	g.toolError(w, c, fmt.Sprintf("%s could not be reached or did not answer as an MCP server. Try again later.", c.p.DisplayName))
}

// relinkState is the upstream state of a gateway continuation whose
// upstream asked for links the legacy way (-32042): the retry calls again
// with nothing to continue.
const relinkState = "\x00relink"

// upstreamLinks relays a 2025-11-25 upstream's -32042 (open these links,
// then call again) to a 2026-07-28 host as input_required url entries,
// only https links of at most 2 KiB without user info, and only to a host
// that declared url elicitation.
func (g *gateway) upstreamLinks(w http.ResponseWriter, c *gwCall, r connections.Ready, re *rpcError) {
	links, problem := relayableLinks(c, re)
	if problem != "" {
		g.toolError(w, c, problem)
		return
	}
	reqs := mcp.InputRequestMap{}
	for i, e := range links {
		reqs[fmt.Sprintf("upstream_link_%d", i+1)] = &mcp.ElicitParams{Mode: "url", Message: e.Message, URL: e.URL}
	}
	if digest, ok := g.argDigest(w, c); ok {
		g.upstreamInput(w, c, r, digest, &upstreamInputs{requests: reqs, state: relinkState})
	}
}

// transportRejected is the go-sdk transport's code for a request that did
// not complete at the HTTP level.
const transportRejected = -32005

// legacyLinks relays an upstream's -32042 to a 2025-11-25 host as the
// same error, its texts sanitised as the 2026-07-28 path sanitises them:
// only to a host whose initialize declared url elicitation, and only
// https links of at most 2 KiB without user info. Anything else is the
// tool error upstreamLinks gives a 2026-07-28 host, naming no link.
func (g *gateway) legacyLinks(w http.ResponseWriter, c *gwCall, re *rpcError) {
	if !slices.Contains(c.up.InputRequests, "elicitation") {
		g.toolError(w, c, fmt.Sprintf("%s asks the person to open a link; the broker relays no elicitation for it (mcp.input_requests). Nothing was done.", c.p.DisplayName))
		return
	}
	if !c.caps.urlCapable {
		g.toolError(w, c, fmt.Sprintf("%s asks the person to open a link, which needs a client that declared the capability elicitation.url; this client did not. Nothing was done.", c.p.DisplayName))
		return
	}
	links, problem := relayableLinks(c, re)
	if problem != "" {
		g.toolError(w, c, problem)
		return
	}
	for i, e := range links {
		links[i] = &mcp.ElicitParams{Mode: "url", Message: e.Message, URL: e.URL, ElicitationID: sanitizeText(e.ElicitationID, maxTitle)}
	}
	b, err := json.Marshal(map[string]any{"elicitations": links})
	if err != nil {
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
		return
	}
	writeRPCErrorValue(w, http.StatusOK, c.id, &rpcError{Code: re.Code, Message: sanitizeText(re.Message, maxUpstreamError), Data: b})
}

// relayableLinks are the links of an upstream's -32042, their messages
// sanitised; problem (the tool error's text, naming no link) when there
// is none, or one is not an https link of at most 2 KiB without user info.
func relayableLinks(c *gwCall, re *rpcError) (links []*mcp.ElicitParams, problem string) {
	var data struct {
		Elicitations []*mcp.ElicitParams `json:"elicitations"`
	}
	if json.Unmarshal(re.Data, &data) != nil || len(data.Elicitations) == 0 {
		return nil, fmt.Sprintf("%s asked for a browser step without a link the broker can relay. Nothing was done.", c.p.DisplayName)
	}
	for _, e := range data.Elicitations {
		if e == nil || !safeElicitURL(e.URL) {
			return nil, fmt.Sprintf("%s asked the person to open a link the broker does not relay (only https links of at most 2 KiB without user info). Nothing was done.", c.p.DisplayName)
		}
		e.Message = sanitizeText(e.Message, maxDescription)
	}
	return data.Elicitations, ""
}

func safeElicitURL(raw string) bool {
	if len(raw) > 2048 || !strings.HasPrefix(raw, "https://") {
		return false
	}
	return !strings.Contains(strings.SplitN(strings.TrimPrefix(raw, "https://"), "/", 2)[0], "@")
}

// refused reports whether err is the upstream refusing the connection's
// token: 403 insufficient_scope, a 401 after the forced refresh, or a
// token that could not be had.
func refused(err error) bool {
	var ns *mcpup.NeedScope
	return errors.As(err, &ns) || errors.Is(err, mcpup.ErrUnauthorized) || errors.Is(err, mcpup.ErrNoToken)
}

// otherLists lists the first page of the prompts, resources and resource
// templates the upstream says it has (its server capabilities), for
// connect_account, each recorded as its own method: the error is the
// first refusal. Only a refusal matters there; a list the upstream cannot
// give for another reason is its lists' business, not the connection's.
func (g *gateway) otherLists(ctx context.Context, c *gwCall, r connections.Ready) error {
	caps, _, err := mcpup.Do(ctx, g.s.opts.Upstreams, r.Target, func(_ context.Context, cs *mcp.ClientSession) (*mcp.ServerCapabilities, error) {
		if init := cs.InitializeResult(); init != nil {
			return init.Capabilities, nil
		}
		return nil, nil
	})
	if err != nil || caps == nil {
		return err
	}
	var methods []string
	if caps.Prompts != nil {
		methods = append(methods, "prompts/list")
	}
	if caps.Resources != nil {
		methods = append(methods, "resources/list", "resources/templates/list")
	}
	for _, m := range methods {
		lc := *c
		lc.method = m
		meta := g.upstreamMeta(&lc)
		_, _, err := relayAs(ctx, g, &lc, r, func(ctx context.Context, cs *mcp.ClientSession) (any, error) {
			switch m {
			case "prompts/list":
				return cs.ListPrompts(ctx, &mcp.ListPromptsParams{Meta: meta})
			case "resources/list":
				return cs.ListResources(ctx, &mcp.ListResourcesParams{Meta: meta})
			}
			return cs.ListResourceTemplates(ctx, &mcp.ListResourceTemplatesParams{Meta: meta})
		})
		if refused(err) {
			return err
		}
	}
	return nil
}

// asks reports whether c may answer with a connect request: tools/call,
// prompts/get and resources/read may be input_required; the lists may not.
func (c *gwCall) asks() bool {
	return c.method == "tools/call" || c.method == "prompts/get" || c.method == "resources/read"
}

// refusedList answers a list the upstream refused as the lists of a
// person who must connect first (the issue's "unconnected, also
// needs_reconnect or missing scopes"): tools/list the placeholder, the
// others empty. A list starts no connect request and spends no step-up:
// it cannot carry the link, and hosts list unprompted, so a server that
// refuses lists would use up the person's step-ups unseen. The person's
// call of connect_account asks instead (call). A 401 still marks the
// connection needs_reconnect (with nobody asked), so the next lists say
// so without asking the upstream.
func (g *gateway) refusedList(ctx context.Context, w http.ResponseWriter, c *gwCall, r connections.Ready, err error) {
	var ns *mcpup.NeedScope
	if !errors.As(err, &ns) {
		if _, rerr := g.s.opts.Connections.UpstreamRefused(ctx, g.request(c, false), r, err); rerr != nil {
			g.failed(w, c, rerr)
			return
		}
	}
	g.unconnectedList(w, c)
}

// failed answers a connections error by its class.
func (g *gateway) failed(w http.ResponseWriter, c *gwCall, err error) {
	f := connections.Explain(err, c.p)
	switch f.Class {
	case connections.BadState:
		writeRPCError(w, g.errStatus(c), c.id, codeInvalidParams, invalidState, nil)
	case connections.StorageUnavailable:
		g.s.storageUnavailable(w, c.id, err)
	case connections.Internal:
		g.s.log.Error("mcpapi: gateway call failed", "provider", c.p.Name, "err", err.Error())
		writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
	default:
		msg := f.Message
		if f.Next == connections.NextStartOver {
			msg += " Call again to start over."
		}
		g.toolError(w, c, msg)
	}
}

func (g *gateway) errStatus(c *gwCall) int {
	if c.modern {
		return http.StatusBadRequest
	}
	return http.StatusOK
}

func (g *gateway) toolError(w http.ResponseWriter, c *gwCall, text string) {
	note(w, func(o *observedWriter) { o.outcome = telemetry.OutcomeToolError })
	res := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: true}
	if c.method != "tools/call" {
		writeRPCError(w, g.errStatus(c), c.id, codeInternal, text, nil)
		return
	}
	g.writeResult(w, c, res)
}

// writeResult writes a complete result in c's era, capped at the entry's
// max_result_bytes.
func (g *gateway) writeResult(w http.ResponseWriter, c *gwCall, res any) {
	if b, ok := g.encodeResult(w, c, res); ok {
		writeRPCResult(w, c.id, b)
	}
}

// encodeResult encodes a complete result in c's era; when it is over the
// entry's max_result_bytes (measured as relayed) or cannot be encoded, the
// answer (a tool error) is written instead (unless w is nil) and ok is
// false. The upstream's own resultType, which the SDK's types keep from
// decoding and encode again, is dropped: the gateway writes its own, once.
func (g *gateway) encodeResult(w http.ResponseWriter, c *gwCall, res any) ([]byte, bool) {
	if c.modern {
		res = privateCopy(res)
	}
	b, ok := g.fastResult(c.modern, res)
	if !ok {
		var err error
		if b, err = g.slowResult(c.modern, res); err != nil {
			if w != nil {
				writeRPCError(w, http.StatusInternalServerError, c.id, codeInternal, "internal error", nil)
			}
			return nil, false
		}
	}
	if c.up.MaxResultBytes > 0 && int64(len(b)) > c.up.MaxResultBytes {
		if w != nil {
			g.tooLarge(w, c)
		}
		return nil, false
	}
	return b, true
}

// tooLarge answers a result over the entry's max_result_bytes, naming the
// setting (and the entry) an operator can raise.
func (g *gateway) tooLarge(w http.ResponseWriter, c *gwCall) {
	g.toolError(w, c, fmt.Sprintf("%s answered with more than %d bytes, more than the broker relays (the setting mcp.max_result_bytes of the %s entry in providers.yaml, which an operator can raise). "+
		"Nothing of the answer was returned; ask for less.", c.p.DisplayName, c.up.MaxResultBytes, quote(c.p.Name)))
}

// slowResult encodes any result with the SDK's encoder: for a 2026-07-28
// host with the broker's serverInfo in its _meta (the upstream's other
// _meta members kept) and resultType complete. It sets res's _meta.
func (g *gateway) slowResult(modern bool, res any) ([]byte, error) {
	if m, ok := res.(interface{ SetMeta(map[string]any) }); ok && modern {
		meta := map[string]any{mcp.MetaKeyServerInfo: g.s.implJSON}
		if gm, ok := res.(interface{ GetMeta() map[string]any }); ok {
			for k, v := range gm.GetMeta() {
				if k != mcp.MetaKeyServerInfo {
					meta[k] = v
				}
			}
		}
		m.SetMeta(meta)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	b = withoutResultType(b)
	if modern {
		b = withResultType("complete", b)
	}
	return b, nil
}

// fastResult encodes the usual relayed tool result (one text content, no
// _meta of the upstream's but its serverInfo, which is replaced) for a
// 2026-07-28 host with the fast encoder (encodeToolResult): what
// slowResult writes, without reflection (FuzzGatewayFastResult); ok is
// false for anything else.
func (g *gateway) fastResult(modern bool, res any) ([]byte, bool) {
	r, ok := res.(*mcp.CallToolResult)
	if !ok || !modern || r == nil || len(r.Meta) > 1 {
		return nil, false
	}
	if _, ok := r.Meta[mcp.MetaKeyServerInfo]; len(r.Meta) == 1 && !ok {
		return nil, false
	}
	return g.s.encodeToolResult(&mcp.CallToolResult{Content: r.Content, StructuredContent: r.StructuredContent, IsError: r.IsError,
		InputRequests: r.InputRequests, RequestState: r.RequestState})
}

// withoutResultType removes a top-level resultType member from an SDK
// result's encoding b (the members keep their values; their order becomes
// encoding/json's for maps, which JSON leaves without meaning).
func withoutResultType(b []byte) []byte {
	if !bytes.Contains(b, []byte(`"resultType"`)) {
		return b
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return b
	}
	if _, ok := m["resultType"]; !ok {
		return b
	}
	delete(m, "resultType")
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// privateCopy returns a relayed list or resource marked cacheScope
// "private", whatever the upstream said (nothing, for a 2025-11-25
// server): an endpoint answers as one person, with their account or their
// session at the server, so no cache may serve the answer to another. A
// copy, since the go-sdk hands out the lists it keeps cached; results of
// other kinds are returned as they are.
func privateCopy(res any) any {
	switch r := res.(type) {
	case *mcp.ListPromptsResult:
		return privately(r, func(v *mcp.ListPromptsResult) *mcp.Cacheable { return &v.Cacheable })
	case *mcp.ListResourcesResult:
		return privately(r, func(v *mcp.ListResourcesResult) *mcp.Cacheable { return &v.Cacheable })
	case *mcp.ListResourceTemplatesResult:
		return privately(r, func(v *mcp.ListResourceTemplatesResult) *mcp.Cacheable { return &v.Cacheable })
	case *mcp.ReadResourceResult:
		return privately(r, func(v *mcp.ReadResourceResult) *mcp.Cacheable { return &v.Cacheable })
	}
	return res
}

// privately is a copy of r whose cache scope is private.
func privately[T any](r *T, cache func(*T) *mcp.Cacheable) *T {
	v := *r
	cache(&v).CacheScope = "private"
	return &v
}

// maxGatewayStateTTL bounds a gateway state's life whatever --state-ttl
// says: it carries an upstream's own requestState, which the broker
// cannot read, so a host holds it at most ten minutes (docs/SECURITY.md
// invariant 17).
const maxGatewayStateTTL = 10 * time.Minute

// stateTTL is how long a gateway state the broker seals now stays valid.
func (g *gateway) stateTTL() time.Duration { return min(g.s.opts.StateTTL, maxGatewayStateTTL) }

// admitCall applies the per-person limits: at most maxInFlight calls at
// once and maxPerMinute a minute for one provider. release ends the call;
// busy is the refusal ("" when admitted).
func (g *gateway) admitCall(c *gwCall) (release func(), busy string) {
	key := limitKey{c.principal, c.p.Name}
	now := g.s.opts.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	l := g.limits[key]
	if l == nil {
		if len(g.limits) > 100000 {
			clear(g.limits)
		}
		l = &limiter{}
		g.limits[key] = l
	}
	if now.Sub(l.window) >= time.Minute {
		l.window, l.count = now, 0
	}
	switch {
	case l.inFlight >= maxInFlight:
		return nil, fmt.Sprintf("Too many calls to %s are running for this person (%d at most); retry when one has finished.", c.p.DisplayName, maxInFlight)
	case l.count >= maxPerMinute:
		wait := (time.Minute - now.Sub(l.window) + time.Second - 1) / time.Second
		return nil, fmt.Sprintf("Too many calls to %s this minute (%d at most); retry in %d s.", c.p.DisplayName, maxPerMinute, wait)
	}
	l.inFlight++
	l.count++
	return func() {
		g.mu.Lock()
		l.inFlight--
		g.mu.Unlock()
	}, ""
}

type limitKey struct {
	principal vault.Principal
	provider  string
}

type limiter struct {
	inFlight, count int
	window          time.Time
}

var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// sanitizeTools keeps the upstream's tools a host may see: allowed by the
// entry's filter, well named, once each, with schemas within bounds and
// their texts cleaned. A changed list is an audit event.
func (g *gateway) sanitizeTools(ctx context.Context, c *gwCall, r connections.Ready, tools []*mcp.Tool) []*mcp.Tool {
	out := make([]*mcp.Tool, 0, len(tools))
	seen := map[string]bool{}
	h := sha256.New()
	dropped := 0
	var bigSchemas []string
	reserved := false
	for _, t := range tools {
		if t == nil || !toolNameRE.MatchString(t.Name) || seen[t.Name] || !c.up.Tools.Allowed(t.Name) {
			continue
		}
		if t.Name == placeholderTool {
			// The endpoint's own tool has the name, and a call of it
			// always reaches that one: listed, the upstream's could
			// never be called.
			reserved = true
			continue
		}
		if len(out) == maxTools {
			dropped++
			continue
		}
		in, _ := json.Marshal(t.InputSchema)
		outSchema, _ := json.Marshal(t.OutputSchema)
		if len(in) > maxToolSchema || len(outSchema) > maxToolSchema {
			bigSchemas = append(bigSchemas, t.Name)
			continue
		}
		seen[t.Name] = true
		t = new(*t) // a copy: the upstream's list may be the session's cache
		t.Description = sanitizeText(t.Description, maxDescription)
		t.Title = sanitizeText(t.Title, maxTitle)
		if t.Annotations != nil {
			a := *t.Annotations
			a.Title = sanitizeText(a.Title, maxTitle)
			t.Annotations = &a
		}
		fmt.Fprintf(h, "%s\x00%s\x00%s\x00%s\x00", t.Name, in, outSchema, t.Description)
		out = append(out, t)
	}
	if dropped > 0 {
		g.s.log.Warn("mcpapi: an upstream listed more tools than the broker relays; the rest were dropped",
			"provider", c.p.Name, "relayed", maxTools, "dropped", dropped)
	}
	if len(bigSchemas) > 0 {
		g.s.log.Warn("mcpapi: upstream tools whose schemas are over 64 KiB were dropped", "provider", c.p.Name, "tools", bigSchemas)
	}
	if reserved {
		g.s.log.Warn("mcpapi: an upstream tool named "+placeholderTool+" was dropped: the endpoint keeps the name for its own tool", "provider", c.p.Name)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	// Each page is compared with the same page (the same cursor) as last
	// listed: the pages of one list differ from each other, so one hash
	// for all of them would report a change at every listing.
	key := toolHashKey{principal: c.principal, provider: r.Target.Provider, conn: r.Target.Conn}
	if c.params.Cursor != nil {
		key.cursor = sha256.Sum256([]byte(*c.params.Cursor)) // digested: the host chooses its length
	}
	g.mu.Lock()
	prev, had := g.toolHash[key]
	if len(g.toolHash) > 100000 {
		clear(g.toolHash)
	}
	g.toolHash[key] = sum
	g.mu.Unlock()
	if had && prev != sum {
		g.s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventToolsChanged, Principal: c.principal, Provider: c.p.Name,
			Connection: r.Conn.ID, Via: "mcp"})
	}
	return out
}

// toolHashKey names one page of a person's tools at a connection, by the
// digest of its cursor (zero for the first page).
type toolHashKey struct {
	principal      vault.Principal
	provider, conn string
	cursor         [32]byte
}

// sanitizeText removes from upstream text what a reader does not see but
// a model reads, or what reorders what the reader sees: control
// characters (newlines and tabs kept), format characters (category Cf:
// bidirectional controls, zero-width characters, soft hyphens, the tag
// characters that spell out invisible text, …, with the unassigned rest
// of the tag block), variation selectors (a run of them after a visible
// character encodes arbitrary bytes no reader sees) and Unicode's other
// default-ignorable code points (the Hangul fillers, the combining
// grapheme joiner, …); then it caps the text at limit bytes. What that
// costs a description: an emoji's presentation selector (U+2764 U+FE0F
// reads as U+2764), and the glyph variants Mongolian and ideographic
// variation selectors choose.
func sanitizeText(s string, limit int) string {
	if s == "" {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if strings.IndexFunc(s, hidden) >= 0 {
		s = strings.Map(func(r rune) rune {
			if hidden(r) {
				return -1
			}
			return r
		}, s)
	}
	if len(s) > limit {
		s = s[:limit]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// hidden reports whether sanitizeText removes r (ASCII text needs only
// the control characters' check).
func hidden(r rune) bool {
	if r < utf8.RuneSelf {
		return (r < ' ' || r == 0x7f) && r != '\n' && r != '\t'
	}
	switch {
	// Variation selectors, and the other default-ignorable code points
	// that are not Cf (Unicode's Variation_Selector and
	// Other_Default_Ignorable_Code_Point, spelled out: two more table
	// look-ups per rune doubled the cost of CJK text; TestHidden checks
	// these against the tables). U+E0000–E0FFF holds the tag block,
	// VS17–256 and the rest, reserved as default-ignorable.
	case r >= 0xE0000 && r <= 0xE0FFF, r >= 0xFE00 && r <= 0xFE0F, r >= 0x180B && r <= 0x180F,
		r == 0x034F, r == 0x115F, r == 0x1160, r == 0x17B4, r == 0x17B5, r == 0x2065, r == 0x3164, r == 0xFFA0,
		r >= 0xFFF0 && r <= 0xFFF8:
		return true
	}
	return unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

// verifierFor is the default Options.VerifierFor: the IdP's JWTs naming
// resource.
func (s *Server) verifierFor(resource string) bearer.Verifier {
	v, err := s.issuerVerifier(resource)
	if err != nil {
		return func(context.Context, string) (bearer.TokenInfo, error) { return bearer.TokenInfo{}, err }
	}
	return v
}
