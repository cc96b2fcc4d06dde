// Package mcpup is the broker's client of upstream MCP servers (the
// gateway's far side), on the go-sdk's client: one session per connection
// (per person for a server that takes no token), the protocol era probed
// when the session opens (server/discover, falling back to initialize),
// the broker's own multi round-trip handling off (an upstream's
// input_required comes back as it is, for the host to answer), and the
// connection's access token on every request through an auth.OAuthHandler:
// the token source is the provider client's (refreshed before expiry,
// single flight), a 401 forces one refresh and one retry, a 403
// insufficient_scope is a *NeedScope. A second 401 is ErrUnauthorized.
//
// Legacy (2025-11-25) sessions are pooled: least recently used first out
// beyond MaxSessions, closed after IdleTimeout, and a session the upstream
// forgot (404, go-sdk's ErrSessionMissing) is opened again once and the
// request retried. Close ends every session (the broker's shutdown).
//
// The package hands no token to its caller, and nothing the upstream
// answers reaches its caller with a token the session used in it:
// answers are redacted of them, in every encoding provider/redact knows,
// before the go-sdk reads them (answers.go).
package mcpup

import (
	"bytes"
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"

	"credbroker/vault"
)

// Errors of a request to an upstream server.
var (
	// ErrUnauthorized: the upstream answered 401 to the connection's token
	// again right after a forced refresh: it no longer accepts the grant.
	ErrUnauthorized = errors.New("mcpup: the upstream server refused the connection's token")
	// ErrNoToken: the connection has no usable token (it needs
	// reconnecting).
	ErrNoToken = errors.New("mcpup: the connection has no usable token")
	// ErrTokenRequired: Probe was refused (401) without a token, as an
	// OAuth-protected server refuses anyone not yet connected.
	ErrTokenRequired = errors.New("mcpup: the upstream server asks for a token")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("mcpup: the pool is closed")
)

// NeedScope is a 403 insufficient_scope: the upstream wants more scopes.
type NeedScope struct {
	// Scopes are the scopes its challenge names (may be empty).
	Scopes []string
}

func (e *NeedScope) Error() string {
	return "mcpup: the upstream server needs the scopes " + strings.Join(e.Scopes, " ")
}

// Target is the upstream a request goes to.
type Target struct {
	// Provider is the catalogue name; URL the server's MCP endpoint.
	Provider, URL string
	// Conn is the connection whose token is used ("" for a server that
	// takes no token).
	Conn string
	// Person is whose session a server that takes no token gets: each
	// person has their own, as each connection does (what a session holds
	// at the server, such as what its tools made, is never another's).
	Person vault.Principal
	// Version is the connection's record version as the caller's listing
	// of it says (0: unknown). It is not part of the session's identity: a
	// session hands out the token it last got again, without asking
	// Tokens, while that token was read at this version and is usable
	// (Token.Version, Token.Until). A refresh or a replacement writes a
	// new version, so the listing, once it shows the write, makes the
	// session ask again; until then a 401 forces a refresh as always. The
	// rule is the same on the pool's own exchange (direct.go) and on the
	// go-sdk's session (a 2025-11-25 upstream's, and every request that is
	// not a relayed call): the token goes on each request where the
	// request's context says which version the caller listed (answers).
	Version uint64
}

// session is t without what does not tell sessions apart.
func (t Target) session() Target {
	t.Version = 0
	return t
}

func (t Target) key() string {
	if t.Conn == "" {
		return "open:" + t.Provider + "\x00" + t.Person.Issuer + "\x00" + t.Person.Subject
	}
	return t.Conn
}

// Tokens gives a connection's tokens and forces a refresh. An error
// wrapping ErrNoToken means the connection must be made again; any other
// is passed through as it is.
type Tokens interface {
	// AccessToken returns connection id's tokens, the access token
	// refreshed when it is about to expire.
	AccessToken(ctx context.Context, id string) (Token, error)
	// ForceRefresh refreshes connection id because the upstream refused
	// the access token stale, unless it was refreshed meanwhile.
	ForceRefresh(ctx context.Context, id, stale string) (Token, error)
}

