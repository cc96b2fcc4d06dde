package mcpapi

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/provider/mcpup"
)

// TestGatewaySilentUpstream: an upstream that takes the connection and
// never answers (not even the session's opening, server/discover) gets
// the host the usual timeout answer within the entry's call_timeout (3 s
// here), in both eras: the session, the tool list the call needs first
// and the call itself share that time, so the answer comes before twice
// it (2.5 s of slack for a busy machine). server/discover and a
// 2025-11-25 initialize, which wait for the upstream's capabilities and
// instructions, answer within the same time with the broker's own.
func TestGatewaySilentUpstream(t *testing.T) {
	var requests atomic.Int64
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); silent.Close() })
	var hh *harness
	h := newHarnessExtra(t, func(h *harness, _ string) string {
		hh = h
		return `  silent:
    display_name: Silent
    type: mcp
    mcp: {url: ` + silent.URL + `/mcp, auth: none, call_timeout: 3s}
`
	}, func(o *Options) {
		o.Upstreams = mcpup.New(mcpup.Options{Tokens: hh.client.UpstreamTokens()}) // OpenTimeout a minute
	})
	bearer := h.iss.token(t, tokenSpec{sub: "alice", aud: publicURL + "/mcp/u/silent", exp: h.clock.Now().Add(time.Hour)})
	for i := range 2 {
		legacy := i%2 == 1
		hd := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + bearer, "MCP-Protocol-Version": versionModern, "Mcp-Method": "tools/call", "Mcp-Name": "anything"}
		body := modernBody(1, "tools/call", urlCaps, map[string]any{"name": "anything", "arguments": map[string]any{}})
		if legacy {
			hd["MCP-Protocol-Version"], hd["Mcp-Method"], hd["Mcp-Name"] = versionLegacy, "", ""
			body = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"anything","arguments":{}}}`
		}
		start := time.Now()
		d := decode(t, h.do(rawCall{path: "/mcp/u/silent", headers: hd, body: body}).body)
		took := time.Since(start)
		if isErr, _ := d.Result["isError"].(bool); !isErr || !strings.Contains(textOf(d), "Silent did not answer within 3 s") {
			t.Fatalf("call %d (legacy %v), after %v: %+v %+v, want the timeout answer", i+1, legacy, took, d.Result, d.Error)
		}
		if took > 5500*time.Millisecond {
			t.Fatalf("call %d answered after %v: the call's time was spent twice", i+1, took)
		}
	}
	if requests.Load() == 0 {
		t.Fatal("the silent upstream was never asked")
	}
	// server/discover and a 2025-11-25 initialize wait for the upstream's
	// session (its capabilities and instructions) within the same time,
	// and answer with the broker's own.
	for _, legacy := range []bool{false, true} {
		start := time.Now()
		var d decoded
		if legacy {
			d = decode(t, h.do(rawCall{path: "/mcp/u/silent", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"Authorization": "Bearer " + bearer, "MCP-Protocol-Version": versionLegacy},
				body: `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"h","version":"1"}}}`}).body)
		} else {
			d = decode(t, h.do(rawCall{path: "/mcp/u/silent", headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
				"Authorization": "Bearer " + bearer, "MCP-Protocol-Version": versionModern, "Mcp-Method": "server/discover"},
				body: modernBody(1, "server/discover", urlCaps, nil)}).body)
		}
		if took := time.Since(start); d.Error != nil || !strings.HasPrefix(fmt.Sprint(d.Result["instructions"]), "This is Silent through credbroker") || took > 5500*time.Millisecond {
			t.Fatalf("legacy %v: after %v: %+v %+v", legacy, took, d.Result, d.Error)
		}
	}
}
