package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/bearer"
	"credbroker/internal/echoapi"
	"credbroker/sidecar"
	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
	"credbroker/vault"
)

func raw(t *testing.T, st *sidecartest.Stack, method, path, secret, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, st.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if secret != "" {
		req.Header.Set("Broker-Sidecar-Secret", secret)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestSidecarRefusals(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	alice := st.UserToken("alice", "")
	for _, tc := range []struct {
		name, secret, token, path, body string
		status                          int
		code                            string
	}{
		{"no secret", "", alice, "/v1/require", `{"provider":"demo"}`, 401, "unauthorized"},
		{"wrong secret", "not-the-secret-0123456789", alice, "/v1/require", `{"provider":"demo"}`, 401, "unauthorized"},
		{"missing user token", st.Secret, "", "/v1/require", `{"provider":"demo"}`, 401, "unauthorized"},
		{"garbage user token", st.Secret, "garbage", "/v1/require", `{"provider":"demo"}`, 401, "unauthorized"},
		{"foreign audience", st.Secret, st.UserToken("alice", "https://other.example/mcp"), "/v1/require", `{"provider":"demo"}`, 401, "unauthorized"},
		{"no export opt-in", st.Secret, alice, "/v1/token", `{"provider":"demo"}`, 403, "token_export_disabled"},
		{"unknown provider", st.Secret, alice, "/v1/require", `{"provider":"nope"}`, 400, "invalid_request"},
		{"unknown field", st.Secret, alice, "/v1/require", `{"provider":"demo","user":"bob"}`, 400, "invalid_request"},
		{"tampered state", st.Secret, alice, "/v1/require", `{"provider":"demo","request_state":"AAAA"}`, 400, "invalid_request_state"},
		{"not connected proxy", st.Secret, alice, "/v1/proxy/demo/user", ``, 409, "not_connected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := http.MethodPost
			if strings.HasPrefix(tc.path, "/v1/proxy/") {
				method = http.MethodGet
			}
			status, body := raw(t, st, method, tc.path, tc.secret, tc.token, tc.body)
			if status != tc.status || !strings.Contains(body, `"error":"`+tc.code+`"`) {
				t.Fatalf("HTTP %d %s; want %d %s", status, body, tc.status, tc.code)
			}
		})
	}
}

func TestSidecarConnectProxyAndExport(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{Export: true})
	ctx := context.Background()
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice, bob := st.UserToken("alice", ""), st.UserToken("bob", "")
	var seen bytes.Buffer
	rr, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}})
	if err != nil || rr.Status != "input_required" || rr.InputRequest.Method != "elicitation/create" || rr.InputRequest.Params.Mode != "url" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	// Bob cannot resume alice's state.
	if _, err := sc.Require(ctx, bob, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState}); !isCode(err, "invalid_request_state") {
		t.Fatalf("bob replaying alice's state: %v", err)
	}
	// Nor can it be used for other arguments.
	if _, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"profile"}, RequestState: rr.RequestState}); !isCode(err, "invalid_request_state") {
		t.Fatalf("state replayed for other scopes: %v", err)
	}
	conn := st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
	rr2, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState})
	if err != nil || rr2.Status != "connected" || rr2.Connection.ID != conn.ID || rr2.Connection.Account != "alice-demo" {
		t.Fatalf("retry: %+v %v", rr2, err)
	}
	resp, err := sc.Do(ctx, alice, "demo", client.Request{Path: "/repos"})
	if err != nil || resp.Status != 200 || !strings.Contains(string(resp.Body), "alice-demo/notes") {
		t.Fatalf("proxy: %+v %v", resp, err)
	}
	seen.Write(resp.Body)
	// The API host a request names must be one of the provider's.
	if _, err := sc.Do(ctx, alice, "demo", client.Request{Path: "/repos", APIHost: "evil.example"}); !isCode(err, "request_refused") {
		t.Errorf("proxy to another host: %v, want request_refused", err)
	}
	for _, p := range []string{"/%2e%2e/token", "/repos%2f..%2fx", "/x@evil"} {
		if _, err := sc.Do(ctx, alice, "demo", client.Request{Path: p}); !isCode(err, "request_refused") {
			t.Errorf("proxy %s: %v, want request_refused", p, err)
		}
	}
	if _, err := sc.Do(ctx, alice, "demo", client.Request{Method: "POST", Path: "/repos", Body: make([]byte, 2<<20)}); !isCode(err, "body_too_large") {
		t.Errorf("oversized body: %v", err)
	}
	// Bob sees nothing of alice's.
	if _, err := sc.Do(ctx, bob, "demo", client.Request{Path: "/user"}); !isCode(err, "not_connected") {
		t.Errorf("bob via alice's connection: %v", err)
	}
	tok, err := sc.Token(ctx, alice, "demo", "")
	if err != nil || tok.AccessToken == "" || tok.ExpiresAt.IsZero() {
		t.Fatalf("export: %+v %v", tok, err)
	}
	stored, _ := st.Store.GetConnection(ctx, conn.ID)
	if tok.AccessToken != stored.Token.AccessToken.Reveal() {
		t.Error("exported token is not the stored access token")
	}
	st.CheckNoTokens("logs", st.Logs.String())
	st.CheckNoTokens("proxy answers", seen.String())
	if strings.Contains(st.Logs.String(), stored.Token.RefreshToken.Reveal()) {
		t.Error("refresh token in logs")
	}
}

