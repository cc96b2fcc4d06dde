package mcpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"credbroker/provider"
	"credbroker/vault"
)

// eraDriver drives one era's tools/call for the schema test: modern calls are
// stateless; legacy ones run in a session whose initialize declared url
// elicitation.
type eraDriver struct {
	name    string
	h       *harness
	session string
}

func (e *eraDriver) call(t *testing.T, tool string, args map[string]any, extra map[string]any) decoded {
	t.Helper()
	if e.name == versionModern {
		_, d := e.h.callTool("alice", urlCaps, tool, args, extra)
		return d
	}
	if e.session == "" {
		r := e.h.do(rawCall{headers: e.headers(""), body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize",
			"params": map[string]any{"protocolVersion": versionLegacy, "capabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
				"clientInfo": map[string]any{"name": "legacy-agent", "version": "1"}}})})
		if e.session = r.header.Get("Mcp-Session-Id"); e.session == "" {
			t.Fatalf("initialize: no session (%d %s)", r.status, r.body)
		}
	}
	r := e.h.do(rawCall{headers: e.headers(versionLegacy), body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})})
	return decode(t, r.body)
}

func (e *eraDriver) headers(version string) map[string]string {
	return map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Authorization": "Bearer " + e.h.bearer("alice"), "Mcp-Session-Id": e.session, "MCP-Protocol-Version": version}
}

