package mcpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/vault"
)

// topLevelKeys counts the members of the JSON object b by name.
func topLevelKeys(t testing.TB, b []byte) map[string]int {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", b)
	}
	n := map[string]int{}
	for dec.More() {
		k, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		n[k.(string)]++
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestGatewayOneResultType: every relayed result carries resultType once
// (the SDK's types keep the upstream's from decoding and encode it again;
// the gateway writes its own), within max_result_bytes as relayed.
func TestGatewayOneResultType(t *testing.T) {
	g := newGatewayHarnessWith(t, []string{"max_result_bytes: 1500"})
	at, rt := g.up.grant("tools")
	if _, err := g.store.CreateConnection(context.Background(), vault.Connection{ID: "conn_up_alice", Principal: g.principal("alice"),
		Provider: "up", AccountID: "up-alice", Scopes: []string{"tools"}, Status: vault.StatusActive, Created: g.clock.Now(), Updated: g.clock.Now(),
		Token: vault.TokenSet{AccessToken: vault.Secret(at), RefreshToken: vault.Secret(rt), TokenType: "Bearer", Expiry: g.clock.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	raw := func(method, name string, params map[string]any) []byte {
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + g.gwBearer("alice"), "MCP-Protocol-Version": versionModern, "Mcp-Method": method}
		if name != "" {
			hd["Mcp-Name"], params["name"] = name, name
		}
		var env struct {
			Result json.RawMessage `json:"result"`
		}
		r := g.do(rawCall{path: "/mcp/u/up", headers: hd, body: modernBody(9, method, urlCaps, params)})
		if err := json.Unmarshal(r.body, &env); err != nil || env.Result == nil {
			t.Fatalf("%s: %d %s", method, r.status, r.body)
		}
		return env.Result
	}
	for _, tc := range []struct {
		method, name string
		params       map[string]any
		want         string
	}{
		{"tools/call", "echo", map[string]any{"arguments": map[string]any{"a": "b"}}, `"text":"echo {\"a\":\"b\"}"`},
		{"tools/list", "", map[string]any{}, `"name":"echo"`},
		{"prompts/list", "", map[string]any{}, `"prompts":[]`},
		{"resources/list", "", map[string]any{}, `"resources":[]`},
		// Over max_result_bytes as relayed: the tool error instead.
		{"tools/call", "echo", map[string]any{"arguments": map[string]any{"a": strings.Repeat("x", 1500)}}, "more than 1500 bytes"},
	} {
		b := raw(tc.method, tc.name, tc.params)
		if n := topLevelKeys(t, b); n["resultType"] != 1 || !bytes.Contains(b, []byte(`"resultType":"complete"`)) || !bytes.Contains(b, []byte(tc.want)) {
			t.Errorf("%s %s: %s", tc.method, tc.name, b)
		}
	}
}

// upstreamResult is an upstream's tools/call result as the go-sdk client
// hands it over: decoded by the SDK (its resultType kept).
func upstreamResult(t testing.TB, wire []byte) *mcp.CallToolResult {
	t.Helper()
	var r mcp.CallToolResult
	if err := json.Unmarshal(wire, &r); err != nil {
		t.Fatalf("the SDK refuses the result (%v): %s", err, wire)
	}
	return &r
}

// checkFastResult: whenever fastResult takes an upstream's result, it
// writes what slowResult writes for it (the same members and values; the
// order of members is JSON's to ignore), resultType once. It reports
// whether the fast path took it.
func checkFastResult(t testing.TB, g *gateway, wire []byte) bool {
	t.Helper()
	fast, ok := g.fastResult(true, upstreamResult(t, wire))
	if !ok {
		return false
	}
	slow, err := g.slowResult(true, upstreamResult(t, wire))
	if err != nil {
		t.Fatalf("slowResult: %v", err)
	}
	var f, s any
	if err := json.Unmarshal(fast, &f); err != nil {
		t.Fatalf("fast encoding is not JSON (%v): %s", err, fast)
	}
	if err := json.Unmarshal(slow, &s); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(f, s) || topLevelKeys(t, fast)["resultType"] != 1 {
		t.Fatalf("for %s:\nfast %s\nslow %s", wire, fast, slow)
	}
	return true
}

func gatewayEncodeTestServer(t testing.TB) *gateway {
	return &gateway{s: encodeTestServer(t)}
}

// TestGatewayFastResult: the usual relayed text results take the fast
// path and encode as the SDK's path does; anything else is left to it.
func TestGatewayFastResult(t *testing.T) {
	g := gatewayEncodeTestServer(t)
	info := `"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"up","version":"1"}}`
	for _, tc := range []struct {
		wire string
		fast bool
	}{
		{`{"resultType":"complete",` + info + `,"content":[{"type":"text","text":"This is a simple text response for testing."}]}`, true},
		{`{"content":[{"type":"text","text":"<&> \u2028 \ud800 é"}],"isError":true}`, true},
		{`{"resultType":"complete","content":[{"type":"text","text":""}]}`, true},
		{`{"resultType":"complete","_meta":{"k":1},"content":[{"type":"text","text":"a"}]}`, false},
		{`{"resultType":"complete",` + info[:len(info)-1] + `,"k":1},"content":[{"type":"text","text":"a"}]}`, false},
		{`{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}`, false},
		{`{"content":[{"type":"text","text":"a","annotations":{"priority":1}}]}`, false},
		{`{"content":[{"type":"image","data":"AA==","mimeType":"image/png"}]}`, false},
		{`{"content":[{"type":"text","text":"a"}],"structuredContent":{"a":1}}`, false},
	} {
		if got := checkFastResult(t, g, []byte(tc.wire)); got != tc.fast {
			t.Errorf("fast path %v, want %v: %s", got, tc.fast, tc.wire)
		}
	}
}

// FuzzGatewayFastResult: an upstream's text, whatever its bytes, is relayed
// by the fast path as the SDK's path relays it.
func FuzzGatewayFastResult(f *testing.F) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10 {
		f.Add(randomString(rng), rng.IntN(2) == 0, rng.IntN(3))
	}
	f.Add("\xff<\u2028>", true, 1)
	f.Fuzz(func(t *testing.T, text string, isError bool, meta int) {
		g := gatewayEncodeTestServer(t)
		res := map[string]any{"resultType": "complete", "content": []any{map[string]any{"type": "text", "text": text}}, "isError": isError}
		switch meta {
		case 1:
			res["_meta"] = map[string]any{mcp.MetaKeyServerInfo: map[string]any{"name": text}}
		case 2:
			res["_meta"] = map[string]any{text: 1}
		}
		wire, err := json.Marshal(res)
		if err != nil {
			t.Fatal(err)
		}
		checkFastResult(t, g, wire)
	})
}

// TestWithoutResultType: only a top-level resultType goes.
func TestWithoutResultType(t *testing.T) {
	for in, want := range map[string]string{
		`{"resultType":"complete","a":1}`:         `{"a":1}`,
		`{"a":{"resultType":"x"}}`:                `{"a":{"resultType":"x"}}`,
		`{"b":2,"resultType":"complete","a":"<"}`: `{"a":"\u003c","b":2}`,
		`{"a":1}`: `{"a":1}`,
	} {
		if got := withoutResultType([]byte(in)); string(got) != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}
