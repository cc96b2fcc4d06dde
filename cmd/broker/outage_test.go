package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/adminapi"
	"credbroker/internal/bearer"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/internal/testskip"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/web"
)

// outageBroker is one broker mounted in-process as serve mounts it, on
// its own pool to the shared PostgreSQL database.
type outageBroker struct {
	name    string
	base    string
	sidecar string
	// admin is the admin API's base URL, served as serve --admin-addr
	// serves it.
	admin string
	rec   *telemetry.Recorder
	logs  *logbuf.Buffer
	// mcp is the bearer for /mcp; gateway for /mcp/u/demo-mcp ("" when
	// the test does not call the gateway on this broker).
	mcp, gateway string
}

// outageStack is two brokers on one PostgreSQL database that the test
// kills and restarts: one in issuer mode (the IdP's tokens: the call's own
// store reads fail first) and one in broker mode (its authorization
// server's tokens: the token family's check fails first); the dev IdP, the
// demo provider, and a demo-mcp gateway entry whose upstream is never
// reached (the person is not connected).
type outageStack struct {
	pg        *pgtest.Server
	dbURL     string
	keys      *vault.Keyring
	idp       *devidp.IdP
	demo      *demoprovider.Provider
	issuer    *outageBroker
	brokerOwn *outageBroker
	users     []string
}

const outageSidecarSecret = "outage-sidecar-secret-0123456789"

// outageAdminScope is what the admin API's tokens hold in the test.
const outageAdminScope = "credbroker-admin"

