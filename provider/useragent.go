package provider

import (
	"net/http"
	"runtime/debug"
)

// DefaultUserAgent is "credbroker/<version>": the module version the Go
// toolchain recorded in the binary, or "devel" for a build without one.
// GitHub asks every API client to name itself this way.
func DefaultUserAgent() string {
	v := "devel"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	return "credbroker/" + v
}

// userAgent sets User-Agent on every request to a provider (token
// endpoints, discovery, account lookups, API calls, revocation).
type userAgent struct {
	next http.RoundTripper
	ua   string
}

func (t userAgent) RoundTrip(r *http.Request) (*http.Response, error) {
	// A RoundTripper must not change the caller's request.
	r = r.Clone(r.Context())
	r.Header.Set("User-Agent", t.ua)
	return t.next.RoundTrip(r)
}

// withUserAgent returns a copy of c whose requests carry ua.
func withUserAgent(c *http.Client, ua string) *http.Client {
	next := c.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	cc := *c
	cc.Transport = userAgent{next: next, ua: ua}
	return &cc
}
