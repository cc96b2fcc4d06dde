package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/testskip"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
	"credbroker/vault/vaulttest"
	"credbroker/webhook"
)

// hookRequest is one request the webhook receiver saw.
type hookRequest struct {
	ID, Type string
	Body     []byte
	Header   http.Header
	// Verified: the Standard Webhooks library accepted the signature and
	// the timestamp.
	Verified error
	Status   int
	At       time.Time
}

// hookReceiver is an application's webhook endpoint on loopback. It
// verifies every request with the Standard Webhooks project's Go library
// (an implementation independent of the broker's), can fail the first
// attempts of the first event of a type, and can hold requests of a type
// until released.
type hookReceiver struct {
	srv *httptest.Server
	wh  *standardwebhooks.Webhook

	mu        sync.Mutex
	reqs      []hookRequest
	failFirst map[string]int
	failID    map[string]string
	holdType  string
	held      chan struct{} // closed to release held requests (never, in these tests: the sender dies)
	holding   chan hookRequest
	arrived   chan hookRequest
	delay     time.Duration
}

func newHookReceiver(t *testing.T, secret string) *hookReceiver {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookReceiver{wh: wh, failFirst: map[string]int{}, failID: map[string]string{}, arrived: make(chan hookRequest, 1000), holding: make(chan hookRequest, 10)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev struct{ Type string }
		json.Unmarshal(body, &ev)
		req := hookRequest{ID: r.Header.Get("webhook-id"), Type: ev.Type, Body: body, Header: r.Header.Clone(),
			Verified: wh.Verify(body, r.Header), Status: http.StatusNoContent, At: time.Now()}
		h.mu.Lock()
		// The first event of a type to arrive fails failFirst times.
		if h.failFirst[ev.Type] > 0 && (h.failID[ev.Type] == "" || h.failID[ev.Type] == req.ID) {
			h.failID[ev.Type] = req.ID
			h.failFirst[ev.Type]--
			req.Status = http.StatusServiceUnavailable
		}
		hold := h.held
		if h.holdType != ev.Type {
			hold = nil
		}
		delay := h.delay
		h.mu.Unlock()
		if hold != nil {
			h.holding <- req
			select {
			case <-hold:
			case <-r.Context().Done():
				return // the sender died: nothing is recorded as answered
			}
		}
		time.Sleep(delay)
		h.mu.Lock()
		h.reqs = append(h.reqs, req)
		h.mu.Unlock()
		if hold == nil {
			h.arrived <- req
		}
		w.WriteHeader(req.Status)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookReceiver) requests() []hookRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

// delivered returns the ids of events of type typ answered 2xx.
func (h *hookReceiver) delivered(typ string) []string {
	var ids []string
	for _, r := range h.requests() {
		if r.Type == typ && r.Status < 300 {
			ids = append(ids, r.ID)
		}
	}
	return ids
}

// waitFor waits (bounded) until cond holds for the receiver.
func (h *hookReceiver) waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-h.arrived:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			t.Fatalf("webhooks: %s did not happen within %s; received %d requests", what, d, len(h.requests()))
		}
	}
}

func newWebhookSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return "whsec_" + base64.StdEncoding.EncodeToString(b)
}

// demoEntry is a providers.yaml entry for a demo provider at base.
func demoEntry(name, base, extra string) string {
	return fmt.Sprintf(`  %s:
    display_name: %s
    type: oauth2
    authorization_url: %[3]s/authorize
    token_url: %[3]s/token
    client_id: %[4]s
    client_secret: ${DEMO_CLIENT_SECRET}
    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    account: {url: %[3]s/api/user, id_field: id, login_field: login}
    api: {base_url: %[3]s/api}
    revocation: {style: rfc7009, url: %[3]s/revoke}
%[5]s`, name, strings.ToUpper(name[:1])+name[1:], base, devDemoClientID, extra)
}

// opsServe is one `broker serve` on a bolt file, restartable, behind a
// loopback TLS balancer, with the dev IdP, two demo providers, a webhook
// receiver and the admin API.
type opsServe struct {
	t         *testing.T
	lb        *balancer
	idp       *devidp.IdP
	demos     map[string]*demoprovider.Provider
	hooks     *hookReceiver
	secret    string
	keys      *vault.Keyring
	dbPath    string
	providers string
	addr      string
	adminAddr string
	args, env []string
	proc      *serveProc
	bearers   map[string]string
}