// Token is a connection's tokens as a Pool is given them: Access goes on
// the upstream requests, and every answer of the upstream is redacted of
// both. It prints as REDACTED.
type Token struct {
	Access, Refresh string
	// Version is the connection's record version the tokens were read at
	// (0: none, never used again without asking); Until is when Access
	// stops being usable without a refresh (zero: it is not).
	Version uint64
	Until   time.Time
}

func (Token) String() string             { return "REDACTED" }
func (Token) LogValue() slog.Value       { return slog.StringValue("REDACTED") }
func (Token) Format(f fmt.State, _ rune) { f.Write([]byte("REDACTED")) }

// Options configures a Pool.
type Options struct {
	// HTTPClient talks to upstreams (the egress policy; it must not follow
	// redirects with a token).
	HTTPClient *http.Client
	Tokens     Tokens
	// MaxSessions bounds open sessions (default 1000); IdleTimeout closes
	// a session unused that long (default 10 minutes).
	MaxSessions int
	IdleTimeout time.Duration
	// ListenWait bounds how long Listen waits for a server's answers
	// (default 5 seconds).
	ListenWait time.Duration
	// OpenTimeout bounds a session's opening (the era probe: discover,
	// else initialize), whoever waits for it (default 1 minute).
	OpenTimeout time.Duration
	// Version is the broker's version, in clientInfo.
	Version string
	Logger  *slog.Logger
	Now     func() time.Time
}

// Pool keeps the sessions.
type Pool struct {
	opts Options
	log  *slog.Logger
	// impl is the clientInfo (implJSON encoded).
	impl     *mcp.Implementation
	implJSON []byte
	// ids numbers the pool's own requests (CallTool).
	ids atomic.Int64
	// wires are what the pool's own exchange uses of each session
	// (*mcp.ClientSession → *wire).
	wires sync.Map

	// progress maps the progress tokens of calls in flight to their sinks.
	progress sync.Map
	// closing counts the sessions being closed.
	closing sync.WaitGroup

	mu       sync.Mutex // guards the fields below
	sessions map[string]*list.Element
	lru      *list.List // of *entry, most recently used first
	closed   bool
	// listens end the Listen sessions (Close).
	listens map[*int]context.CancelFunc
	// retired are sessions replaced because their lists changed, each
	// closed by its timer (Options.IdleTimeout later: a request in flight
	// on it has ended by then) or by Close.
	retired map[*entry]*time.Timer
	// sweep closes idle sessions when nobody uses the pool (nil: no
	// session held).
	sweep *time.Timer
}

type entry struct {
	key    string
	target Target
	cs     *mcp.ClientSession
	used   time.Time
	// ready is closed once cs (or err) is set; concurrent first users wait.
	ready chan struct{}
	err   error
	// cancel ends the context the session was opened with (which lives
	// as long as the session): an opening in progress is abandoned.
	cancel context.CancelFunc
}

// New builds a Pool.
func New(opts Options) *Pool {
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = 1000
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = 10 * time.Minute
	}
	if opts.ListenWait <= 0 {
		opts.ListenWait = 5 * time.Second
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = time.Minute
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	impl := &mcp.Implementation{Name: "credbroker", Version: opts.Version}
	implJSON, _ := json.Marshal(impl)
	return &Pool{opts: opts, log: log, impl: impl, implJSON: implJSON,
		sessions: map[string]*list.Element{}, lru: list.New()}
}

