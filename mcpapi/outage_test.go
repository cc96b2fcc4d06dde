package mcpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// downStore is a store whose connection listing fails as a storage outage
// does (a database that went away): the test's stand-in for the call's
// own store read failing first.
type downStore struct{ vault.Store }

func (downStore) ListConnections(context.Context, vault.Principal) ([]vault.Connection, error) {
	return nil, vault.UnavailableError("postgres 127.0.0.1:5432", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))
}

// TestStorageOutageEitherReadFirst: a storage outage is answered alike
// whichever store read fails first, in both eras: the bearer token's
// check (broker mode: the token family's liveness) or the call's own read
// (issuer mode, or broker mode with the liveness cache answering). HTTP
// 503, Retry-After, a JSON-RPC error carrying the request's id, a code in
// the implementation-defined server-error range with data.retryable, a
// message saying the storage is unavailable and to retry; the cause is
// logged, never shown; each refusal is counted.
func TestStorageOutageEitherReadFirst(t *testing.T) {
	rec := telemetry.New(telemetry.Options{})
	withRec := func(o *Options) { o.Telemetry = rec }
	tokenCheck := newHarness(t, withRec, func(o *Options) {
		o.Verifier = func(context.Context, string) (bearer.TokenInfo, error) {
			return bearer.TokenInfo{}, vault.UnavailableError("postgres 127.0.0.1:5432", errors.New("dial tcp 127.0.0.1:5432: connect: connection refused"))
		}
	})
	ownRead := newHarness(t, withRec)
	down := downStore{ownRead.store}
	conns, err := connections.New(connections.Options{Store: down, Grants: binding.New(down, binding.Options{Now: ownRead.clock.Now}),
		Client: ownRead.client, PublicURL: publicURL, Now: ownRead.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ownRead.srv.opts.Connections = conns

	for name, h := range map[string]*harness{"the token check": tokenCheck, "the call's own read": ownRead} {
		for _, era := range []string{versionModern, versionLegacy} {
			t.Run(name+", "+era, func(t *testing.T) {
				var r rawResult
				if era == versionModern {
					r = h.do(rawCall{headers: h.modernHeaders("alice", "tools/call", toolList),
						body: modernBody(41, "tools/call", urlCaps, map[string]any{"name": toolList, "arguments": map[string]any{}})})
				} else {
					// No initialize first: a legacy client's call stands alone.
					r = h.do(rawCall{headers: map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
						"Authorization": "Bearer " + h.bearer("alice"), "MCP-Protocol-Version": versionLegacy},
						body: jsonBody(map[string]any{"jsonrpc": "2.0", "id": 41, "method": "tools/call",
							"params": map[string]any{"name": toolList, "arguments": map[string]any{}}})})
				}
				var a struct {
					ID    json.RawMessage `json:"id"`
					Error *struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
						Data    struct {
							Retryable bool `json:"retryable"`
						} `json:"data"`
					} `json:"error"`
				}
				if err := json.Unmarshal(r.body, &a); err != nil || a.Error == nil {
					t.Fatalf("HTTP %d, not a JSON-RPC error: %s", r.status, r.body)
				}
				switch {
				case r.status != http.StatusServiceUnavailable:
					t.Errorf("HTTP %d, want 503", r.status)
				case r.header.Get("Retry-After") != "2":
					t.Errorf("Retry-After %q, want 2", r.header.Get("Retry-After"))
				case string(a.ID) != "41":
					t.Errorf("id %s, want the request's 41", a.ID)
				case a.Error.Code != codeStorageUnavailable || a.Error.Code < -32099 || a.Error.Code > -32000 || !a.Error.Data.Retryable:
					t.Errorf("error %+v, want a retryable implementation-defined server error", a.Error)
				case !strings.Contains(a.Error.Message, "storage is unavailable") || !strings.Contains(a.Error.Message, "Retry"):
					t.Errorf("message %q", a.Error.Message)
				case strings.Contains(string(r.body), "5432"):
					t.Errorf("the answer shows the cause: %s", r.body)
				}
				if !strings.Contains(h.logs.String(), "connection refused") {
					t.Errorf("the log does not name the cause:\n%s", h.logs.String())
				}
			})
		}
	}
	rr := httptest.NewRecorder()
	rec.Handler().ServeHTTP(rr, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rr.Body.String(), `credbroker_store_unavailable_total{door="mcp"} 4`) {
		t.Errorf("want 4 refusals counted at the mcp door:\n%s", rr.Body.String())
	}
}
