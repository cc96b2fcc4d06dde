package mcpapi

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"credbroker/internal/plainjson/plainjsontest"
)

// refParse is what serveMCP did before fastParse: encoding/json on the body,
// then on params.
func refParse(body []byte) (rpcMessage, modernParams, error, error) {
	var msg rpcMessage
	var p modernParams
	if err := json.Unmarshal(body, &msg); err != nil {
		return msg, p, err, nil
	}
	var perr error
	if len(msg.Params) > 0 && string(msg.Params) != "null" {
		perr = json.Unmarshal(msg.Params, &p)
	}
	return msg, p, nil, perr
}

// checkFastParse fails when fastParse accepts body and encoding/json either
// rejects it or decodes different values. It reports whether the fast path
// was taken.
func checkFastParse(t testing.TB, body []byte) bool {
	t.Helper()
	var msg rpcMessage
	var p modernParams
	if !fastParse(body, &msg, &p) {
		return false
	}
	rmsg, rp, err, perr := refParse(body)
	if err != nil || perr != nil {
		t.Fatalf("fastParse accepted what encoding/json rejects (%v, %v): %q", err, perr, body)
	}
	if !reflect.DeepEqual(msg, rmsg) {
		t.Fatalf("envelope differs for %q:\nfast %+v\njson %+v", body, msg, rmsg)
	}
	if !reflect.DeepEqual(p, rp) {
		t.Fatalf("params differ for %q:\nfast %+v\njson %+v", body, p, rp)
	}
	checkGatewayFastParse(t, body)
	return true
}

// checkGatewayFastParse: when the gateway's one-pass decode takes body, it
// gives the envelope and params encoding/json gives (gwParams: the
// gateway's shape, inputResponses kept raw).
func checkGatewayFastParse(t testing.TB, body []byte) {
	t.Helper()
	var msg rpcMessage
	var p gwParams
	if !gwFastParse(body, &msg, &p) {
		return
	}
	var rmsg rpcMessage
	var rp gwParams
	if err := json.Unmarshal(body, &rmsg); err != nil {
		t.Fatalf("gwFastParse accepted what encoding/json rejects (%v): %q", err, body)
	}
	if len(rmsg.Params) > 0 && string(rmsg.Params) != "null" {
		if err := json.Unmarshal(rmsg.Params, &rp); err != nil {
			t.Fatalf("gwFastParse accepted params encoding/json rejects (%v): %q", err, body)
		}
	}
	if !reflect.DeepEqual(msg, rmsg) || !reflect.DeepEqual(p, rp) {
		t.Fatalf("gateway decode differs for %q:\nfast %+v %+v\njson %+v %+v", body, msg, p, rmsg, rp)
	}
}