// Session returns the session for t, opening it (and probing the era) on
// first use. The caller must not close it: Forget does.
func (p *Pool) Session(ctx context.Context, t Target) (*mcp.ClientSession, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	p.expireLocked()
	if el, ok := p.sessions[t.key()]; ok && el.Value.(*entry).target.session() == t.session() {
		e := el.Value.(*entry)
		p.lru.MoveToFront(el)
		e.used = p.opts.Now()
		p.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e.err != nil {
			return nil, e.err // its opener dropped it
		}
		return e.cs, nil
	}
	// The session lives as long as the context it is opened with: the
	// caller's values, none of its deadlines, ended by removal or Close.
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	e := &entry{key: t.key(), target: t, used: p.opts.Now(), ready: make(chan struct{}), cancel: cancel}
	if old, ok := p.sessions[t.key()]; ok {
		p.removeLocked(old)
	}
	p.sessions[e.key] = p.lru.PushFront(e)
	for p.lru.Len() > p.opts.MaxSessions {
		p.removeLocked(p.lru.Back())
	}
	if p.sweep == nil {
		p.sweep = time.AfterFunc(p.opts.IdleTimeout, p.sweepIdle)
	}
	p.mu.Unlock()
	// The opening goes on without its caller, who waits for it only as
	// long as ctx lets it (a server that never answers its discover or
	// initialize must not hold the caller past its deadline); it is given
	// up after OpenTimeout whoever waits.
	var state atomic.Int32 // opening, then opened or abandoned
	const opening, opened, abandoned = 0, 1, 2
	giveUp := time.AfterFunc(p.opts.OpenTimeout, func() {
		if state.CompareAndSwap(opening, abandoned) {
			cancel()
		}
	})
	go func() {
		cs, err := p.connect(cctx, t, nil, nil)
		giveUp.Stop()
		if !state.CompareAndSwap(opening, opened) {
			if cs != nil {
				cs.Close()
			}
			cs, err = nil, fmt.Errorf("mcpup: %s did not answer the session's opening within %s", t.URL, p.opts.OpenTimeout)
		}
		e.cs, e.err = cs, err
		if err != nil {
			p.drop(t, e) // before the callers hear of it: gone when they look
		}
		close(e.ready)
	}()
	select {
	case <-e.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if e.err != nil {
		return nil, e.err
	}
	return e.cs, nil
}

// Probe opens a session with t only to tell its era, and closes it. A
// server that answers 401 to a target without a connection (no token
// sent) gives an error wrapping ErrTokenRequired.
func (p *Pool) Probe(ctx context.Context, t Target) (string, error) {
	cs, err := p.Session(ctx, t)
	if err != nil {
		return "", err
	}
	defer p.Forget(t)
	return Era(cs), nil
}

// drop closes and drops t's session if it is still the one e holds: a
// caller that saw a session fail must not close the one another caller
// opened since.
func (p *Pool) drop(t Target, e *entry) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if el, ok := p.sessions[t.key()]; ok && el.Value.(*entry) == e {
		p.removeLocked(el)
	}
}

// dropSession is drop for the entry holding cs.
func (p *Pool) dropSession(t Target, cs *mcp.ClientSession) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.sessions[t.key()]
	if !ok {
		return
	}
	e := el.Value.(*entry)
	select {
	case <-e.ready:
		if e.cs == cs {
			p.removeLocked(el)
		}
	default: // another caller is opening a new one
	}
}

// Forget closes and drops t's session (after ErrSessionMissing, a
// disconnect, a reconnect with new tokens).
func (p *Pool) Forget(t Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if el, ok := p.sessions[t.key()]; ok {
		p.removeLocked(el)
	}
}

// Close closes every session and refuses new ones (ErrClosed); sessions
// being opened are abandoned. It returns once every session the pool
// opened is closed (a 2025-11-25 session is ended at the upstream with a
// DELETE, which the go-sdk bounds).
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	for _, stop := range p.listens {
		stop()
	}
	for p.lru.Len() > 0 {
		el := p.lru.Front()
		el.Value.(*entry).cancel() // an opening in progress gives up
		p.removeLocked(el)
	}
	for e, t := range p.retired {
		t.Stop()
		p.closeLocked(e)
	}
	clear(p.retired)
	if p.sweep != nil {
		p.sweep.Stop()
		p.sweep = nil
	}
	p.mu.Unlock()
	p.closing.Wait()
}

// Len is the number of sessions held.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lru.Len()
}

func (p *Pool) removeLocked(el *list.Element) {
	e := el.Value.(*entry)
	p.lru.Remove(el)
	if p.sessions[e.key] == el {
		delete(p.sessions, e.key)
	}
	p.closeLocked(e)
}

// closeLocked closes e's session once it is open (or given up).
func (p *Pool) closeLocked(e *entry) {
	p.closing.Go(func() {
		<-e.ready
		if e.cs != nil {
			e.cs.Close()
			p.wires.Delete(e.cs)
		}
		e.cancel()
	})
}

