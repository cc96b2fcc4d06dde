// Command brokerctl is a small MCP client for credbroker, for people and
// scripts: connect, list, disconnect and request, and call for any tool of
// any MCP server (such as one built on the broker's sidecar API).
//
// It behaves as a careful MCP host should with URL-mode elicitation: it shows
// the full URL with its domain set apart (and a warning when the host is
// punycode, non-ASCII or not the broker's own host), asks before opening it,
// never fetches it itself, waits for the user to finish in the browser, and
// retries the call with a new JSON-RPC id and the requestState unchanged.
// With --protocol-version 2025-11-25 it opens a session with initialize and
// takes the links of a URLElicitationRequired error (-32042) the same way,
// then calls again.
//
//	brokerctl --url http://127.0.0.1:8080/mcp --token "$TOKEN" connect demo
//	brokerctl list
//	brokerctl disconnect demo
//	brokerctl request demo GET /api/user
//	brokerctl --url http://127.0.0.1:8090/mcp call list_demo_repos   (any MCP server)
//	brokerctl --url http://127.0.0.1:8080/mcp/u/demo-mcp tools       (a remote MCP server, relayed)
//
// Exit status: 0 success, 1 failure (including a tool error), 2 usage,
// 3 (--non-interactive) the user must open the printed URL, then run the
// command again.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}
