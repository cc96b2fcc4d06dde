package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// peer is a real go-sdk MCP server whose connect_account tool asks for a
// url elicitation until the retry carries an accept and the expected state.
type peer struct {
	mu     sync.Mutex
	states []string // requestState received on each call
	ids    []string // JSON-RPC ids of tools/call requests
	auth   []string
	link   string
}

func startPeer(t *testing.T, link string) (*peer, *httptest.Server) {
	p := &peer{link: link}
	srv := mcp.NewServer(&mcp.Implementation{Name: "peer", Version: "1"}, nil)
	type args struct {
		Provider string `json:"provider"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "connect_account"}, func(ctx context.Context, req *mcp.CallToolRequest, a args) (*mcp.CallToolResult, any, error) {
		p.mu.Lock()
		p.states = append(p.states, req.Params.RequestState)
		p.mu.Unlock()
		if req.Params.RequestState != "sealed-state-1" {
			return &mcp.CallToolResult{
				InputRequests: mcp.InputRequestMap{"connect_" + a.Provider: &mcp.ElicitParams{Mode: "url", Message: "Connect your Demo account.", URL: p.link}},
				RequestState:  "sealed-state-1",
			}, nil, nil
		}
		r, ok := req.Params.InputResponses["connect_"+a.Provider].(*mcp.ElicitResult)
		if !ok {
			return nil, nil, io.ErrUnexpectedEOF
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "action=" + r.Action}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &msg)
		p.mu.Lock()
		p.auth = append(p.auth, r.Header.Get("Authorization"))
		if msg.Method == "tools/call" {
			p.ids = append(p.ids, string(msg.ID))
		}
		p.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return p, ts
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestConnectRetriesWithStateAndNewID(t *testing.T) {
	p, ts := startPeer(t, "")
	p.link = ts.URL + "/connect/AAAAAAAAAAAAAAAAAAAAAA"
	var out, errOut bytes.Buffer
	var opened []string
	code := runWith(t, []string{"--url", ts.URL, "--open", "connect", "demo"}, "y\n\n", &out, &errOut, &opened)
	if code != exitOK {
		t.Fatalf("exit %d, stderr: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "action=accept") {
		t.Errorf("result not printed: %s", out.String())
	}
	if !strings.Contains(out.String(), p.link) || !strings.Contains(out.String(), ">>> "+strings.TrimPrefix(ts.URL, "http://")+" <<<") {
		t.Errorf("URL or domain not shown: %s", out.String())
	}
	if len(opened) != 1 || opened[0] != p.link {
		t.Errorf("browser opened %v, want the link once after consent", opened)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.states) != 2 || p.states[0] != "" || p.states[1] != "sealed-state-1" {
		t.Errorf("requestState per call = %q, want echo on retry", p.states)
	}
	if len(p.ids) != 2 || p.ids[0] == p.ids[1] {
		t.Errorf("tools/call ids = %v, want two distinct", p.ids)
	}
	for _, a := range p.auth {
		if a != "Bearer tok-123" {
			t.Fatalf("Authorization header %q", a)
		}
	}
}

// runWith runs the CLI with a scripted stdin and a recording browser opener.
func runWith(t *testing.T, args []string, stdin string, out, errOut *bytes.Buffer, opened *[]string) int {
	t.Helper()
	prev := systemOpenHook
	systemOpenHook = func(u string) error { *opened = append(*opened, u); return nil }
	defer func() { systemOpenHook = prev }()
	return run(context.Background(), args, strings.NewReader(stdin), out, errOut, env(map[string]string{"BROKER_TOKEN": "tok-123"}))
}

func TestDeclineAndCancel(t *testing.T) {
	for _, tt := range []struct{ answer, want string }{{"n\n", "action=decline"}, {"c\n", "action=cancel"}, {"y\nc\n", "action=cancel"}, {"", "action=cancel"}} {
		t.Run(strings.TrimSpace(tt.answer), func(t *testing.T) {
			p, ts := startPeer(t, "")
			p.link = ts.URL + "/connect/x"
			var out, errOut bytes.Buffer
			var opened []string
			if code := runWith(t, []string{"--url", ts.URL, "connect", "demo"}, tt.answer, &out, &errOut, &opened); code != exitOK {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			if !strings.Contains(out.String(), tt.want) {
				t.Errorf("got %s, want %s", out.String(), tt.want)
			}
			if len(opened) != 0 {
				t.Errorf("opened a browser without --open: %v", opened)
			}
		})
	}
}

func TestNonInteractivePrintsURLAndExits3(t *testing.T) {
	p, ts := startPeer(t, "")
	p.link = ts.URL + "/connect/AAAAAAAAAAAAAAAAAAAAAA"
	var out, errOut bytes.Buffer
	var opened []string
	code := runWith(t, []string{"--url", ts.URL, "--non-interactive", "connect", "demo"}, "", &out, &errOut, &opened)
	if code != exitNeedsBrowser {
		t.Fatalf("exit %d, want %d; stderr %s", code, exitNeedsBrowser, errOut.String())
	}
	if strings.TrimSpace(out.String()) != p.link {
		t.Errorf("stdout %q, want exactly the URL", out.String())
	}
	if len(p.states) != 1 {
		t.Errorf("%d calls, want 1 (no retry)", len(p.states))
	}
}

func TestHostWarnings(t *testing.T) {
	tests := []struct {
		link, broker string
		want         []string
	}{
		{"http://127.0.0.1:8080/connect/x", "http://127.0.0.1:8080/mcp", nil},
		{"https://broker.example.com/connect/x", "https://broker.example.com/mcp", nil},
		{"https://xn--brker-jua.example.com/connect/x", "https://xn--brker-jua.example.com/mcp", []string{"punycode"}},
		{"https://bröker.example.com/connect/x", "https://broker.example.com/mcp", []string{"non-ASCII", "not the host you called"}},
		{"https://evil.example/connect/x", "https://broker.example.com/mcp", []string{"not the host you called"}},
		{"http://broker.example.com/connect/x", "http://broker.example.com/mcp", []string{"not HTTPS"}},
	}
	for _, tt := range tests {
		t.Run(tt.link, func(t *testing.T) {
			u, err := url.Parse(tt.link)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(hostWarnings(u, tt.broker), "|")
			if len(tt.want) == 0 && got != "" {
				t.Fatalf("unexpected warnings %q", got)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("warnings %q lack %q", got, w)
				}
			}
		})
	}
}

func TestParseCommand(t *testing.T) {
	tests := []struct {
		args    []string
		tool    string
		want    string
		wantErr string
	}{
		{[]string{"connect", "demo", "--scopes", "a,b"}, "connect_account", `{"provider":"demo","scopes":["a","b"]}`, ""},
		{[]string{"list"}, "list_connections", `{}`, ""},
		{[]string{"disconnect", "github", "--account", "octocat"}, "disconnect_account", `{"account":"octocat","provider":"github"}`, ""},
		{[]string{"request", "demo", "get", "/api/user", "--query", "a=1"}, "provider_request", `{"method":"GET","path":"/api/user","provider":"demo","query":{"a":"1"}}`, ""},
		{[]string{"call", "list_demo_repos"}, "list_demo_repos", `{}`, ""},
		{[]string{"call", "search", "--args", `{"q":"x","n":2}`}, "search", `{"n":2,"q":"x"}`, ""},
		{[]string{"call", "search", "--args", `[1]`}, "", "", "not one JSON object"},
		{[]string{"call", "search", "--args", `{} {}`}, "", "", "not one JSON object"},
		{[]string{"call"}, "", "", "want TOOL"},
		{[]string{"connect"}, "", "", "want PROVIDER"},
		{[]string{"request", "demo", "GET", "/x", "--query", "noeq"}, "", "", "want k=v"},
		{[]string{"frobnicate"}, "", "", "unknown command"},
		{[]string{"tools"}, listTools, `null`, ""},
		{[]string{"tools", "extra"}, "", "", "want no arguments"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			tool, a, err := parseCommand(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			b, _ := json.Marshal(a)
			if err != nil || tool != tt.tool || string(b) != tt.want {
				t.Fatalf("got %s %s %v, want %s %s", tool, b, err, tt.tool, tt.want)
			}
		})
	}
}

func TestNoTokenIsUsageError(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"list"}, strings.NewReader(""), &out, &errOut, env(nil)); code != exitUsage {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(errOut.String(), "BROKER_TOKEN") {
		t.Errorf("message %q does not say how to give a token", errOut.String())
	}
}

// TestToolsListsTheServersTools: brokerctl tools prints each tool's name
// and the first line of its description (control characters removed),
// with the token on the request.
func TestToolsListsTheServersTools(t *testing.T) {
	p, ts := startPeer(t, "")
	var out, errOut bytes.Buffer
	var opened []string
	if code := runWith(t, []string{"--url", ts.URL, "tools"}, "", &out, &errOut, &opened); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "connect_account") {
		t.Fatalf("tools printed %q", out.String())
	}
	out.Reset()
	if code := runWith(t, []string{"--url", ts.URL, "--json", "tools"}, "", &out, &errOut, &opened); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var tools []map[string]any
	if err := json.Unmarshal(out.Bytes(), &tools); err != nil || len(tools) != 1 || tools[0]["name"] != "connect_account" {
		t.Fatalf("--json tools printed %s (%v)", out.String(), err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.auth {
		if a != "Bearer tok-123" {
			t.Fatalf("Authorization header %q", a)
		}
	}
}

// legacyPeer is a go-sdk server spoken to in 2025-11-25: its tool refuses
// with a URLElicitationRequired error (-32042) until the test says the
// link was opened.
type legacyPeer struct {
	mu       sync.Mutex
	opened   bool
	versions []string // MCP-Protocol-Version of each tools/call, "initialize" for an initialize
	calls    int
}

func startLegacyPeer(t *testing.T) (*legacyPeer, *httptest.Server) {
	p := &legacyPeer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "legacy-peer", Version: "1"}, nil)
	var link string
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(ctx context.Context, req *mcp.CallToolRequest, a struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.calls++
		if !p.opened {
			return nil, nil, mcp.URLElicitationRequiredError([]*mcp.ElicitParams{{Mode: "url", Message: "Connect your Demo account.", URL: link, ElicitationID: "e1"}})
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + a.Text}}}, nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var msg struct {
			Method string `json:"method"`
			Params struct {
				ProtocolVersion string `json:"protocolVersion"`
			} `json:"params"`
		}
		json.Unmarshal(body, &msg)
		p.mu.Lock()
		switch msg.Method {
		case "initialize":
			p.versions = append(p.versions, "initialize "+msg.Params.ProtocolVersion)
		case "tools/call", "server/discover":
			p.versions = append(p.versions, msg.Method+" "+r.Header.Get("Mcp-Protocol-Version"))
		}
		p.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	link = ts.URL + "/connect/AAAAAAAAAAAAAAAAAAAAAA"
	return p, ts
}

// TestLegacyCallOpensLinksThenCallsAgain: with --protocol-version
// 2025-11-25 brokerctl opens a session with initialize, shows the links of
// a -32042 error as it shows an elicitation, and once the user is done
// calls again; non-interactive, it prints the link and exits 3; declining
// stops without a retry.
func TestLegacyCallOpensLinksThenCallsAgain(t *testing.T) {
	t.Run("interactive", func(t *testing.T) {
		p, ts := startLegacyPeer(t)
		var out, errOut bytes.Buffer
		var opened []string
		prev := systemOpenHook
		systemOpenHook = func(u string) error {
			opened = append(opened, u)
			p.mu.Lock()
			p.opened = true // the person finishes in the browser
			p.mu.Unlock()
			return nil
		}
		defer func() { systemOpenHook = prev }()
		code := run(context.Background(), []string{"--url", ts.URL, "--protocol-version", "2025-11-25", "--open", "call", "echo", "--args", `{"text":"hi"}`},
			strings.NewReader("y\n\n"), &out, &errOut, env(map[string]string{"BROKER_TOKEN": "tok-123"}))
		if code != exitOK || !strings.Contains(out.String(), "echo: hi") {
			t.Fatalf("exit %d, stdout %s, stderr %s", code, out.String(), errOut.String())
		}
		if !strings.Contains(out.String(), "URL:    "+ts.URL+"/connect/") || len(opened) != 1 {
			t.Errorf("the link was shown/opened %v: %s", opened, out.String())
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if got := strings.Join(p.versions, ","); got != "initialize 2025-11-25,tools/call 2025-11-25,tools/call 2025-11-25" {
			t.Errorf("the server saw %s, want initialize then two calls in 2025-11-25", got)
		}
	})
	t.Run("non-interactive", func(t *testing.T) {
		p, ts := startLegacyPeer(t)
		var out, errOut bytes.Buffer
		var opened []string
		code := runWith(t, []string{"--url", ts.URL, "--protocol-version", "2025-11-25", "--non-interactive", "call", "echo", "--args", `{"text":"x"}`}, "", &out, &errOut, &opened)
		if code != exitNeedsBrowser || strings.TrimSpace(out.String()) != ts.URL+"/connect/AAAAAAAAAAAAAAAAAAAAAA" || p.calls != 1 {
			t.Fatalf("exit %d, stdout %q, %d calls; want 3, the link, one call", code, out.String(), p.calls)
		}
	})
	t.Run("declined", func(t *testing.T) {
		p, ts := startLegacyPeer(t)
		var out, errOut bytes.Buffer
		var opened []string
		code := runWith(t, []string{"--url", ts.URL, "--protocol-version", "2025-11-25", "call", "echo", "--args", `{"text":"x"}`}, "n\n", &out, &errOut, &opened)
		if code != exitFailure || !strings.Contains(errOut.String(), "not retried: you answered decline") || p.calls != 1 {
			t.Fatalf("exit %d, stderr %q, %d calls; want 1, not retried, one call", code, errOut.String(), p.calls)
		}
	})
	t.Run("unknown version", func(t *testing.T) {
		var out, errOut bytes.Buffer
		var opened []string
		if code := runWith(t, []string{"--protocol-version", "2024-11-05", "list"}, "", &out, &errOut, &opened); code != exitUsage ||
			!strings.Contains(errOut.String(), `--protocol-version "2024-11-05": want 2026-07-28 or 2025-11-25`) {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
	})
}

// TestDefaultVersionIsTheNewest: without --protocol-version brokerctl
// opens with server/discover (2026-07-28).
func TestDefaultVersionIsTheNewest(t *testing.T) {
	p, ts := startLegacyPeer(t)
	p.opened = true
	var out, errOut bytes.Buffer
	var opened []string
	if code := runWith(t, []string{"--url", ts.URL, "call", "echo", "--args", `{"text":"x"}`}, "", &out, &errOut, &opened); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.versions) == 0 || p.versions[0] != "server/discover 2026-07-28" {
		t.Fatalf("the server saw %v first, want server/discover in 2026-07-28", p.versions)
	}
}
