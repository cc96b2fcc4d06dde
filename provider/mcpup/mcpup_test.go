package mcpup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/egress"
)

// upstream is a go-sdk MCP server on loopback for the pool's tests:
// modern (stateless, both eras) or legacy only (stateful, 2025-11-25),
// behind bearer tokens when tokens is set, every request recorded.
//
// Tools: echo (answers "echo" and its arguments), admin (403
// insufficient_scope "admin issues:write" for every token). The methods in
// forbidden get 403 insufficient_scope "issues:read" for every token.
type upstream struct {
	t      testing.TB
	srv    *httptest.Server
	legacy bool
	// sse: a modern server answers calls as event streams (else JSON);
	// set before restart.
	sse bool
	// quiet records no headers (a soak's thousands of requests).
	quiet bool

	mu      sync.Mutex // guards the fields below
	handler http.Handler
	server  *mcp.Server
	// tokens are the access tokens it takes (nil: it takes no token).
	tokens    map[string]bool
	forbidden map[string]bool
	seen      []seenRequest
}

// seenRequest is what the upstream received.
type seenRequest struct {
	HTTPMethod, RPC, Session string
	Header                   http.Header
	Body                     []byte
	Status                   int
}

func newUpstream(t testing.TB, legacy bool) *upstream {
	return startUpstream(&upstream{t: t, legacy: legacy})
}

// newSSEUpstream is a modern upstream answering calls as event streams.
func newSSEUpstream(t testing.TB) *upstream {
	return startUpstream(&upstream{t: t, sse: true})
}

func startUpstream(u *upstream) *upstream {
	t := u.t
	u.handler = u.newHandler()
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) url() string { return u.srv.URL + "/mcp" }

// newHandler is a fresh go-sdk handler: a restarted server, which knows
// no session.
func (u *upstream) newHandler() http.Handler {
	opts := &mcp.ServerOptions{}
	if u.legacy {
		opts.SupportedProtocolVersions = []string{"2025-11-25"}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, opts)
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo " + string(req.Params.Arguments)}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "admin", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "admin"}}}, nil
		})
	u.server = server
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: !u.legacy, JSONResponse: !u.sse, DisableLocalhostProtection: true})
}

// restart replaces the server: every session is forgotten.
func (u *upstream) restart() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.handler = u.newHandler()
}

func (u *upstream) with(f func()) {
	u.mu.Lock()
	defer u.mu.Unlock()
	f()
}

func (u *upstream) setTokens(toks ...string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.tokens = map[string]bool{}
	for _, t := range toks {
		u.tokens[t] = true
	}
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var msg struct {
		Method string `json:"method"`
		Params struct {
			Name string `json:"name"`
		} `json:"params"`
	}
	_ = json.Unmarshal(body, &msg)
	s := seenRequest{HTTPMethod: r.Method, RPC: msg.Method, Session: r.Header.Get("Mcp-Session-Id")}
	if !u.quiet {
		s.Header, s.Body = r.Header.Clone(), body
	}
	u.mu.Lock()
	h, toks, forbidden := u.handler, u.tokens, u.forbidden[msg.Method]
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	ok := toks == nil || toks[tok]
	u.mu.Unlock()
	// Only a stream that lasts is flushed as it is written (an answer is
	// held until it is whole, as before the request is recorded below).
	rec := &statusWriter{ResponseWriter: w, status: http.StatusOK, stream: r.Method == http.MethodGet || msg.Method == "subscriptions/listen"}
	switch {
	case !ok:
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token", resource_metadata="`+u.srv.URL+`/.well-known/oauth-protected-resource/mcp"`)
		http.Error(rec, `{"error":"invalid_token"}`, http.StatusUnauthorized)
	case toks != nil && msg.Method == "tools/call" && msg.Params.Name == "admin":
		w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="admin issues:write", resource_metadata="`+u.srv.URL+`/.well-known/oauth-protected-resource/mcp"`)
		http.Error(rec, `{"error":"insufficient_scope"}`, http.StatusForbidden)
	case toks != nil && forbidden:
		w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="issues:read", resource_metadata="`+u.srv.URL+`/.well-known/oauth-protected-resource/mcp"`)
		http.Error(rec, `{"error":"insufficient_scope"}`, http.StatusForbidden)
	default:
		h.ServeHTTP(rec, r)
	}
	s.Status = rec.status
	u.mu.Lock()
	u.seen = append(u.seen, s)
	u.mu.Unlock()
}

type statusWriter struct {
	http.ResponseWriter
	status int
	stream bool
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush lets a lasting event stream (subscriptions/listen, a 2025-11-25
// session's GET) through as it is written.
func (s *statusWriter) Flush() {
	if s.stream {
		http.NewResponseController(s.ResponseWriter).Flush()
	}
}

// requests returns what the upstream received.
func (u *upstream) requests() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.seen)
}

// count counts the received requests of JSON-RPC method rpc (HTTP method
// DELETE when rpc is "DELETE").
func (u *upstream) count(rpc string) int {
	n := 0
	for _, s := range u.requests() {
		if s.RPC == rpc || rpc == "DELETE" && s.HTTPMethod == http.MethodDelete {
			n++
		}
	}
	return n
}

