package sidecar_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
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
