package sidecar_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
)

// TestSidecarProxyMCPProvider: issue 31's "the sidecar proxy answers
// '<name> is an MCP provider: use <endpoint>'": a proxy request naming a
// provider of type mcp is refused (400 request_refused) with the
// broker's endpoint for it, before anything is connected or sent, in the
// raw API and through the client.
func TestSidecarProxyMCPProvider(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{ExtraProviders: `  linear:
    type: mcp
    display_name: Linear
    mcp: {url: https://mcp.linear.example/mcp}
`})
	want := "linear is an MCP provider: use " + sidecartest.PublicURL + "/mcp/u/linear"
	alice := st.UserToken("alice", "")
	status, body := raw(t, st, http.MethodGet, "/v1/proxy/linear/issues", st.Secret, alice, "")
	if status != http.StatusBadRequest || !strings.Contains(body, `"error":"request_refused"`) || !strings.Contains(body, want) {
		t.Fatalf("proxy to an MCP provider: HTTP %d %s, want 400 request_refused saying %q", status, body, want)
	}
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = sc.Do(context.Background(), alice, "linear", client.Request{Path: "/issues"})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest || e.Code != "request_refused" || e.Message != want {
		t.Fatalf("client proxy to an MCP provider: %v, want request_refused %q", err, want)
	}
}