// newOpsServe starts the stack; demoOpts tune each demo provider and
// extra adds lines to each providers.yaml entry.
func newOpsServe(t *testing.T, demoOpts demoprovider.Options, extra map[string]string, flags ...string) *opsServe {
	t.Helper()
	s := &opsServe{t: t, lb: newBalancer(t), demos: map[string]*demoprovider.Provider{}, bearers: map[string]string{},
		secret: newWebhookSecret()}
	public := s.lb.srv.URL
	users := []devidp.User{
		{Username: "alice", Password: "alice", Subject: "alice", Email: "alice@example.test", Name: "Alice"},
		{Username: "root", Password: "root", Subject: "root", Name: "Root", Groups: []string{"staff", "credbroker-admins"}},
		{Username: "mallory", Password: "mallory", Subject: "mallory", Name: "Mallory", Groups: []string{"engineering"}},
		{Username: "carol", Password: "carol", Subject: "carol", Name: "Carol"},
	}
	s.idp = devidptest.Start(t, users, nil)
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret", RedirectURIs: []string{public + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
	doc := "providers:\n"
	for _, name := range []string{"demo", "demo2"} {
		o := demoOpts
		o.BaseURL, o.ClientID, o.ClientSecret = psrv.URL+"/"+name, devDemoClientID, "demo-secret"
		o.RedirectURIs = []string{public + "/oauth/" + name + "/callback"}
		d, err := demoprovider.New(o)
		if err != nil {
			t.Fatal(err)
		}
		pmux.Handle("/"+name+"/", d.Handler())
		s.demos[name] = d
		doc += demoEntry(name, o.BaseURL, extra[name])
	}
	dir := t.TempDir()
	s.providers = filepath.Join(dir, "providers.yaml")
	hooksFile := filepath.Join(dir, "webhooks.yaml")
	s.hooks = newHookReceiver(t, s.secret)
	for path, content := range map[string]string{
		s.providers: doc,
		hooksFile:   "endpoints:\n  apps:\n    url: " + s.hooks.srv.URL + "/hooks\n    secret: ${APPS_WEBHOOK_SECRET}\n",
	} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if s.keys, err = vault.ParseKeys(vault.GenerateKey()); err != nil {
		t.Fatal(err)
	}
	s.dbPath = filepath.Join(dir, "data", "broker.db")
	s.addr, s.adminAddr = freeAddr(t), freeAddr(t)
	s.env = []string{"BROKER_KEYS=" + s.keys.Format(), "BROKER_CLIENT_SECRET=idp-secret", "DEMO_CLIENT_SECRET=demo-secret",
		"APPS_WEBHOOK_SECRET=" + s.secret, "BROKER_STORE=", "BROKER_KEYS_FILE=", "BROKER_WEBHOOK_URL=", "BROKER_ADMIN_CLAIM="}
	s.args = append([]string{"--public-url", public, "--issuer", s.idp.Issuer(), "--client-id", devClientID,
		"--providers", s.providers, "--store", "bolt:" + s.dbPath, "--log-format", "json", "--mcp-auth", "issuer",
		"--webhooks-file", hooksFile, "--webhook-timeout", "5s", "--webhook-backoff", "200ms", "--webhook-poll", "100ms",
		"--admin-addr", s.adminAddr, "--admin-claim", "groups=credbroker-admins"}, flags...)
	s.start()
	s.lb.add("a", s.proc.base)
	for _, u := range []string{"alice", "root", "mallory", "carol"} {
		tok, _, err := s.idp.MintAccessToken(u, public+"/mcp", nil, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		s.bearers[u] = tok
	}
	return s
}

func (s *opsServe) start() { s.proc = startServe(s.t, "a", s.addr, s.args, s.env) }

// stop ends the broker with SIGTERM and waits for it.
func (s *opsServe) stop() {
	s.proc.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.proc.exited:
	case <-time.After(30 * time.Second):
		s.t.Fatal("broker did not stop on SIGTERM")
	}
}