// deleted reports whether the upstream was told session id is closed.
func (u *upstream) deleted(id string) bool {
	for _, s := range u.requests() {
		if s.HTTPMethod == http.MethodDelete && s.Session == id {
			return true
		}
	}
	return false
}

// fakeTokens is the provider client's side: each connection's access
// token, and a forced refresh that replaces it.
type fakeTokens struct {
	mu sync.Mutex // guards the fields below
	// tok is each connection's current access token; refresh its
	// refresh token (none when absent).
	tok, refresh map[string]string
	// fresh are the tokens forced refreshes hand out, in order (then
	// "<conn>-refreshed-<n>").
	fresh []string
	// accessErr and refreshErr fail AccessToken and ForceRefresh.
	accessErr, refreshErr error
	// stales are the tokens ForceRefresh was asked to replace.
	stales []string
	// version is each connection's record version (none: 0), given with
	// its tokens, usable until until; asked counts AccessToken calls.
	version map[string]uint64
	until   time.Time
	asked   int
}

func (f *fakeTokens) AccessToken(_ context.Context, id string) (Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	if f.accessErr != nil {
		return Token{}, f.accessErr
	}
	return Token{Access: f.tok[id], Refresh: f.refresh[id], Version: f.version[id], Until: f.until}, nil
}

// replace is another replica's refresh: a new token at the next version.
func (f *fakeTokens) replace(id, tok string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tok[id] = tok
	if f.version != nil {
		f.version[id]++
	}
}

func (f *fakeTokens) askedFor() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.asked
}

func (f *fakeTokens) ForceRefresh(_ context.Context, id, stale string) (Token, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stales = append(f.stales, stale)
	if f.refreshErr != nil {
		return Token{}, f.refreshErr
	}
	if f.tok[id] == stale {
		if len(f.fresh) > 0 {
			f.tok[id], f.fresh = f.fresh[0], f.fresh[1:]
		} else {
			f.tok[id] = fmt.Sprintf("%s-refreshed-%d", id, len(f.stales))
		}
		if f.version != nil {
			f.version[id]++
		}
	}
	return Token{Access: f.tok[id], Refresh: f.refresh[id], Version: f.version[id], Until: f.until}, nil
}

func (f *fakeTokens) refreshes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.stales)
}

// echo calls the echo tool on t's session.
func echo(ctx context.Context, p *Pool, t Target, arg string) (string, string, error) {
	return echoVia(ctx, p, t, arg, viaSession)
}

// via is how a test's call reaches the upstream: through the session (the
// go-sdk's client), or through the pool's own exchange (CallTool, which
// must take it: the call is a failure otherwise).
type via int

const (
	viaSession via = iota
	viaDirect
)

func (v via) String() string { return [...]string{"session", "direct"}[v] }

// hostCaps are the client capabilities a gateway call carries.
func hostCaps() mcp.Meta {
	return mcp.Meta{mcp.MetaKeyClientCapabilities: map[string]json.RawMessage{"elicitation": json.RawMessage(`{"url":{}}`)}}
}

// callVia makes the call params on t's session, v's way.
func callVia(ctx context.Context, p *Pool, t Target, v via, params *mcp.CallToolParams) (*mcp.CallToolResult, string, error) {
	return Do(ctx, p, t, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
		if v == viaSession {
			return cs.CallTool(ctx, params)
		}
		tr, err := p.CallTool(ctx, cs, t, params, 1<<20)
		if err != nil {
			return nil, err
		}
		defer tr.Finish()
		if tr.Raw == nil {
			return nil, errors.New("the call went through the session, not the pool's own exchange")
		}
		var r mcp.CallToolResult
		return &r, r.UnmarshalJSON(tr.Raw)
	})
}

// echoVia calls the echo tool on t's session, v's way (directly with the
// client capabilities a gateway call carries, which it needs).
func echoVia(ctx context.Context, p *Pool, t Target, arg string, v via) (string, string, error) {
	params := &mcp.CallToolParams{Name: "echo", Arguments: map[string]string{"x": arg}}
	if v == viaDirect {
		params.Meta = hostCaps()
	}
	res, era, err := callVia(ctx, p, t, v, params)
	if err != nil {
		return "", era, err
	}
	if len(res.Content) != 1 {
		return "", era, fmt.Errorf("echo answered %d contents", len(res.Content))
	}
	return res.Content[0].(*mcp.TextContent).Text, era, nil
}

// ways are the upstreams and paths a call's behaviour must hold on: a
// modern session, a legacy one, and the pool's own exchange on a modern
// one.
var ways = []way{{false, viaSession}, {true, viaSession}, {false, viaDirect}}

type way struct {
	legacy bool
	via    via
}

func (w way) String() string { return fmt.Sprintf("legacy %v via %s", w.legacy, w.via) }

// newPool is a pool on the broker's egress policy (loopback allowed, as
// with --upstream-allow-private).
func newPool(t testing.TB, o Options) *Pool {
	if o.HTTPClient == nil {
		c, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true})
		if err != nil {
			t.Fatal(err)
		}
		o.HTTPClient = c
	}
	return New(o)
}