// listsChanged replaces t's session when it speaks 2026-07-28: the
// go-sdk's client keeps that session's lists (tools, prompts, resources)
// for the ttlMs the upstream gave them and does not hear the change,
// which came on a Listen session, so the next list would be the one
// before it. The next request opens a new session; the old one is
// retired, not closed, since requests may be in flight on it (closed
// after IdleTimeout, which is no shorter than the longest call when left
// at its default, provider.MaxCallTimeout; at most MaxSessions are kept
// so). A 2025-11-25 session keeps no lists.
func (p *Pool) listsChanged(t Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	el, ok := p.sessions[t.key()]
	if !ok || p.closed {
		return
	}
	e := el.Value.(*entry)
	select {
	case <-e.ready:
	default:
		return // being opened: it lists nothing before the change
	}
	if e.cs == nil || Era(e.cs) < "2026-07-28" {
		return
	}
	p.lru.Remove(el)
	delete(p.sessions, e.key)
	if len(p.retired) >= p.opts.MaxSessions {
		// An upstream announcing changes without end keeps no more
		// sessions than the pool holds: this one closes now.
		p.closeLocked(e)
		return
	}
	if p.retired == nil {
		p.retired = map[*entry]*time.Timer{}
	}
	p.retired[e] = time.AfterFunc(p.opts.IdleTimeout, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if _, ok := p.retired[e]; ok {
			delete(p.retired, e)
			p.closeLocked(e)
		}
	})
}

// sweepIdle closes the sessions idle longer than IdleTimeout without
// waiting for the pool's next use (a quiet broker would otherwise keep
// 2025-11-25 sessions open at their servers), then runs again when the
// oldest session left would be idle that long.
func (p *Pool) sweepIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.sweep == nil {
		return
	}
	p.expireLocked()
	el := p.lru.Back()
	if el == nil {
		p.sweep = nil
		return
	}
	next := el.Value.(*entry).used.Add(p.opts.IdleTimeout).Sub(p.opts.Now())
	p.sweep.Reset(max(next, time.Second))
}

// expireLocked closes the sessions idle longer than IdleTimeout.
func (p *Pool) expireLocked() {
	now := p.opts.Now()
	for el := p.lru.Back(); el != nil; {
		prev := el.Prev()
		if now.Sub(el.Value.(*entry).used) < p.opts.IdleTimeout {
			break
		}
		p.removeLocked(el)
		el = prev
	}
}

