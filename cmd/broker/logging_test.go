package main

import (
	"net/http"
	"strings"
	"testing"
)

// TestLogMessagesReadable: the broker's own log (JSON, behind the
// redacting handler, as serve and dev write it) keeps the words of a
// message about a token, and masks the token.
func TestLogMessagesReadable(t *testing.T) {
	s := newOpsStack(t)
	const bogus = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJtYWxsb3J5In0.c2lnbmF0dXJl"
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+bogus)
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("HTTP %d, want 401", resp.StatusCode)
	}
	logs := s.logs.String()
	if !strings.Contains(logs, `"msg":"mcpapi: bearer token rejected"`) {
		t.Errorf("log lacks the message as written:\n%s", logs)
	}
	if strings.Contains(logs, bogus) {
		t.Error("the rejected token was logged")
	}
}