// testClock is a clock tests move by hand (nanoseconds since the epoch).
type testClock struct{ ns atomic.Int64 }

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// waitFor polls cond until it holds (the pool closes sessions in the
// background), failing the test after a generous while.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestEraProbe: a session's era is the server's: 2026-07-28 from
// server/discover, 2025-11-25 from initialize when the server speaks
// only that.
func TestEraProbe(t *testing.T) {
	for _, c := range []struct {
		legacy bool
		want   string
		rpcs   []string
	}{
		{false, "2026-07-28", []string{"server/discover", "tools/call"}},
		{true, "2025-11-25", []string{"server/discover", "initialize", "notifications/initialized", "tools/call"}},
	} {
		t.Run(c.want, func(t *testing.T) {
			u := newUpstream(t, c.legacy)
			p := newPool(t, Options{})
			out, era, err := echo(context.Background(), p, Target{Provider: "up", URL: u.url()}, "hi")
			if err != nil || era != c.want || out != `echo {"x":"hi"}` {
				t.Fatalf("echo = %q, era %q, %v; want era %s", out, era, err, c.want)
			}
			var rpcs []string
			for _, s := range u.requests() {
				rpcs = append(rpcs, s.RPC)
			}
			if !slices.Equal(rpcs, c.rpcs) {
				t.Fatalf("the upstream received %v, want %v", rpcs, c.rpcs)
			}
			if c.legacy && p.Len() != 1 {
				t.Fatalf("%d sessions held", p.Len())
			}
		})
	}
}

// TestOpenTargetSendsNoAuthorization: a server that takes no token gets
// no Authorization header, whatever the pool's token source holds.
func TestOpenTargetSendsNoAuthorization(t *testing.T) {
	for _, w := range ways {
		u := newUpstream(t, w.legacy)
		p := newPool(t, Options{Tokens: &fakeTokens{tok: map[string]string{"": "should-not-be-sent", "open:up": "should-not-be-sent"}}})
		if _, _, err := echoVia(context.Background(), p, Target{Provider: "up", URL: u.url()}, "hi", w.via); err != nil {
			t.Fatal(err)
		}
		for _, s := range u.requests() {
			if v := s.Header.Values("Authorization"); len(v) != 0 {
				t.Fatalf("%s: %s carried Authorization %q", w, s.RPC, v)
			}
		}
	}
}

// TestHostHeadersNeverReachUpstream: a call made while serving a host's
// request carries none of the host's headers (its bearer token, cookies,
// session id, anything else): only what the MCP client sets, and the
// connection's own token.
func TestHostHeadersNeverReachUpstream(t *testing.T) {
	for _, way := range ways {
		legacy := way.legacy
		t.Run(way.String(), func(t *testing.T) {
			u := newUpstream(t, legacy)
			u.setTokens("upstream-token")
			p := newPool(t, Options{Tokens: &fakeTokens{tok: map[string]string{"conn-1": "upstream-token"}}})
			target := Target{Provider: "up", URL: u.url(), Conn: "conn-1"}
			host := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				out, _, err := echoVia(r.Context(), p, target, "from the host", way.via)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadGateway)
					return
				}
				io.WriteString(w, out)
			}))
			defer host.Close()
			req, _ := http.NewRequest(http.MethodPost, host.URL+"/mcp/u/up", strings.NewReader(`{}`))
			for k, v := range map[string]string{"Authorization": "Bearer host-token", "Cookie": "session=host-cookie",
				"Mcp-Session-Id": "host-session", "X-Forwarded-For": "10.9.9.9", "Traceparent": "00-host-trace-01", "X-Custom": "host-custom"} {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("host request: %d %s", resp.StatusCode, body)
			}
			allowed := []string{"Accept", "Accept-Encoding", "Authorization", "Content-Length", "Content-Type", "Mcp-Method", "Mcp-Name",
				"Mcp-Protocol-Version", "Mcp-Session-Id", "User-Agent", "Last-Event-Id"}
			sessions := map[string]bool{}
			for _, s := range u.requests() {
				for name, vals := range s.Header {
					if !slices.Contains(allowed, name) {
						t.Errorf("%s carried header %s: %q", s.RPC, name, vals)
					}
					for _, v := range vals {
						if strings.Contains(v, "host-") || strings.Contains(v, "10.9.9.9") {
							t.Errorf("%s carried the host's %s: %q", s.RPC, name, v)
						}
					}
				}
				if got := s.Header.Get("Authorization"); got != "Bearer upstream-token" {
					t.Errorf("%s carried Authorization %q, want the connection's token", s.RPC, got)
				}
				if s.Session != "" {
					sessions[s.Session] = true
				}
			}
			if legacy && len(sessions) != 1 || !legacy && len(sessions) != 0 {
				t.Errorf("session ids sent: %v", sessions)
			}
		})
	}
}

