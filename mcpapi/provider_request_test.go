package mcpapi

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"credbroker/oauthflow"
	"credbroker/vault"
)

// fakeAPI answers provider requests and records which connection was used.
type fakeAPI struct {
	mu    sync.Mutex
	used  []string
	fails map[string]error
}

func (f *fakeAPI) Do(_ context.Context, id string, req oauthflow.APIRequest) (oauthflow.APIResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fails[id]; err != nil {
		delete(f.fails, id)
		return oauthflow.APIResponse{}, err
	}
	f.used = append(f.used, id)
	return oauthflow.APIResponse{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"path":"` + req.Path + `"}`)}, nil
}

func TestProviderRequestFlows(t *testing.T) {
	api := &fakeAPI{fails: map[string]error{}}
	h := newHarness(t, func(o *Options) { o.Provider = api })
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
		if api.used[len(api.used)-1] != conn.ID {
			t.Fatalf("used %v, want %s", api.used, conn.ID)
		}
		// needs_reconnect → url elicitation saying revoked/expired → reconnect → same id.
		api.fails[conn.ID] = oauthflow.ErrNeedsReconnect
		_, d = h.callTool("alice", urlCaps, toolRequest, args, nil)
		key, link, state = elicitation(t, d)
		msg := d.Result["inputRequests"].(map[string]any)[key].(map[string]any)["params"].(map[string]any)["message"].(string)
		if !strings.Contains(msg, "revoked or has expired") {
			t.Errorf("message %q does not say revoked/expired", msg)
		}
		g, _ := h.grants.Approve(context.Background(), grantIDOf(t, link), alice)
		if _, err := h.grants.Complete(context.Background(), g.ID, alice, conn.ID); err != nil {
			t.Fatal(err)
		}
		_, d = h.callTool("alice", urlCaps, toolRequest, args, map[string]any{"requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		if d.Result["isError"] == true || api.used[len(api.used)-1] != conn.ID {
			t.Fatalf("after reconnect: %+v used %v", d, api.used)
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
		if d.Result["isError"] == true || api.used[len(api.used)-1] != second.ID {
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
		before := len(api.used)
		_, d = h.callTool("alice", urlCaps, toolRequest, named, map[string]any{"requestState": state,
			"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
		text, _ := json.Marshal(d.Result)
		if d.Result["isError"] != true || !strings.Contains(string(text), "still not connected") {
			t.Fatalf("want a refusal, got %s", text)
		}
		if len(api.used) != before {
			t.Fatalf("the request ran as another account: %v", api.used[before:])
		}
	})
	if strings.Contains(h.logs.String(), providerSecret) {
		t.Error("token in logs")
	}
}