func isCode(err error, code string) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Code == code
}

// connect makes user's demo account accountID connected and returns it.
func connect(t *testing.T, st *sidecartest.Stack, sc *client.Client, userToken, user, accountID string) string {
	t.Helper()
	rr, err := sc.Require(context.Background(), userToken, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}})
	if err != nil || rr.Status != "input_required" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	return st.CompleteConnect(rr.InputRequest.Params.URL, user, accountID).ID
}

func TestSidecarRequiredScope(t *testing.T) {
	const scope = "broker:use"
	for _, tc := range []struct {
		name     string
		required string
		scopes   []string
		refused  bool
	}{
		{"required, token has it", scope, []string{"openid", scope}, false},
		{"required, token has none", scope, nil, true},
		{"required, token has others", scope, []string{"openid", "broker:used"}, true},
		{"not required, token has none", "", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := sidecartest.Start(t, sidecartest.Options{Export: true, RequiredScope: tc.required})
			tok := st.UserTokenWithScopes("alice", "", tc.scopes)
			for _, route := range []struct{ method, path, body string }{
				{http.MethodPost, "/v1/require", `{"provider":"demo"}`},
				{http.MethodPost, "/v1/token", `{"provider":"demo"}`},
				{http.MethodGet, "/v1/proxy/demo/user", ``},
			} {
				status, body := raw(t, st, route.method, route.path, st.Secret, tok, route.body)
				refused := status == http.StatusForbidden && strings.Contains(body, `"error":"insufficient_scope"`)
				if refused != tc.refused {
					t.Errorf("%s %s: HTTP %d %s; refused=%v, want %v", route.method, route.path, status, body, refused, tc.refused)
				}
			}
			sc, err := client.New(st.URL, st.Secret, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = sc.Do(context.Background(), tok, "demo", client.Request{Path: "/user"})
			if want := map[bool]string{true: "insufficient_scope", false: "not_connected"}[tc.refused]; !isCode(err, want) {
				t.Errorf("client proxy call: %v, want %s", err, want)
			}
		})
	}
}

func TestSidecarTokenExportIsAudited(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{Export: true})
	ctx := context.Background()
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	connID := connect(t, st, sc, alice, "alice", "1001")
	if strings.Contains(st.AuditLog.String(), "event=token_export") || auditCount(t, st, "token_export") != 0 {
		t.Fatalf("token_export audit events before any export: %s", st.AuditLog.String())
	}
	tok, err := sc.Token(ctx, alice, "demo", "")
	if err != nil {
		t.Fatal(err)
	}
	audit := st.AuditLog.String()
	for _, want := range []string{"event=token_export", "provider=demo", "account=alice-demo",
		"connection=" + connID, "principal.sub=alice", "principal.iss=" + st.IdP.Issuer(), "via=sidecar"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit log lacks %q:\n%s", want, audit)
		}
	}
	if strings.Contains(audit, tok.AccessToken) || strings.Contains(audit, alice) {
		t.Error("audit log contains a token")
	}
	st.CheckNoTokens("audit log", audit)
	if n := auditCount(t, st, "token_export"); n != 1 {
		t.Errorf("credbroker_audit_events_total{event=token_export} = %v, want 1", n)
	}
	// A refused export (unknown account) is not an export.
	if _, err := sc.Token(ctx, alice, "demo", "nobody"); !isCode(err, "not_connected") {
		t.Fatalf("export for another account: %v", err)
	}
	if n := auditCount(t, st, "token_export"); n != 1 {
		t.Errorf("after a refused export: %v events, want 1", n)
	}
}

