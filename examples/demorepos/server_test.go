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