func newOutageStack(t *testing.T) *outageStack {
	t.Helper()
	s := &outageStack{pg: pgtest.StartT(t), users: []string{"alice"}}
	s.dbURL = s.pg.Schema(t)
	for i := range 16 {
		s.users = append(s.users, fmt.Sprintf("u%02d", i))
	}
	var idpUsers []devidp.User
	for _, u := range s.users {
		idpUsers = append(idpUsers, devidp.User{Username: u, Password: u, Subject: u, Email: u + "@example.test", Name: u})
	}
	s.idp = devidptest.Start(t, idpUsers, nil)
	var err error
	if s.keys, err = vault.ParseKeys(vault.GenerateKey()); err != nil {
		t.Fatal(err)
	}
	pmux := http.NewServeMux()
	psrv := httptest.NewServer(pmux)
	t.Cleanup(psrv.Close)
	iMux, bMux := http.NewServeMux(), http.NewServeMux()
	iSrv, bSrv := httptest.NewServer(iMux), httptest.NewServer(bMux)
	t.Cleanup(iSrv.Close)
	t.Cleanup(bSrv.Close)
	s.demo, err = demoprovider.New(demoprovider.Options{
		BaseURL: psrv.URL + devProviderPath, ClientID: devDemoClientID, ClientSecret: "demo-secret",
		RedirectURIs: []string{iSrv.URL + "/oauth/demo/callback", bSrv.URL + "/oauth/demo/callback"},
	})
	if err != nil {
		t.Fatal(err)
	}
	pmux.Handle(devProviderPath+"/", s.demo.Handler())
	if err := s.idp.AddClient(devidp.Client{ID: devClientID, Secret: "idp-secret",
		RedirectURIs: []string{iSrv.URL + "/auth/callback", bSrv.URL + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	yaml := strings.NewReplacer("{{BASE}}", psrv.URL+devProviderPath, "{{MCP}}", "http://127.0.0.1:9/mcp").Replace(devProvidersYAML)
	providers, err := provider.ParseProviders("outage providers", []byte(yaml), func(string) string { return "demo-secret" })
	if err != nil {
		t.Fatal(err)
	}
	mountOne := func(name string, mux *http.ServeMux, base string, auth *authServerConfig) *outageBroker {
		store, err := pgstore.Open(t.Context(), s.dbURL, s.keys, pgstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		side, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		b := &outageBroker{name: name, base: base, sidecar: "http://" + side.Addr().String(), logs: &logbuf.Buffer{}}
		log := newLogger(b.logs, "json", slog.LevelInfo)
		b.rec = telemetry.New(telemetry.Options{Providers: providers.Names(), Audit: log})
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		m, err := mount(ctx, mux, brokerDeps{
			PublicURL: base, Resource: base + "/mcp", Issuer: s.idp.Issuer(),
			ClientID: devClientID, ClientSecret: "idp-secret", DevMode: true,
			GrantTTL: 10 * time.Minute, StateTTL: 10 * time.Minute,
			Store: store, Keys: s.keys, Providers: providers, Logger: log, HTTPClient: outboundClient(),
			Telemetry: b.rec, MetricsOnMain: true,
			Sidecar:    sidecarConfig{Listener: side, Secret: vault.Secret(outageSidecarSecret)},
			AuthServer: auth,
			Upstreams:  upstreamConfig{AllowPrivate: true, MaxCallTimeout: provider.MaxCallTimeout},
		})
		if err != nil {
			t.Fatal(err)
		}
		verify, err := bearer.NewJWTVerifier(s.idp.Issuer(), []string{base + "/admin"}, outboundClient(), nil)
		if err != nil {
			t.Fatal(err)
		}
		claim, _ := adminapi.ParseClaim("scope=" + outageAdminScope)
		api, err := adminapi.New(adminapi.Options{Connections: m.Conns, Verify: verify, Claim: claim,
			Telemetry: b.rec, Logger: log.With("component", "adminapi")})
		if err != nil {
			t.Fatal(err)
		}
		asrv := httptest.NewServer(web.APIPolicy(api.Handler()))
		t.Cleanup(asrv.Close)
		b.admin = asrv.URL
		if auth != nil {
			tok, _, err := m.Auth.MintAccessToken(ctx, vault.Principal{Issuer: s.idp.Issuer(), Subject: "alice"}, "urn:credbroker:outage", "outage test", "", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			b.mcp = tok
		}
		return b
	}
	s.issuer = mountOne("issuer", iMux, iSrv.URL, nil)
	s.brokerOwn = mountOne("broker", bMux, bSrv.URL, &authServerConfig{Registration: true})
	s.issuer.mcp = s.bearer(t, "alice", s.issuer.base+"/mcp")
	s.issuer.gateway = s.bearer(t, "alice", s.issuer.base+"/mcp/u/demo-mcp")
	return s
}

func (s *outageStack) bearer(t *testing.T, user, aud string) string {
	t.Helper()
	tok, _, err := s.idp.MintAccessToken(user, aud, nil, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// hit is one request of the load and what it got.
type hit struct {
	door       string
	start, end time.Time
	id         int64 // the JSON-RPC id sent, 0 for other requests
	status     int
	header     http.Header
	body       string
	err        error
}

// rpcRequest is a JSON-RPC request to an MCP endpoint: modern (2026-07-28
// tools/call, or another method) or legacy (2025-11-25).
func rpcRequest(url, bearer, method, tool string, args map[string]any, legacy bool) (*http.Request, int64) {
	id := rpcID.Add(1)
	params := map[string]any{}
	h := map[string]string{"Authorization": "Bearer " + bearer, "Content-Type": "application/json",
		"Accept": "application/json, text/event-stream"}
	if method == "tools/call" {
		params["name"], params["arguments"] = tool, args
		h["Mcp-Name"] = tool
	}
	if legacy {
		h["MCP-Protocol-Version"] = "2025-11-25"
	} else {
		params["_meta"] = map[string]any{
			"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
			"io.modelcontextprotocol/clientCapabilities": map[string]any{"elicitation": map[string]any{"url": map[string]any{}}},
			"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "outage-test", "version": "1"},
		}
		h["MCP-Protocol-Version"], h["Mcp-Method"] = "2026-07-28", method
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	for k, v := range h {
		req.Header.Set(k, v)
	}
	return req, id
}

// send performs req for door and records the answer.
func send(c *http.Client, door string, req *http.Request, id int64) hit {
	h := hit{door: door, id: id, start: time.Now()}
	resp, err := c.Do(req)
	h.end = time.Now()
	if err != nil {
		h.err = err
		return h
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	h.status, h.header, h.body = resp.StatusCode, resp.Header, string(b)
	return h
}

// outageProblem says what is wrong with h, an answer given while the store
// was down: anything but the outage's 503 in the door's own format.
func outageProblem(h hit) string {
	switch {
	case h.err != nil:
		return h.err.Error()
	case h.status != http.StatusServiceUnavailable:
		return fmt.Sprintf("HTTP %d, want 503", h.status)
	case h.header.Get("Retry-After") != "2":
		return fmt.Sprintf("Retry-After %q, want 2", h.header.Get("Retry-After"))
	case strings.Contains(h.body, "postgres") || strings.Contains(h.body, "127.0.0.1:") || strings.Contains(h.body, "SQLSTATE"):
		return "the answer shows the cause: " + h.body
	}
	switch h.door {
	case "mcp issuer", "mcp legacy", "mcp broker", "gateway":
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
		if err := json.Unmarshal([]byte(h.body), &a); err != nil || a.Error == nil {
			return "not a JSON-RPC error: " + h.body
		}
		switch {
		case string(a.ID) != fmt.Sprint(h.id):
			return fmt.Sprintf("id %s, want the request's %d", a.ID, h.id)
		case a.Error.Code < -32099 || a.Error.Code > -32000:
			return fmt.Sprintf("code %d is not an implementation-defined server error", a.Error.Code)
		case !a.Error.Data.Retryable:
			return "data.retryable is not true: " + h.body
		case !strings.Contains(a.Error.Message, "storage is unavailable") || !strings.Contains(a.Error.Message, "Retry"):
			return "the message does not say the storage is unavailable and to retry: " + a.Error.Message
		}
	case "sidecar":
		if !strings.Contains(h.body, `"error":"storage_unavailable"`) || h.header.Get("Broker-Error") != "true" {
			return "not the sidecar's storage_unavailable: " + h.body
		}
	case "page":
		if !strings.Contains(h.header.Get("Content-Type"), "text/html") || !strings.Contains(h.body, "storage is unavailable") {
			return "not the outage page: " + h.body
		}
	case "token", "register":
		if !strings.Contains(h.body, `"error":"temporarily_unavailable"`) {
			return "not temporarily_unavailable: " + h.body
		}
	case "admin":
		var e struct {
			Error string `json:"error"`
			Desc  string `json:"error_description"`
		}
		if json.Unmarshal([]byte(h.body), &e) != nil || e.Error != "storage_unavailable" ||
			!strings.Contains(e.Desc, "storage is unavailable") || !strings.Contains(e.Desc, "Retry") {
			return "not the admin API's storage_unavailable: " + h.body
		}
	}
	return ""
}

// TestStorageOutage is issue 33's outage test: PostgreSQL under load is
// killed (SIGKILL) and restarted. While it is down every answer of every
// door (MCP in both --mcp-auth modes and both eras, the gateway, the
// sidecar, the pages, the token endpoint, the admin API) is the outage's 503 with
// Retry-After, none a 500 nor the cause; /readyz is false and the metric
// counts the refusals. Within 5 s of its return every call succeeds with
// the same brokers, no acknowledged write is lost, and a connect flow the
// outage interrupted at the provider's callback completes from the same
// link.
func TestStorageOutage(t *testing.T) {
	testskip.Short(t, "PostgreSQL crash test")
	s := newOutageStack(t)
	ib, bb := s.issuer, s.brokerOwn
	c := &http.Client{Timeout: 20 * time.Second, Transport: testClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	// A signed-in browser on the issuer-mode broker, for the pages.
	page := &routeStack{t: t, base: ib.base}
	page.signIn("alice")

	// alice starts connecting demo and gets as far as the provider's
	// consent: the outage will hit her at the broker's callback.
	first, err := mcpCall(c, ib.base, "", ib.mcp, "connect_account", map[string]any{"provider": "demo"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	key, link := elicitation(t, first)
	jar, _ := cookiejar.New(nil)
	br := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: testClient.Transport}
	req, _ := http.NewRequest(http.MethodGet, link, nil)
	p := fetch(t, br, req)
	p = submitForm(t, br, p, "login", url.Values{"username": {"alice"}, "password": {"alice"}})
	atProvider := submitForm(t, br, p, "/connect/", url.Values{"decision": {"approve"}})
	if !strings.Contains(atProvider.url.String(), devProviderPath) {
		t.Fatalf("approving did not reach the demo provider: %s", atProvider.url)
	}

	// The load: every door, in loops, until stop.
	var (
		mu       sync.Mutex // guards hits and acked
		hits     []hit
		acked    []string // grant ids of acknowledged connect requests
		stopping atomic.Bool
	)
	record := func(h hit) {
		mu.Lock()
		defer mu.Unlock()
		hits = append(hits, h)
		if h.door == "mcp issuer" && h.status == http.StatusOK && strings.Contains(h.body, `"input_required"`) {
			var a mcpAnswer
			if json.Unmarshal([]byte(h.body), &a) == nil {
				for _, raw := range a.Result.InputRequests {
					var ir struct {
						Params struct{ URL string } `json:"params"`
					}
					json.Unmarshal(raw, &ir)
					acked = append(acked, strings.TrimPrefix(ir.Params.URL, ib.base+"/connect/"))
				}
			}
		}
	}
	sidecarToken := s.bearer(t, "alice", ib.base+"/mcp")
	adminToken, _, err := s.idp.MintAccessToken("alice", ib.base+"/admin", []string{outageAdminScope}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	doors := map[string]func(i int) hit{
		"mcp issuer": func(i int) hit {
			tool, args, bearer := "list_connections", map[string]any{}, ib.mcp
			if i%2 == 1 { // a write: a connect request of one of the users
				user := s.users[1+i%(len(s.users)-1)]
				tool, args, bearer = "connect_account", map[string]any{"provider": "demo"}, s.bearer(t, user, ib.base+"/mcp")
			}
			req, id := rpcRequest(ib.base+"/mcp", bearer, "tools/call", tool, args, false)
			return send(c, "mcp issuer", req, id)
		},
		"mcp legacy": func(int) hit {
			req, id := rpcRequest(ib.base+"/mcp", ib.mcp, "tools/call", "list_connections", map[string]any{}, true)
			return send(c, "mcp legacy", req, id)
		},
		"mcp broker": func(int) hit {
			req, id := rpcRequest(bb.base+"/mcp", bb.mcp, "tools/call", "list_connections", map[string]any{}, false)
			return send(c, "mcp broker", req, id)
		},
		"gateway": func(int) hit {
			req, id := rpcRequest(ib.base+"/mcp/u/demo-mcp", ib.gateway, "tools/list", "", nil, false)
			return send(c, "gateway", req, id)
		},
		"sidecar": func(int) hit {
			req, _ := http.NewRequest(http.MethodGet, ib.sidecar+"/v1/proxy/demo/user", nil)
			req.Header.Set("Broker-Sidecar-Secret", outageSidecarSecret)
			req.Header.Set("Authorization", "Bearer "+sidecarToken)
			return send(c, "sidecar", req, 0)
		},
		"page": func(int) hit {
			req, _ := http.NewRequest(http.MethodGet, ib.base+"/connections", nil)
			for _, ck := range page.cookies {
				req.AddCookie(ck)
			}
			return send(c, "page", req, 0)
		},
		"admin": func(int) hit {
			req, _ := http.NewRequest(http.MethodGet, ib.admin+"/admin/v1/connections?"+
				url.Values{"iss": {s.idp.Issuer()}, "sub": {"alice"}}.Encode(), nil)
			req.Header.Set("Authorization", "Bearer "+adminToken)
			return send(c, "admin", req, 0)
		},
		"token": func(int) hit {
			req, _ := http.NewRequest(http.MethodPost, bb.base+"/token",
				strings.NewReader(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"x"}, "client_id": {"no-such-client"}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			return send(c, "token", req, 0)
		},
	}
	var wg sync.WaitGroup
	for _, door := range doors {
		wg.Go(func() {
			for i := 0; !stopping.Load(); i++ {
				h := door(i)
				record(h)
				if h.status == http.StatusServiceUnavailable {
					// A client backing off (less than Retry-After asks: the
					// test wants many answers from the outage).
					<-time.After(20 * time.Millisecond)
				}
			}
		})
	}
	waitHits := func(what string, since time.Time, cond func(h hit) bool, n int) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for {
			mu.Lock()
			got := 0
			for _, h := range hits {
				if h.start.After(since) && cond(h) {
					got++
				}
			}
			mu.Unlock()
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d answers in 60s", what, got, n)
			}
			<-time.After(20 * time.Millisecond)
		}
	}
	loadStart := time.Now()
	waitHits("load before the kill", loadStart, func(h hit) bool { return h.status == http.StatusOK }, 40)

	if err := s.pg.Kill(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	// Every door answers a few times well inside the outage (a second
	// after the kill: calls in flight at the kill are over).
	for name := range doors {
		waitHits("the outage at "+name, down.Add(time.Second), func(h hit) bool { return h.door == name }, 5)
	}
	for _, b := range []*outageBroker{ib, bb} {
		if code := get(t, c, b.base+"/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("%s broker's /readyz during the outage: HTTP %d, want 503", b.name, code)
		}
	}
	// The interrupted connect flow: alice approves at the provider, whose
	// redirect lands on the broker's callback while the store is down.
	cb := submitForm(t, br, atProvider, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if cb.status != http.StatusServiceUnavailable || !strings.Contains(cb.body, "storage is unavailable") || !strings.Contains(cb.body, "connect link") {
		t.Errorf("the provider's callback during the outage: HTTP %d at %s:\n%.1500s", cb.status, cb.url, cb.body)
	}

	restarting := time.Now()
	if err := s.pg.Restart(); err != nil {
		t.Fatalf("restart PostgreSQL: %v\n%s", err, s.pg.Log())
	}
	back := time.Now()
	// Every door answers again, and keeps answering, within 5 s.
	settled := back.Add(5 * time.Second)
	for name := range doors {
		waitHits("after the restart at "+name, settled, func(h hit) bool { return h.door == name }, 5)
	}
	stopping.Store(true)
	wg.Wait()

	// The same link works once the store is back: consent again, the
	// provider, the callback, and the client's retry sees the connection.
	req, _ = http.NewRequest(http.MethodGet, link, nil)
	p = fetch(t, br, req)
	p = submitForm(t, br, p, "/connect/", url.Values{"decision": {"approve"}})
	p = submitForm(t, br, p, "authorize", url.Values{"decision": {"approve"}, "account": {"1001"}})
	if p.status != http.StatusOK || !strings.Contains(p.body, "Connected") {
		t.Fatalf("the same link after the outage ended on %s (HTTP %d):\n%.1500s", p.url, p.status, p.body)
	}
	retry, err := mcpCall(c, ib.base, "", ib.mcp, "connect_account", map[string]any{"provider": "demo"}, map[string]any{
		"inputResponses": map[string]any{key: map[string]any{"action": "accept"}},
		"requestState":   first.Result.RequestState,
	})
	if err != nil || retry.Result.ResultType != "complete" || !strings.Contains(retry.Raw, "alice-demo") {
		t.Fatalf("the client's retry after the outage: %v %s", err, retry.Raw)
	}

	mu.Lock()
	defer mu.Unlock()
	counts := map[string]map[int]int{}
	var during, after int
	var recovered time.Duration // from the store's return to the end of the last 503
	for _, h := range hits {
		if h.status == http.StatusServiceUnavailable && h.end.Sub(back) > recovered {
			recovered = h.end.Sub(back)
		}
		if counts[h.door] == nil {
			counts[h.door] = map[int]int{}
		}
		counts[h.door][h.status]++
		switch {
		case h.err != nil:
			t.Errorf("%s: no answer: %v", h.door, h.err)
		case h.status >= 500 && h.status != http.StatusServiceUnavailable:
			t.Errorf("%s answered HTTP %d: %.300s", h.door, h.status, h.body)
		case h.status == http.StatusServiceUnavailable:
			if problem := outageProblem(h); problem != "" {
				t.Errorf("%s during the outage: %s", h.door, problem)
			}
		}
		if h.start.After(down.Add(time.Second)) && h.end.Before(restarting) {
			// Well inside the outage: the 503 and nothing else.
			during++
			if h.status != http.StatusServiceUnavailable {
				t.Errorf("%s while the store was down (%v..%v after the kill; back at %v): HTTP %d: %.100s", h.door, h.start.Sub(down), h.end.Sub(down), back.Sub(down), h.status, h.body)
			}
		}
		if h.start.After(settled) {
			// Answered as usual: alice has no demo connection yet (the
			// sidecar's 409), the token request names no client (401).
			after++
			if h.status >= 500 || (h.door != "token" && h.door != "sidecar" && h.status != http.StatusOK) {
				t.Errorf("%s more than 5 s after the store came back: HTTP %d: %.300s", h.door, h.status, h.body)
			}
		}
	}
	if during == 0 || after == 0 {
		t.Fatalf("%d answers inside the outage and %d after it: the test saw too little", during, after)
	}
	t.Logf("answers by door and status: %v; %d inside the outage, %d after; the last 503 ended %v after PostgreSQL was back",
		counts, during, after, recovered)

	// The operators' view: the cause in the log, the refusals counted,
	// ready again.
	for _, b := range []*outageBroker{ib, bb} {
		if !strings.Contains(b.logs.String(), "storage unavailable: postgres 127.0.0.1:") {
			t.Errorf("%s broker's log never names the cause:\n%.2000s", b.name, grepLines(b.logs.String(), "{"))
		}
		m := get200(t, c, b.base+"/metrics")
		for _, door := range map[string][]string{"issuer": {"mcp", "sidecar", "page", "admin"}, "broker": {"mcp", "authserver"}}[b.name] {
			if !strings.Contains(m, `credbroker_store_unavailable_total{door="`+door+`"}`) {
				t.Errorf("%s broker's metrics count no refusal at %s:\n%s", b.name, door, grepLines(m, "credbroker_store_unavailable"))
			}
		}
		deadline := time.Now().Add(20 * time.Second)
		for get(t, c, b.base+"/readyz") != http.StatusOK {
			if time.Now().After(deadline) {
				t.Fatalf("%s broker's /readyz not ready 20 s after the store came back", b.name)
			}
			<-time.After(200 * time.Millisecond)
		}
	}

	// No acknowledged write was lost.
	store, err := pgstore.Open(t.Context(), s.dbURL, s.keys, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if len(acked) == 0 {
		t.Fatal("no connect request was acknowledged")
	}
	for _, id := range acked {
		if _, err := store.GetGrant(t.Context(), id); err != nil {
			t.Fatalf("acknowledged grant %s after the crash: %v", id, err)
		}
	}
	t.Logf("%d acknowledged connect requests survived", len(acked))
}

// get returns the status of GET u.
func get(t *testing.T, c *http.Client, u string) int {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// get200 returns the body of GET u, which must answer 200.
func get200(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d", u, resp.StatusCode)
	}
	return string(b)
}
