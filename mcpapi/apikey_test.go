package mcpapi

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"credbroker/internal/echoapi"
	"credbroker/provider"
	"credbroker/vault"
)

// keyProviders are the API-key services of the key tests: the test
// provider's key service and the echo API taking a key.
func keyProviders(h *harness, echoURL string) string {
	return `  keys:
    display_name: Keys
    type: api_key
    instructions: Create a key in your Keys settings.
    instructions_url: https://keys.example/settings/keys
    fields: [{name: api_key, label: API key, secret: true, pattern: 'mk_[A-Za-z0-9_-]+'}]
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /login}
    api: {base_url: ` + h.api.srv.URL + `/keysapi}
  echokeys:
    display_name: Echo keys
    type: api_key
    instructions: Any key.
    instructions_url: https://keys.example/settings/keys
    fields: [{name: api_key, label: API key, secret: true}]
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {path: /echo/raw, account_id: /you_sent}
    api: {base_url: ` + echoURL + `}
`
}

func (h *harness) keyOf(login string) string { return keySecret + "-" + login }

// saveKey completes grant id with login's key, verified at the test key
// service, as the broker's key entry page would.
func (h *harness) saveKey(id string, p vault.Principal, login string) vault.Connection {
	h.t.Helper()
	ctx := context.Background()
	g, err := h.grants.Authorize(ctx, id, p)
	if err != nil {
		h.t.Fatal(err)
	}
	pr, _ := h.conns.Providers().Lookup(g.Provider)
	ex, err := h.client.VerifyKey(ctx, pr, map[string]string{"api_key": h.keyOf(login)})
	if err != nil {
		h.t.Fatalf("VerifyKey: %v", err)
	}
	c, err := h.conns.Save(ctx, p, g, pr, ex)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

func inputMessage(t *testing.T, d decoded, key string) map[string]any {
	t.Helper()
	ir, _ := d.Result["inputRequests"].(map[string]any)[key].(map[string]any)
	if ir == nil {
		t.Fatalf("no input request %s in %+v", key, d.Result)
	}
	return ir["params"].(map[string]any)
}

// TestKeyConnectIsNeverFormMode: an API key is asked for in url mode
// only, whatever the client supports: a client offering both modes gets a
// url elicitation, and one offering form mode only gets -32021 naming
// elicitation.url, never a form asking for the key.
func TestKeyConnectIsNeverFormMode(t *testing.T) {
	h := newHarnessExtra(t, keyProviders)
	args := map[string]any{"provider": "keys"}
	for _, caps := range []string{`{"elicitation":{"form":{},"url":{}}}`, urlCaps} {
		_, d := h.callTool("alice", caps, toolConnect, args, nil)
		key, url, _ := elicitation(t, d) // fails unless it is url mode
		params := inputMessage(t, d, key)
		if params["requestedSchema"] != nil || key != "connect_keys" {
			t.Fatalf("caps %s: %v", caps, params)
		}
		if msg := params["message"].(string); !strings.Contains(msg, "enter your Keys key there (never into this app)") {
			t.Errorf("message %q", msg)
		}
		grantIDOf(t, url)
	}
	for _, caps := range []string{`{"elicitation":{"form":{}}}`, `{"elicitation":{}}`, `{}`} {
		_, d := h.callTool("alice", caps, toolConnect, args, nil)
		if d.Error == nil || d.Error.Code != codeMissingCapability || !strings.Contains(string(d.Error.Data), `"url"`) {
			t.Fatalf("caps %s: want -32021 naming elicitation.url, got %+v", caps, d)
		}
	}
	// provider_request asks the same way.
	_, d := h.callTool("alice", `{"elicitation":{"form":{},"url":{}}}`, toolRequest, map[string]any{"provider": "keys", "method": "GET", "path": "/me"}, nil)
	elicitation(t, d)
	// A key has no scopes.
	_, d = h.callTool("alice", urlCaps, toolConnect, map[string]any{"provider": "keys", "scopes": []string{"read"}}, nil)
	if text, _ := json.Marshal(d.Result); d.Result["isError"] != true || !strings.Contains(string(text), "uses an API key, which has no scopes") {
		t.Fatalf("scopes for a key: %s", text)
	}
}

// TestKeyFlowOverMCP: connect with a key (the retry completes),
// provider_request with the key injected, a 401 marks the connection
// needs_reconnect and re-elicits ("your key was rejected; enter a new
// one"), a new key for the same account completes the retry on the same
// connection, list shows no key, disconnect says where to revoke it.
// Neither results nor logs carry a key.
func TestKeyFlowOverMCP(t *testing.T) {
	h := newHarnessExtra(t, keyProviders)
	alice := h.principal("alice")
	var transcript strings.Builder
	call := func(tool string, args, extra map[string]any) decoded {
		r, d := h.callTool("alice", urlCaps, tool, args, extra)
		transcript.Write(r.body)
		return d
	}
	connectArgs := map[string]any{"provider": "keys"}
	d := call(toolConnect, connectArgs, nil)
	key, link, state := elicitation(t, d)
	conn := h.saveKey(grantIDOf(t, link), alice, "alice-k")
	d = call(toolConnect, connectArgs, map[string]any{"requestState": state, "inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	sc := structured(t, d)
	if sc["status"] != "connected" || sc["connection"].(map[string]any)["account"] != "alice-k" ||
		len(sc["connection"].(map[string]any)["scopes"].([]any)) != 0 {
		t.Fatalf("retry: %v", sc)
	}

	reqArgs := map[string]any{"provider": "keys", "method": "GET", "path": "/me"}
	d = call(toolRequest, reqArgs, nil)
	sc = structured(t, d)
	if sc["status"] != float64(200) || !strings.Contains(sc["body"].(string), `"login":"alice-k"`) || h.api.lastUsed() != "key:alice-k" {
		t.Fatalf("provider_request: %v", sc)
	}

	// The key is revoked at the provider.
	h.api.kill("key:alice-k")
	d = call(toolRequest, reqArgs, nil)
	key, link, state = elicitation(t, d)
	if msg := inputMessage(t, d, key)["message"].(string); !strings.Contains(msg, "Your Keys key was rejected; enter a new one") {
		t.Fatalf("re-elicitation message %q", msg)
	}
	if c, _ := h.store.GetConnection(context.Background(), conn.ID); c.Status != vault.StatusNeedsReconnect {
		t.Fatalf("status %s after a 401", c.Status)
	}
	// The next call, too, asks for a new key without sending the old one.
	used := h.api.calls()
	_, d2 := h.callTool("alice", urlCaps, toolRequest, reqArgs, nil)
	if _, _, _ = elicitation(t, d2); h.api.calls() != used {
		t.Fatal("a rejected key was sent again")
	}
	// alice enters a new key for the same account: same connection.
	h.api.mu.Lock()
	delete(h.api.dead, "key:alice-k")
	h.api.mu.Unlock()
	again := h.saveKey(grantIDOf(t, link), alice, "alice-k")
	if again.ID != conn.ID {
		t.Fatalf("a new key made connection %s, want %s", again.ID, conn.ID)
	}
	d = call(toolRequest, reqArgs, map[string]any{"requestState": state, "inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	if sc = structured(t, d); sc["status"] != float64(200) {
		t.Fatalf("after a new key: %v", sc)
	}

	d = call(toolList, map[string]any{}, nil)
	list, _ := json.Marshal(structured(t, d))
	if !strings.Contains(string(list), `"account":"alice-k"`) || !strings.Contains(string(list), `"status":"active"`) {
		t.Fatalf("list: %s", list)
	}
	d = call(toolDisconnect, connectArgs, nil)
	sc = structured(t, d)
	if sc["revocation"] != string(provider.NotSupported) || sc["deleted"] != true ||
		!strings.Contains(sc["message"].(string), "cannot revoke an API key; revoke it at Keys as well: https://keys.example/settings/keys") {
		t.Fatalf("disconnect: %v", sc)
	}
	if n, _ := h.store.ListConnections(context.Background(), alice); len(n) != 0 {
		t.Fatal("the key connection is still stored")
	}
	for _, where := range []struct{ name, text string }{{"results", transcript.String()}, {"log", h.logs.String()}} {
		if strings.Contains(where.text, keySecret) {
			t.Errorf("the %s hold a key", where.name)
		}
	}
}

// TestKeyRedactedFromAnswers: an API that reflects the key in any
// encoding hands none of them back through provider_request.
func TestKeyRedactedFromAnswers(t *testing.T) {
	h := newHarnessExtra(t, keyProviders)
	alice := h.principal("alice")
	const echoKey = "ek_ECHOKEY_0123456789abcdefghij"
	g, err := h.grants.Create(context.Background(), alice, "echokeys", nil, "t")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := h.conns.Providers().Lookup("echokeys")
	// The echo API names the account with the key itself: refused.
	if _, err := h.client.VerifyKey(context.Background(), p, map[string]string{"api_key": echoKey}); err == nil {
		t.Fatal("an account named by the key itself was accepted")
	}
	if _, err := h.grants.Authorize(context.Background(), g.ID, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := h.conns.Save(context.Background(), alice, g, p, provider.Exchanged{Account: provider.Account{ID: "e1", Login: "echo"},
		Token: vault.TokenSet{Fields: map[string]vault.Secret{"api_key": echoKey}}}); err != nil {
		t.Fatal(err)
	}
	for _, form := range echoapi.Forms {
		raw, d := h.callTool("alice", urlCaps, toolRequest, map[string]any{"provider": "echokeys", "method": "GET", "path": "/echo/" + form}, nil)
		sc := structured(t, d)
		if sc["status"] != float64(200) || !strings.Contains(sc["body"].(string), "REDACTED") {
			t.Fatalf("%s: %v", form, sc)
		}
		if leaks := echoapi.Leaks(string(raw.body), echoKey); len(leaks) > 0 {
			t.Errorf("%s: %v of the key leaked", form, leaks)
		}
	}
}