// connect opens a session with t: the era probed (discover, else
// initialize declaring url elicitation only). ctx lives as long as the
// session. With changed set, the session also hears the server's
// list-changed notifications (Listen), and acked is closed when a
// 2026-07-28 server acknowledges the subscription.
func (p *Pool) connect(ctx context.Context, t Target, changed func(method string), acked chan<- struct{}) (*mcp.ClientSession, error) {
	hc := *p.opts.HTTPClient
	tr := &mcp.StreamableClientTransport{Endpoint: t.URL, HTTPClient: &hc, MaxRetries: -1, DisableStandaloneSSE: true}
	ans := answers{next: transportOf(p.opts.HTTPClient), pool: p, refused: new(atomic.Bool)}
	w := &wire{url: t.URL}
	if t.Conn != "" {
		ans.secrets = &secrets{}
		w.auth = &oauthHandler{tokens: p.opts.Tokens, conn: t.Conn, secrets: ans.secrets, now: p.opts.Now}
		tr.OAuthHandler, ans.auth = w.auth, w.auth
	}
	hc.Transport = ans
	opts := &mcp.ClientOptions{
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		Capabilities:   &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		// A pushed url elicitation (a legacy upstream asking in-band) is
		// not relayed: the person is not listening on this session. Any
		// other push (a form elicitation) is a method the broker does not
		// serve (issue 31's era table).
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if req.Params.Mode != "url" {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "the broker relays no pushed form elicitation"}
			}
			return &mcp.ElicitResult{Action: "cancel"}, nil
		},
		// Progress is routed by answers, as it is read: the go-sdk's
		// handler would run after the response it preceded.
		Logger: p.log,
	}
	if changed != nil {
		// The go-sdk then opens a subscriptions/listen stream with a
		// 2026-07-28 server that declares listChanged (in the background:
		// a server that refuses it does not fail the session), and with a
		// 2025-11-25 one its standalone event stream. Each request is
		// answered at once, or given up.
		tr.DisableStandaloneSSE = false
		hc.Transport = headerDeadline{next: hc.Transport, d: p.opts.ListenWait}
		opts.ToolListChangedHandler = func(context.Context, *mcp.ToolListChangedRequest) { changed(ToolsListChanged) }
		opts.PromptListChangedHandler = func(context.Context, *mcp.PromptListChangedRequest) { changed(PromptsListChanged) }
		opts.ResourceListChangedHandler = func(context.Context, *mcp.ResourceListChangedRequest) { changed(ResourcesListChanged) }
	}
	// The pool's own exchange (direct.go) asks for no progress: its
	// answers are only redacted. A listening session keeps the go-sdk's
	// client as it is.
	own := hc
	if changed == nil {
		quiet := ans
		quiet.noProgress, quiet.auth = true, nil // it puts the token on itself
		own.Transport = quiet
	}
	w.hc = &own
	client := mcp.NewClient(p.impl, opts)
	// Nor does it serve a pushed sampling request or a roots listing,
	// which the go-sdk's client would answer itself (its own error for
	// sampling, an empty list for roots): the era table's -32601.
	client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch method {
			case "sampling/createMessage", "roots/list":
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "the broker relays no pushed " + method}
			}
			return next(ctx, method, req)
		}
	})
	if acked != nil {
		var once sync.Once
		client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
			return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
				if method == "notifications/subscriptions/acknowledged" {
					once.Do(func() { close(acked) })
				}
				return next(ctx, method, req)
			}
		})
	}
	ctx, rec := withRecorder(ctx)
	cs, err := client.Connect(ctx, tr, nil)
	if ns := rec.scope(); ns != nil {
		// The upstream wants more scopes for server/discover (the go-sdk's
		// fall back to initialize was stopped at the transport: a session
		// of the wrong era past the refusal): the step-up comes first.
		if cs != nil {
			cs.Close()
		}
		return nil, ns
	}
	switch {
	case err != nil && t.Conn == "" && ans.refused.Load():
		return nil, fmt.Errorf("%w: %w", ErrTokenRequired, err)
	case err != nil:
		return nil, rec.classify(err)
	}
	p.wires.Store(cs, w)
	return cs, nil
}

// Era returns the protocol version cs speaks.
func Era(cs *mcp.ClientSession) string {
	if r := cs.InitializeResult(); r != nil {
		return r.ProtocolVersion
	}
	return ""
}

// Do runs one request on t's session: op gets the session (re-opened
// once if the upstream forgot it) and ctx carries the per-request
// recorder that turns a second 401 into ErrUnauthorized. A session that
// may be broken after a failure (the transport failed, the upstream
// answered something that is not MCP, which makes the go-sdk close the
// session, or refused the token) is dropped, so the next request opens a
// new one.
func Do[T any](ctx context.Context, p *Pool, t Target, op func(context.Context, *mcp.ClientSession) (T, error)) (T, string, error) {
	var zero T
	for attempt := 0; ; attempt++ {
		cs, err := p.Session(ctx, t)
		if err != nil {
			return zero, "", err
		}
		rctx, rec := withRecorder(ctx)
		rec.version = t.Version
		out, err := guarded(rctx, cs, op)
		if err == nil {
			return out, Era(cs), nil
		}
		err = rec.classify(err)
		if !sessionSurvives(err) {
			p.dropSession(t, cs)
		}
		if errors.Is(err, mcp.ErrSessionMissing) && attempt == 0 {
			continue
		}
		return zero, Era(cs), err
	}
}

// guarded runs op, a panic of it (the go-sdk's decoder reading an
// upstream's answer: v1.8.0's InputRequestMap panics on a null entry) an
// error like an answer that cannot be read.
func guarded[T any](ctx context.Context, cs *mcp.ClientSession, op func(context.Context, *mcp.ClientSession) (T, error)) (out T, err error) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			out, err = zero, fmt.Errorf("mcpup: the upstream's answer could not be read (%v)", p)
		}
	}()
	return op(ctx, cs)
}