func auditCount(t *testing.T, st *sidecartest.Stack, kind string) float64 {
	t.Helper()
	mfs, err := st.Telemetry.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "credbroker_audit_events_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "event" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSidecarProxyRedactsEncodedEchoes: the proxy never hands back any
// form of the token an API reflects (base64, hex, buried in base64 text,
// compressed unasked), and refuses an encoding it cannot undo.
func TestSidecarProxyRedactsEncodedEchoes(t *testing.T) {
	echo := echoapi.Start(t)
	st := sidecartest.Start(t, sidecartest.Options{ExtraProviders: `  echo:
    type: oauth2
    authorization_url: ` + echo.URL + `/authorize
    token_url: ` + echo.URL + `/token
    client_id: echo-client
    client_secret: ${DEMO_SECRET}
    account: {url: ` + echo.URL + `/user, id_field: id}
    api: {base_url: ` + echo.URL + `}
`})
	const token = "echo-access-token-0123456789abcdefghij"
	if _, err := st.Store.CreateConnection(context.Background(), vault.Connection{ID: "conn-echo", Principal: st.Principal("alice"),
		Provider: "echo", AccountID: "1", Status: vault.StatusActive, Token: vault.TokenSet{AccessToken: token, TokenType: "Bearer"}}); err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	get := func(form string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodGet, st.URL+"/v1/proxy/echo/echo/"+form, nil)
		req.Header.Set(sidecar.SecretHeader, st.Secret)
		req.Header.Set("Authorization", "Bearer "+alice)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, form := range echoapi.Forms {
		t.Run(form, func(t *testing.T) {
			resp, body := get(form)
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, "REDACTED") {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if leaks := echoapi.Leaks(body, token); len(leaks) > 0 {
				t.Fatalf("the token came back as %v: %s", leaks, body)
			}
			if compressed := form == "gzip" || form == "deflate" || form == "raw-deflate"; compressed != (resp.Header.Get(sidecar.DecodedHeader) != "") ||
				resp.Header.Get("Content-Encoding") != "" {
				t.Fatalf("%s: %s %q, Content-Encoding %q", form, sidecar.DecodedHeader, resp.Header.Get(sidecar.DecodedHeader), resp.Header.Get("Content-Encoding"))
			}
		})
	}
	for _, form := range echoapi.Refused {
		resp, body := get(form)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, `"provider_answer_refused"`) || strings.Contains(body, token) {
			t.Fatalf("%s: %d %s", form, resp.StatusCode, body)
		}
	}
	st.CheckNoTokens("logs", st.Logs.String())
	if strings.Contains(st.Logs.String(), token) {
		t.Fatal("the token is in the log")
	}
}