// adminToken mints a token for the admin API's audience.
func (s *opsServe) adminToken(user string) string {
	s.t.Helper()
	tok, _, err := s.idp.MintAccessToken(user, s.lb.srv.URL+"/admin", nil, time.Hour)
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

// admin calls the admin API.
func (s *opsServe) admin(method, path, token string, body any) (int, map[string]any, http.Header) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://"+s.adminAddr+path, rd)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, resp.Header
}

// connect runs alice's connect_account for provider (scopes) through the
// MCP endpoint and the browser, approving demo account 1001.
func (s *opsServe) connect(provider string, scopes []string) {
	s.t.Helper()
	args := map[string]any{"provider": provider}
	if scopes != nil {
		args["scopes"] = scopes
	}
	first, err := mcpCall(s.lb.srv.Client(), s.lb.srv.URL, "", s.bearers["alice"], "connect_account", args, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	_, link := elicitation(s.t, first)
	br := s.browser()
	req, _ := http.NewRequest(http.MethodGet, link, nil)
	p := fetch(s.t, br, req)
	p = submitForm(s.t, br, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	p = submitForm(s.t, br, p, "/connect/", url.Values{"decision": {"approve"}})
	p = submitForm(s.t, br, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
		s.t.Fatalf("connecting %s ended on %s (HTTP %d):\n%.1500s", provider, p.url, p.status, p.body)
	}
}

func (s *opsServe) browser() *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: s.lb.srv.Client().Transport}
}

// waitLogs waits (at most 30 s, woken by every write) until cond holds for
// the broker's log, and returns the log. An audit line the broker writes
// before its HTTP answer can reach the test after that answer: it comes
// through the subprocess's stderr pipe, copied on its own goroutine.
func (s *opsServe) waitLogs(what string, cond func(logs string) bool) string {
	s.t.Helper()
	if !s.proc.logs.WaitUntil(cond, s.proc.exited, 30*time.Second) {
		s.t.Fatalf("the broker's log never showed %s:\n%s", what, s.proc.logs.String())
	}
	return s.proc.logs.String()
}

// auditLines returns the broker's audit records of kind.
func auditLines(logs, kind string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["audit"] == true && m["event"] == kind {
			out = append(out, m)
		}
	}
	return out
}

func field(m map[string]any, path ...string) string {
	var cur any = m
	for _, k := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[k]
	}
	s, _ := cur.(string)
	return s
}