// sessionSurvives reports whether a session is still usable after a
// request on it failed with err: the upstream answered it (a JSON-RPC
// error, a 403 insufficient_scope) or the caller gave up.
func sessionSurvives(err error) bool {
	var we *jsonrpc.Error
	var ns *NeedScope
	return errors.As(err, &we) || errors.As(err, &ns) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// oauthHandler gives the connection's token for every request (put), and
// notes each token it hands out in the session's secrets. The token it
// last got is handed out again, without asking Tokens, to a request whose
// caller's listing shows the connection at the version it was read at,
// while it is usable (Target.Version): the session holds it anyway (its
// secrets). It is the go-sdk's OAuthHandler for its 401s and 403s, but it
// gives the go-sdk no token source: the go-sdk asks one on the session's
// context, which does not say what the request's caller listed, so the
// session's transport (answers) puts the token on instead.
type oauthHandler struct {
	tokens  Tokens
	conn    string
	secrets *secrets
	now     func() time.Time

	mu   sync.Mutex // guards last
	last Token
}

// token returns the token for a request on ctx: the last one while its
// version is the listing's and it is usable, else Tokens'.
func (h *oauthHandler) token(ctx context.Context) (Token, error) {
	rec, _ := ctx.Value(recorderKey{}).(*recorder)
	if rec != nil && rec.version != 0 {
		h.mu.Lock()
		last := h.last
		h.mu.Unlock()
		if last.Version == rec.version && h.now().Before(last.Until) {
			return last, nil
		}
	}
	tok, err := h.tokens.AccessToken(ctx, h.conn)
	if err != nil {
		return Token{}, err
	}
	h.secrets.add(tok)
	h.remember(tok)
	return tok, nil
}

// remember keeps tok as the last token (unless a later version is kept).
func (h *oauthHandler) remember(tok Token) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if tok.Version >= h.last.Version {
		h.last = tok
	}
}

// forget drops the last token: the upstream refused it.
func (h *oauthHandler) forget() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = Token{}
}

// put puts the token for a request on ctx in header, as the go-sdk
// would (a refresh the authorization server answered invalid_grant sends
// none, for the upstream's 401 to force the refresh that says the
// connection must be made again), and notes what it put in the request's
// recorder (the token Authorize refreshes when the go-sdk's request is
// refused: the go-sdk sees only its own copy of the request).
func (h *oauthHandler) put(ctx context.Context, header http.Header) error {
	tok, err := h.token(ctx)
	var re *oauth2.RetrieveError
	if err != nil && !(errors.As(err, &re) && re.ErrorCode == "invalid_grant") {
		return err
	}
	if err == nil {
		header["Authorization"] = []string{"Bearer " + tok.Access}
	}
	if rec, ok := ctx.Value(recorderKey{}).(*recorder); ok {
		rec.mu.Lock()
		rec.sent = tok.Access
		rec.mu.Unlock()
	}
	return nil
}

var _ auth.OAuthHandler = (*oauthHandler)(nil)

// TokenSource gives the go-sdk none: the session's transport puts the
// token on (see oauthHandler).
func (h *oauthHandler) TokenSource(context.Context) (oauth2.TokenSource, error) {
	return nil, nil
}

// Authorize answers a 401 with one forced refresh (the transport then
// retries once), a 403 insufficient_scope with *NeedScope.
func (h *oauthHandler) Authorize(ctx context.Context, req *http.Request, resp *http.Response) error {
	defer resp.Body.Close()
	rec, _ := ctx.Value(recorderKey{}).(*recorder)
	if rec == nil {
		rec = &recorder{}
	}
	if resp.StatusCode == http.StatusForbidden {
		ns := &NeedScope{}
		if cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate")); err == nil {
			for _, c := range cs {
				if insufficientScope(c.Scheme, c.Params) {
					ns.Scopes = strings.Fields(c.Params["scope"])
					rec.mu.Lock()
					rec.needScope = ns
					rec.mu.Unlock()
					return ns
				}
			}
		}
		return fmt.Errorf("mcpup: the upstream server answered 403")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch {
	case rec.refreshErr != nil:
		// The refresh already failed in this exchange (the go-sdk asks
		// again when it falls back from server/discover to initialize).
		return rec.refreshErr
	case rec.refreshed:
		// The token a forced refresh gave is refused too.
		return ErrUnauthorized
	}
	stale, _ := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if stale == "" {
		// The go-sdk's request: the token went on the transport's copy.
		stale = rec.sent
	}
	h.forget()
	fresh, err := h.tokens.ForceRefresh(ctx, h.conn, stale)
	if err != nil {
		rec.refreshErr = err
		return err
	}
	h.secrets.add(fresh)
	h.remember(fresh)
	rec.refreshed = true
	return nil
}