// TestSidecarAnswers: the host's answer to the relayed input request
// (input_responses, keyed by input_key) reaches the broker, which answers
// the three outcomes as connect_account does: accept keeps the same
// request open until the person finished, decline closes it for good,
// cancel leaves the link usable.
func TestSidecarAnswers(t *testing.T) {
	ctx := context.Background()
	st := sidecartest.Start(t, sidecartest.Options{})
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	ask := func(t *testing.T) *client.RequireResult {
		t.Helper()
		rr, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}})
		if err != nil || rr.Status != "input_required" || rr.InputKey != "connect_demo" {
			t.Fatalf("require: %+v %v", rr, err)
		}
		return rr
	}
	retry := func(rr *client.RequireResult, action string) (*client.RequireResult, error) {
		return sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState,
			InputResponses: mcp.InputResponseMap{rr.InputKey: &mcp.ElicitResult{Action: action}}})
	}
	grantOf := func(t *testing.T, rr *client.RequireResult) vault.Grant {
		t.Helper()
		id := strings.TrimPrefix(rr.InputRequest.Params.URL, sidecartest.PublicURL+"/connect/")
		g, err := st.Store.GetGrant(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	t.Run("decline", func(t *testing.T) {
		rr := ask(t)
		out, err := retry(rr, "decline")
		if err != nil || out.Status != "declined" || !strings.Contains(out.Message, "declined to connect Demo") {
			t.Fatalf("decline: %+v %v", out, err)
		}
		if g := grantOf(t, rr); g.State != vault.GrantDenied || g.Rounds != 0 {
			t.Fatalf("after decline the grant is %s with %d rounds; want denied, no round", g.State, g.Rounds)
		}
		// The request stays declined, whatever a later retry says: no new round opens.
		for _, action := range []string{"", "accept"} {
			var again *client.RequireResult
			if action == "" {
				again, err = sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState})
			} else {
				again, err = retry(rr, action)
			}
			if err != nil || again.Status != "declined" || again.InputRequest != nil {
				t.Fatalf("retry (%q) after decline: %+v %v", action, again, err)
			}
		}
		if g := grantOf(t, rr); g.Rounds != 0 {
			t.Fatalf("retries after a decline counted %d rounds", g.Rounds)
		}
	})

	t.Run("answers of the server's own requests are not the broker's", func(t *testing.T) {
		rr := ask(t)
		out, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState,
			InputResponses: mcp.InputResponseMap{"confirm_delete": &mcp.ElicitResult{Action: "decline"}}})
		if err != nil || out.Status != "input_required" {
			t.Fatalf("another key's decline: %+v %v; want the request still open", out, err)
		}
	})

	t.Run("malformed answers", func(t *testing.T) {
		rr := ask(t)
		state := strconv.Quote(rr.RequestState)
		for _, body := range []string{
			`{"provider":"demo","scopes":["repos"],"request_state":` + state + `,"input_responses":{"connect_demo":{"action":"maybe"}}}`,
			`{"provider":"demo","scopes":["repos"],"request_state":` + state + `,"input_responses":{"connect_demo":"decline"}}`,
			`{"provider":"demo","scopes":["repos"],"request_state":` + state + `,"input_responses":{"connect_demo":{"action":"decline","extra":1}}}`,
			`{"provider":"demo","scopes":["repos"],"request_state":` + state + `,"input_responses":["decline"]}`,
			`{"provider":"demo","scopes":["repos"],"input_responses":{"connect_demo":{"action":"decline"}}}`,
		} {
			status, out := raw(t, st, http.MethodPost, "/v1/require", st.Secret, alice, body)
			if status != http.StatusBadRequest || !strings.Contains(out, `"error":"invalid_request"`) {
				t.Errorf("%s: HTTP %d %s; want 400 invalid_request", body, status, out)
			}
		}
		if g := grantOf(t, rr); g.State != vault.GrantPending {
			t.Fatalf("a malformed answer changed the grant to %s", g.State)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		rr := ask(t)
		out, err := retry(rr, "cancel")
		if err != nil || out.Status != "cancelled" || !strings.Contains(out.Message, "dismissed the request to connect Demo") {
			t.Fatalf("cancel: %+v %v", out, err)
		}
		g := grantOf(t, rr)
		if g.State != vault.GrantPending || g.Rounds != 0 {
			t.Fatalf("after cancel the grant is %s with %d rounds; want pending, no round", g.State, g.Rounds)
		}
		if !strings.Contains(out.Message, g.Expires.UTC().Format(time.RFC3339)) {
			t.Errorf("cancelled message %q does not say until when the link works", out.Message)
		}
		// The link still works: the person connects, the next retry is connected.
		st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
		done, err := retry(rr, "accept")
		if err != nil || done.Status != "connected" || done.Connection.Account != "alice-demo" {
			t.Fatalf("retry after connecting: %+v %v", done, err)
		}
	})

	t.Run("accept", func(t *testing.T) {
		bob := st.UserToken("bob", "")
		rr, err := sc.Require(ctx, bob, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}})
		if err != nil || rr.Status != "input_required" {
			t.Fatalf("require: %+v %v", rr, err)
		}
		again, err := sc.Require(ctx, bob, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState,
			InputResponses: mcp.InputResponseMap{rr.InputKey: &mcp.ElicitResult{Action: "accept"}}})
		if err != nil || again.Status != "input_required" || again.InputRequest.Params.URL != rr.InputRequest.Params.URL ||
			!strings.Contains(again.InputRequest.Params.Message, "Finish connecting") {
			t.Fatalf("accept before finishing: %+v %v; want the same link, told to finish", again, err)
		}
		st.CompleteConnect(rr.InputRequest.Params.URL, "bob", "1002")
		done, err := sc.Require(ctx, bob, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: again.RequestState,
			InputResponses: mcp.InputResponseMap{rr.InputKey: &mcp.ElicitResult{Action: "accept"}}})
		if err != nil || done.Status != "connected" || done.Connection.Account != "bob-demo" {
			t.Fatalf("accept after finishing: %+v %v", done, err)
		}
	})

}