// TestPoolLRU: beyond MaxSessions the least recently used session is
// closed (the upstream is told) and a later use opens it again.
func TestPoolLRU(t *testing.T) {
	u := newUpstream(t, true)
	p := newPool(t, Options{MaxSessions: 2})
	ctx := context.Background()
	target := func(name string) Target { return Target{Provider: name, URL: u.url()} }
	session := func(name string) *mcp.ClientSession {
		t.Helper()
		cs, err := p.Session(ctx, target(name))
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	a, b := session("a"), session("b")
	if session("a") != a {
		t.Fatal("a second use opened another session")
	}
	c := session("c")
	if p.Len() != 2 {
		t.Fatalf("%d sessions held, want 2", p.Len())
	}
	waitFor(t, "b's session to be closed", func() bool { return u.deleted(b.ID()) })
	if u.deleted(a.ID()) || u.deleted(c.ID()) {
		t.Fatal("a recently used session was closed")
	}
	if _, _, err := echo(ctx, p, target("a"), "still open"); err != nil {
		t.Fatal(err)
	}
	b2 := session("b") // now c is the least recently used
	if b2 == b || b2.ID() == b.ID() || p.Len() != 2 {
		t.Fatalf("b was not opened again (%d sessions)", p.Len())
	}
	waitFor(t, "c's session to be closed", func() bool { return u.deleted(c.ID()) })
	if u.count("initialize") != 4 {
		t.Fatalf("%d sessions opened, want 4", u.count("initialize"))
	}
}

// TestPoolIdleExpiry: a session unused for IdleTimeout is closed at the
// pool's next use; one used since is kept.
func TestPoolIdleExpiry(t *testing.T) {
	u := newUpstream(t, true)
	clock := &testClock{}
	clock.ns.Store(time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	p := newPool(t, Options{IdleTimeout: 10 * time.Minute, Now: clock.Now})
	ctx := context.Background()
	a, err := p.Session(ctx, Target{Provider: "a", URL: u.url()})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(6 * time.Minute)
	b, err := p.Session(ctx, Target{Provider: "b", URL: u.url()})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(4*time.Minute - time.Second)
	if _, _, err := echo(ctx, p, Target{Provider: "b", URL: u.url()}, "x"); err != nil || p.Len() != 2 {
		t.Fatalf("just before a's idle timeout: %v, %d sessions", err, p.Len())
	}
	clock.Advance(time.Second)
	if _, _, err := echo(ctx, p, Target{Provider: "b", URL: u.url()}, "x"); err != nil || p.Len() != 1 {
		t.Fatalf("at a's idle timeout: %v, %d sessions, want 1", err, p.Len())
	}
	waitFor(t, "a's session to be closed", func() bool { return u.deleted(a.ID()) })
	if u.deleted(b.ID()) {
		t.Fatal("the session in use was closed")
	}
	// b was last used at 10 minutes, opened at 6: at 16 it is kept.
	clock.Advance(6 * time.Minute)
	if cs, err := p.Session(ctx, Target{Provider: "b", URL: u.url()}); err != nil || cs != b || p.Len() != 1 {
		t.Fatalf("six minutes after its last use: %v, a new session %v, %d sessions", err, cs != b, p.Len())
	}
	clock.Advance(time.Hour)
	a2, err := p.Session(ctx, Target{Provider: "a", URL: u.url()})
	if err != nil || a2 == a || p.Len() != 1 {
		t.Fatalf("after an hour: %v, %d sessions", err, p.Len())
	}
	waitFor(t, "b's session to be closed", func() bool { return u.deleted(b.ID()) })
}

// TestPoolConcurrentFirstUse: callers that need a target's session at
// once share the one the first of them opens.
func TestPoolConcurrentFirstUse(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy %v", legacy), func(t *testing.T) {
			u := newUpstream(t, legacy)
			tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}}
			u.setTokens("tok-1")
			p := newPool(t, Options{Tokens: tokens})
			target := Target{Provider: "up", URL: u.url(), Conn: "conn-1"}
			const callers = 20
			sessions := make([]*mcp.ClientSession, callers)
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					cs, err := p.Session(context.Background(), target)
					if err != nil {
						t.Error(err)
					}
					sessions[i] = cs
				})
			}
			wg.Wait()
			for _, cs := range sessions {
				if cs == nil || cs != sessions[0] {
					t.Fatal("callers got different sessions")
				}
			}
			if n := u.count("server/discover"); n != 1 || p.Len() != 1 {
				t.Fatalf("%d sessions opened, %d held; want 1", n, p.Len())
			}
		})
	}
}

