package mcpapi

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"credbroker/binding"
	"credbroker/internal/requeststate"
	"credbroker/vault"
)

func structured(t *testing.T, d decoded) map[string]any {
	t.Helper()
	if d.Error != nil {
		t.Fatalf("want a result, got error %d %s", d.Error.Code, d.Error.Message)
	}
	if d.Result["resultType"] != "complete" {
		t.Fatalf("want resultType complete, got %v", d.Result)
	}
	sc, _ := d.Result["structuredContent"].(map[string]any)
	return sc
}

func TestConnectRetryOutcomes(t *testing.T) {
	args := map[string]any{"provider": "github"}
	tests := []struct {
		name string
		// between the first answer and the retry
		browser   func(h *harness, grantID string)
		responses func(key string) map[string]any
		check     func(t *testing.T, h *harness, grantID, url string, r rawResult, d decoded)
	}{
		{
			name:    "completed",
			browser: func(h *harness, id string) { h.completeGrant(id, h.principal("alice"), "octocat") },
			responses: func(key string) map[string]any {
				return map[string]any{key: map[string]any{"action": "accept"}}
			},
			check: func(t *testing.T, h *harness, id, url string, r rawResult, d decoded) {
				sc := structured(t, d)
				conn := sc["connection"].(map[string]any)
				if sc["status"] != "connected" || conn["account"] != "octocat" || conn["provider"] != "github" {
					t.Fatalf("got %v", sc)
				}
			},
		},
		{
			name: "accepted but not finished",
			responses: func(key string) map[string]any {
				return map[string]any{key: map[string]any{"action": "accept"}}
			},
			check: func(t *testing.T, h *harness, id, url string, r rawResult, d decoded) {
				_, url2, state := elicitation(t, d)
				if url2 != url || state == "" {
					t.Fatalf("want the same URL %s and a fresh state, got %s", url, url2)
				}
				msg := d.Result["inputRequests"].(map[string]any)["connect_github"].(map[string]any)["params"].(map[string]any)["message"].(string)
				if !strings.Contains(msg, "Finish connecting") || !strings.Contains(msg, "retry") {
					t.Fatalf("message %q does not say to finish in the browser and retry", msg)
				}
			},
		},
		{
			name: "declined",
			responses: func(key string) map[string]any {
				return map[string]any{key: map[string]any{"action": "decline"}}
			},
			check: func(t *testing.T, h *harness, id, url string, r rawResult, d decoded) {
				sc := structured(t, d)
				if sc["status"] != "declined" || d.Result["isError"] == true {
					t.Fatalf("got %v", d.Result)
				}
				g, _ := h.grants.Lookup(context.Background(), id)
				if g.State != vault.GrantDenied {
					t.Fatalf("grant state %s, want denied", g.State)
				}
			},
		},
		{
			name: "cancelled",
			responses: func(key string) map[string]any {
				return map[string]any{key: map[string]any{"action": "cancel"}}
			},
			check: func(t *testing.T, h *harness, id, url string, r rawResult, d decoded) {
				sc := structured(t, d)
				if sc["status"] != "cancelled" || !strings.Contains(sc["message"].(string), "Nothing was connected") {
					t.Fatalf("got %v", sc)
				}
				g, err := h.grants.Lookup(context.Background(), id)
				if err != nil || g.State != vault.GrantPending {
					t.Fatalf("grant should stay usable: %v %v", g.State, err)
				}
			},
		},
		{
			name:      "no responses",
			responses: func(string) map[string]any { return nil },
			check: func(t *testing.T, h *harness, id, url string, r rawResult, d decoded) {
				_, url2, _ := elicitation(t, d)
				if url2 != url {
					t.Fatalf("want the same URL")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			_, d := h.callTool("alice", urlCaps, "connect_account", args, nil)
			key, url, state := elicitation(t, d)
			if key != "connect_github" {
				t.Fatalf("key %q", key)
			}
			id := grantIDOf(t, url)
			if tt.browser != nil {
				tt.browser(h, id)
			}
			extra := map[string]any{"requestState": state}
			if resp := tt.responses(key); resp != nil {
				extra["inputResponses"] = resp
			}
			r, d := h.callTool("alice", urlCaps, "connect_account", args, extra)
			tt.check(t, h, id, url, r, d)
		})
	}
}

func TestConnectRoundsAreBounded(t *testing.T) {
	h := newHarness(t) // MaxRounds 3
	args := map[string]any{"provider": "github"}
	_, d := h.callTool("alice", urlCaps, "connect_account", args, nil)
	for i := 0; ; i++ {
		_, _, state := elicitation(t, d)
		_, d = h.callTool("alice", urlCaps, "connect_account", args, map[string]any{"requestState": state,
			"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}})
		if d.Result["resultType"] == "complete" {
			if d.Result["isError"] != true || !strings.Contains(d.Result["content"].([]any)[0].(map[string]any)["text"].(string), "start over") {
				t.Fatalf("want a tool error asking to start over, got %v", d.Result)
			}
			if i != 3 {
				t.Fatalf("gave up after %d rounds, want 3", i)
			}
			return
		}
		if i > 5 {
			t.Fatal("rounds are not bounded")
		}
	}
}

func TestAlreadyConnected(t *testing.T) {
	h := newHarness(t)
	h.connect(h.principal("alice"), "github", "octocat", []string{"read:user", "repo"})
	_, d := h.callTool("alice", "{}", "connect_account", map[string]any{"provider": "github", "scopes": []string{"repo"}}, nil)
	if sc := structured(t, d); sc["status"] != "connected" {
		t.Fatalf("got %v", sc)
	}
	// needs_reconnect → asks again.
	h.store.UpdateConnection(context.Background(), "conn-1", func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	})
	_, d = h.callTool("alice", urlCaps, "connect_account", map[string]any{"provider": "github"}, nil)
	_, _, _ = elicitation(t, d)
	msg := d.Result["inputRequests"].(map[string]any)["connect_github"].(map[string]any)["params"].(map[string]any)["message"].(string)
	if !strings.Contains(msg, "reconnected") {
		t.Fatalf("message %q does not say why", msg)
	}
}

func TestToolErrors(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		tool string
		args map[string]any
		want []string
	}{
		{"connect_account", map[string]any{"provider": "gitlab"}, []string{`Unknown provider "gitlab"`, "github, google"}},
		{"connect_account", map[string]any{"provider": "github", "scopes": []string{"admin:org"}}, []string{`"admin:org"`, "read:user, repo"}},
		{"connect_account", map[string]any{"provider": "github", "extra": 1}, []string{`unknown argument "extra"`}},
		{"connect_account", map[string]any{"provider": 5}, []string{`"provider" has the wrong type`}},
		{"disconnect_account", map[string]any{"provider": "github"}, []string{"No GitHub account is connected"}},
		{"disconnect_account", map[string]any{"provider": "nope"}, []string{"Unknown provider"}},
	}
	for _, tt := range tests {
		t.Run(tt.tool+"/"+strings.Join(tt.want, ","), func(t *testing.T) {
			_, d := h.callTool("alice", urlCaps, tt.tool, tt.args, nil)
			if d.Error != nil || d.Result["isError"] != true {
				t.Fatalf("want a tool error, got %+v", d)
			}
			text := d.Result["content"].([]any)[0].(map[string]any)["text"].(string)
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q lacks %q", text, w)
				}
			}
		})
	}
}