func TestFastParseMatchesEncodingJSON(t *testing.T) {
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}},"io.modelcontextprotocol/clientInfo":{"name":"agent","title":"Agent ✓","version":"1.0"}}`
	for _, tc := range []struct {
		body string
		fast bool // the fast path must take it (the common shapes)
	}{
		{modernBody(1, "tools/call", "{}", map[string]any{"name": "list_connections", "arguments": map[string]any{}}), true},
		{modernBody(7, "tools/call", urlCaps, map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "github", "scopes": []any{"repo", 1.5e3, nil, true}}}), true},
		{modernBody(2, "tools/list", "{}", map[string]any{"cursor": ""}), true},
		{modernBody(3, "server/discover", "{}", nil), true},
		{`{"jsonrpc":"2.0","id":"abc","method":"tools/call","params":{"name":"x","arguments":{"a":"\u00e9\n"},` + meta + `}}`, true},
		{" \n{ \"jsonrpc\" : \"2.0\" , \"id\" : -1.5e+3 , \"method\" : \"tools/call\" , \"params\" : { " + meta + " , \"requestState\" : \"AQ\" } } \r\n", true},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","extra":[1,{"b":[]}],` + meta + `},"other":{"k":null}}`, true},
		{`{}`, true},
		// SEP-414 trace context in _meta (the traced request's parent).
		{`{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","_meta":{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","tracestate":"k=v","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, true},
		{`{"jsonrpc":"2.0","id":4,"method":"x","params":{"_meta":{"traceparent":"a","traceparent":"b"}}}`, false},
		{`{"jsonrpc":"2.0","id":4,"method":"x","params":{"_meta":{"TraceParent":"a"}}}`, false},
		// Unusual shapes: encoding/json decides.
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","name":"b"}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tools\/call"}`, false},
		{`{"JSONRPC":"2.0","id":1,"method":"x"}`, false},
		{`{"jsonrpc":"2.0","id":1,"Method":"x"}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"NAME":"y"}}`, false},
		{`{"jsonrpc":"2.0","id":null,"method":"x"}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":null}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":[]}`, false},
		// The retry after a connect link.
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x",` + meta + `,"requestState":"AQ","inputResponses":{"connect_github":{"action":"accept"}}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses": { "a" : { "action" : "decline" } , "b":{"action":"cancel"}}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"action":"accept"},"a":{"action":"decline"}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"action":"accept","content":{"k":1}}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"action":"accept","action":"decline"}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"Action":"accept"}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"action":null}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"roots":[]}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":null}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":null}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{},"inputResponses":{}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"InputResponses":{}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"_meta":{"io.modelcontextprotocol/clientInfo":{"name":"x","icons":[]}}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":5}`, false},
		{"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}", false},
		{`{"jsonrpc":"2.0","id":01,"method":"x"}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x"} x`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x",}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"a":"\x"}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"x","params":{"arguments":{"a":1.}}}`, false},
		{`[{"jsonrpc":"2.0"}]`, false},
		{``, false},
		{`null`, false},
		{`{"id":{}}`, true}, // valid JSON; validID rejects it later, as before
		// The gateway's: a progress token (a string or a number) and a
		// resource's URI.
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":"p-1","io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":17}}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":null}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"progressToken":1,"progressToken":2}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"ProgressToken":1}}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///a b.txt",` + meta + `}}`, true},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"a","uri":"b"}}`, false},
		{`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"URI":"a"}}`, false},
	} {
		if got := checkFastParse(t, []byte(tc.body)); got != tc.fast {
			t.Errorf("fast path %v, want %v: %s", got, tc.fast, tc.body)
		}
	}

	// A random corpus: generated requests, then byte-level mutations of them.
	rng := rand.New(rand.NewPCG(16, 16))
	var fast [2]int // generated, mutated
	const n = 20000
	for i := range n {
		body := randomRequest(rng)
		if i%2 == 1 {
			body = mutate(rng, body)
		}
		if checkFastParse(t, body) {
			fast[i%2]++
		}
	}
	// Both halves must reach the fast path often enough to test it.
	if fast[0] < n/20 || fast[1] < n/100 {
		t.Errorf("fast path took %d generated and %d mutated of %d random bodies: the corpus no longer exercises it", fast[0], fast[1], n)
	}
	t.Logf("fast path: %d generated, %d mutated, of %d", fast[0], fast[1], n)
}

var fuzzKeys = []string{"jsonrpc", "id", "method", "params", "_meta", "name", "arguments", "cursor", "requestState",
	"inputResponses", "io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientCapabilities",
	"io.modelcontextprotocol/clientInfo", "title", "version", "description", "websiteUrl", "icons", "x", "Name", "ID", "ſ", "K",
	"progressToken", "uri", "URI"}