// TestSessionMissingReopensOnce: a legacy server that forgot the session
// (restarted: 404) gets one new session and the call once more; one that
// forgets it again fails the call.
func TestSessionMissingReopensOnce(t *testing.T) {
	u := newUpstream(t, true)
	p := newPool(t, Options{})
	ctx := context.Background()
	target := Target{Provider: "up", URL: u.url()}
	if _, _, err := echo(ctx, p, target, "before"); err != nil {
		t.Fatal(err)
	}
	old, _ := p.Session(ctx, target)
	u.restart()
	out, era, err := echo(ctx, p, target, "after")
	if err != nil || out != `echo {"x":"after"}` || era != "2025-11-25" {
		t.Fatalf("after a restart: %q, %v", out, err)
	}
	if cs, _ := p.Session(ctx, target); cs == old || u.count("initialize") != 2 || u.count("tools/call") != 3 || p.Len() != 1 {
		t.Fatalf("initialize %d times, tools/call %d times, %d sessions; want 2, 3 (one refused), 1",
			u.count("initialize"), u.count("tools/call"), p.Len())
	}

	// A server that forgets the session at every call: one retry, no
	// more.
	forgetful := newUpstream(t, true)
	fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"tools/call"`)) {
			forgetful.restart()
		}
		forgetful.serve(w, r)
	}))
	defer fs.Close()
	_, _, err = echo(ctx, p, Target{Provider: "forgetful", URL: fs.URL + "/mcp"}, "x")
	if !errors.Is(err, mcp.ErrSessionMissing) || forgetful.count("initialize") != 2 || forgetful.count("tools/call") != 2 {
		t.Fatalf("a server forgetting every session: %v after %d sessions and %d calls, want ErrSessionMissing after 2 and 2",
			err, forgetful.count("initialize"), forgetful.count("tools/call"))
	}
}

// TestUnauthorizedRefreshesOnce: a 401 forces one refresh of the stale
// token and the request is sent again, on opening a session and on a
// call; a second 401 is ErrUnauthorized and drops the session.
func TestUnauthorizedRefreshesOnce(t *testing.T) {
	for _, w := range ways {
		t.Run(w.String(), func(t *testing.T) {
			u := newUpstream(t, w.legacy)
			tokens := &fakeTokens{tok: map[string]string{"conn-1": "expired"}, fresh: []string{"tok-2", "tok-3", "tok-4"}}
			u.setTokens("tok-2")
			p := newPool(t, Options{Tokens: tokens})
			ctx := context.Background()
			target := Target{Provider: "up", URL: u.url(), Conn: "conn-1"}
			// Opening: refused, refreshed, accepted.
			if out, _, err := echoVia(ctx, p, target, "1", w.via); err != nil || out != `echo {"x":"1"}` {
				t.Fatalf("first call: %q, %v", out, err)
			}
			if r := tokens.refreshes(); !slices.Equal(r, []string{"expired"}) {
				t.Fatalf("forced refreshes of %v, want one of the refused token", r)
			}
			// A call whose token the server stopped taking.
			u.setTokens("tok-3")
			if out, _, err := echoVia(ctx, p, target, "2", w.via); err != nil || out != `echo {"x":"2"}` {
				t.Fatalf("second call: %q, %v", out, err)
			}
			if r := tokens.refreshes(); !slices.Equal(r, []string{"expired", "tok-2"}) || p.Len() != 1 {
				t.Fatalf("forced refreshes of %v, %d sessions", r, p.Len())
			}
			// Refused again after the refresh: ErrUnauthorized, one refresh
			// more, and the session is dropped.
			u.setTokens("nothing-we-have")
			_, _, err := echoVia(ctx, p, target, "3", w.via)
			if !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("after a second 401: %v, want ErrUnauthorized", err)
			}
			if r := tokens.refreshes(); len(r) != 3 || r[2] != "tok-3" || p.Len() != 0 {
				t.Fatalf("forced refreshes of %v, %d sessions; want one more (of tok-3), none held", r, p.Len())
			}
			// The same on opening a session.
			_, _, err = echoVia(ctx, p, target, "4", w.via)
			if !errors.Is(err, ErrUnauthorized) || len(tokens.refreshes()) != 4 || p.Len() != 0 {
				t.Fatalf("opening refused twice: %v, %d refreshes, %d sessions", err, len(tokens.refreshes()), p.Len())
			}
		})
	}
}

// TestTokenAtListedVersion: a session hands out the token it last got
// again, without asking Tokens, while the caller's listing shows the
// connection at the version that token was read at and it is usable; a
// new version (another replica refreshed), its end of use, or no version
// asks again. A token refreshed elsewhere but not yet listed is used
// stale until the upstream refuses it: the 401's forced refresh gets the
// stored token, refreshing nothing more, and the next calls use it. The
// same on every way a call goes: the pool's own exchange, and the go-sdk's
// session of either era (whose token source would be asked on the
// session's context, which does not carry the request's version).
func TestTokenAtListedVersion(t *testing.T) {
	for _, w := range ways {
		t.Run(w.String(), func(t *testing.T) {
			u := newUpstream(t, w.legacy)
			u.setTokens("tok-1")
			now := time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)
			var mu sync.Mutex
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}, version: map[string]uint64{"conn-1": 4}, until: now.Add(time.Hour)}
			p := newPool(t, Options{Tokens: tokens, Now: clock})
			ctx := context.Background()
			target := Target{Provider: "up", URL: u.url(), Conn: "conn-1", Version: 4}
			call := func(what string, tg Target) {
				t.Helper()
				if out, _, err := echoVia(ctx, p, tg, what, w.via); err != nil || out != `echo {"x":"`+what+`"}` {
					t.Fatalf("%s: %q, %v", what, out, err)
				}
			}
			call("first", target) // opens the session (its requests ask)
			asked := tokens.askedFor()
			call("second", target)
			call("third", target)
			if n := tokens.askedFor(); n != asked {
				t.Fatalf("Tokens asked %d times more at the listed version, want none", n-asked)
			}
			// Unversioned: asked every time, as before.
			unversioned := target
			unversioned.Version = 0
			call("unversioned", unversioned)
			if n := tokens.askedFor(); n == asked {
				t.Fatalf("a call without a listed version did not ask for the token")
			}
			// Another replica refreshed (version 5, tok-2; the upstream no
			// longer takes tok-1): a listing still at 4 sends tok-1, the
			// 401 forces a refresh that finds tok-2 stored.
			tokens.replace("conn-1", "tok-2")
			u.setTokens("tok-2")
			call("stale", target)
			if r := tokens.refreshes(); !slices.Equal(r, []string{"tok-1"}) {
				t.Fatalf("forced refreshes of %v, want one of tok-1", r)
			}
			target.Version = 5
			asked = tokens.askedFor()
			call("listed", target)
			call("listed-again", target)
			if n := tokens.askedFor(); n != asked {
				t.Fatalf("Tokens asked %d times after the refresh at the listed version, want none", n-asked)
			}
			// Past its end of use: asked again.
			mu.Lock()
			now = now.Add(2 * time.Hour)
			mu.Unlock()
			call("late", target)
			if n := tokens.askedFor(); n == asked {
				t.Fatalf("a token past its end of use was handed out again")
			}
			if r := tokens.refreshes(); len(r) != 1 {
				t.Fatalf("forced refreshes of %v, want only the one", r)
			}
		})
	}
}

// TestInsufficientScope: a 403 insufficient_scope is a *NeedScope with
// the challenge's scopes, refreshes nothing and keeps the session.
func TestInsufficientScope(t *testing.T) {
	for _, w := range ways {
		u := newUpstream(t, w.legacy)
		tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}}
		u.setTokens("tok-1")
		p := newPool(t, Options{Tokens: tokens})
		target := Target{Provider: "up", URL: u.url(), Conn: "conn-1"}
		params := &mcp.CallToolParams{Name: "admin", Arguments: map[string]any{}}
		if w.via == viaDirect {
			params.Meta = hostCaps()
		}
		_, _, err := callVia(context.Background(), p, target, w.via, params)
		var ns *NeedScope
		if !errors.As(err, &ns) || !slices.Equal(ns.Scopes, []string{"admin", "issues:write"}) || errors.Is(err, ErrUnauthorized) {
			t.Fatalf("%s: %v, want *NeedScope{admin issues:write}", w, err)
		}
		if len(tokens.refreshes()) != 0 || p.Len() != 1 {
			t.Fatalf("%s: %d refreshes, %d sessions", w, len(tokens.refreshes()), p.Len())
		}
		if _, _, err := echoVia(context.Background(), p, target, "ok", w.via); err != nil {
			t.Fatalf("%s: the session broke: %v", w, err)
		}
	}
}

// TestListen: a listening session hears the server's list changes: a
// 2026-07-28 server's over subscriptions/listen, acknowledged before
// Listen returns (so a change right after is heard), a 2025-11-25 one's on
// its standalone event stream. It takes no place in the pool and ends
// with its context.
func TestListen(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy %v", legacy), func(t *testing.T) {
			u := newUpstream(t, legacy)
			u.sse = true
			u.restart()
			// The broker's client of MCP servers: no time limit on a whole
			// exchange (a stream lasts).
			hc, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true, Timeout: -1})
			if err != nil {
				t.Fatal(err)
			}
			p := newPool(t, Options{HTTPClient: hc})
			heard := make(chan string, 16)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if err := p.Listen(ctx, Target{Provider: "up", URL: u.url()}, func(m string) { heard <- m }); err != nil {
				t.Fatal(err)
			}
			if p.Len() != 0 {
				t.Fatalf("%d sessions in the pool", p.Len())
			}
			u.mu.Lock()
			server := u.server
			u.mu.Unlock()
			add := func(i int) {
				server.AddTool(&mcp.Tool{Name: fmt.Sprintf("late%d", i), InputSchema: json.RawMessage(`{"type":"object"}`)},
					func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
						return &mcp.CallToolResult{}, nil
					})
			}
			if !legacy {
				add(0)
				select {
				case m := <-heard:
					if m != ToolsListChanged {
						t.Fatalf("heard %s", m)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the change right after Listen was not heard")
				}
				return
			}
			// The standalone stream opens in the background: change until
			// one is heard.
			for i := 0; ; i++ {
				add(i)
				select {
				case m := <-heard:
					if m != ToolsListChanged {
						t.Fatalf("heard %s", m)
					}
					cancel()
					waitFor(t, "the session's end", func() bool { return u.count("DELETE") == 1 })
					return
				case <-time.After(100 * time.Millisecond):
				}
				if i == 300 {
					t.Fatal("no change heard in 30 s")
				}
			}
		})
	}
}

// TestListenGivesUp: a server that answers nothing holds Listen up for
// twice Options.ListenWait at most (server/discover, then initialize), and
// Listen says it could not listen.
func TestListenGivesUp(t *testing.T) {
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(silent.Close)
	t.Cleanup(func() { close(release) })
	hc, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true, Timeout: -1})
	if err != nil {
		t.Fatal(err)
	}
	p := newPool(t, Options{HTTPClient: hc, ListenWait: 200 * time.Millisecond})
	start := time.Now()
	err = p.Listen(context.Background(), Target{Provider: "up", URL: silent.URL + "/mcp"}, func(string) {})
	if err == nil || time.Since(start) > 10*time.Second {
		t.Fatalf("Listen = %v after %s, want an error within twice the wait", err, time.Since(start))
	}
	t.Logf("Listen after %s: %v", time.Since(start), err)
}

// TestInsufficientScopeAtDiscover: a 403 insufficient_scope answering the
// server/discover that opens a session is a *NeedScope with the
// challenge's scopes, not a fall back to initialize (the go-sdk's answer
// to a failed discover, which would open a session of the wrong era past
// the server's refusal); no session is kept.
func TestInsufficientScopeAtDiscover(t *testing.T) {
	u := newUpstream(t, false)
	u.setTokens("tok-1")
	u.with(func() { u.forbidden = map[string]bool{"server/discover": true} })
	tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}}
	p := newPool(t, Options{Tokens: tokens})
	_, era, err := echo(context.Background(), p, Target{Provider: "up", URL: u.url(), Conn: "conn-1"}, "x")
	var ns *NeedScope
	if !errors.As(err, &ns) || !slices.Equal(ns.Scopes, []string{"issues:read"}) {
		t.Fatalf("echo: %v (era %q), want *NeedScope{issues:read}", err, era)
	}
	if n := u.count("initialize"); n != 0 || p.Len() != 0 || len(tokens.refreshes()) != 0 {
		t.Fatalf("%d initialize requests, %d sessions kept, %d refreshes", n, p.Len(), len(tokens.refreshes()))
	}
}

// TestNoTokenPassthrough: a token source error that wraps ErrNoToken
// (the connection must be made again) comes back as it is, as does any
// other (an authorization server that is down), never as
// ErrUnauthorized; a session that could not be opened is not kept.
func TestNoTokenPassthrough(t *testing.T) {
	down := errors.New("the authorization server is down")
	for _, c := range []struct {
		name               string
		accessErr, refresh error
		start              string // the token the source has, when accessErr is nil
		isNoToken          bool
		want               error
	}{
		{name: "no token", accessErr: fmt.Errorf("%w: needs reconnect", ErrNoToken), isNoToken: true, want: ErrNoToken},
		{name: "source down", accessErr: down, want: down},
		{name: "refresh says reconnect", start: "expired", refresh: fmt.Errorf("%w: invalid_grant", ErrNoToken), isNoToken: true, want: ErrNoToken},
		{name: "refresh down", start: "expired", refresh: down, want: down},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := newUpstream(t, false)
			u.setTokens("tok-1")
			tokens := &fakeTokens{tok: map[string]string{"conn-1": c.start}, accessErr: c.accessErr, refreshErr: c.refresh}
			p := newPool(t, Options{Tokens: tokens})
			_, _, err := echo(context.Background(), p, Target{Provider: "up", URL: u.url(), Conn: "conn-1"}, "x")
			if !errors.Is(err, c.want) || errors.Is(err, ErrNoToken) != c.isNoToken || errors.Is(err, ErrUnauthorized) {
				t.Fatalf("err = %v; want %v (ErrNoToken %v), never ErrUnauthorized", err, c.want, c.isNoToken)
			}
			if p.Len() != 0 {
				t.Fatalf("%d sessions kept", p.Len())
			}
			// A failed refresh is not tried again in the same exchange (the
			// go-sdk falls back from server/discover to initialize).
			if n := len(tokens.refreshes()); c.refresh != nil && n != 1 || c.refresh == nil && n != 0 {
				t.Fatalf("%d forced refreshes", n)
			}
			for _, s := range u.requests() {
				if s.Status == http.StatusOK {
					t.Fatalf("%s reached the server", s.RPC)
				}
			}
		})
	}
}

// TestSessionReopenedAfterTransportFailure: an upstream answering a call
// with something that is not MCP (a plain-text 400) fails that call; the
// go-sdk closes the session then, so the next call runs on a new one. A
// JSON-RPC error keeps the session.
func TestSessionReopenedAfterTransportFailure(t *testing.T) {
	for _, w := range ways {
		legacy := w.legacy
		t.Run(w.String(), func(t *testing.T) {
			u := newUpstream(t, legacy)
			var mu sync.Mutex
			answer := 0 // the next tools/call's status: 400 plain text, or 0 to pass
			fs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				body, _ := io.ReadAll(r.Body)
				r.Body = io.NopCloser(bytes.NewReader(body))
				mu.Lock()
				status := answer
				if bytes.Contains(body, []byte(`"tools/call"`)) {
					answer = 0
				} else {
					status = 0
				}
				mu.Unlock()
				if status != 0 {
					http.Error(w, "not MCP", status)
					return
				}
				u.serve(w, r)
			}))
			defer fs.Close()
			p := newPool(t, Options{})
			ctx := context.Background()
			target := Target{Provider: "up", URL: fs.URL + "/mcp"}
			if _, _, err := echo(ctx, p, target, "1"); err != nil {
				t.Fatal(err)
			}
			// A JSON-RPC error: the session stays.
			_, _, err := Do(ctx, p, target, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.GetPromptResult, error) {
				return cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "no-such-prompt"})
			})
			first, _ := p.Session(ctx, target)
			if err == nil || p.Len() != 1 {
				t.Fatalf("unknown prompt: %v, %d sessions", err, p.Len())
			}
			mu.Lock()
			answer = http.StatusBadRequest
			mu.Unlock()
			if _, _, err := echoVia(ctx, p, target, "2", w.via); err == nil {
				t.Fatal("a call answered 400 succeeded")
			}
			for i := range 3 {
				if out, _, err := echoVia(ctx, p, target, "3", w.via); err != nil || out != `echo {"x":"3"}` {
					t.Fatalf("call %d after the failure: %q, %v", i, out, err)
				}
			}
			if cs, _ := p.Session(ctx, target); cs == first {
				t.Fatal("the failed session is still in use")
			}
			opened := u.count("server/discover")
			if legacy {
				opened = u.count("initialize")
			}
			if opened != 2 {
				t.Fatalf("%d sessions opened, want 2", opened)
			}
		})
	}
}

// TestProbe: Probe tells an open server's era and keeps no session; a
// server refusing the token-less request is ErrTokenRequired (what
// `broker upstreams check` reports as needing a connection), and any
// other failure is not.
func TestProbe(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		u := newUpstream(t, legacy)
		p := newPool(t, Options{})
		era, err := p.Probe(context.Background(), Target{Provider: "up", URL: u.url()})
		want := map[bool]string{false: "2026-07-28", true: "2025-11-25"}[legacy]
		if err != nil || era != want {
			t.Fatalf("legacy %v: Probe = %q, %v; want %s", legacy, era, err, want)
		}
		if p.Len() != 0 {
			t.Fatalf("legacy %v: Probe kept %d sessions", legacy, p.Len())
		}
		u.setTokens("a-token")
		if _, err := p.Probe(context.Background(), Target{Provider: "up", URL: u.url()}); !errors.Is(err, ErrTokenRequired) {
			t.Fatalf("legacy %v: Probe of a protected server = %v, want ErrTokenRequired", legacy, err)
		}
	}
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	p := newPool(t, Options{})
	if _, err := p.Probe(context.Background(), Target{Provider: "up", URL: down.URL + "/mcp"}); err == nil || errors.Is(err, ErrTokenRequired) {
		t.Fatalf("Probe of a closed port = %v, want an error that is not ErrTokenRequired", err)
	}
}

// TestPoolSweepsIdleSessions: a session idle for IdleTimeout is closed
// (a 2025-11-25 server is sent its DELETE) though nobody uses the pool
// again, and one not idle that long is kept until it is; once none is
// left the sweep stops, and a new session starts it again. The pool's
// clock is the test's, so what is idle does not depend on the machine's
// speed; the sweep's timer runs in real time.
func TestPoolSweepsIdleSessions(t *testing.T) {
	u := newUpstream(t, true)
	clock := &testClock{}
	clock.ns.Store(time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	idle := 200 * time.Millisecond
	p := newPool(t, Options{IdleTimeout: idle, Now: clock.Now})
	ctx := context.Background()
	a, err := p.Session(ctx, Target{Provider: "a", URL: u.url()})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(idle / 2)
	b, err := p.Session(ctx, Target{Provider: "b", URL: u.url()})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(idle / 2) // a idle for IdleTimeout, b for half of it
	waitFor(t, "a's idle session to be closed with no use of the pool", func() bool { return u.deleted(a.ID()) })
	if u.deleted(b.ID()) || p.Len() != 1 {
		t.Fatalf("b, idle half as long, closed %v; %d sessions held, want 1", u.deleted(b.ID()), p.Len())
	}
	clock.Advance(idle / 2)
	waitFor(t, "b's session to be closed once idle", func() bool { return u.deleted(b.ID()) && p.Len() == 0 })
	p.mu.Lock()
	running := p.sweep != nil
	p.mu.Unlock()
	if running {
		t.Fatal("the sweep still runs with no session held")
	}
	c, err := p.Session(ctx, Target{Provider: "c", URL: u.url()})
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(idle)
	waitFor(t, "a session opened after the sweep stopped to be closed once idle", func() bool { return u.deleted(c.ID()) })
}

// TestSessionOpeningBounded: a server that takes the connection and never
// answers the session's opening (discover) holds no caller past its
// deadline, a second caller waiting for the same opening included; the
// opening is given up after OpenTimeout though nobody waits any more, and
// the next caller starts a new one.
func TestSessionOpeningBounded(t *testing.T) {
	var requests atomic.Int64
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); silent.Close() })
	// The opening outlives both callers' 100 ms by far, so a second caller
	// that starts late on a busy machine still finds it.
	p := newPool(t, Options{OpenTimeout: 3 * time.Second})
	target := Target{Provider: "silent", URL: silent.URL + "/mcp"}
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := p.Session(ctx, target)
		return err
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- call() }()
	}
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a caller of the silent server got %v, want its deadline", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a caller waited for the silent server past its deadline")
		}
	}
	// The callers gave up after 100 ms, whether or not the opening's
	// request had reached the server by then.
	waitFor(t, "the opening's request to reach the server", func() bool { return requests.Load() >= 1 })
	if n := requests.Load(); n != 1 {
		t.Fatalf("%d openings for two callers at once, want 1", n)
	}
	waitFor(t, "the abandoned opening to be dropped", func() bool { return p.Len() == 0 })
	if err := call(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the next caller got %v", err)
	}
	waitFor(t, fmt.Sprintf("a new opening (%d requests)", requests.Load()), func() bool { return requests.Load() >= 2 })
}