// insufficientScope reports whether a 403's challenge asks for more
// scopes: RFC 6750's error="insufficient_scope", or a Bearer challenge
// naming scope with no error at all, which is what the go-sdk's own
// auth.RequireBearerToken answers when a token lacks one of its Scopes.
func insufficientScope(scheme string, params map[string]string) bool {
	if scheme != "bearer" {
		return false
	}
	e, named := params["error"]
	return e == "insufficient_scope" || !named && params["scope"] != ""
}

// recorder follows one request's exchanges (a call, or opening a
// session, which may be server/discover and then initialize): whether a
// forced refresh was made and how it went, and whether a 401 came after
// it, so that the upstream refusing a fresh token (which the transport
// reports only in words) is typed, and an exchange forces one refresh at
// most.
type recorder struct {
	// version is the request's Target.Version (set before the request).
	version uint64

	mu sync.Mutex // guards the fields below
	// sent is the access token the exchange's last request carried.
	sent string
	// refreshed: a forced refresh gave a new token; refreshErr: it failed.
	refreshed  bool
	refreshErr error
	// refusedAfter: a 401 answered a request made after the refresh.
	refusedAfter bool
	// needScope: a 403 insufficient_scope answered a request.
	needScope *NeedScope
	// inputResult is the result, as the go-sdk read it (redacted), of the
	// exchange's first answer that was input_required (InputResult).
	inputResult json.RawMessage
}

// noteAnswer keeps msg's result when msg is the first answer of the
// exchange whose result asks for input (resultType input_required): the
// go-sdk decodes it into its types, which drop the members they do not
// know (InputResult). What follows it on the stream (which the go-sdk
// reads past) is not noted.
func (r *recorder) noteAnswer(msg []byte) {
	if !bytes.Contains(msg, []byte(`"input_required"`)) {
		return
	}
	var m struct {
		Method *string         `json:"method"`
		Result json.RawMessage `json:"result"`
	}
	var res struct {
		ResultType string `json:"resultType"`
	}
	if json.Unmarshal(msg, &m) != nil || m.Method != nil || m.Result == nil || json.Unmarshal(m.Result, &res) != nil || res.ResultType != "input_required" {
		return
	}
	r.mu.Lock()
	if r.inputResult == nil {
		r.inputResult = m.Result
	}
	r.mu.Unlock()
}

// InputResult is, within Do's op, the result of the first answer the
// upstream gave ctx's tools/call, prompts/get or resources/read through
// the go-sdk that asked for input (resultType input_required), as it was
// sent (redacted of the session's secrets, as the go-sdk read it): the
// input requests verbatim, members the go-sdk's types do not know
// included. It is the bytes the go-sdk decoded as long as the stream held
// no other such answer before the call's own (the caller compares the
// two). Nil when there was none, and for CallTool's own exchange, whose
// ToolResult.Raw is that result.
func InputResult(ctx context.Context) json.RawMessage {
	r, ok := ctx.Value(recorderKey{}).(*recorder)
	if !ok {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inputResult
}

// scope is the 403 insufficient_scope an exchange got, if any.
func (r *recorder) scope() *NeedScope {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.needScope
}

type recorderKey struct{}

func withRecorder(ctx context.Context) (context.Context, *recorder) {
	r := &recorder{}
	return context.WithValue(ctx, recorderKey{}, r), r
}

func (r *recorder) classify(err error) error {
	r.mu.Lock()
	refused := r.refusedAfter
	r.mu.Unlock()
	var ns *NeedScope
	switch {
	case errors.As(err, &ns), errors.Is(err, ErrNoToken), errors.Is(err, ErrUnauthorized):
		return err
	case refused:
		return fmt.Errorf("%w: %w", ErrUnauthorized, err)
	}
	return err
}

func transportOf(c *http.Client) http.RoundTripper {
	if c.Transport != nil {
		return c.Transport
	}
	return http.DefaultTransport
}
