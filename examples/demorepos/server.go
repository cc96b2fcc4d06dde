// Command demorepos is an example MCP server that lives next to credbroker
// and offers one tool, list_demo_repos, through the broker's sidecar API.
// It contains no OAuth code and never sees a token: when the user has not
// connected the demo provider yet, it copies the broker's input request
// into its own InputRequiredResult, and on the client's retry it passes
// the requestState and the person's answer (inputResponses: accept,
// decline or cancel) back to the broker.
//
//	go run ./examples/demorepos -addr 127.0.0.1:8090 -sidecar-url http://127.0.0.1:8081 -secret-file data/sidecar.secret
//
// (`broker dev` prints this command with its own address and secret file.)
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/sidecar/client"
)

// repo is what the tool reports per repository.
type repo struct {
	Name     string `json:"name"`
	FullName string `json:"full_name"`
	Private  bool   `json:"private"`
}

type reposOutput struct {
	Account string `json:"account"`
	Repos   []repo `json:"repos"`
}

// NewServer returns the MCP server offering list_demo_repos via sc.
func NewServer(sc *client.Client) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "demorepos", Version: "0.1.0"}, nil)
	srv.AddTool(&mcp.Tool{
		Name:        "list_demo_repos",
		Title:       "List my demo repositories",
		Description: "List the repositories of the user's demo provider account (connecting it first if needed).",
		InputSchema: json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return listRepos(ctx, sc, req)
	})
	return srv
}

// userToken is the caller's own bearer token, passed to the broker, which
// validates it itself.
func userToken(req *mcp.CallToolRequest) string {
	if req.Extra == nil || req.Extra.Header == nil {
		return ""
	}
	scheme, tok, ok := strings.Cut(req.Extra.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

func toolError(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

func listRepos(ctx context.Context, sc *client.Client, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	tok := userToken(req)
	if tok == "" {
		return toolError("This server needs the user's bearer token (Authorization header)."), nil
	}
	rr, err := sc.Require(ctx, tok, client.RequireFrom(req, "demo", "repos"))
	if err != nil {
		var se *client.Error
		if errors.As(err, &se) {
			return toolError("The broker refused: %s.", se.Message), nil
		}
		return nil, err
	}
	switch rr.Status {
	case "input_required":
		return rr.InputRequired(), nil
	case "declined":
		// An answer, not a failure: the person said no.
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: rr.Message}},
			StructuredContent: map[string]string{"status": "declined", "message": rr.Message}}, nil
	case "cancelled":
		return toolError("Nothing listed: %s", rr.Message), nil
	case "connected":
	default:
		return toolError("The broker answered %q.", rr.Status), nil
	}
	resp, err := sc.Do(ctx, tok, "demo", client.Request{Path: "/repos", Account: rr.Connection.Account})
	if err != nil {
		var se *client.Error
		if errors.As(err, &se) {
			return toolError("The broker refused the request: %s.", se.Message), nil
		}
		return nil, err
	}
	if resp.Status != http.StatusOK {
		return toolError("The demo provider answered HTTP %d.", resp.Status), nil
	}
	out := reposOutput{Account: rr.Connection.Account}
	if err := json.Unmarshal(resp.Body, &out.Repos); err != nil {
		return toolError("The demo provider's answer was not a list of repositories."), nil
	}
	names := make([]string, 0, len(out.Repos))
	for _, r := range out.Repos {
		names = append(names, r.FullName)
	}
	b, _ := json.Marshal(out)
	return &mcp.CallToolResult{
		Content:           []mcp.Content{&mcp.TextContent{Text: "Repositories of " + out.Account + ": " + strings.Join(names, ", ")}},
		StructuredContent: json.RawMessage(b),
	}, nil
}