func randomValue(rng *rand.Rand, depth int) string {
	switch k := rng.IntN(10); {
	case k == 0:
		return "null"
	case k == 1:
		return []string{"true", "false"}[rng.IntN(2)]
	case k == 2:
		return []string{"0", "-1", "1.5", "2e10", "-0.0E-2", "123456789012345678901234567890"}[rng.IntN(6)]
	case k <= 5 || depth > 3:
		return randomString(rng)
	case k <= 7:
		var parts []string
		for range rng.IntN(4) {
			parts = append(parts, randomString(rng)+":"+randomValue(rng, depth+1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	default:
		var parts []string
		for range rng.IntN(4) {
			parts = append(parts, randomValue(rng, depth+1))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
}

func randomString(rng *rand.Rand) string {
	if rng.IntN(3) == 0 {
		return `"` + fuzzKeys[rng.IntN(len(fuzzKeys))] + `"`
	}
	pieces := []string{"a", "é", `\n`, `\"`, `\u00e9`, "2026-07-28", "tools/call", "\xff", " ", `\ud800`}
	var b strings.Builder
	b.WriteByte('"')
	for range rng.IntN(4) {
		if rng.IntN(4) == 0 {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		} else {
			b.WriteString(pieces[rng.IntN(2)])
		}
	}
	b.WriteByte('"')
	return b.String()
}

// randomRequest is a request of the common shape with random variations:
// missing, extra, duplicated, re-cased or mistyped members, whitespace.
func randomRequest(rng *rand.Rand) []byte {
	ws := func() string { return []string{"", "", " ", "\n\t", "\r\n  "}[rng.IntN(5)] }
	obj := func(members map[string]string) string {
		var parts []string
		for k, v := range members {
			if rng.IntN(8) == 0 {
				continue
			}
			if rng.IntN(12) == 0 {
				k = strings.ToUpper(k[:1]) + k[1:]
			}
			if rng.IntN(10) == 0 {
				v = randomValue(rng, 2)
			}
			parts = append(parts, ws()+`"`+k+`"`+ws()+":"+ws()+v+ws())
			if rng.IntN(25) == 0 {
				parts = append(parts, `"`+k+`":`+v)
			}
		}
		if rng.IntN(5) == 0 {
			parts = append(parts, randomString(rng)+":"+randomValue(rng, 1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	caps := []string{"{}", urlCaps, `{"elicitation":{}}`, `{"elicitation":{"form":{},"url":{}}}`, `{"roots":{"listChanged":true}}`}[rng.IntN(5)]
	info := obj(map[string]string{"name": `"agent"`, "version": `"1.0"`, "title": `"Agent é"`})
	meta := obj(map[string]string{
		"io.modelcontextprotocol/protocolVersion":    `"2026-07-28"`,
		"io.modelcontextprotocol/clientCapabilities": caps,
		"io.modelcontextprotocol/clientInfo":         info,
		"progressToken":                              []string{`"p-1"`, "7"}[rng.IntN(2)],
	})
	members := map[string]string{
		"_meta": meta, "name": `"connect_account"`, "arguments": `{"provider":"github","scopes":["repo"]}`,
		"requestState": `"AQVrMTIzNA"`, "cursor": `""`, "uri": `"file:///a.txt"`,
	}
	if rng.IntN(2) == 0 { // a retry after a connect link
		members["inputResponses"] = obj(map[string]string{
			"connect_github": obj(map[string]string{"action": []string{`"accept"`, `"decline"`, `"cancel"`}[rng.IntN(3)]}),
			"connect_slack":  obj(map[string]string{"action": `"accept"`}),
		})
	}
	params := obj(members)
	id := []string{"1", `"x"`, "-2.5e3", "0"}[rng.IntN(4)]
	return []byte(ws() + obj(map[string]string{"jsonrpc": `"2.0"`, "id": id, "method": `"tools/call"`, "params": params}) + ws())
}

// mutate is plainjsontest.Mutate with the characters this parser decides on.
func mutate(rng *rand.Rand, b []byte) []byte {
	return plainjsontest.Mutate(rng, b, "{}[]\",:\\ nx0-.eE\x00\xff")
}

// FuzzFastParse: whenever fastParse accepts a body, encoding/json accepts it
// too and decodes the same envelope and params (the handler falls back to
// encoding/json otherwise, so its behaviour is that of encoding/json).
func FuzzFastParse(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add(randomRequest(rng))
	}
	f.Add([]byte(modernBody(1, "tools/call", urlCaps, map[string]any{"name": "connect_account", "arguments": map[string]any{"provider": "github"}})))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"x","params":{"name":"a","name":"b"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"x","params":{"inputResponses":{"a":{"action":"accept"},"b":{"action":"cancel"}}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		checkFastParse(t, body)
	})
}

// TestCapsMemo: the memo answers what a fresh decode does, and stays bounded.
func TestCapsMemo(t *testing.T) {
	var m bytesMemo[capsInfo]
	for i := range 3 * memoEntries {
		for _, raw := range []string{"{}", urlCaps, `{"elicitation":{}}`, `{"elicitation":5}`, `[]`, fmt.Sprintf(`{"experimental":{"k%d":{}}}`, i)} {
			if got, want := m.get([]byte(raw), capsFrom), capsFrom([]byte(raw)); got != want {
				t.Fatalf("%s: memo %+v, decode %+v", raw, got, want)
			}
		}
	}
	if len(m.m) > memoEntries {
		t.Fatalf("memo holds %d entries, bound %d", len(m.m), memoEntries)
	}
	// Full, it still learns: the last object asked for is remembered.
	if _, ok := m.m[fmt.Sprintf(`{"experimental":{"k%d":{}}}`, 3*memoEntries-1)]; !ok {
		t.Fatal("a full memo stopped learning")
	}
	if c := capsFrom([]byte(urlCaps)); !c.ok || !c.urlCapable || c.formCapable {
		t.Fatalf("url caps: %+v", c)
	}
	if c := capsFrom([]byte(`{"elicitation":{}}`)); !c.ok || c.urlCapable || !c.formCapable {
		t.Fatalf("empty elicitation: %+v", c)
	}
}
