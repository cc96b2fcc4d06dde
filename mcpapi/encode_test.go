package mcpapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestEncodeToolResultMatchesSDK checks the fast encoder against the SDK's
// encoding for every shape the tools produce, HTML-sensitive text included.
func TestEncodeToolResultMatchesSDK(t *testing.T) {
	var err error
	srv := &Server{impl: &mcp.Implementation{Name: "credbroker", Title: "cred<broker>", Version: "1&2"}}
	if srv.implJSON, err = json.Marshal(srv.impl); err != nil {
		t.Fatal(err)
	}
	errOutcome := complete(disconnectOutput{Provider: "github", Account: "a<b>&c", Revocation: "failed", Message: "x \"quoted\" \u2028 <tag>"})
	errOutcome.result.IsError = true
	tests := []struct {
		name string
		o    outcome
		fast bool
	}{
		{"connected", complete(connectOutput{Status: "connected", Message: "Connected: GitHub account <octo&cat>.",
			Connection: &connectionView{ID: "conn_1", Provider: "github", Account: "octo", Scopes: []string{"repo"}, Status: "active"}}), true},
		{"tool error without structured content", toolError("Unknown provider %q. Valid: <a>, b&c.", "x\x00y"), true},
		{"structured error", errOutcome, true},
		{"empty list", complete(listOutput{Connections: []connectionView{}}), true},
		{"two contents", outcome{result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}, &mcp.TextContent{Text: "b"}}}}, false},
		{"map structured content", outcome{result: &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "a"}}, StructuredContent: map[string]any{"a": 1}}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := srv.encodeToolResult(tc.o.result)
			if ok != tc.fast {
				t.Fatalf("fast path = %v, want %v", ok, tc.fast)
			}
			if !ok {
				return
			}
			res := *tc.o.result
			res.Meta = srv.serverMeta()
			b, err := json.Marshal(&res)
			if err != nil {
				t.Fatal(err)
			}
			want := withResultType("complete", b)
			if !bytes.Equal(got, want) {
				t.Errorf("fast encoding differs:\n got %s\nwant %s", got, want)
			}
		})
	}
}

// refInputRequired is what writeOutcome encoded before encodeInputRequired.
func refInputRequired(s *Server, in *inputRequired) ([]byte, error) {
	return json.Marshal(inputRequiredResult{
		ResultType:    "input_required",
		Meta:          s.serverMeta(),
		InputRequests: mcp.InputRequestMap{in.key: in.params},
		RequestState:  in.state,
	})
}

// checkInputRequired fails when encodeInputRequired takes in and writes
// anything but the reference bytes. It reports whether it took in.
func checkInputRequired(t testing.TB, s *Server, in *inputRequired) bool {
	t.Helper()
	got, ok := s.encodeInputRequired(in)
	if !ok {
		return false
	}
	want, err := refInputRequired(s, in)
	if err != nil {
		t.Fatalf("reference encoding failed: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("fast encoding differs:\n got %s\nwant %s", got, want)
	}
	return true
}

func encodeTestServer(t testing.TB) *Server {
	var err error
	srv := &Server{impl: &mcp.Implementation{Name: "credbroker", Title: "cred<broker>", Version: "1&2"}}
	if srv.implJSON, err = json.Marshal(srv.impl); err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestEncodeInputRequiredMatchesSDK: the connect link answer, and strings
// that need escaping, are encoded as json.Marshal and the SDK would.
func TestEncodeInputRequiredMatchesSDK(t *testing.T) {
	srv := encodeTestServer(t)
	for _, tc := range []struct {
		in   inputRequired
		fast bool
	}{
		{inputRequired{key: "connect_github", state: "AQVrMTIzNA_-x", params: &mcp.ElicitParams{Mode: "url",
			Message: "Connect your GitHub account (needed: repo) in the browser, then retry.", URL: "https://broker.example/connect/g_1"}}, true},
		{inputRequired{key: "connect_<x>", params: &mcp.ElicitParams{Mode: "url", Message: "a & b \"q\" \\ \n \u2028 \u2029 \x00 \xff é ✓",
			URL: "https://b/c?x=1&y=<2>", ElicitationID: "e1"}}, true},
		{inputRequired{key: "", params: &mcp.ElicitParams{Mode: "form", Message: ""}}, true},
		{inputRequired{key: "k", params: &mcp.ElicitParams{Message: "no mode"}}, false},
		{inputRequired{key: "k", params: &mcp.ElicitParams{Mode: "form", RequestedSchema: map[string]any{"type": "object"}}}, false},
		{inputRequired{key: "k", params: &mcp.ElicitParams{Mode: "url", Meta: mcp.Meta{"a": 1}}}, false},
		{inputRequired{key: "k"}, false},
	} {
		if got := checkInputRequired(t, srv, &tc.in); got != tc.fast {
			t.Errorf("fast path %v, want %v: %+v", got, tc.fast, tc.in)
		}
	}
}

// FuzzEncodeInputRequired: the fast encoder writes the reference bytes for
// any strings.
func FuzzEncodeInputRequired(f *testing.F) {
	srv := encodeTestServer(f)
	f.Add("connect_github", "url", "Connect your GitHub account in the browser, then retry.", "https://broker.example/connect/g_1", "", "AQVr")
	f.Add("<&>", "form", "\u2028\"\\\x00\xff", "a&b", "id", "")
	f.Fuzz(func(t *testing.T, key, mode, message, url, elicitationID, state string) {
		checkInputRequired(t, srv, &inputRequired{key: key, state: state,
			params: &mcp.ElicitParams{Mode: mode, Message: message, URL: url, ElicitationID: elicitationID}})
	})
}

func BenchmarkEncodeInputRequired(b *testing.B) {
	srv := encodeTestServer(b)
	in := &inputRequired{key: "connect_github", state: strings.Repeat("AQVrMTIzNA", 20), params: &mcp.ElicitParams{Mode: "url",
		Message: "Connect your GitHub account (needed: repo) in the browser, then retry.", URL: "https://broker.example/connect/g_0123456789"}}
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			srv.encodeInputRequired(in)
		}
	})
	b.Run("json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			refInputRequired(srv, in)
		}
	})
}