func TestRateLimitedGrantGivesNoURL(t *testing.T) {
	h := newHarness(t)
	h.setGrants(binding.Options{Now: h.clock.Now, MaxPending: 1})
	_, d := h.callTool("alice", urlCaps, "connect_account", map[string]any{"provider": "github"}, nil)
	elicitation(t, d)
	r, d := h.callTool("alice", urlCaps, "connect_account", map[string]any{"provider": "google"}, nil)
	if d.Result["isError"] != true || strings.Contains(string(r.body), "/connect/") {
		t.Fatalf("want a tool error without URL, got %s", r.body)
	}
}

func TestDisconnect(t *testing.T) {
	for _, tt := range []struct {
		name      string
		provider  string
		revokeErr bool
		want      string
	}{
		{"revoked", "github", false, "revoked"},
		{"revocation not confirmed", "github", true, "not_confirmed"},
		{"no revocation configured", "google", false, "not_supported"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.api.revokeErr = tt.revokeErr
			c := h.connect(h.principal("alice"), tt.provider, "octocat", []string{"repo"})
			_, d := h.callTool("alice", "{}", "disconnect_account", map[string]any{"provider": tt.provider}, nil)
			sc := structured(t, d)
			if sc["revocation"] != tt.want || sc["deleted"] != true {
				t.Fatalf("got %v", sc)
			}
			if _, err := h.store.GetConnection(context.Background(), c.ID); !errors.Is(err, vault.ErrNotFound) {
				t.Fatalf("connection still stored: %v", err)
			}
			h.api.mu.Lock()
			revoked := slices.Clone(h.api.revoked)
			h.api.mu.Unlock()
			if sent := slices.Contains(revoked, refreshSecret+"-"+c.ID); sent != (tt.want == "revoked") {
				t.Fatalf("revocation requests %v", revoked)
			}
		})
	}
	t.Run("other principal's connection is not found", func(t *testing.T) {
		h := newHarness(t)
		h.connect(h.principal("bob"), "github", "bobcat", []string{"repo"})
		_, d := h.callTool("alice", "{}", "disconnect_account", map[string]any{"provider": "github"}, nil)
		if d.Result["isError"] != true {
			t.Fatalf("alice disconnected bob: %v", d.Result)
		}
		if cs, _ := h.store.ListConnections(context.Background(), h.principal("bob")); len(cs) != 1 {
			t.Fatal("bob's connection was deleted")
		}
	})
}

