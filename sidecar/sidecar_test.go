package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

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
	rr, err := sc.Require(ctx, alice, "demo", []string{"repos"}, "")
	if err != nil || rr.Status != "input_required" || rr.InputRequest.Method != "elicitation/create" || rr.InputRequest.Params.Mode != "url" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	// Bob cannot resume alice's state.
	if _, err := sc.Require(ctx, bob, "demo", []string{"repos"}, rr.RequestState); !isCode(err, "invalid_request_state") {
		t.Fatalf("bob replaying alice's state: %v", err)
	}
	// Nor can it be used for other arguments.
	if _, err := sc.Require(ctx, alice, "demo", []string{"profile"}, rr.RequestState); !isCode(err, "invalid_request_state") {
		t.Fatalf("state replayed for other scopes: %v", err)
	}
	conn := st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
	rr2, err := sc.Require(ctx, alice, "demo", []string{"repos"}, rr.RequestState)
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
	rr, err := sc.Require(context.Background(), userToken, "demo", []string{"repos"}, "")
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
