package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/internal/htmlform"
	"credbroker/internal/powercut"
	"credbroker/internal/testskip"
	"credbroker/vault"
	"credbroker/vault/boltstore"
)

// TestStorageOutageFailingDisk is issue 33's outage on bbolt: `broker dev`
// (--mcp-auth broker, its bolt file on internal/powercut's FUSE file
// system) while the disk fails every write with EIO. Every request that
// must write (a connect request over MCP in both eras, the sidecar's
// require, a client registration, the provider's callback of a connect
// flow) answers the outage's 503 with Retry-After in its door's format;
// the cause ("input/output error") is in the log only; reads go on;
// /readyz is false and credbroker_store_unavailable_total counts the
// refusals at each door. Once the disk works again the same process
// serves every write within 5 s, the interrupted connect flow completes
// from the same link, and every acknowledged write is in the file, which
// checks clean.
func TestStorageOutageFailingDisk(t *testing.T) {
	testskip.Short(t, "failing disk test")
	disk := powercut.MountT(t)
	side := freeAddr(t)
	d := startDevArgs(t, freeAddr(t), disk.Dir, []string{"--sidecar-addr", side, "--log-format", "json"})
	secret, err := os.ReadFile(filepath.Join(disk.Dir, "sidecar.secret"))
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: testClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	alice, bob := d.Token("alice"), d.Token("bob")

	var acked []string // connect requests the broker acknowledged
	// writes are requests that store something, one per door. bob asks
	// over 2025-11-25 only: a legacy client is handed the person's open
	// connect request again (a read), and he has none until one is
	// stored.
	writes := map[string]func() hit{
		"mcp broker": func() hit {
			req, id := rpcRequest(d.BaseURL+"/mcp", alice, "tools/call", "connect_account", map[string]any{"provider": "demo"}, false)
			h := send(c, "mcp broker", req, id)
			if g := grantOfMCP(d.BaseURL, h); g != "" {
				acked = append(acked, g)
			}
			return h
		},
		"mcp legacy": func() hit {
			session := legacySession(t, c, d.BaseURL+"/mcp", bob)
			req, id := rpcRequest(d.BaseURL+"/mcp", bob, "tools/call", "connect_account", map[string]any{"provider": "demo"}, true)
			req.Header.Set("Mcp-Session-Id", session)
			return send(c, "mcp legacy", req, id)
		},
		"sidecar": func() hit {
			req, _ := http.NewRequest(http.MethodPost, "http://"+side+"/v1/require", strings.NewReader(`{"provider":"demo"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Broker-Sidecar-Secret", strings.TrimSpace(string(secret)))
			req.Header.Set("Authorization", "Bearer "+alice)
			h := send(c, "sidecar", req, 0)
			var rr struct {
				InputRequest struct {
					Params struct{ URL string } `json:"params"`
				} `json:"input_request"`
			}
			if h.status == http.StatusOK && json.Unmarshal([]byte(h.body), &rr) == nil && rr.InputRequest.Params.URL != "" {
				acked = append(acked, strings.TrimPrefix(rr.InputRequest.Params.URL, d.BaseURL+"/connect/"))
			}
			return h
		},
		"register": func() hit {
			req, _ := http.NewRequest(http.MethodPost, d.BaseURL+"/register", strings.NewReader(
				`{"redirect_uris":["http://127.0.0.1/cb"],"token_endpoint_auth_method":"none","client_name":"outage test"}`))
			req.Header.Set("Content-Type", "application/json")
			return send(c, "register", req, 0)
		},
	}
	// wrote says what is wrong with h, the answer to a write on a disk
	// that works: anything but the door's usual answer.
	wrote := func(h hit) string {
		switch {
		case h.err != nil:
			return h.err.Error()
		case h.door == "register" && h.status != http.StatusCreated, h.door != "register" && h.status != http.StatusOK:
			return "HTTP " + http.StatusText(h.status) + ": " + h.body
		case h.door == "mcp legacy" && !strings.Contains(h.body, "-32042"):
			return "no -32042 connect link: " + h.body
		case (h.door == "mcp broker" || h.door == "sidecar") && !strings.Contains(h.body, "input_required"):
			return "no connect link: " + h.body
		}
		return ""
	}

	// Before: the MCP endpoint and the sidecar store connect requests.
	for _, door := range []string{"mcp broker", "sidecar"} {
		if problem := wrote(writes[door]()); problem != "" {
			t.Fatalf("%s on a working disk: %s", door, problem)
		}
	}
	// alice starts connecting demo and gets as far as the provider's
	// consent: the failing disk will stop her at the broker's callback.
	first, err := mcpCall(c, d.BaseURL, "", alice, "connect_account", map[string]any{"provider": "demo"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, link := elicitation(t, first)
	acked = append(acked, strings.TrimPrefix(link, d.BaseURL+"/connect/"))
	jar, _ := cookiejar.New(nil)
	br := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: testClient.Transport}
	req, _ := http.NewRequest(http.MethodGet, link, nil)
	p := fetch(t, br, req)
	p = submitForm(t, br, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	atProvider := submitForm(t, br, p, "/connect/", url.Values{"decision": {"approve"}})
	if !strings.Contains(atProvider.url.String(), devProviderPath) {
		t.Fatalf("approving did not reach the demo provider: %s", atProvider.url)
	}

	disk.Fail(true)
	var refused []hit
	for door, w := range writes {
		h := w()
		refused = append(refused, h)
		if problem := outageProblem(h); problem != "" {
			t.Errorf("%s on a failing disk: %s", door, problem)
		}
	}
	// The provider's redirect lands on the broker's callback, which cannot
	// store the connection.
	target, vals, err := htmlform.Find(atProvider.url, atProvider.body, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ = http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	cb := send(br, "page", req, 0)
	refused = append(refused, cb)
	if problem := outageProblem(cb); problem != "" || !strings.Contains(cb.body, "connect link") {
		t.Errorf("the provider's callback on a failing disk: %s\n%.1500s", problem, cb.body)
	}
	for _, h := range refused {
		if strings.Contains(h.body, "input/output") || strings.Contains(h.body, disk.Dir) {
			t.Errorf("%s shows the cause: %s", h.door, h.body)
		}
	}
	// Reads go on.
	req, id := rpcRequest(d.BaseURL+"/mcp", alice, "tools/call", "list_connections", map[string]any{}, false)
	if h := send(c, "mcp broker", req, id); h.status != http.StatusOK || !strings.Contains(h.body, `"connections"`) {
		t.Errorf("list_connections on a failing disk: HTTP %d %.300s", h.status, h.body)
	}
	resp, err := c.Get(d.BaseURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	var rep readyReport
	json.NewDecoder(resp.Body).Decode(&rep)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || rep.Ready || !strings.Contains(rep.Checks["store"], "store unavailable") {
		t.Errorf("/readyz on a failing disk: HTTP %d %+v, want 503 naming the store", resp.StatusCode, rep)
	}
	m := get200(t, c, d.BaseURL+"/metrics")
	for _, door := range []string{"mcp", "sidecar", "page", "authserver"} {
		if !strings.Contains(m, `credbroker_store_unavailable_total{door="`+door+`"}`) {
			t.Errorf("the metrics count no refusal at %s:\n%s", door, grepLines(m, "credbroker_store_unavailable"))
		}
	}
	named := func(log string) bool {
		return strings.Contains(log, "input/output error") && strings.Contains(log, filepath.Join(disk.Dir, "broker.db"))
	}
	if !d.stderr.WaitUntil(named, d.exited, 30*time.Second) {
		t.Errorf("the log names neither the cause nor the file:\n%s", grepLines(d.Stderr(), `{"time"`))
	}

	// The disk works again: the same process writes at every door within
	// 5 s.
	disk.Fail(false)
	fixed := time.Now()
	for door, w := range writes {
		for {
			h := w()
			problem := wrote(h)
			if problem == "" {
				break
			}
			if h.status != http.StatusServiceUnavailable || time.Since(fixed) > 5*time.Second {
				t.Fatalf("%s %v after the disk worked again: %s", door, time.Since(fixed), problem)
			}
			<-time.After(100 * time.Millisecond)
		}
	}
	t.Logf("every door wrote again %v after the disk worked again", time.Since(fixed))
	// The same link works: consent again, the provider, the callback, and
	// the client's retry sees the connection.
	req, _ = http.NewRequest(http.MethodGet, link, nil)
	p = fetch(t, br, req)
	p = submitForm(t, br, p, "/connect/", url.Values{"decision": {"approve"}})
	p = submitForm(t, br, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
		t.Fatalf("the same link once the disk worked again ended on %s (HTTP %d):\n%.1500s", p.url, p.status, p.body)
	}
	retry, err := mcpCall(c, d.BaseURL, "", alice, "connect_account", map[string]any{"provider": "demo"}, map[string]any{
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}},
		"requestState":   first.Result.RequestState,
	})
	if err != nil || retry.Result.ResultType != "complete" || !strings.Contains(retry.Raw, "alice-demo") {
		t.Fatalf("the client's retry once the disk worked again: %v %s", err, retry.Raw)
	}
	deadline := time.Now().Add(20 * time.Second)
	for get(t, c, d.BaseURL+"/readyz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatal("/readyz not ready 20 s after the disk worked again")
		}
		<-time.After(200 * time.Millisecond)
	}

	// Every acknowledged write is in the file, which checks clean: read
	// from a copy, once the broker is stopped (this process must not map
	// a file its own FUSE server serves).
	d.Stop()
	db, ok := disk.Contents("broker.db")
	keys, ok2 := disk.Contents("dev.keys")
	if !ok || !ok2 {
		t.Fatal("the broker's files are gone")
	}
	kr, err := vault.ParseKeys(string(keys))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "broker.db")
	if err := os.WriteFile(path, db, 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if len(acked) < 5 {
		t.Fatalf("%d connect requests acknowledged, want 5", len(acked))
	}
	for _, g := range acked {
		if _, err := st.GetGrant(t.Context(), g); err != nil {
			t.Errorf("acknowledged connect request %s: %v", g, err)
		}
	}
	if g, err := st.GetGrant(t.Context(), strings.TrimPrefix(link, d.BaseURL+"/connect/")); err != nil || g.State != vault.GrantCompleted {
		t.Errorf("the interrupted connect request: %s, %v; want completed", g.State, err)
	}
	if err := st.DB().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Errorf("the file does not check clean: %v", err)
	}
}

// grantOfMCP returns the connect request id of an input_required answer
// of the MCP endpoint at base ("" for any other answer).
func grantOfMCP(base string, h hit) string {
	if h.status != http.StatusOK || !strings.Contains(h.body, `"input_required"`) {
		return ""
	}
	var a mcpAnswer
	if json.Unmarshal([]byte(h.body), &a) != nil {
		return ""
	}
	for _, raw := range a.Result.InputRequests {
		var ir struct {
			Params struct{ URL string } `json:"params"`
		}
		if json.Unmarshal(raw, &ir) == nil {
			return strings.TrimPrefix(ir.Params.URL, base+"/connect/")
		}
	}
	return ""
}

// legacySession opens a 2025-11-25 session at the MCP endpoint u whose
// client declares url elicitation, and returns its Mcp-Session-Id.
func legacySession(t *testing.T, c *http.Client, u, bearer string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
		"protocolVersion": "2025-11-25", "clientInfo": map[string]any{"name": "outage-test", "version": "1"},
		"capabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
	}})
	req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	h := send(c, "mcp legacy", req, 1)
	session := h.header.Get("Mcp-Session-Id")
	if h.status != http.StatusOK || session == "" {
		t.Fatalf("initialize: HTTP %d, session %q: %s", h.status, session, h.body)
	}
	return session
}