// listTools returns the era's tools/list: each tool's output schema,
// compiled by a JSON Schema validator (formats asserted).
func (e *eraDriver) schemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	var d decoded
	if e.name == versionModern {
		r := e.h.do(rawCall{headers: e.h.modernHeaders("alice", "tools/list", ""), body: modernBody(1, "tools/list", urlCaps, nil)})
		d = decode(t, r.body)
	} else {
		e.call(t, toolList, map[string]any{}, nil) // opens the session
		r := e.h.do(rawCall{headers: e.headers(versionLegacy), body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": map[string]any{}})})
		d = decode(t, r.body)
	}
	tools, _ := d.Result["tools"].([]any)
	out := map[string]*jsonschema.Schema{}
	for _, raw := range tools {
		tool := raw.(map[string]any)
		name := tool["name"].(string)
		b, _ := json.Marshal(tool["outputSchema"])
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		url := "mem://" + name + ".json"
		if err := c.AddResource(url, doc); err != nil {
			t.Fatal(err)
		}
		if out[name], err = c.Compile(url); err != nil {
			t.Fatalf("%s's outputSchema does not compile: %v", name, err)
		}
	}
	if len(out) != 4 {
		t.Fatalf("tools/list named %d tools with schemas, want 4", len(out))
	}
	return out
}

// TestOutputSchemas: every structured result of every tool, in every
// outcome each era can produce, validates against the output schema
// tools/list declares for it (a JSON Schema validator, formats asserted).
func TestOutputSchemas(t *testing.T) {
	for _, name := range []string{versionModern, versionLegacy} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			e := &eraDriver{name: name, h: h}
			schemas := e.schemas(t)
			alice := h.principal("alice")
			seen := map[string]bool{}
			check := func(t *testing.T, tool, outcome string, d decoded) {
				t.Helper()
				sc, ok := d.Result["structuredContent"]
				if !ok {
					t.Fatalf("%s %s: no structuredContent: %+v", tool, outcome, d)
				}
				b, _ := json.Marshal(sc)
				inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				if err := schemas[tool].Validate(inst); err != nil {
					t.Errorf("%s %s: %s does not validate against its outputSchema: %v", tool, outcome, b, err)
				}
				if text := d.Result["content"].([]any)[0].(map[string]any)["text"].(string); !jsonEqual(text, string(b)) {
					t.Errorf("%s %s: text content %s is not the structured content %s", tool, outcome, text, b)
				}
				seen[tool] = true
			}
			gh := map[string]any{"provider": "github"}

			t.Run("list_connections: none", func(t *testing.T) { check(t, toolList, "none", e.call(t, toolList, map[string]any{}, nil)) })
			c := h.connect(alice, "github", "octocat", []string{"read:user"})
			t.Run("connect_account: connected, never used", func(t *testing.T) {
				check(t, toolConnect, "connected", e.call(t, toolConnect, gh, nil))
			})
			t.Run("provider_request: 200 text", func(t *testing.T) {
				check(t, toolRequest, "200", e.call(t, toolRequest, map[string]any{"provider": "github", "method": "GET", "path": "/user"}, nil))
			})
			t.Run("connect_account: connected, used", func(t *testing.T) {
				d := e.call(t, toolConnect, gh, nil)
				if !strings.Contains(fmt.Sprint(d.Result["structuredContent"]), "lastUsed") {
					t.Fatalf("no lastUsed after a call: %+v", d)
				}
				check(t, toolConnect, "connected", d)
			})
			// The person granted less than the connect request asked for.
			if _, err := h.store.UpdateConnectionMeta(t.Context(), c.ID, func(x vault.Connection) (vault.Connection, error) {
				x.Requested = []string{"read:user", "repo"}
				return x, nil
			}); err != nil {
				t.Fatal(err)
			}
			for _, tool := range []string{toolConnect, toolList} {
				t.Run(tool+": a scope not granted", func(t *testing.T) {
					args := gh
					if tool == toolList {
						args = map[string]any{}
					}
					d := e.call(t, tool, args, nil)
					if sc := fmt.Sprint(d.Result["structuredContent"]); !strings.Contains(sc, "notGranted:[repo]") || !strings.Contains(sc, "note:") {
						t.Fatalf("no notGranted: %+v", d)
					}
					check(t, tool, "not granted", d)
				})
			}
			echo := h.connect(alice, "echo", "echo-user", nil)
			t.Run("provider_request: 404 from the API", func(t *testing.T) {
				d := e.call(t, toolRequest, map[string]any{"provider": "echo", "method": "GET", "path": "/nothing-here"}, nil)
				if d.Result["isError"] != true {
					t.Fatalf("want isError: %+v", d)
				}
				check(t, toolRequest, "404", d)
			})
			t.Run("provider_request: decoded answer", func(t *testing.T) {
				check(t, toolRequest, "gzip", e.call(t, toolRequest, map[string]any{"provider": "echo", "method": "GET", "path": "/echo/gzip"}, nil))
			})
			h.api.kill(c.ID)
			if _, err := h.client.Do(t.Context(), c.ID, provider.APIRequest{Method: "GET", Path: "/user"}); err == nil {
				t.Fatal("a killed connection still works")
			}
			t.Run("list_connections: active and needs_reconnect", func(t *testing.T) {
				d := e.call(t, toolList, map[string]any{}, nil)
				if !strings.Contains(fmt.Sprint(d.Result["structuredContent"]), "needs_reconnect") {
					t.Fatalf("no needs_reconnect connection listed: %+v", d)
				}
				check(t, toolList, "several", d)
			})
			t.Run("disconnect_account: revoked", func(t *testing.T) {
				check(t, toolDisconnect, "revoked", e.call(t, toolDisconnect, gh, nil))
			})
			t.Run("disconnect_account: not supported", func(t *testing.T) {
				check(t, toolDisconnect, "not_supported", e.call(t, toolDisconnect, map[string]any{"provider": "echo", "account": echo.AccountLogin}, nil))
			})
			t.Run("disconnect_account: not confirmed", func(t *testing.T) {
				h.connect(alice, "github", "octocat", nil)
				h.api.mu.Lock()
				h.api.revokeErr = true
				h.api.mu.Unlock()
				defer func() { h.api.mu.Lock(); h.api.revokeErr = false; h.api.mu.Unlock() }()
				check(t, toolDisconnect, "not_confirmed", e.call(t, toolDisconnect, gh, nil))
			})
			if name == versionModern {
				// Only a 2026-07-28 client relays the person's answer.
				for _, action := range []string{"decline", "cancel"} {
					t.Run("connect_account: "+action, func(t *testing.T) {
						_, d := h.callTool("alice", urlCaps, toolConnect, gh, nil)
						key, _, state := elicitation(t, d)
						_, d = h.callTool("alice", urlCaps, toolConnect, gh, map[string]any{"requestState": state,
							"inputResponses": map[string]any{key: map[string]any{"action": action}}})
						check(t, toolConnect, action, d)
					})
				}
			}
			for tool := range schemas {
				if !seen[tool] {
					t.Errorf("no structured result of %s was checked", tool)
				}
			}
		})
	}
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