func TestRequestStateRejected(t *testing.T) {
	args := map[string]any{"provider": "github"}
	tests := []struct {
		name   string
		sub    string
		tool   string
		args   map[string]any
		mangle func(h *harness, s string) string
	}{
		{"tampered", "alice", "connect_account", args, func(h *harness, s string) string {
			b := []byte(s)
			b[len(b)/2] ^= 1
			if b[len(b)/2] == s[len(s)/2] {
				b[len(b)/2]++
			}
			return string(b)
		}},
		{"truncated", "alice", "connect_account", args, func(h *harness, s string) string { return s[:len(s)-4] }},
		{"garbage", "alice", "connect_account", args, func(h *harness, s string) string { return "not-a-state" }},
		{"other principal", "mallory", "connect_account", args, nil},
		{"other arguments", "alice", "connect_account", map[string]any{"provider": "github", "scopes": []string{"repo"}}, nil},
		{"other tool", "alice", "list_connections", map[string]any{}, nil},
		{"expired", "alice", "connect_account", args, func(h *harness, s string) string { h.clock.Advance(11 * time.Minute); return s }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			// list_connections ignores requestState: make the tool-bound check observable via connect.
			_, d := h.callTool("alice", urlCaps, "connect_account", args, nil)
			_, _, state := elicitation(t, d)
			if tt.mangle != nil {
				state = tt.mangle(h, state)
			}
			tool := tt.tool
			if tool == "list_connections" {
				// A state issued for connect_account replayed on a different
				// tool: sealed tool name differs → rejected by openState.
				_, err := requeststate.Open(h.srv.opts.StateKeys, state, h.principal("alice"), tool, mustDigest(t, nil), h.clock.Now())
				if !errors.Is(err, requeststate.ErrInvalid) {
					t.Fatalf("cross-tool state opened: %v", err)
				}
				return
			}
			r, d := h.callTool(tt.sub, urlCaps, tool, tt.args, map[string]any{"requestState": state,
				"inputResponses": map[string]any{"connect_github": map[string]any{"action": "accept"}}})
			if d.Error == nil || d.Error.Code != -32602 || d.Error.Message != "Invalid or expired requestState" || r.status != 400 {
				t.Fatalf("want -32602 Invalid or expired requestState, got %d %s", r.status, r.body)
			}
		})
	}
}

