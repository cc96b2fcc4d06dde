package mcpapi

import (
	"strings"
	"testing"
)

func TestNewReportsEveryProblem(t *testing.T) {
	_, err := New(Options{PublicURL: "http://broker.example.com"})
	if err == nil {
		t.Fatal("New accepted empty options")
	}
	for _, want := range []string{"must use https", "Issuer is required", "Connections is required", "StateKeys is required"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestDefaults(t *testing.T) {
	h := newHarness(t)
	o := h.srv.opts
	if o.ResourceURI != publicURL+"/mcp" || o.AuthorizationServers[0] != h.iss.srv.URL || o.StateTTL.Minutes() != 10 || o.MaxBodyBytes != 1<<20 {
		t.Fatalf("defaults: %+v", o)
	}
}
