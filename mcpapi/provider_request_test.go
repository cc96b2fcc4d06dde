package mcpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"credbroker/internal/echoapi"
	"credbroker/vault"
)

func TestProviderRequestFlows(t *testing.T) {
	h := newHarness(t)
	api := h.api
	alice := h.principal("alice")
	args := map[string]any{"provider": "github", "method": "GET", "path": "/user"}

	t.Run("bad path refused before connecting", func(t *testing.T) {
		_, d := h.callTool("alice", urlCaps, toolRequest, map[string]any{"provider": "github", "method": "GET", "path": "/%2e%2e/x"}, nil)
		if d.Result["isError"] != true {
			t.Fatalf("got %+v", d)
		}
	})
	t.Run("not connected, connect, then the request runs", func(t *testing.T) {
		_, d := h.callTool("alice", urlCaps, toolRequest, args, nil)
		key, link, state := elicitation(t, d)
		conn := h.completeGrant(grantIDOf(t, link), alice, "alice-gh")
		_, d = h.callTool("alice", urlCaps, toolRequest, args, map[string]any{"requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		sc, _ := d.Result["structuredContent"].(map[string]any)
		if sc == nil || sc["status"] != float64(200) || sc["body"] != `{"path":"/user"}` || sc["body_encoding"] != "text" {
			t.Fatalf("got %+v", d)
		}
		if api.lastUsed() != conn.ID {
			t.Fatalf("used %v, want %s", api.used, conn.ID)
		}
		// The provider kills the tokens: 401, then invalid_grant on the
		// refresh → needs_reconnect → url elicitation saying
		// revoked/expired → reconnect → same id.
		api.kill(conn.ID)
		_, d = h.callTool("alice", urlCaps, toolRequest, args, nil)
		key, link, state = elicitation(t, d)
		msg := d.Result["inputRequests"].(map[string]any)[key].(map[string]any)["params"].(map[string]any)["message"].(string)
		if !strings.Contains(msg, "revoked or has expired") {
			t.Errorf("message %q does not say revoked/expired", msg)
		}
		if again := h.reconnect(grantIDOf(t, link), conn); again.ID != conn.ID {
			t.Fatalf("reconnect stored %s, want %s", again.ID, conn.ID)
		}
		_, d = h.callTool("alice", urlCaps, toolRequest, args, map[string]any{"requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		if d.Result["isError"] == true || api.lastUsed() != conn.ID {
			t.Fatalf("after reconnect: %+v used %v", d, api.used)
		}
	})
	t.Run("host names one of the provider's API hosts", func(t *testing.T) {
		apiHost := strings.TrimPrefix(api.srv.URL, "http://")
		with := map[string]any{"provider": "github", "method": "GET", "path": "/user", "host": apiHost}
		if _, d := h.callTool("alice", urlCaps, toolRequest, with, nil); structured(t, d)["status"] != float64(200) {
			t.Fatalf("the API's own host: %+v", d)
		}
		with["host"] = "evil.example"
		_, d := h.callTool("alice", urlCaps, toolRequest, with, nil)
		text := d.Result["content"].([]any)[0].(map[string]any)["text"].(string)
		if d.Result["isError"] != true || !strings.Contains(text, "is not one of github's API hosts") {
			t.Fatalf("another host: %+v", d)
		}
	})
	t.Run("several accounts: form elicitation, then the chosen one", func(t *testing.T) {
		second := h.connect(alice, "github", "alice-work", []string{"read:user"})
		_, d := h.callTool("alice", `{"elicitation":{"form":{},"url":{}}}`, toolRequest, args, nil)
		irs, _ := d.Result["inputRequests"].(map[string]any)
		form, _ := irs[chooseAccountKey].(map[string]any)
		if form == nil || form["params"].(map[string]any)["mode"] != "form" {
			t.Fatalf("want a form elicitation, got %+v", d)
		}
		schema, _ := json.Marshal(form["params"].(map[string]any)["requestedSchema"])
		if !strings.Contains(string(schema), `"enum":["alice-gh","alice-work"]`) {
			t.Errorf("schema %s", schema)
		}
		_, d = h.callTool("alice", `{"elicitation":{"form":{},"url":{}}}`, toolRequest, args, map[string]any{
			"requestState":   d.Result["requestState"],
			"inputResponses": map[string]any{chooseAccountKey: map[string]any{"action": "accept", "content": map[string]any{"account": "alice-work"}}}})
		if d.Result["isError"] == true || api.lastUsed() != second.ID {
			t.Fatalf("chosen account not used: %+v %v", d, api.used)
		}
		// Without form capability: a tool error listing the accounts.
		_, d = h.callTool("alice", urlCaps, toolRequest, args, nil)
		text, _ := json.Marshal(d.Result)
		if d.Result["isError"] != true || !strings.Contains(string(text), "alice-gh, alice-work") {
			t.Fatalf("got %s", text)
		}
	})
	t.Run("named account needs reconnecting; the browser connects another: refused", func(t *testing.T) {
		// alice-work needs reconnecting; alice-gh stays active.
		var work vault.Connection
		conns, _ := h.store.ListConnections(context.Background(), alice)
		for _, c := range conns {
			if c.AccountLogin == "alice-work" {
				work = c
			}
		}
		if _, err := h.store.UpdateConnection(context.Background(), work.ID, func(c vault.Connection) (vault.Connection, error) {
			c.Status = vault.StatusNeedsReconnect
			return c, nil
		}); err != nil {
			t.Fatal(err)
		}
		named := map[string]any{"provider": "github", "method": "DELETE", "path": "/repos/x/y", "account": "alice-work"}
		_, d := h.callTool("alice", urlCaps, toolRequest, named, nil)
		key, link, state := elicitation(t, d)
		// In the browser alice signs in to a third account, not alice-work.
		h.completeGrant(grantIDOf(t, link), alice, "alice-other")
		before := api.calls()
		_, d = h.callTool("alice", urlCaps, toolRequest, named, map[string]any{"requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		text, _ := json.Marshal(d.Result)
		if d.Result["isError"] != true || !strings.Contains(string(text), "still not connected") {
			t.Fatalf("want a refusal, got %s", text)
		}
		if api.calls() != before {
			t.Fatalf("the request ran as another account: %v", api.used[before:])
		}
	})
	if strings.Contains(h.logs.String(), providerSecret) {
		t.Error("token in logs")
	}
}

// TestProviderRequestRedactsEncodedEchoes: an API that reflects the token
// base64-encoded (alone, as "Bearer <token>", buried in a longer base64
// text at any offset), hex-encoded, or compressed without being asked
// never hands any form of it back; an encoding the broker cannot undo is
// refused.
func TestProviderRequestRedactsEncodedEchoes(t *testing.T) {
	h := newHarness(t)
	c := h.connect(h.principal("alice"), "echo", "echo-user", nil)
	token := providerSecret + "-" + c.ID
	for _, form := range echoapi.Forms {
		t.Run(form, func(t *testing.T) {
			_, d := h.callTool("alice", "{}", toolRequest, map[string]any{"provider": "echo", "method": "GET", "path": "/echo/" + form}, nil)
			raw, _ := json.Marshal(d)
			sc, _ := d.Result["structuredContent"].(map[string]any)
			if sc == nil || sc["status"] != float64(200) {
				t.Fatalf("got %s", raw)
			}
			if leaks := echoapi.Leaks(string(raw), token); len(leaks) > 0 {
				t.Fatalf("the token came back as %v: %s", leaks, raw)
			}
			if !strings.Contains(fmt.Sprint(sc["body"]), "REDACTED") {
				t.Fatalf("nothing was redacted: %s", raw)
			}
			if compressed := form == "gzip" || form == "deflate" || form == "raw-deflate"; compressed != (sc["decoded"] != nil) {
				t.Fatalf("decoded = %v for %s", sc["decoded"], form)
			}
		})
	}
	for _, form := range echoapi.Refused {
		_, d := h.callTool("alice", "{}", toolRequest, map[string]any{"provider": "echo", "method": "GET", "path": "/echo/" + form}, nil)
		raw, _ := json.Marshal(d)
		if d.Result["isError"] != true || !strings.Contains(string(raw), "cannot check for secrets") || strings.Contains(string(raw), token) {
			t.Fatalf("%s: want a refusal naming why, got %s", form, raw)
		}
	}
}