// TestSidecarNamedServers: each co-located server has its own secret and
// name; the name reaches the grant (consent page), the audit log and the
// metrics; a server limited to some providers is refused the others.
func TestSidecarNamedServers(t *testing.T) {
	ctx := context.Background()
	const reposSecret, otherSecret = "repos-secret-0123456789abcdef", "other-secret-0123456789abcdef"
	st := sidecartest.Start(t, sidecartest.Options{Export: true, Callers: []sidecar.Caller{
		{Name: "demorepos", Secret: vault.Secret(reposSecret), Providers: []string{"demo"}},
		{Name: "calendar", Secret: vault.Secret(otherSecret), Providers: []string{"notes"}},
	}})
	alice := st.UserToken("alice", "")
	repos, _ := client.New(st.URL, reposSecret, nil)
	other, _ := client.New(st.URL, otherSecret, nil)

	rr, err := repos.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, ClientName: "Claude <b>Desktop</b>"})
	if err != nil || rr.Status != "input_required" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	g, err := st.Store.GetGrant(ctx, strings.TrimPrefix(rr.InputRequest.Params.URL, sidecartest.PublicURL+"/connect/"))
	if err != nil || g.Server != "demorepos" || g.ClientName != "Claude <b>Desktop</b>" {
		t.Fatalf("grant %+v %v; want server demorepos, the host's name kept as given", g, err)
	}
	st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
	if _, err := repos.Token(ctx, alice, "demo", ""); err != nil {
		t.Fatal(err)
	}
	// The other server is limited to a provider that is not demo.
	for name, call := range map[string]func() error{
		"require": func() error {
			_, err := other.Require(ctx, alice, client.RequireRequest{Provider: "demo"})
			return err
		},
		"proxy": func() error { _, err := other.Do(ctx, alice, "demo", client.Request{Path: "/user"}); return err },
		"token": func() error { _, err := other.Token(ctx, alice, "demo", ""); return err },
	} {
		if err := call(); !isCode(err, "provider_not_allowed") {
			t.Errorf("%s by a server limited to other providers: %v, want provider_not_allowed", name, err)
		}
	}
	if _, err := repos.Do(ctx, alice, "demo", client.Request{Path: "/user"}); err != nil {
		t.Errorf("proxy by the allowed server: %v", err)
	}
	audit := st.AuditLog.String()
	for _, want := range []string{"event=token_export", "via=sidecar server=demorepos", "event=connect"} {
		if !strings.Contains(audit, want) {
			t.Errorf("audit log lacks %q:\n%s", want, audit)
		}
	}
	m := metricText(t, st)
	for _, want := range []string{
		`credbroker_sidecar_requests_total{route="require",server="demorepos",status="200"} 1`,
		`credbroker_sidecar_requests_total{route="token",server="demorepos",status="200"} 1`,
		`credbroker_sidecar_requests_total{route="proxy",server="demorepos",status="200"} 1`,
		`credbroker_sidecar_requests_total{route="proxy",server="calendar",status="403"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if status, _ := raw(t, st, http.MethodPost, "/v1/require", "not-a-configured-secret-000", alice, `{"provider":"demo"}`); status != 401 ||
		!strings.Contains(metricText(t, st), `credbroker_sidecar_requests_total{route="require",server="none",status="401"} 1`) {
		t.Errorf("a wrong secret: HTTP %d, or not counted as server none", status)
	}
}

func metricText(t *testing.T, st *sidecartest.Stack) string {
	t.Helper()
	rr := httptest.NewRecorder()
	st.Telemetry.Handler().ServeHTTP(rr, httptest.NewRequest("GET", "/metrics", nil))
	return rr.Body.String()
}

// TestSidecarCallerConfigRefused: New reports every bad caller at once.
func TestSidecarCallerConfigRefused(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	verify := func(context.Context, string) (bearer.TokenInfo, error) {
		return bearer.TokenInfo{}, bearer.ErrInvalidToken
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	_, err := sidecar.New(sidecar.Options{Verify: verify, Connections: st.Conns, StateKeys: kr, Callers: []sidecar.Caller{
		{Name: "ok", Secret: "same-secret-0123456789abcdef"},
		{Name: "ok", Secret: "another-secret-0123456789abcdef"},
		{Name: "Bad Name", Secret: "third-secret-0123456789abcdef"},
		{Name: "short", Secret: "tiny"},
		{Name: "copy", Secret: "same-secret-0123456789abcdef"},
		{Name: "limited", Secret: "fourth-secret-0123456789abcdef", Providers: []string{"nope"}},
	}})
	if err == nil {
		t.Fatal("New accepted bad callers")
	}
	for _, want := range []string{`caller 2 ("ok"): the name is taken`, `caller 3 ("Bad Name"): a name is`, `caller 4 ("short"): the secret must be at least 16 bytes`,
		`caller 5 ("copy"): the secret is another caller's too`, `caller 6 ("limited"): unknown provider "nope"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q: %v", want, err)
		}
	}
}