// runBroker runs the broker binary with args and env, returning its
// output and error.
func runBroker(t *testing.T, env []string, args ...string) (string, string, error) {
	t.Helper()
	broker, _ := binaries(t)
	cmd := exec.Command(broker, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// TestOperations is issue 18 on one `broker serve` subprocess with a bolt
// store: the admin API's refusals; webhook delivery to a receiver that
// fails three times, verified by the Standard Webhooks library; an event
// committed and then the broker SIGKILLed before delivering it, delivered
// after the restart; offboarding alice's two connections where one
// provider fails revocation once, the second run (the offline command)
// completing it, with the audit log and the events checked.
func TestOperations(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	s := newOpsServe(t, demoprovider.Options{}, nil)
	iss := s.idp.Issuer()
	listPath := "/admin/v1/connections?" + url.Values{"iss": {iss}, "sub": {"alice"}}.Encode()

	t.Run("admin API refusals", func(t *testing.T) {
		status, body, h := s.admin("GET", listPath, "", nil)
		if status != 401 || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") || body["error"] != "invalid_token" {
			t.Fatalf("no token: %d %v %q", status, body, h.Get("WWW-Authenticate"))
		}
		// root's token for the MCP endpoint is not one for the admin API.
		if status, body, _ := s.admin("GET", listPath, s.bearers["root"], nil); status != 401 {
			t.Fatalf("a token for another audience: %d %v", status, body)
		}
		// carol's token has no groups claim at all; mallory is in a group,
		// not the admins'.
		for _, who := range []string{"carol", "mallory"} {
			if status, body, _ := s.admin("GET", listPath, s.adminToken(who), nil); status != 403 || body["error"] != "forbidden" {
				t.Fatalf("%s: %d %v", who, status, body)
			}
			if status, _, _ := s.admin("POST", "/admin/v1/offboard", s.adminToken(who), map[string]string{"iss": iss, "sub": "alice"}); status != 403 {
				t.Fatalf("%s could offboard: %d", who, status)
			}
		}
		if status, body, _ := s.admin("GET", listPath, s.adminToken("root"), nil); status != 200 {
			t.Fatalf("root: %d %v", status, body)
		}
		// The broker writes each audit line before it answers, but the line
		// reaches this process through a pipe read on another goroutine:
		// wait for it.
		logs := s.waitLogs("six admin_refused and one admin_list audit lines", func(logs string) bool {
			return len(auditLines(logs, "admin_refused")) >= 6 && len(auditLines(logs, "admin_list")) >= 1
		})
		refused := auditLines(logs, "admin_refused")
		var subs []string
		for _, r := range refused {
			subs = append(subs, field(r, "principal", "sub"))
		}
		if len(refused) != 6 || !slices.Contains(subs, "mallory") || !slices.Contains(subs, "carol") {
			t.Fatalf("admin_refused audit events: %d, for %v", len(refused), subs)
		}
		if l := auditLines(logs, "admin_list"); len(l) != 1 || field(l[0], "admin", "sub") != "root" {
			t.Fatalf("admin_list audit: %v", l)
		}
	})

	t.Run("connection.created retried three times, signatures verified independently", func(t *testing.T) {
		s.hooks.mu.Lock()
		s.hooks.failFirst["connection.created"] = 3
		s.hooks.mu.Unlock()
		s.connect("demo", nil)
		s.connect("demo2", nil)
		// An open connect request: more scopes than alice granted.
		if a, err := mcpCall(s.lb.srv.Client(), s.lb.srv.URL, "", s.bearers["alice"], "connect_account",
			map[string]any{"provider": "demo", "scopes": []string{"repos"}}, nil); err != nil || a.Result.ResultType != "input_required" {
			t.Fatalf("open connect request: %v %s", err, a.Raw)
		}
		s.hooks.waitFor(t, "two connection.created deliveries", 30*time.Second, func() bool {
			return len(s.hooks.delivered("connection.created")) == 2
		})
		var first []hookRequest
		s.hooks.mu.Lock()
		firstID := s.hooks.failID["connection.created"]
		s.hooks.mu.Unlock()
		for _, r := range s.hooks.requests() {
			if r.Type != "connection.created" {
				continue
			}
			if r.Verified != nil {
				t.Fatalf("the Standard Webhooks library rejects a delivery: %v", r.Verified)
			}
			if r.ID == firstID {
				first = append(first, r)
			}
			for _, bad := range []string{"token", "secret"} {
				if strings.Contains(string(r.Body), bad) {
					t.Fatalf("payload mentions %s: %s", bad, r.Body)
				}
			}
		}
		if len(first) != 4 || first[3].Status >= 300 || !bytes.Equal(first[0].Body, first[3].Body) {
			t.Fatalf("the first event took %d attempts (want 3 failures, then success)", len(first))
		}
		var ev struct {
			Type string
			Data map[string]any
		}
		json.Unmarshal(first[3].Body, &ev)
		if field(ev.Data, "principal", "sub") != "alice" || field(ev.Data, "principal", "iss") != iss ||
			ev.Data["account_login"] != "alice-demo" || !strings.HasPrefix(field(ev.Data, "connection_id"), "conn_") {
			t.Fatalf("payload data %v", ev.Data)
		}
	})

	t.Run("SIGKILL after the commit, before delivery: the event arrives after restart", func(t *testing.T) {
		s.hooks.mu.Lock()
		s.hooks.holdType, s.hooks.held = "connection.needs_reconnect", make(chan struct{})
		s.hooks.mu.Unlock()
		status, body, _ := s.admin("POST", "/admin/v1/providers/demo/disable", s.adminToken("root"), map[string]bool{"delete": false})
		if status != 200 || body["marked_needs_reconnect"] != float64(1) {
			t.Fatalf("disable demo: %d %v", status, body)
		}
		var held hookRequest
		select {
		case held = <-s.hooks.holding:
		case <-time.After(20 * time.Second):
			t.Fatal("the needs_reconnect event was never sent")
		}
		s.proc.kill()
		killedAt := time.Now()
		// The held request is never answered: its handler ends when the
		// dead broker's connection does. New requests are answered.
		s.hooks.mu.Lock()
		s.hooks.holdType = ""
		s.hooks.mu.Unlock()
		s.start()
		s.hooks.waitFor(t, "the needs_reconnect delivery after the restart", 30*time.Second, func() bool {
			return len(s.hooks.delivered("connection.needs_reconnect")) == 1
		})
		var got hookRequest
		for _, r := range s.hooks.requests() {
			if r.Type == "connection.needs_reconnect" {
				got = r
			}
		}
		if got.ID != held.ID || got.Verified != nil || got.At.Before(killedAt) {
			t.Fatalf("after the restart: id %s (held %s), verified %v", got.ID, held.ID, got.Verified)
		}
		t.Logf("delivered %s after the restart", got.At.Sub(killedAt).Round(time.Millisecond))
	})

	t.Run("offboarding: one revocation fails, the second run completes offline", func(t *testing.T) {
		s.demos["demo2"].FailRevocations(1)
		status, body, _ := s.admin("POST", "/admin/v1/offboard", s.adminToken("root"), map[string]string{"iss": iss, "sub": "alice"})
		if status != 200 || body["complete"] != false || body["connect_requests_deleted"].(float64) < 1 {
			t.Fatalf("first run: %d %v", status, body)
		}
		revs := map[string]string{}
		for _, c := range body["connections"].([]any) {
			c := c.(map[string]any)
			revs[c["provider"].(string)] = c["revocation"].(string)
			if c["provider"] == "demo2" && c["revocation_pending"] != true {
				t.Fatalf("demo2's failed revocation is not pending: %v", c)
			}
		}
		if revs["demo"] != "revoked" || revs["demo2"] != "not_confirmed" {
			t.Fatalf("revocations %v", revs)
		}
		if l, _ := mcpCall(s.lb.srv.Client(), s.lb.srv.URL, "", s.bearers["alice"], "list_connections", map[string]any{}, nil); strings.Contains(l.Raw, "alice-demo") {
			t.Fatalf("alice still has connections: %s", l.Raw)
		}
		s.hooks.waitFor(t, "two connection.deleted deliveries", 30*time.Second, func() bool {
			return len(s.hooks.delivered("connection.deleted")) == 2
		})
		logs := s.waitLogs("the revoke, offboard and two disconnect audit lines", func(logs string) bool {
			return len(auditLines(logs, "revoke")) >= 2 && len(auditLines(logs, "offboard")) >= 1 && len(auditLines(logs, "disconnect")) >= 2
		})
		var notConfirmed bool
		for _, r := range auditLines(logs, "revoke") {
			if field(r, "admin", "sub") == "root" && field(r, "outcome") == "not_confirmed" && field(r, "provider") == "demo2" {
				notConfirmed = true
			}
		}
		off := auditLines(logs, "offboard")
		if !notConfirmed || len(off) != 1 || field(off[0], "admin", "sub") != "root" || !strings.Contains(field(off[0], "outcome"), "revocation_pending=1") {
			t.Fatalf("audit: revoke not_confirmed by root %v, offboard %v", notConfirmed, off)
		}
		if d := auditLines(logs, "disconnect"); len(d) != 2 || field(d[0], "via") != "admin-api" {
			t.Fatalf("disconnect audit events: %v", d)
		}

		// The command refuses while the broker holds the bolt file.
		cliEnv := append(slices.Clone(s.env), "BROKER_WEBHOOKS_FILE=")
		cli := []string{"admin", "offboard", "--store", "bolt:" + s.dbPath, "--providers", s.providers, "--admin", "ops-oncall",
			"--principal", iss, "alice"}
		if _, stderr, err := runBroker(t, cliEnv, cli...); err == nil || !strings.Contains(stderr, "stop the broker") {
			t.Fatalf("offboard against the running broker's file: %v\n%s", err, stderr)
		}
		revokesBefore := 0
		for _, e := range s.demos["demo2"].Events() {
			if e.Kind == "revoke" && e.Status == 200 {
				revokesBefore++
			}
		}
		s.stop()
		stdout, stderr, err := runBroker(t, cliEnv, cli...)
		if err != nil || !strings.Contains(stdout, "complete: nothing is left") || !strings.Contains(stdout, "revocation retried") {
			t.Fatalf("second run: %v\n%s\n%s", err, stdout, stderr)
		}
		if !strings.Contains(stderr, "audit: revoke") || !strings.Contains(stderr, "admin.sub=ops-oncall") || !strings.Contains(stderr, "outcome=revoked") {
			t.Fatalf("the command's audit log:\n%s", stderr)
		}
		revokes := 0
		for _, e := range s.demos["demo2"].Events() {
			if e.Kind == "revoke" && e.Status == 200 {
				revokes++
			}
		}
		if revokes != revokesBefore+1 {
			t.Fatalf("demo2 saw %d successful revocations, want %d", revokes, revokesBefore+1)
		}
		// A third run finds nothing; listing shows nothing.
		if stdout, stderr, err := runBroker(t, cliEnv, cli...); err != nil || !strings.Contains(stdout, "complete") {
			t.Fatalf("third run: %v\n%s\n%s", err, stdout, stderr)
		}
		st, err := boltstore.Open(s.dbPath, s.keys, boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if conns, _ := st.ListConnections(t.Context(), vault.Principal{Issuer: iss, Subject: "alice"}); len(conns) != 0 {
			t.Fatalf("%d connections left", len(conns))
		}
		if ret, _ := st.RetiredConnections(t.Context(), vault.Principal{Issuer: iss, Subject: "alice"}); len(ret) != 0 {
			t.Fatalf("%d retired records left", len(ret))
		}
		if g, _ := st.ListGrants(t.Context(), vault.Principal{Issuer: iss, Subject: "alice"}, time.Time{}); len(g) != 0 {
			t.Fatalf("%d connect requests left", len(g))
		}
	})

	for _, secret := range []string{"idp-secret", "demo-secret", s.secret, s.bearers["alice"]} {
		if strings.Contains(s.proc.logs.String(), secret) {
			t.Error("the broker logged a secret")
		}
	}
}

// TestKeepAlive: with keep_alive, a demo connection nobody uses outlives
// the provider's idle expiry of refresh tokens (configured at 4s here):
// the broker refreshes it in the background. The same connection at a
// provider without keep_alive dies and asks to be reconnected.
func TestKeepAlive(t *testing.T) {
	testskip.Short(t, "multi-process test")
	const idle = 4 * time.Second
	s := newOpsServe(t, demoprovider.Options{AccessTTL: 2 * time.Second, RefreshIdleTTL: idle},
		map[string]string{"demo": "    keep_alive: 1h\n    keep_alive_refresh: 1s\n"}, "--keep-alive-interval", "300ms")
	s.connect("demo", nil)
	s.connect("demo2", nil)
	connected := time.Now()
	kept := func() int {
		n := 0
		for _, e := range s.demos["demo"].Events() {
			if e.Kind == "token" && e.GrantType == "refresh_token" && e.Status == 200 {
				n++
			}
		}
		return n
	}
	// Idle past twice the idle expiry, watching the keep-alive work.
	deadline := time.Now().Add(60 * time.Second)
	for time.Since(connected) < 2*idle+time.Second || kept() < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("keep-alive refreshed demo %d times in %s", kept(), time.Since(connected))
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, e := range s.demos["demo2"].Events() {
		if e.Kind == "token" && e.GrantType == "refresh_token" {
			t.Fatalf("demo2 (no keep_alive) was refreshed while idle: %+v", e)
		}
	}
	call := func(provider string) mcpAnswer {
		a, err := mcpCall(s.lb.srv.Client(), s.lb.srv.URL, "", s.bearers["alice"], "provider_request",
			map[string]any{"provider": provider, "method": "GET", "path": "/user"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	if a := call("demo"); a.Result.ResultType != "complete" || a.Result.IsError || !strings.Contains(a.Raw, "alice-demo") {
		t.Fatalf("the kept connection after %s idle: %s", time.Since(connected).Round(time.Second), a.Raw)
	}
	if a := call("demo2"); a.Result.ResultType != "input_required" {
		t.Fatalf("the connection without keep_alive still works after %s idle: %s", time.Since(connected).Round(time.Second), a.Raw)
	}
	resp, err := http.Get(s.proc.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(m), `credbroker_keepalive_refreshes_total{outcome="refreshed",provider="demo"}`) {
		t.Fatalf("no keep-alive metric:\n%s", grepLines(string(m), "credbroker_keepalive"))
	}
	started := func(logs string) bool {
		return strings.Contains(grepLines(logs, `{"time"`), "keep-alive: this process runs the passes")
	}
	if !s.proc.logs.WaitUntil(started, s.proc.exited, 30*time.Second) {
		t.Fatalf("the keep-alive loop did not start:\n%s", grepLines(s.proc.logs.String(), `{"time"`))
	}
}

// TestWebhooksReplicas: two replicas on one PostgreSQL database deliver
// each of 200 events exactly once (the receiver deduplicates by
// webhook-id and counts), sharing the work.
func TestWebhooksReplicas(t *testing.T) {
	testskip.Short(t, "multi-process test")
	t.Parallel()
	secret := newWebhookSecret()
	hooks := newHookReceiver(t, secret)
	hooks.delay = 5 * time.Millisecond
	file := filepath.Join(t.TempDir(), "webhooks.yaml")
	if err := os.WriteFile(file, []byte("endpoints:\n  apps:\n    url: "+hooks.srv.URL+"/hooks\n    secret: ${APPS_WEBHOOK_SECRET}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newReplicaStackWith(t, []string{"alice"},
		[]string{"--webhooks-file", file, "--webhook-poll", "50ms", "--webhook-timeout", "10s"},
		[]string{"APPS_WEBHOOK_SECRET=" + secret})
	// The test writes 200 connections through the broker's own hook, as a
	// third process sharing the database would (the admin command does).
	cfg, err := webhook.LoadConfig(file, func(string) string { return secret })
	if err != nil {
		t.Fatal(err)
	}
	writer, err := pgstore.Open(t.Context(), s.dbURL, s.keys, pgstore.Options{Changes: webhook.NewPublisher(cfg, nil).Hook()})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	const n = 200
	for i := range n {
		c := vaulttest.Conn(fmt.Sprintf("conn_r%03d", i), vault.Principal{Issuer: s.idp.Issuer(), Subject: fmt.Sprintf("p%03d", i)}, "demo", fmt.Sprint(i))
		if _, err := writer.CreateConnection(t.Context(), c); err != nil {
			t.Fatal(err)
		}
	}
	delivered := func(p *serveProc) int {
		resp, err := http.Get(p.base + "/metrics")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v int
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, `credbroker_webhook_deliveries_total{endpoint="apps",outcome="delivered"} `) {
				fmt.Sscan(strings.Fields(l)[1], &v)
			}
		}
		return v
	}
	hooks.waitFor(t, "200 deliveries counted by both replicas", 60*time.Second, func() bool {
		return delivered(s.a)+delivered(s.b) >= n
	})
	a, b := delivered(s.a), delivered(s.b)
	seen := map[string]int{}
	for _, r := range hooks.requests() {
		if r.Verified != nil {
			t.Fatalf("signature: %v", r.Verified)
		}
		seen[r.ID]++
	}
	if len(hooks.requests()) != n || len(seen) != n || a+b != n {
		t.Fatalf("receiver got %d requests for %d events; replicas counted %d + %d deliveries; want %d each", len(hooks.requests()), len(seen), a, b, n)
	}
	if a == 0 || b == 0 {
		t.Fatalf("one replica delivered everything (%d / %d)", a, b)
	}
	// A replica counts a delivery when the endpoint answered, then removes
	// it from the outbox: the last removals may still be on their way.
	hooks.waitFor(t, "an empty outbox", 30*time.Second, func() bool {
		depth, _, err := writer.OutboxDepth(t.Context())
		return err == nil && depth == 0
	})
	if len(hooks.requests()) != n {
		t.Fatalf("the receiver got %d requests once the outbox was empty, want %d", len(hooks.requests()), n)
	}
	t.Logf("200 events delivered once each: %d by replica a, %d by replica b", a, b)
}