func mustDigest(t *testing.T, raw json.RawMessage) []byte {
	d, err := requeststate.Digest(raw)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestArgDigestIsCanonical(t *testing.T) {
	a := mustDigest(t, json.RawMessage(`{"provider":"github","scopes":["repo"]}`))
	b := mustDigest(t, json.RawMessage(` { "scopes" : [ "repo" ] , "provider" : "github" } `))
	c := mustDigest(t, json.RawMessage(`{"provider":"github","scopes":["read:user"]}`))
	if string(a) != string(b) || string(a) == string(c) {
		t.Fatal("digest is not canonical")
	}
	if string(mustDigest(t, nil)) != string(mustDigest(t, json.RawMessage(`{}`))) {
		t.Fatal("absent and empty arguments differ")
	}
}

func TestNoURLElicitationWithoutCapability(t *testing.T) {
	for _, caps := range []string{`{}`, `{"elicitation":{}}`, `{"elicitation":{"form":{}}}`} {
		t.Run(caps, func(t *testing.T) {
			h := newHarness(t)
			r, d := h.callTool("alice", caps, "connect_account", map[string]any{"provider": "github"}, nil)
			if r.status != 400 || d.Error == nil || d.Error.Code != -32021 {
				t.Fatalf("want 400 -32021, got %d %s", r.status, r.body)
			}
			var data map[string]any
			json.Unmarshal(d.Error.Data, &data)
			if b, _ := json.Marshal(data["requiredCapabilities"]); string(b) != urlCaps {
				t.Fatalf("requiredCapabilities = %s", b)
			}
			if strings.Contains(string(r.body), "/connect/") {
				t.Fatal("a URL was sent")
			}
			if created, _, _ := h.store.CountGrants(context.Background(), h.principal("alice"), epoch.Add(-time.Hour), h.clock.Now()); created != 0 {
				t.Fatal("a grant was created")
			}
		})
	}
}

func TestConnectURLCarriesNothingPersonal(t *testing.T) {
	h := newHarness(t)
	_, d := h.callTool("alice", urlCaps, "connect_account", map[string]any{"provider": "github"}, nil)
	_, url, _ := elicitation(t, d)
	id := grantIDOf(t, url)
	if url != publicURL+"/connect/"+id {
		t.Fatalf("URL %q has more than the grant id", url)
	}
	for _, bad := range []string{"alice", h.iss.srv.URL, "127.0.0.1", "?", "#", "token"} {
		if strings.Contains(strings.TrimPrefix(url, publicURL), bad) {
			t.Errorf("URL %q contains %q", url, bad)
		}
	}
}

// TestLegacyRetryReusesTheLink: a 2025-11-25 client retries the whole
// call while the person is still in the browser; it gets the same link
// (the same grant) back, not a new one, until the grant is used, and a
// different client or scope set still gets its own.
func TestLegacyRetryReusesTheLink(t *testing.T) {
	h := newHarness(t)
	alice := h.principal("alice")
	var session string
	initialize := func(client string) {
		r := h.do(rawCall{headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + h.bearer("alice")},
			body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
				"protocolVersion": versionLegacy, "capabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
				"clientInfo": map[string]any{"name": client, "version": "1"}}})})
		if session = r.header.Get("Mcp-Session-Id"); session == "" {
			t.Fatal("no session id")
		}
	}
	call := func(args map[string]any) string {
		t.Helper()
		r := h.do(rawCall{headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
			"Authorization": "Bearer " + h.bearer("alice"), "Mcp-Session-Id": session, "MCP-Protocol-Version": versionLegacy},
			body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{"name": "connect_account", "arguments": args}})})
		var d struct {
			Error *struct {
				Code int `json:"code"`
				Data struct {
					Elicitations []struct {
						URL string `json:"url"`
					} `json:"elicitations"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.Unmarshal(r.body, &d); err != nil || d.Error == nil || d.Error.Code != -32042 || len(d.Error.Data.Elicitations) != 1 {
			t.Fatalf("want -32042 with one elicitation, got %s", r.body)
		}
		return d.Error.Data.Elicitations[0].URL
	}
	initialize("legacy-agent")
	gh := map[string]any{"provider": "github"}
	first := call(gh)
	for range 3 {
		if again := call(gh); again != first {
			t.Fatalf("retry got a new link %s, want %s", again, first)
		}
	}
	if other := call(map[string]any{"provider": "github", "scopes": []string{"read:user", "repo"}}); other == first {
		t.Fatal("other scopes reused the link")
	}
	if created, _, _ := h.store.CountGrants(t.Context(), alice, epoch.Add(-time.Hour), h.clock.Now()); created != 2 {
		t.Fatalf("%d grants created, want 2 (one per scope set)", created)
	}
	initialize("another-agent")
	if other := call(gh); other == first {
		t.Fatal("another client reused the link")
	}
	// Once the link was used, the next call is a new request.
	initialize("legacy-agent")
	h.completeGrant(grantIDOf(t, first), alice, "octocat")
	h.store.DeleteConnection(t.Context(), h.mustOnlyConnection(alice).ID)
	if next := call(gh); next == first {
		t.Fatal("a completed request's link was handed out again")
	}
}

// mustOnlyConnection returns p's one connection.
func (h *harness) mustOnlyConnection(p vault.Principal) vault.Connection {
	h.t.Helper()
	cs, err := h.store.ListConnections(context.Background(), p)
	if err != nil || len(cs) != 1 {
		h.t.Fatalf("%d connections, %v; want one", len(cs), err)
	}
	return cs[0]
}

// TestLongClientNameStillConnects: a client name longer than the stored
// limit, or not valid UTF-8, is clipped to valid text; the connect
// request is created (not refused as an unstorable record).
func TestLongClientNameStillConnects(t *testing.T) {
	h := newHarness(t)
	for _, name := range []string{strings.Repeat("€", 120), "a" + strings.Repeat("é", 120)} {
		hd := h.modernHeaders("alice", "tools/call", "connect_account")
		body := strings.Replace(modernBody(1, "tools/call", urlCaps, map[string]any{"name": "connect_account",
			"arguments": map[string]any{"provider": "github"}}), `"name":"test-agent"`, `"name":`+jsonBody(name), 1)
		r := h.do(rawCall{headers: hd, body: body})
		_, link, _ := elicitation(t, decode(t, r.body))
		g, err := h.grants.Lookup(context.Background(), grantIDOf(t, link))
		if err != nil || !utf8.ValidString(g.ClientName) || utf8.RuneCountInString(g.ClientName) > 101 {
			t.Fatalf("grant client name %q, %v", g.ClientName, err)
		}
	}
}