// TestSidecarAudiencePolicy: each accepted audience carries its own
// required scope; the MCP endpoint's does not leak onto the others.
func TestSidecarAudiencePolicy(t *testing.T) {
	const tools, agents = "https://tools.example.test/mcp", "https://agents.example.test"
	st := sidecartest.Start(t, sidecartest.Options{Audiences: []sidecar.Audience{
		{URI: sidecartest.Audience, RequiredScope: "broker:use"},
		{URI: tools},
		{URI: agents, RequiredScope: "agents:run"},
	}})
	for _, tc := range []struct {
		name, aud string
		scopes    []string
		status    int
		code      string
	}{
		{"broker audience with its scope", sidecartest.Audience, []string{"broker:use"}, 409, "not_connected"},
		{"broker audience without it", sidecartest.Audience, []string{"agents:run"}, 403, "insufficient_scope"},
		{"audience without a policy", tools, nil, 409, "not_connected"},
		{"audience with its own scope", agents, []string{"agents:run"}, 409, "not_connected"},
		{"audience lacking its own scope", agents, []string{"broker:use"}, 403, "insufficient_scope"},
		{"audience not accepted", "https://elsewhere.example.test", []string{"broker:use"}, 401, "unauthorized"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := raw(t, st, http.MethodGet, "/v1/proxy/demo/user", st.Secret, st.UserTokenWithScopes("alice", tc.aud, tc.scopes), "")
			if status != tc.status || !strings.Contains(body, `"error":"`+tc.code+`"`) {
				t.Fatalf("HTTP %d %s; want %d %s", status, body, tc.status, tc.code)
			}
		})
	}
}

