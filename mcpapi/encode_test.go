package mcpapi

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

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
	errOutcome.isError = true
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
			got, ok := srv.encodeToolResult(tc.o.toolResult())
			if ok != tc.fast {
				t.Fatalf("fast path = %v, want %v", ok, tc.fast)
			}
			if !ok {
				return
			}
			res := *tc.o.toolResult()
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

func checkAppendJSONString(t testing.TB, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendJSONString([]byte("x"), s); string(got) != "x"+string(want) {
		t.Fatalf("appendJSONString(%q) = %s, json.Marshal %s", s, got[1:], want)
	}
	if got := appendJSONString([]byte("x"), []byte(s)); string(got) != "x"+string(want) {
		t.Fatalf("appendJSONString([]byte(%q)) = %s, json.Marshal %s", s, got[1:], want)
	}
}

func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{"", "plain", "é✓𝄞", "\"\\/", "<a href='x'>&amp;</a>", "\b\f\n\r\t\x00\x01\x1f\x7f",
		"\u2028\u2029", "\xff", "a\xe2\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "{\"k\":\"v\"}", "\ufffd"} {
		checkAppendJSONString(t, s)
	}
	for c := range 256 {
		checkAppendJSONString(t, string(rune(c)))
		checkAppendJSONString(t, string([]byte{byte(c)}))
	}
}

func FuzzAppendJSONString(f *testing.F) {
	f.Add("Connect your <GitHub> account & retry \"now\"\n\u2028\xff")
	f.Fuzz(func(t *testing.T, s string) {
		checkAppendJSONString(t, s)
	})
}

func checkConnectOutput(t testing.TB, o connectOutput) {
	t.Helper()
	want, err := json.Marshal(o)
	got, ok := encodeConnectOutput([]byte("x")[:0], &o)
	if ok != (err == nil) {
		t.Fatalf("encodeConnectOutput ok=%v, json.Marshal err=%v: %+v", ok, err, o)
	}
	if ok && !bytes.Equal(got, want) {
		t.Fatalf("encodeConnectOutput differs:\n got %s\nwant %s", got, want)
	}
}

func TestEncodeConnectOutput(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 4, 5, 120000000, time.UTC)
	later := now.Add(time.Hour).In(time.FixedZone("x", 5400))
	bad := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, o := range []connectOutput{
		{Status: "connected", Message: "Connected: GitHub account octo.", Connection: &connectionView{ID: "conn_1", Provider: "github",
			Account: "octo", Scopes: []string{"repo", "read:org"}, Status: "active", Created: now}},
		{Status: "connected", Message: "<&>\"\n", Connection: &connectionView{Scopes: []string{}, Created: now, LastUsed: &later}},
		{Status: "connected", Connection: &connectionView{}},
		{Status: "declined", Message: "The person declined."},
		{},
		{Connection: &connectionView{Created: bad}},
		{Connection: &connectionView{LastUsed: &bad}},
		{Status: "connected", Message: "Connected.", Connection: &connectionView{ID: "conn_2", Scopes: []string{"openid"}, Created: now,
			NotGranted: []string{"https://www.googleapis.com/auth/drive", "<\u2028>"}, Note: "Not \"granted\"."}},
	} {
		checkConnectOutput(t, o)
	}
}

func FuzzEncodeConnectOutput(f *testing.F) {
	f.Add("connected", "Connected: GitHub account octo.", "conn_1", "github", "octo", "repo", "active", int64(1796000000), int64(5), 0, true)
	f.Add("<", "\u2028", "\xff", "&", "\"", "", "\n", int64(-62135596801), int64(0), 3600*25, false)
	f.Fuzz(func(t *testing.T, status, message, id, prov, account, scope, cstatus string, sec, nsec int64, zone int, conn bool) {
		o := connectOutput{Status: status, Message: message}
		if conn {
			tm := time.Unix(sec, nsec).In(time.FixedZone("z", zone%(48*3600)))
			v := &connectionView{ID: id, Provider: prov, Account: account, Status: cstatus, Created: tm}
			if scope != "" {
				v.Scopes = []string{scope, id}
			}
			if nsec%2 == 0 {
				v.LastUsed = &tm
			}
			if nsec%3 == 0 && scope != "" {
				v.NotGranted, v.Note = []string{scope, account}, message
			}
			o.Connection = v
		}
		checkConnectOutput(t, o)
	})
}

// BenchmarkConnectedResult: the retry's answer, structured content and
// result, as complete and encodeToolResult build it.
func BenchmarkConnectedResult(b *testing.B) {
	srv := encodeTestServer(b)
	o := connectOutput{Status: "connected", Message: "Connected: Demo account demo-user.", Connection: &connectionView{ID: "conn_0123456789",
		Provider: "demo", Account: "demo-user", Scopes: []string{"profile"}, Status: "active", Created: time.Now().UTC()}}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := srv.encodeToolResult(complete(o).toolResult()); !ok {
			b.Fatal("not encoded")
		}
	}
}
