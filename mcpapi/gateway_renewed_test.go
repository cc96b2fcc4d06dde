package mcpapi

import (
	"encoding/json"
	"net/http/httptest"
	"testing"

	"credbroker/connections"
	"credbroker/provider"
)

// TestGatewayRenewedByIdP: when the upstream's refusal was answered by a
// connection the organisation's IdP made with no browser step
// (connections.UpstreamRefused answering Ready, for an mcp.auth:
// enterprise entry), the placeholder's call says connected, naming the
// account, and any other call is a tool error asking the host to call
// again; neither is the internal error the door answered before, and the
// person's cached tool list is forgotten.
func TestGatewayRenewedByIdP(t *testing.T) {
	g, conn := connectedGateway(t, "tools")
	p, _ := g.conns.Providers().Lookup("up")
	key := toolsKey{principal: g.principal("alice"), conn: conn.ID, gen: toolsGeneration(conn), modern: true, provider: "up"}
	for _, c := range []struct{ tool, want string }{
		{placeholderTool, "Connected to Upstream as alice@up. Upstream's own tools are listed now: list the tools again to see them."},
		{"echo", "Upstream needed the connection renewed, which your organisation's identity provider just did. Nothing was done: call again."},
	} {
		if d := g.gwCall("alice", urlCaps, "tools/list", "", nil); len(toolNames(t, d)) < 2 {
			t.Fatalf("tools/list: %+v", d)
		}
		if _, ok := g.srv.gw.cachedToolsList(key); !ok {
			t.Fatal("the person's list is not cached")
		}
		call := &gwCall{id: json.RawMessage(`7`), principal: g.principal("alice"), p: p, up: p.Kind.(provider.Gateway).Upstream(),
			method: "tools/call", params: gwParams{Name: c.tool}, modern: true}
		w := httptest.NewRecorder()
		g.srv.gw.notReady(w, call, connections.Ready{Provider: p, Conn: conn}, nil)
		d := decode(t, w.Body.Bytes())
		if w.Code != 200 || d.Error != nil || textOf(d) != c.want || (d.Result["isError"] == true) == (c.tool == placeholderTool) {
			t.Fatalf("%s after a renewal: HTTP %d %+v %+v; want %q", c.tool, w.Code, d.Result, d.Error, c.want)
		}
		if _, ok := g.srv.gw.cachedToolsList(key); ok {
			t.Fatalf("%s after a renewal: the person's cached list is kept", c.tool)
		}
	}
}
