package oauthflow

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"credbroker/internal/clientaddr"
	"credbroker/web"
)

// TestSecurityEventNamesClientAddr: a security event names the connection's
// peer (its address, without the port), or, with ClientAddr set
// (--trusted-proxies), the client address the trusted proxy forwarded.
func TestSecurityEventNamesClientAddr(t *testing.T) {
	var logs bytes.Buffer
	flow := func(addr func(*http.Request) string) *Flow {
		kit, err := web.NewKit(web.KitOptions{Door: "oauthflow", Pages: []string{"error"}, ClientAddr: addr,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		return &Flow{kit: kit}
	}
	f := flow(clientaddr.Trusted{}.Addr)
	r := httptest.NewRequest("GET", "/auth/callback", nil)
	r.RemoteAddr = "10.1.2.3:5000"
	r.Header.Set("X-Forwarded-For", "192.0.2.1, 198.51.100.7")

	f.securityEvent(r, "login_state_mismatch", nil)
	if !strings.Contains(logs.String(), "remote=10.1.2.3\n") || strings.Contains(logs.String(), "198.51.100.7") {
		t.Fatalf("trusting no proxy, the event should name the peer only:\n%s", logs.String())
	}
	logs.Reset()
	lb, err := clientaddr.Parse("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	f = flow(lb.Addr)
	f.securityEvent(r, "login_state_mismatch", nil)
	if !strings.Contains(logs.String(), "remote=198.51.100.7") || strings.Contains(logs.String(), "192.0.2.1") {
		t.Fatalf("behind the trusted proxy the event should name the forwarded client only:\n%s", logs.String())
	}
}
