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
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestDirectCallIsTheSessionsRequest: the pool's own exchange sends what
// the go-sdk's client sends for the same call (the headers, the body but
// its id) and reads the same result from a JSON answer and from an event
// stream, with a token and without.
func TestDirectCallIsTheSessionsRequest(t *testing.T) {
	for _, sse := range []bool{false, true} {
		for _, conn := range []string{"", "conn-1"} {
			t.Run(fmt.Sprintf("sse %v conn %q", sse, conn), func(t *testing.T) {
				u := newUpstream(t, false)
				if sse {
					u = newSSEUpstream(t)
				}
				tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}}
				if conn != "" {
					u.setTokens("tok-1")
				}
				p := newPool(t, Options{Tokens: tokens, Version: "v9"})
				target := Target{Provider: "up", URL: u.url(), Conn: conn}
				call := func(v via) *mcp.CallToolResult {
					params := &mcp.CallToolParams{Meta: hostCaps(), Name: "echo", Arguments: json.RawMessage(`{"b":"<&>","a":[1,2]}`)}
					res, era, err := callVia(context.Background(), p, target, v, params)
					if err != nil || era != modernEra {
						t.Fatalf("via %s: %v (era %q)", v, err, era)
					}
					return res
				}
				bySession, direct := call(viaSession), call(viaDirect)
				if !reflect.DeepEqual(bySession, direct) {
					t.Errorf("results differ:\nsession %+v\ndirect  %+v", bySession, direct)
				}
				var calls []seenRequest
				for _, s := range u.requests() {
					if s.RPC == "tools/call" {
						calls = append(calls, s)
					}
				}
				if len(calls) != 2 {
					t.Fatalf("%d calls reached the upstream", len(calls))
				}
				if !reflect.DeepEqual(calls[0].Header, calls[1].Header) {
					t.Errorf("headers differ:\nsession %v\ndirect  %v", calls[0].Header, calls[1].Header)
				}
				if got := calls[1].Header.Get("Authorization"); conn != "" && got != "Bearer tok-1" || conn == "" && got != "" {
					t.Errorf("Authorization %q", got)
				}
				if a, b := withoutID(t, calls[0].Body), withoutID(t, calls[1].Body); !reflect.DeepEqual(a, b) {
					t.Errorf("bodies differ:\nsession %s\ndirect  %s", calls[0].Body, calls[1].Body)
				}
			})
		}
	}
}

// withoutID is a JSON-RPC request decoded, its id left out.
func withoutID(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if _, ok := m["id"]; !ok {
		t.Fatalf("no id: %s", b)
	}
	delete(m, "id")
	return m
}

