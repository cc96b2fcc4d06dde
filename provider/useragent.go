package provider

import (
	"net/http"

	"credbroker/internal/buildinfo"
)

// DefaultUserAgent is "credbroker/<version>", the version broker version
// reports ("devel" for a build that carries none). GitHub asks every API
// client to name itself this way.
func DefaultUserAgent() string {
	return "credbroker/" + buildinfo.Get().Version
}

// userAgent sets User-Agent on every request to a provider made through
// Options.HTTPClient (token endpoints, discovery, account lookups, key
// verification, revocation). API calls set it themselves (send), without
// the copy of the request this makes.
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