// TestSidecarLogMessagesReadable pins the words of the sidecar's log
// messages as they come out of the redacting handler.
func TestSidecarLogMessagesReadable(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	alice := st.UserToken("alice", "")
	raw(t, st, http.MethodPost, "/v1/require", st.Secret, "garbage-token", `{"provider":"demo"}`)
	raw(t, st, http.MethodPost, "/v1/token", st.Secret, alice, `{"provider":"demo"}`)
	logs := st.Logs.String()
	for _, want := range []string{`msg="sidecar: user token rejected"`, `msg="sidecar: token export refused"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "garbage-token") {
		t.Error("the rejected token was logged")
	}
}

// TestSidecarAPIKey: a demo-keys connection works through the sidecar as
// an OAuth one does (require, url elicitation, retry, proxy with the key
// injected), is never exported by /v1/token, and a 401 to the stored key
// is needs_reconnect until a new key is entered. No answer or log line
// carries a key.
func TestSidecarAPIKey(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{DemoKeys: true, Export: true})
	ctx := context.Background()
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	var seen bytes.Buffer
	keys := client.RequireRequest{Provider: "demo-keys"}
	rr, err := sc.Require(ctx, alice, keys)
	if err != nil || rr.Status != "input_required" || rr.InputRequest.Params.Mode != "url" || !strings.Contains(rr.InputRequest.Params.Message, "enter your Demo keys key there") {
		t.Fatalf("require: %+v %v", rr, err)
	}
	conn := st.CompleteKeyConnect(rr.InputRequest.Params.URL, "alice", "alice-demo")
	retry := keys
	retry.RequestState = rr.RequestState
	rr2, err := sc.Require(ctx, alice, retry)
	if err != nil || rr2.Status != "connected" || rr2.Connection.ID != conn.ID || rr2.Connection.Account != "alice-demo" {
		t.Fatalf("retry: %+v %v", rr2, err)
	}
	resp, err := sc.Do(ctx, alice, "demo-keys", client.Request{Path: "/me"})
	if err != nil || resp.Status != 200 || !strings.Contains(string(resp.Body), `"login":"alice-demo"`) {
		t.Fatalf("proxy: %+v %v", resp, err)
	}
	seen.Write(resp.Body)
	// Never exported, whatever the request says.
	if _, err := sc.Token(ctx, alice, "demo-keys", ""); !isCode(err, "token_export_disabled") {
		t.Fatalf("export of an API key: %v", err)
	}
	status, body := raw(t, st, http.MethodPost, "/v1/token", st.Secret, alice, `{"provider":"demo-keys"}`)
	seen.WriteString(body)
	if status != http.StatusForbidden || !strings.Contains(body, "never handed out") {
		t.Fatalf("export: HTTP %d %s", status, body)
	}
	// The key is replaced at the provider: 401 → needs_reconnect.
	if _, err := st.Demo.RotateKey("alice-demo"); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Do(ctx, alice, "demo-keys", client.Request{Path: "/me"}); !isCode(err, "needs_reconnect") {
		t.Fatalf("proxy with a rejected key: %v", err)
	}
	rr3, err := sc.Require(ctx, alice, keys)
	if err != nil || rr3.Status != "input_required" || !strings.Contains(rr3.InputRequest.Params.Message, "key was rejected; enter a new one") {
		t.Fatalf("require after a 401: %+v %v", rr3, err)
	}
	if again := st.CompleteKeyConnect(rr3.InputRequest.Params.URL, "alice", "alice-demo"); again.ID != conn.ID {
		t.Fatalf("a new key made connection %s, want %s", again.ID, conn.ID)
	}
	if resp, err = sc.Do(ctx, alice, "demo-keys", client.Request{Path: "/me"}); err != nil || resp.Status != 200 {
		t.Fatalf("proxy with the new key: %+v %v", resp, err)
	}
	st.CheckNoTokens("logs", st.Logs.String()+st.AuditLog.String())
	st.CheckNoTokens("answers", seen.String())
}

// TestSidecarScopesNotGranted: the person grants fewer scopes than a
// co-located server's require asked for. The retry's answer is connected
// with the narrower scopes, not_granted naming what is missing and a note
// saying it was not granted and how to ask again (the contract's
// Connection schema is checked on the exchange); a full grant names
// nothing.
func TestSidecarScopesNotGranted(t *testing.T) {
	st := sidecartest.Start(t, sidecartest.Options{})
	ctx := context.Background()
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	req := client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}}
	rr, err := sc.Require(ctx, alice, req)
	if err != nil || rr.Status != "input_required" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	st.CompleteConnectGranting(rr.InputRequest.Params.URL, "alice", "1001", []string{"profile"})
	req.RequestState = rr.RequestState
	done, err := sc.Require(ctx, alice, req)
	if err != nil || done.Status != "connected" || done.Connection == nil {
		t.Fatalf("retry: %+v %v", done, err)
	}
	c := done.Connection
	if !slices.Equal(c.Scopes, []string{"profile"}) || !slices.Equal(c.NotGranted, []string{"repos"}) {
		t.Fatalf("connected with scopes %v, not granted %v; want [profile], [repos]", c.Scopes, c.NotGranted)
	}
	for _, want := range []string{`"repos" was not granted`, "POST /v1/require"} {
		if !strings.Contains(c.Note, want) {
			t.Fatalf("note %q does not say %q", c.Note, want)
		}
	}
	// Asking again: the person grants everything this time.
	rr, err = sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}})
	if err != nil || rr.Status != "input_required" {
		t.Fatalf("require again: %+v %v", rr, err)
	}
	st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
	done, err = sc.Require(ctx, alice, client.RequireRequest{Provider: "demo", Scopes: []string{"repos"}, RequestState: rr.RequestState})
	if err != nil || done.Status != "connected" || done.Connection.NotGranted != nil || done.Connection.Note != "" {
		t.Fatalf("after a full grant: %+v %v, want connected naming nothing missing", done.Connection, err)
	}
}
