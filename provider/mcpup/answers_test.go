package mcpup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/echoapi"
)

// Tokens with characters that JSON, URLs and HTML escape, so each escaped
// form differs from the token.
const (
	leakAccess  = "ya29.a0/Bx+c=d&e<f>g-ACCESS-0123456789"
	leakRefresh = "1//0g-REFRESH+tok/en=<&>-9876543210"
)

// leakyUpstream is an upstream MCP server that hands back the token it
// was sent in every form it can think of: echo_headers answers the
// Authorization header in each of echoapi's encodings, URL-escaped and
// inside JSON (escaped by the go-sdk's encoder), with the refresh token,
// after a progress notification that carries them; fail answers a
// JSON-RPC error naming them; over answers HTTP 400 with a JSON-RPC error
// naming them; scope answers 403 insufficient_scope whose scope is the
// token; escaped answers the header with every character a JSON \u
// escape. Its answers are event streams (sse) or JSON bodies.
func leakyUpstream(t *testing.T, legacy, sse bool) *httptest.Server {
	opts := &mcp.ServerOptions{}
	if legacy {
		opts.SupportedProtocolVersions = []string{"2025-11-25"}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "leaky", Version: "1"}, opts)
	leak := func(h http.Header) string {
		auth := h.Get("Authorization")
		var b strings.Builder
		for _, form := range slices.Sorted(func(yield func(string) bool) {
			for k := range echoapi.Echoes(auth) {
				if !yield(k) {
					return
				}
			}
		}) {
			fmt.Fprintf(&b, "%s: %s\n", form, echoapi.Echoes(auth)[form])
		}
		fmt.Fprintf(&b, "url: %s\nrefresh: %s\nrefresh url: %s\n", url.QueryEscape(auth), leakRefresh, url.QueryEscape(leakRefresh))
		return b.String()
	}
	server.AddTool(&mcp.Tool{Name: "echo_headers", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			text := leak(req.Extra.Header)
			if tok := req.Params.GetProgressToken(); tok != nil {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1, Message: text})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}},
				StructuredContent: map[string]any{"headers": text}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "fail", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "refused " + leak(req.Extra.Header)}
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: !legacy, JSONResponse: !sse, DisableLocalhostProtection: true})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(body, &msg)
		switch {
		case r.Header.Get("Authorization") != "Bearer "+leakAccess:
			w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
			http.Error(w, `{"error":"invalid_token"}`, http.StatusUnauthorized)
		case msg.Params.Name == "over":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(map[string]any{"jsonrpc": "2.0", "id": 2, "error": map[string]any{"code": -32603, "message": leak(r.Header)}})
		case msg.Params.Name == "escaped":
			var esc strings.Builder
			for _, c := range r.Header.Get("Authorization") + " " + leakRefresh {
				fmt.Fprintf(&esc, `\u%04x`, c)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}`, msg.ID, esc.String())
		case msg.Params.Name == "scope":
			w.Header().Set("WWW-Authenticate", `Bearer error="insufficient_scope", scope="`+leakAccess+` `+leakRefresh+`"`)
			http.Error(w, leak(r.Header), http.StatusForbidden)
		default:
			h.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// leaks names the forms of the two tokens found in text: each encoding
// echoapi knows (raw, hex, base64 fragments at any offset), and the
// JSON- and URL-escaped forms.
func leaks(text string) []string {
	var found []string
	for _, tok := range []string{leakAccess, leakRefresh} {
		found = append(found, echoapi.Leaks(text, tok)...)
		jsonHTML, _ := json.Marshal(tok)
		forms := map[string]string{"json": string(jsonHTML[1 : len(jsonHTML)-1]), "url": url.QueryEscape(tok), "path": url.PathEscape(tok)}
		for name, f := range forms {
			if strings.Contains(text, f) {
				found = append(found, name)
			}
		}
	}
	return found
}

// TestAnswersRedacted: whatever an upstream sends back, nothing of it
// reaches the pool's caller with a form of the connection's access or
// refresh token: results (text and structured content), progress
// notifications, relayed JSON-RPC errors (in the answer and in an HTTP
// 400's body), a 403's challenge; modern and legacy, event streams and
// JSON bodies.
func TestAnswersRedacted(t *testing.T) {
	for _, c := range []struct {
		legacy, sse bool
		via         via
	}{{false, false, viaSession}, {false, true, viaSession}, {true, false, viaSession}, {true, true, viaSession},
		{false, false, viaDirect}, {false, true, viaDirect}} {
		t.Run(fmt.Sprintf("legacy %v, sse %v, via %s", c.legacy, c.sse, c.via), func(t *testing.T) {
			srv := leakyUpstream(t, c.legacy, c.sse)
			p := newPool(t, Options{Tokens: &fakeTokens{tok: map[string]string{"conn-1": leakAccess}, refresh: map[string]string{"conn-1": leakRefresh}}})
			target := Target{Provider: "up", URL: srv.URL + "/mcp", Conn: "conn-1"}
			var progress []string
			stop := p.OnProgress("cb-1", func(pn *mcp.ProgressNotificationParams) { progress = append(progress, pn.Message) })
			defer stop()
			// The pool's own exchange asks no progress (the gateway relays a
			// call asking it through the session).
			call := func(name string, meta mcp.Meta) (*mcp.CallToolResult, error) {
				params := &mcp.CallToolParams{Meta: meta, Name: name, Arguments: map[string]any{}}
				if c.via == viaDirect {
					params.Meta, params.Arguments = hostCaps(), json.RawMessage(`{}`)
				}
				res, _, err := callVia(context.Background(), p, target, c.via, params)
				return res, err
			}
			res, err := call("echo_headers", mcp.Meta{"progressToken": "cb-1"})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(res)
			text := res.Content[0].(*mcp.TextContent).Text
			for what, s := range map[string]string{"result": string(b), "text": text, "structured": fmt.Sprint(res.StructuredContent)} {
				if l := leaks(s); len(l) > 0 {
					t.Errorf("%s: %v leaked: %.200s", what, l, s)
				}
			}
			if !strings.Contains(text, "REDACTED") || !strings.Contains(text, "hex-upper: ") {
				t.Fatalf("the echo came back as %s", b)
			}
			// Every character escaped: decoded, it would be the tokens.
			res, err = call("escaped", nil)
			if err != nil {
				t.Fatal(err)
			}
			if text := res.Content[0].(*mcp.TextContent).Text; len(leaks(text)) > 0 || !strings.Contains(text, "REDACTED") {
				t.Errorf("escaped: %v leaked: %.200s", leaks(text), text)
			}
			if c.sse && c.via == viaSession && len(progress) != 1 {
				t.Errorf("%d progress notifications, want 1", len(progress))
			}
			for _, m := range progress {
				if l := leaks(m); len(l) > 0 || !strings.Contains(m, "REDACTED") {
					t.Errorf("progress: %v leaked: %.200s", l, m)
				}
			}
			for _, tool := range []string{"fail", "over", "scope"} {
				_, err := call(tool, nil)
				var ns *NeedScope
				var we *jsonrpc.Error
				switch {
				case err == nil:
					t.Fatalf("%s: no error", tool)
				case tool == "scope" && !errors.As(err, &ns):
					t.Fatalf("%s: %v, want a *NeedScope", tool, err)
				case tool == "fail" && !errors.As(err, &we):
					t.Fatalf("%s: %v, want a JSON-RPC error", tool, err)
				}
				s := err.Error()
				if ns != nil {
					s += strings.Join(ns.Scopes, " ")
				}
				if we != nil {
					s += we.Message + string(we.Data)
				}
				if l := leaks(s); len(l) > 0 {
					t.Errorf("%s: %v leaked: %.200s", tool, l, s)
				}
			}
		})
	}
}

// TestProgressInWireOrder: an upstream that sends a burst of progress
// notifications right before its result has every one of them reach the
// sink, in the order sent, before the call returns (the go-sdk hands
// notifications to a queue of its own while the response ends the call
// at once, so the last ones used to arrive after the caller stopped
// listening, if at all).
func TestProgressInWireOrder(t *testing.T) {
	const steps, calls = 20, 30
	server := mcp.NewServer(&mcp.Implementation{Name: "burst", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "burst", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			for i := 1; i <= steps; i++ {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: req.Params.GetProgressToken(), Progress: float64(i), Total: steps})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true}))
	t.Cleanup(srv.Close)
	p := newPool(t, Options{})
	target := Target{Provider: "up", URL: srv.URL + "/mcp"}
	for n := range calls {
		token := fmt.Sprintf("cb-%d", n)
		var mu sync.Mutex
		var got []float64
		stop := p.OnProgress(token, func(pn *mcp.ProgressNotificationParams) {
			mu.Lock()
			got = append(got, pn.Progress)
			mu.Unlock()
		})
		_, _, err := Do(context.Background(), p, target, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
			return cs.CallTool(ctx, &mcp.CallToolParams{Meta: mcp.Meta{"progressToken": token}, Name: "burst", Arguments: map[string]any{}})
		})
		stop()
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		seen := slices.Clone(got)
		mu.Unlock()
		want := make([]float64, steps)
		for i := range want {
			want[i] = float64(i + 1)
		}
		if !slices.Equal(seen, want) {
			t.Fatalf("call %d: progress %v when the call returned, want 1..%d in order", n, seen, steps)
		}
	}
}

// TestPoolClose: Close ends every session (a 2025-11-25 one is deleted at
// the upstream) and abandons one being opened; the pool then refuses new
// sessions, and once the idle HTTP connections are closed the goroutines
// are back where they were before the pool was made.
func TestPoolClose(t *testing.T) {
	modern, legacy := newUpstream(t, false), newUpstream(t, true)
	modern.setTokens("tok-1", "tok-2")
	legacy.setTokens("tok-1", "tok-2")
	// hang accepts a request and answers nothing until the test ends.
	arrived, release := make(chan struct{}, 1), make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then a client going away ends r's context
		select {
		case arrived <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(release) })
	client := newPool(t, Options{}).opts.HTTPClient
	runtime.GC()
	before := runtime.NumGoroutine()
	p := New(Options{HTTPClient: client, Tokens: &fakeTokens{tok: map[string]string{"conn-1": "tok-1", "conn-2": "tok-2"}}})
	var sessions []string
	for _, up := range []*upstream{modern, legacy} {
		for _, conn := range []string{"conn-1", "conn-2"} {
			if out, _, err := echo(context.Background(), p, Target{Provider: "up", URL: up.url(), Conn: conn}, "x"); err != nil || out != `echo {"x":"x"}` {
				t.Fatalf("%s: %q, %v", up.url(), out, err)
			}
		}
	}
	for _, s := range legacy.requests() {
		if s.Session != "" && !slices.Contains(sessions, s.Session) {
			sessions = append(sessions, s.Session)
		}
	}
	opening := make(chan error, 1)
	go func() {
		_, err := p.Session(context.Background(), Target{Provider: "hang", URL: hang.URL + "/mcp", Conn: "conn-1"})
		opening <- err
	}()
	<-arrived
	p.Close()
	if err := <-opening; err == nil {
		t.Fatal("a session being opened when the pool closed was opened")
	}
	if p.Len() != 0 || len(sessions) != 2 {
		t.Fatalf("after Close: %d sessions held; %d legacy sessions were opened, want 2", p.Len(), len(sessions))
	}
	for _, id := range sessions {
		if !legacy.deleted(id) {
			t.Errorf("legacy session %s was not deleted at the upstream", id)
		}
	}
	if _, err := p.Session(context.Background(), Target{Provider: "up", URL: modern.url(), Conn: "conn-1"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Session after Close: %v, want ErrClosed", err)
	}
	var now int
	waitFor(t, "the goroutines to settle", func() bool {
		client.CloseIdleConnections()
		now = runtime.NumGoroutine()
		return now <= before
	})
	t.Logf("goroutines %d → %d", before, now)
}

// TestTokenPrintsRedacted: a Token printed or logged, in any verb or
// inside a struct, shows no token.
func TestTokenPrintsRedacted(t *testing.T) {
	tok := Token{Access: leakAccess, Refresh: leakRefresh}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("token", "t", tok)
	for _, s := range []string{fmt.Sprint(tok), fmt.Sprintf("%+v %#v %s %q %x", tok, tok, tok, tok, tok),
		fmt.Sprintf("%+v", struct{ T Token }{tok}), fmt.Sprintf("%v", &tok), logged.String()} {
		if len(leaks(s)) > 0 || strings.Contains(s, "ACCESS") || strings.Contains(s, "REFRESH") {
			t.Fatalf("a token printed as %s", s)
		}
	}
}
