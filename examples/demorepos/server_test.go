package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
	"credbroker/vault"
)

type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// TestConnectAndListThroughSidecar: an MCP client calls list_demo_repos on
// this example server; the server asks the broker's sidecar, relays the
// url elicitation, the user connects (completing the broker's grant), the
// client's MRTR retry carries the request_state back and the repositories
// come from the demo provider through the broker's proxy.
func TestConnectAndListThroughSidecar(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(sc)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var links []string
	cl := mcp.NewClient(&mcp.Implementation{Name: "example-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if req.Params.Mode != "url" {
				t.Errorf("elicitation mode %q, want url", req.Params.Mode)
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			links = append(links, req.Params.URL)
			if len(links) == 1 {
				st.CompleteConnect(req.Params.URL, "alice", "1001") // the user connects in the browser
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		},
	})
	cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL,
		HTTPClient: &http.Client{Transport: bearer{st.UserToken("alice", ""), http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_demo_repos", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if res.IsError {
		t.Fatalf("tool error: %+v", res.Content[0])
	}
	if len(links) != 1 || !strings.HasPrefix(links[0], sidecartest.PublicURL+"/connect/") {
		t.Fatalf("want one connect link from the broker, got %q", links)
	}
	// The consent page will name the host as it named itself, next to the
	// server the broker knows by its secret.
	if g, err := st.Store.GetGrant(ctx, strings.TrimPrefix(links[0], sidecartest.PublicURL+"/connect/")); err != nil ||
		g.ClientName != "example-test" || g.Server != vault.UnnamedServer {
		t.Fatalf("grant %+v %v; want the host's name example-test and the unnamed server", g, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var out reposOutput
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Account != "alice-demo" || len(out.Repos) != 2 || out.Repos[0].FullName != "alice-demo/hello-demo" {
		t.Fatalf("repos = %+v", out)
	}
	all, _ := json.Marshal(res)
	st.CheckNoTokens("tool result", string(all))
	st.CheckNoTokens("logs", st.Logs.String())

	// A second call needs no connect step.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_demo_repos", Arguments: map[string]any{}})
	if err != nil || res.IsError || len(links) != 1 {
		t.Fatalf("second call: err=%v isError=%v links=%d", err, res != nil && res.IsError, len(links))
	}
}

// TestDeclineAndCancelThroughExample: the person's answer in the MCP host
// travels through this server to the broker. Declining is an answer (no
// error, the broker's request is closed); cancelling leaves the request
// open and says so.
func TestDeclineAndCancelThroughExample(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(sc)
	ts := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	t.Cleanup(ts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		user, action string
		isError      bool
		text         string
		state        vault.GrantState
	}{
		{"alice", "decline", false, "The user declined to connect Demo", vault.GrantDenied},
		{"bob", "cancel", true, "Nothing listed: Nothing was connected: the user dismissed the request to connect Demo", vault.GrantPending},
	} {
		t.Run(tc.action, func(t *testing.T) {
			var link string
			cl := mcp.NewClient(&mcp.Implementation{Name: "example-test", Version: "1"}, &mcp.ClientOptions{
				Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
				ElicitationHandler: func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
					link = req.Params.URL
					return &mcp.ElicitResult{Action: tc.action}, nil
				},
			})
			cs, err := cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: ts.URL,
				HTTPClient: &http.Client{Transport: bearer{st.UserToken(tc.user, ""), http.DefaultTransport}}, DisableStandaloneSSE: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_demo_repos", Arguments: map[string]any{}})
			if err != nil {
				t.Fatal(err)
			}
			text := res.Content[0].(*mcp.TextContent).Text
			if res.IsError != tc.isError || !strings.Contains(text, tc.text) {
				t.Fatalf("result isError=%v %q; want isError=%v and %q", res.IsError, text, tc.isError, tc.text)
			}
			g, err := st.Store.GetGrant(ctx, strings.TrimPrefix(link, sidecartest.PublicURL+"/connect/"))
			if err != nil || g.State != tc.state {
				t.Fatalf("the broker's request is %s (%v), want %s", g.State, err, tc.state)
			}
		})
	}
}
