package client_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/sidecar/client"
)

// A tool of a co-located MCP server: make sure the person has connected
// GitHub, relaying the broker's connect link to the host when needed and
// the host's answer back on its retry, then call the API through the
// broker. The server never holds a GitHub token.
func Example() {
	sc, err := client.New("http://127.0.0.1:8081", os.Getenv("BROKER_SIDECAR_SECRET"), nil)
	if err != nil {
		panic(err)
	}
	listIssues := func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		// The person's token, as the host sent it; the broker checks it.
		userToken := strings.TrimPrefix(req.Extra.Header.Get("Authorization"), "Bearer ")
		// RequireFrom carries the host's requestState and inputResponses
		// (accept, decline, cancel) and its name.
		rr, err := sc.Require(ctx, userToken, client.RequireFrom(req, "github", "repo"))
		if err != nil {
			return nil, err
		}
		switch rr.Status {
		case "input_required":
			return rr.InputRequired(), nil // the host shows the link, then retries
		case "declined", "cancelled":
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: rr.Message}}}, nil
		}
		resp, err := sc.Do(ctx, userToken, "github", client.Request{Path: "/issues", Account: rr.Connection.Account})
		if err != nil {
			return nil, err
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("GitHub answered HTTP %d", resp.Status)}}}, nil
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "issues", Version: "1"}, nil)
	srv.AddTool(&mcp.Tool{Name: "list_issues", InputSchema: map[string]any{"type": "object"}}, listIssues)
}