// fakeCalls is a modern upstream whose tools/call answers are answer's
// (id is the request's id, as sent); the go-sdk server answers the rest.
func fakeCalls(t *testing.T, answer func(w http.ResponseWriter, r *http.Request, id string)) (string, *upstream) {
	u := newUpstream(t, false)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(body, &msg) == nil && msg.Method == "tools/call" {
			answer(w, r, string(msg.ID))
			return
		}
		u.serve(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp", u
}

// TestDirectCallAnswers: what the pool's own exchange makes of each way
// an upstream may answer, next to what the go-sdk's client makes of it:
// the same result, or a failure of the same kind (an error the upstream
// answered, relayed with its code; the transport's refusal, code -32005;
// anything else), and the session kept or dropped alike. Where they
// differ (see direct.go) the go-sdk's side is not run.
func TestDirectCallAnswers(t *testing.T) {
	const ok = `{"content":[{"type":"text","text":"fine"}]}`
	result := func(id string) string { return `{"jsonrpc":"2.0","id":` + id + `,"result":` + ok + `}` }
	big := `{"content":[{"type":"text","text":"` + strings.Repeat("x", 2000) + `"}]}`
	for _, tc := range []struct {
		name        string
		status      int
		contentType string
		body        func(id string) string
		// text is the result's text; code the error's JSON-RPC code (0:
		// no JSON-RPC error); fail a failure of no JSON-RPC kind.
		text       string
		code       int64
		fail       bool
		sentinel   error
		kept       bool
		notSession bool // the go-sdk's client answers otherwise (direct.go)
	}{
		{name: "json", status: 200, contentType: "application/json", body: result, text: "fine", kept: true},
		{name: "json with charset", status: 200, contentType: "application/json; charset=utf-8", body: result, text: "fine", kept: true},
		{name: "event stream", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return ": a comment\nretry: 100\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n" +
				"id: 7\ndata: " + result(id) + "\n\n"
		}, text: "fine", kept: true},
		{name: "event stream, crlf, data in two lines", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return "event: other\r\ndata: {}\r\n\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":" + id + ",\r\ndata: \"result\":" + ok + "}\r\n\r\n"
		}, text: "fine", kept: true},
		{name: "event stream without the last blank line", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return "data: " + result(id)
		}, text: "fine", kept: true},
		{name: "error answered", status: 200, contentType: "application/json", body: func(id string) string {
			return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32602,"message":"bad arguments"}}`
		}, code: -32602, kept: true},
		{name: "error answered in a stream", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return `data: {"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32042,"message":"open this","data":{"elicitations":[]}}}` + "\n\n"
		}, code: -32042, kept: true},
		{name: "400 with a JSON-RPC error", status: 400, contentType: "application/json", body: func(id string) string {
			return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32020,"message":"Header mismatch"}}`
		}, code: -32020, kept: true},
		{name: "503", status: 503, contentType: "application/json", body: func(id string) string {
			return `{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32603,"message":"not relayed"}}`
		}, code: -32005, kept: true},
		{name: "400 plain text", status: 400, contentType: "text/plain", body: func(string) string { return "no" }, fail: true},
		{name: "not MCP", status: 200, contentType: "text/html", body: func(string) string { return "<p>hello</p>" }, fail: true},
		{name: "not JSON-RPC", status: 200, contentType: "application/json", body: func(id string) string { return `{"id":` + id + `,"result":{}}` }, fail: true},
		{name: "stream ends first", status: 200, contentType: "text/event-stream", body: func(string) string {
			return "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n"
		}, fail: true},
		{name: "malformed stream", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return "this line has no colon\ndata: " + result(id) + "\n\n"
		}, fail: true},
		{name: "another request's answer", status: 200, contentType: "application/json", body: func(id string) string {
			return result(id + "0")
		}, fail: true, notSession: true},
		{name: "json over the limit", status: 200, contentType: "application/json", body: func(id string) string {
			return `{"jsonrpc":"2.0","id":` + id + `,"result":` + big + `}`
		}, fail: true, sentinel: ErrTooLarge, notSession: true},
		{name: "event over the limit", status: 200, contentType: "text/event-stream", body: func(id string) string {
			return "data: " + `{"jsonrpc":"2.0","id":` + id + `,"result":` + big + "}\n\n"
		}, fail: true, sentinel: ErrTooLarge, notSession: true},
	} {
		for _, v := range []via{viaSession, viaDirect} {
			if v == viaSession && tc.notSession {
				continue
			}
			t.Run(tc.name+" via "+v.String(), func(t *testing.T) {
				url, _ := fakeCalls(t, func(w http.ResponseWriter, _ *http.Request, id string) {
					w.Header().Set("Content-Type", tc.contentType)
					w.WriteHeader(tc.status)
					io.WriteString(w, tc.body(id))
				})
				p := newPool(t, Options{})
				target := Target{Provider: "up", URL: url}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var res *mcp.CallToolResult
				var err error
				if v == viaSession {
					res, _, err = callVia(ctx, p, target, v, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"})
				} else {
					// One kilobyte read at most.
					res, _, err = Do(ctx, p, target, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
						tr, err := p.CallTool(ctx, cs, target, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"}, 1024)
						if err != nil {
							return nil, err
						}
						defer tr.Finish()
						if tr.Raw == nil {
							return nil, errors.New("not the pool's own exchange")
						}
						var r mcp.CallToolResult
						return &r, r.UnmarshalJSON(tr.Raw)
					})
				}
				var we *jsonrpc.Error
				switch {
				case tc.text != "":
					if err != nil || len(res.Content) != 1 || res.Content[0].(*mcp.TextContent).Text != tc.text {
						t.Fatalf("%+v, %v; want %q", res, err, tc.text)
					}
				case tc.code != 0:
					if !errors.As(err, &we) || we.Code != tc.code {
						t.Fatalf("%v; want a JSON-RPC error %d", err, tc.code)
					}
				case tc.fail:
					if err == nil || errors.As(err, &we) || errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("%v; want a failure of no JSON-RPC kind, at once", err)
					}
					if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
						t.Fatalf("%v; want %v", err, tc.sentinel)
					}
				}
				if kept := p.Len() == 1; kept != tc.kept {
					t.Fatalf("session kept %v, want %v", kept, tc.kept)
				}
			})
		}
	}
}

// TestDirectCallTakesWhatItCan: the pool's own exchange is for a modern
// session and a call carrying the host's client capabilities and asking
// no progress, of a tool no listing gave x-mcp-header parameters; every
// other call goes through the session (and a tool with them gets its
// header).
func TestDirectCallTakesWhatItCan(t *testing.T) {
	u := newUpstream(t, false)
	u.mu.Lock()
	server := mcp.NewServer(&mcp.Implementation{Name: "upstream", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "regional", InputSchema: json.RawMessage(`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}`)},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "regional"}}}, nil
		})
	u.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, DisableLocalhostProtection: true})
	u.mu.Unlock()
	legacy := newUpstream(t, true)
	p := newPool(t, Options{})
	ctx := context.Background()
	took := func(target Target, params *mcp.CallToolParams) bool {
		t.Helper()
		tr, _, err := Do(ctx, p, target, func(ctx context.Context, cs *mcp.ClientSession) (ToolResult, error) {
			return p.CallTool(ctx, cs, target, params, 1<<20)
		})
		tr.Finish()
		if err != nil || (tr.Raw == nil) == (tr.Decoded == nil) {
			t.Fatalf("%s: %+v, %v", params.Name, tr, err)
		}
		return tr.Raw != nil
	}
	modern := Target{Provider: "up", URL: u.url()}
	withMeta := func(m mcp.Meta) mcp.Meta {
		out := hostCaps()
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		target Target
		params *mcp.CallToolParams
		direct bool
	}{
		{"usual", modern, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"}, true},
		{"legacy session", Target{Provider: "old", URL: legacy.url()}, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"}, false},
		{"no client capabilities", modern, &mcp.CallToolParams{Name: "echo"}, false},
		{"progress", modern, &mcp.CallToolParams{Meta: withMeta(mcp.Meta{"progressToken": "cb-1"}), Name: "echo"}, false},
		{"own protocol version", modern, &mcp.CallToolParams{Meta: withMeta(mcp.Meta{mcp.MetaKeyProtocolVersion: "2026-07-28"}), Name: "echo"}, false},
		{"own client info", modern, &mcp.CallToolParams{Meta: withMeta(mcp.Meta{mcp.MetaKeyClientInfo: map[string]string{"name": "x", "version": "1"}}), Name: "echo"}, false},
	} {
		if got := took(tc.target, tc.params); got != tc.direct {
			t.Errorf("%s: the pool's own exchange %v, want %v", tc.name, got, tc.direct)
		}
	}
	if _, _, err := Do(ctx, p, modern, func(ctx context.Context, cs *mcp.ClientSession) (*mcp.ListToolsResult, error) {
		return p.ListTools(ctx, cs, nil)
	}); err != nil {
		t.Fatal(err)
	}
	if took(modern, &mcp.CallToolParams{Meta: hostCaps(), Name: "regional", Arguments: map[string]string{"region": "eu"}}) {
		t.Error("a listed tool with x-mcp-header parameters went through the pool's own exchange")
	}
	if !took(modern, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"}) {
		t.Error("the other tools stopped taking the pool's own exchange")
	}
	var region []string
	for _, s := range u.requests() {
		if s.RPC == "tools/call" && bytes.Contains(s.Body, []byte(`"regional"`)) {
			region = append(region, s.Header.Get("Mcp-Param-Region"))
		}
	}
	if !slices.Equal(region, []string{"eu"}) {
		t.Errorf("Mcp-Param-Region of the regional calls: %q, want eu", region)
	}
	// A session dropped takes what the own exchange keeps of it along.
	for _, tg := range []Target{modern, {Provider: "old", URL: legacy.url()}} {
		p.Forget(tg)
	}
	waitFor(t, "the sessions' wires to go", func() bool {
		n := 0
		p.wires.Range(func(any, any) bool { n++; return true })
		return n == 0
	})
}

// TestDirectCallFinish: an event stream's answer comes back as soon as
// its event is read, however long the upstream keeps the stream open;
// what follows the answer is read only once the caller finishes the
// result (until then the connection carries no other call), and then to
// the stream's end, so the connection carries the next call.
func TestDirectCallFinish(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var conns []string // each call's connection, as the upstream saw it
	url, _ := fakeCalls(t, func(w http.ResponseWriter, r *http.Request, id string) {
		mu.Lock()
		first := len(conns) == 0
		conns = append(conns, r.RemoteAddr)
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":"+id+",\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"fine\"}]}}\n\n")
		w.(http.Flusher).Flush()
		if first {
			select { // the stream held open after the answer
			case <-release:
			case <-time.After(30 * time.Second):
			}
		}
	})
	p := newPool(t, Options{})
	target := Target{Provider: "up", URL: url}
	call := func() (ToolResult, string) {
		t.Helper()
		tr, _, err := Do(context.Background(), p, target, func(ctx context.Context, cs *mcp.ClientSession) (ToolResult, error) {
			return p.CallTool(ctx, cs, target, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"}, 1<<20)
		})
		if err != nil || !bytes.Contains(tr.Raw, []byte(`"fine"`)) {
			t.Fatalf("%s, %v", tr.Raw, err)
		}
		mu.Lock()
		defer mu.Unlock()
		return tr, conns[len(conns)-1]
	}
	start := time.Now()
	first, conn1 := call()
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the answer came after %v, with the stream's end", d)
	}
	close(release)
	// The stream's end is on the wire now; time for it to be read, were
	// it read before the result is finished.
	time.Sleep(100 * time.Millisecond)
	second, conn2 := call()
	if conn2 == conn1 {
		t.Errorf("a call went over the connection of a result not yet finished (%s)", conn1)
	}
	first.Finish()
	second.Finish()
	var seen []string
	waitFor(t, "a call over a finished call's connection", func() bool {
		tr, conn := call()
		tr.Finish()
		reused := conn == conn1 || conn == conn2 || slices.Contains(seen, conn)
		seen = append(seen, conn)
		return reused
	})
}

// TestDirectCallCancels: a call that ends (the host went away, or the
// entry's timeout) closes its request, which 2026-07-28 streamable HTTP
// takes as the cancellation; the caller gets the context's error.
func TestDirectCallCancels(t *testing.T) {
	for _, timeout := range []bool{false, true} {
		t.Run(fmt.Sprintf("timeout %v", timeout), func(t *testing.T) {
			arrived, cancelled := make(chan struct{}), make(chan struct{})
			url, _ := fakeCalls(t, func(w http.ResponseWriter, r *http.Request, _ string) {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(200)
				w.(http.Flusher).Flush()
				close(arrived)
				<-r.Context().Done()
				close(cancelled)
			})
			p := newPool(t, Options{})
			target := Target{Provider: "up", URL: url}
			if _, err := p.Session(context.Background(), target); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if timeout {
				// Long enough for the request to reach the handler on a
				// busy machine, whose closing is what is checked.
				ctx, cancel = context.WithTimeout(ctx, 2*time.Second)
				defer cancel()
			} else {
				go func() { <-arrived; cancel() }()
			}
			_, _, err := callVia(ctx, p, target, viaDirect, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"})
			want := context.Canceled
			if timeout {
				want = context.DeadlineExceeded
			}
			if !errors.Is(err, want) {
				t.Fatalf("%v, want %v", err, want)
			}
			select {
			case <-cancelled:
			case <-time.After(30 * time.Second):
				t.Fatal("the upstream's request was not closed")
			}
		})
	}
}

// TestDirectCallAnswersBeforeTheStreamEnds: an event stream the upstream
// keeps open after the answer does not hold the call; the stream is read
// to its end in the background.
func TestDirectCallAnswersBeforeTheStreamEnds(t *testing.T) {
	release, ended := make(chan struct{}), make(chan struct{})
	url, _ := fakeCalls(t, func(w http.ResponseWriter, _ *http.Request, id string) {
		defer close(ended)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(200)
		io.WriteString(w, `data: {"jsonrpc":"2.0","id":`+id+`,"result":{"content":[{"type":"text","text":"early"}]}}`+"\n\n")
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, ": bye\n\n")
	})
	p := newPool(t, Options{})
	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		res, _, err := callVia(context.Background(), p, Target{Provider: "up", URL: url}, viaDirect, &mcp.CallToolParams{Meta: hostCaps(), Name: "echo"})
		got <- answer{res, err}
	}()
	select {
	case a := <-got:
		if a.err != nil || a.res.Content[0].(*mcp.TextContent).Text != "early" {
			t.Fatalf("%+v, %v", a.res, a.err)
		}
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the call waited for the stream to end")
	}
	close(release)
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("the stream was not read to its end")
	}
}

// TestDirectTokenSourceDown: a token source that fails on a call (the
// connection needs reconnecting, or its authorization server is down)
// fails the call with its error, sends nothing and keeps the session, as
// through the session.
func TestDirectTokenSourceDown(t *testing.T) {
	for _, v := range []via{viaSession, viaDirect} {
		for _, fail := range []error{fmt.Errorf("%w: needs reconnect", ErrNoToken), errors.New("the authorization server is down")} {
			u := newUpstream(t, false)
			u.setTokens("tok-1")
			tokens := &fakeTokens{tok: map[string]string{"conn-1": "tok-1"}}
			p := newPool(t, Options{Tokens: tokens})
			target := Target{Provider: "up", URL: u.url(), Conn: "conn-1"}
			if _, _, err := echoVia(context.Background(), p, target, "1", v); err != nil {
				t.Fatal(err)
			}
			tokens.mu.Lock()
			tokens.accessErr = fail
			tokens.mu.Unlock()
			sent := u.count("tools/call")
			_, _, err := echoVia(context.Background(), p, target, "2", v)
			if !errors.Is(err, fail) || errors.Is(err, ErrUnauthorized) || p.Len() != 1 {
				t.Fatalf("via %s: %v, %d sessions; want %v and the session kept", v, err, p.Len(), fail)
			}
			if u.count("tools/call") != sent {
				t.Fatalf("via %s: the call was sent", v)
			}
		}
	}
}

// membersCases are JSON-RPC messages and near misses for scanMembers.
var membersCases = []string{
	`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}]}}`,
	` { "id" : "x" , "error" : { "code" : -1 , "message" : "m" } , "jsonrpc" : "2.0" } `,
	`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}`,
	`{}`, `{"a":1,"a":2}`, `{"a\u0062":1}`, `{"Result":1}`, `{"a":1,}`, `{"a":1} {}`, `[1]`, `null`, `{"a":[1,{"b":null}]}`,
	`{"a":"\xff"}`, `{"é":1}`, `{"a":1`, ``,
}

// checkMembers: whenever scanMembers reads b, encoding/json decodes b
// into a map to the same members.
func checkMembers(t *testing.T, b []byte) {
	t.Helper()
	got, ok := scanMembers(b)
	if !ok {
		return
	}
	var want members
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatalf("scanMembers read what encoding/json refuses (%v): %q", err, b)
	}
	if want == nil || len(got) != len(want) {
		t.Fatalf("%q: %q, encoding/json %q", b, got, want)
	}
	for k, v := range want {
		if !bytes.Equal(got[k], v) {
			t.Fatalf("%q: member %q is %q, encoding/json %q", b, k, got[k], v)
		}
	}
}

func TestScanMembers(t *testing.T) {
	for _, c := range membersCases {
		checkMembers(t, []byte(c))
	}
	for c, want := range map[string]bool{membersCases[0]: true, `{}`: true, `{"a":1,"a":2}`: false, `{"a\u0062":1}`: false, `{"a":1,}`: false} {
		if _, ok := scanMembers([]byte(c)); ok != want {
			t.Errorf("scanMembers(%s): %v, want %v", c, ok, want)
		}
	}
}

func FuzzScanMembers(f *testing.F) {
	for _, c := range membersCases {
		f.Add([]byte(c))
	}
	f.Fuzz(checkMembers)
}

// checkAppendCall: whenever appendCall writes a call, it is the JSON
// encoding/json writes for it (as the pool completes it), once both are
// decoded.
func checkAppendCall(t *testing.T, p *Pool, params *mcp.CallToolParams) bool {
	t.Helper()
	fast, ok := p.appendCall(nil, 7, modernEra, params)
	if !ok {
		return false
	}
	call := *params
	call.Meta = mcp.Meta{mcp.MetaKeyProtocolVersion: modernEra, mcp.MetaKeyClientInfo: p.impl}
	for k, v := range params.Meta {
		call.Meta[k] = v
	}
	if call.Arguments == nil {
		call.Arguments = map[string]any{}
	}
	slow, err := json.Marshal(callRequest{JSONRPC: "2.0", ID: 7, Method: "tools/call", Params: &call})
	if err != nil {
		t.Fatalf("appendCall wrote what encoding/json refuses (%v): %s", err, fast)
	}
	// Numbers are compared as their literal text: JSON has no range limit
	// (RFC 8259 §6), so 1e700 is a valid argument both sides pass on
	// verbatim even though it fits no float64.
	decode := func(raw []byte, v *any) error {
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		return d.Decode(v)
	}
	var a, b any
	if err := decode(fast, &a); err != nil {
		t.Fatalf("appendCall wrote no JSON (%v): %s", err, fast)
	}
	if err := decode(slow, &b); err != nil {
		t.Fatalf("encoding/json wrote no JSON (%v): %s", err, slow)
	}
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("appendCall:\n%s\nencoding/json:\n%s", fast, slow)
	}
	return true
}

func TestAppendCall(t *testing.T) {
	p := New(Options{Version: "v1"})
	caps := func(kv ...string) mcp.Meta {
		m := map[string]json.RawMessage{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = json.RawMessage(kv[i+1])
		}
		return mcp.Meta{mcp.MetaKeyClientCapabilities: m}
	}
	for _, tc := range []struct {
		params *mcp.CallToolParams
		fast   bool
	}{
		{&mcp.CallToolParams{Meta: caps("elicitation", `{"url":{}}`, "sampling", ` { } `), Name: "echo", Arguments: json.RawMessage(` {"a" : [1, "<&>"]} `)}, true},
		{&mcp.CallToolParams{Meta: caps(), Name: "echo"}, true},
		{&mcp.CallToolParams{Meta: caps("a\"b", `{}`), Name: "echo", Arguments: json.RawMessage(`{}`)}, false},
		{&mcp.CallToolParams{Meta: caps("a", `{`), Name: "echo", Arguments: json.RawMessage(`{}`)}, false},
		{&mcp.CallToolParams{Meta: caps(), Name: "echo", Arguments: json.RawMessage(`{`)}, false},
		{&mcp.CallToolParams{Meta: caps(), Name: "e<ho", Arguments: json.RawMessage(`{}`)}, false},
		{&mcp.CallToolParams{Meta: caps(), Name: "echo", Arguments: map[string]string{"a": "b"}}, false},
		{&mcp.CallToolParams{Meta: caps(), Name: "echo", RequestState: "s"}, false},
		{&mcp.CallToolParams{Meta: mcp.Meta{mcp.MetaKeyClientCapabilities: map[string]any{}}, Name: "echo"}, false},
		{&mcp.CallToolParams{Meta: mcp.Meta{mcp.MetaKeyClientCapabilities: map[string]json.RawMessage{}, "progressToken": "t"}, Name: "echo"}, false},
	} {
		if got := checkAppendCall(t, p, tc.params); got != tc.fast {
			t.Errorf("%+v: fast %v, want %v", tc.params, got, tc.fast)
		}
	}
}

func FuzzAppendCall(f *testing.F) {
	f.Add("elicitation", []byte(`{"url":{}}`), "echo", []byte(`{"a":1}`))
	f.Add("", []byte(` 1 `), "n\u00e9", []byte(`[]`))
	p := New(Options{Version: "v1"})
	f.Fuzz(func(t *testing.T, key string, value []byte, name string, args []byte) {
		checkAppendCall(t, p, &mcp.CallToolParams{Meta: mcp.Meta{mcp.MetaKeyClientCapabilities: map[string]json.RawMessage{key: value}},
			Name: name, Arguments: json.RawMessage(args)})
	})
}
