package provider

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestPrepareUpstream: readying an entry for a connect request registers
// the broker dynamically when that is the method, once (the authorization
// request then uses that client), with the same backoff after a failure
// (each refusal an *UpstreamError of its kind); a pre-registered client
// and a server that takes no token need nothing.
func TestPrepareUpstream(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	reg := r.registry("", "")
	k := r.client(reg, nil)
	r.as.with(func() { r.as.regFail = 1 })
	if ue := upstreamError(t, k.PrepareUpstream(context.Background(), "linear")); ue.Kind != UpstreamRegistrationFailed || !strings.Contains(ue.Reason, "tries again after a minute") {
		t.Fatalf("a failed registration: %s %q", ue.Kind, ue.Reason)
	}
	r.clock.Advance(30 * time.Second)
	if ue := upstreamError(t, k.PrepareUpstream(context.Background(), "linear")); ue.Kind != UpstreamRegistrationBackoff || len(r.as.requests("/register")) != 1 {
		t.Fatalf("within the minute: %s %q, %d registration requests", ue.Kind, ue.Reason, len(r.as.requests("/register")))
	}
	r.clock.Advance(31 * time.Second)
	for range 2 {
		if err := k.PrepareUpstream(context.Background(), "linear"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.as.requests("/register")); n != 2 {
		t.Fatalf("%d registration requests, want 2 (the failed one and one that worked)", n)
	}
	a, _ := r.authorize(k, nil)
	u, _ := url.Parse(a.URL)
	if got := u.Query().Get("client_id"); !strings.HasPrefix(got, "dcr-client-") || len(r.as.requests("/register")) != 2 {
		t.Fatalf("the authorization request is as %q after %d registrations", got, len(r.as.requests("/register")))
	}

	// A pre-registered client: nothing is registered or stored.
	r2 := newMCPRig(t, "127.0.0.1")
	if err := r2.client(r2.registry("", "    client_id: static-client\n"), nil).PrepareUpstream(context.Background(), "linear"); err != nil {
		t.Fatal(err)
	}
	if gets, puts := r2.clients.counts(); puts != 0 || len(r2.as.requests("/register")) != 0 {
		t.Fatalf("static: %d registrations stored (%d lookups), %d registration requests", puts, gets, len(r2.as.requests("/register")))
	}
	open, err := ParseProviders("o.yaml", []byte("providers:\n  open:\n    type: mcp\n    mcp: {url: "+r.up.url+", auth: none}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.client(open, nil).PrepareUpstream(context.Background(), "open"); err != nil {
		t.Fatalf("open: %v", err)
	}
	if err := k.PrepareUpstream(context.Background(), "nope"); !errors.Is(err, ErrUnknownProvider) {
		t.Fatalf("unknown provider: %v", err)
	}
}
