package mcpapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"credbroker/provider"
)

// TestScopesNotGranted: the person grants fewer scopes than connect_account
// asked for (they unchecked one on a granular consent screen). The retry's
// result is connected with the narrower scopes, and names what is missing
// twice: a structured field (connection.notGranted) and a sentence saying
// it was not granted and how to ask again (connection.note, repeated in
// the message). list_connections says the same; a full grant says
// nothing; the next call needing the scope asks again for it.
func TestScopesNotGranted(t *testing.T) {
	h := newHarness(t)
	alice := h.principal("alice")
	args := map[string]any{"provider": "github", "scopes": []string{"repo"}}
	_, d := h.callTool("alice", urlCaps, toolConnect, args, nil)
	key, url, state := elicitation(t, d)
	h.saveGranting(grantIDOf(t, url), alice, provider.Account{ID: "1001", Login: "octocat"}, []string{"read:user"})
	_, d = h.callTool("alice", urlCaps, toolConnect, args, map[string]any{"requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	sc := structured(t, d)
	conn, _ := sc["connection"].(map[string]any)
	if sc["status"] != "connected" || conn == nil || fmt.Sprint(conn["scopes"]) != "[read:user]" {
		t.Fatalf("retry: %v, want connected with scopes [read:user]", sc)
	}
	checkNotGranted := func(what string, conn map[string]any) string {
		t.Helper()
		if fmt.Sprint(conn["notGranted"]) != "[repo]" {
			t.Fatalf("%s: notGranted %v, want [repo]", what, conn["notGranted"])
		}
		note, _ := conn["note"].(string)
		for _, want := range []string{`"repo" was not granted`, `call connect_account with provider "github" and scopes ["repo"]`} {
			if !strings.Contains(note, want) {
				t.Fatalf("%s: note %q does not say %q", what, note, want)
			}
		}
		return note
	}
	note := checkNotGranted("connect result", conn)
	if msg, _ := sc["message"].(string); !strings.Contains(msg, note) {
		t.Fatalf("message %q does not carry the note", msg)
	}
	if text := fmt.Sprint(d.Result["content"]); !strings.Contains(text, "was not granted") {
		t.Fatalf("the text content does not say what was not granted: %s", text)
	}
	_, d = h.callTool("alice", urlCaps, toolList, map[string]any{}, nil)
	list, _ := structured(t, d)["connections"].([]any)
	if len(list) != 1 {
		t.Fatalf("list_connections: %v", d.Result)
	}
	checkNotGranted("list_connections", list[0].(map[string]any))

	// Asking again for repo asks the person again, for everything held too.
	_, d = h.callTool("alice", urlCaps, toolConnect, args, nil)
	key, url, state = elicitation(t, d)
	g, err := h.grants.Lookup(t.Context(), grantIDOf(t, url))
	if err != nil || !slices.Equal(g.Scopes, []string{"read:user", "repo"}) {
		t.Fatalf("the new connect request asks for %v (%v), want [read:user repo]", g.Scopes, err)
	}
	h.saveGranting(g.ID, alice, provider.Account{ID: "1001", Login: "octocat"}, nil)
	_, d = h.callTool("alice", urlCaps, toolConnect, args, map[string]any{"requestState": state,
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}}})
	sc = structured(t, d)
	conn, _ = sc["connection"].(map[string]any)
	_, has := conn["notGranted"]
	_, hasNote := conn["note"]
	if sc["status"] != "connected" || has || hasNote || strings.Contains(sc["message"].(string), "not granted") {
		t.Fatalf("after a full grant: %v, want connected naming nothing missing", sc)
	}
}
