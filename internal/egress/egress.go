// Package egress is the one outbound HTTP policy for destinations the
// broker does not control: hosted MCP servers and their authorization
// servers (the gateway), and whatever a client_id URL names (Client ID
// Metadata Documents). Such a URL is a server-side request forgery vector,
// so every request goes through these checks, in this order:
//
//  1. Before anything is dialled: the scheme must be https (plain http only
//     to a loopback host, and only with AllowLoopbackHTTP), and with
//     AllowedHosts the URL's host must be one of them (exact host, case
//     insensitive; an entry without a port means the scheme's default
//     port). Refusals: ErrNotHTTPS, ErrHostNotAllowed.
//  2. At every dial: the host name is resolved (Options.Resolver, else the
//     system resolver) and every address it resolves to is checked against
//     the special-use ranges of RFC 6890 and its successors (IsSpecialUse);
//     one special-use answer refuses the name, so a name mixing public and
//     private answers (DNS rebinding) reaches nothing. Only the checked
//     addresses are dialled, and the dialer checks the address it connects
//     to once more. Refusal: ErrSpecialAddress. AllowPrivate turns this
//     check off (tests on loopback, `--upstream-allow-private`).
//  3. Redirects are not followed (ErrRedirectRefused) unless
//     FollowRedirects is set; then each hop must stay on the same host
//     (scheme, name and port) and passes 1 and 2 again, and a request that
//     carries credentials (Authorization, Cookie, Proxy-Authorization, URL
//     user info) or a body (a token request's code, refresh token or
//     client secret; an MCP message) follows no redirect at all.
//
// NewDialer is check 2 alone, for a client that keeps its own
// http.Transport (the authorization server's fetch of Client ID Metadata
// Documents, which checks the scheme and refuses redirects itself): the
// same ranges, the same dial.
//
// No proxy is ever used: a proxy would connect on the broker's behalf to
// anything. Every refusal is a *RefusedError wrapping one of the
// sentinels, so callers branch with errors.Is; its message names the host
// (never a path or query) and, for addresses, the range.
//
// Responses can be capped: Options.MaxResponseBytes on every body, or
// ReadAll and CapBody where the caller reads. Reading past the cap gives
// ErrTooLarge. No request asks for a compressed answer, and none is
// decompressed: a cap counts the bytes the server sent.
//
// egress imports only the standard library and internal/loopback, so the
// provider layer and the front doors can both use it.
package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// Refusal is a kind of request or answer egress refuses. The kinds are
// constants (no importer can reassign them) matched with errors.Is.
type Refusal string

func (r Refusal) Error() string { return string(r) }

// The refusals. A *RefusedError wraps exactly one of the first four;
// ErrTooLarge is the answer to reading past a cap (ReadAll, CapBody,
// Options.MaxResponseBytes).
const (
	ErrSpecialAddress  Refusal = "the address is a loopback, private, link-local or other special-use address"
	ErrHostNotAllowed  Refusal = "the host is not one this client may reach"
	ErrNotHTTPS        Refusal = "only https is allowed"
	ErrRedirectRefused Refusal = "the redirect is not followed"
	ErrTooLarge        Refusal = "the response is larger than allowed"
)

// RefusedError is a request egress refused, and why.
type RefusedError struct {
	// Err is ErrSpecialAddress, ErrHostNotAllowed, ErrNotHTTPS or
	// ErrRedirectRefused.
	Err Refusal
	// Host is the host the request was for (host or host:port as in the
	// URL); never a path, query or user info.
	Host string
	// Addr is the refused address (ErrSpecialAddress), Range the name of
	// its special-use range.
	Addr  netip.Addr
	Range string
	// Status is the redirect's HTTP status and Reason why it was refused
	// (ErrRedirectRefused).
	Status int
	Reason string
}

func (e *RefusedError) Error() string {
	var b strings.Builder
	b.WriteString("egress: ")
	if e.Host != "" && !(e.Addr.IsValid() && e.Host == e.Addr.String()) {
		b.WriteString(e.Host + ": ")
	}
	switch {
	case e.Addr.IsValid():
		fmt.Fprintf(&b, "%s is %s: ", e.Addr, e.Range)
	case e.Status != 0:
		fmt.Fprintf(&b, "HTTP %d: ", e.Status)
	}
	b.WriteString(string(e.Err))
	if e.Reason != "" {
		b.WriteString(" (" + e.Reason + ")")
	}
	return b.String()
}

func (e *RefusedError) Unwrap() error { return e.Err }

// Resolver looks up the addresses of a host name (never an IP literal).
// The default is the system resolver.
type Resolver func(ctx context.Context, host string) ([]netip.Addr, error)

// Options configure a client or transport. The zero value is the strict
// policy: https to any public address, no redirects, 30-second requests.
type Options struct {
	// AllowPrivate lets requests reach special-use addresses (loopback,
	// private, link-local, …): development and tests on loopback.
	AllowPrivate bool
	// AllowedHosts, when not empty, are the only hosts requests may go
	// to: "host" or "host:port" (an IPv6 literal in brackets), compared
	// exactly and case-insensitively; without a port the scheme's default
	// port. Anything else is refused before dialling.
	AllowedHosts []string
	// AllowLoopbackHTTP allows plain http to a loopback host (localhost,
	// 127.0.0.0/8, ::1), as OAuth and MCP allow for local development;
	// reaching it still needs AllowPrivate. Every other http URL is
	// refused.
	AllowLoopbackHTTP bool
	// FollowRedirects follows up to MaxRedirects redirects on the same
	// host, each checked again, for requests without credentials or a
	// body. Leave it false for a client whose requests carry a token.
	FollowRedirects bool
	MaxRedirects    int // default 5

	// Timeout bounds a whole exchange, the body included (default 30
	// seconds; negative: none, the request's context decides).
	Timeout time.Duration
	// DialTimeout and TLSHandshakeTimeout bound connecting (default 10
	// seconds each); ResponseHeaderTimeout bounds waiting for the answer's
	// headers once the request is sent (default: none, Timeout decides).
	DialTimeout           time.Duration
	TLSHandshakeTimeout   time.Duration
	ResponseHeaderTimeout time.Duration
	// MaxResponseBytes caps every response body (CapBody); 0: no cap.
	MaxResponseBytes int64

	// TLSConfig is cloned for the transport (tests pass the pool that
	// trusts their server); its MinVersion is at least TLS 1.2.
	TLSConfig *tls.Config
	// Resolver replaces the system resolver (tests).
	Resolver Resolver
}

const (
	defaultTimeout      = 30 * time.Second
	defaultDialTimeout  = 10 * time.Second
	defaultMaxRedirects = 5
	maxHeaderBytes      = 64 << 10
)

// New returns an HTTP client applying opts.
func New(opts Options) (*http.Client, error) {
	t, err := NewTransport(opts)
	if err != nil {
		return nil, err
	}
	timeout := opts.Timeout
	switch {
	case timeout == 0:
		timeout = defaultTimeout
	case timeout < 0:
		timeout = 0
	}
	maxRedirects := opts.MaxRedirects
	if maxRedirects == 0 {
		maxRedirects = defaultMaxRedirects
	}
	return &http.Client{
		Transport: t,
		Timeout:   timeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			return t.policy.checkRedirect(req, via, opts.FollowRedirects, maxRedirects)
		},
	}, nil
}

// Transport is an http.RoundTripper applying the policy's checks before
// dialling and at every dial. Redirects are the client's: use New, or a
// client whose CheckRedirect refuses them.
type Transport struct {
	base     *http.Transport
	policy   policy
	maxBytes int64
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns the transport of a client applying opts.
func NewTransport(opts Options) (*Transport, error) {
	p, err := newPolicy(opts)
	if err != nil {
		return nil, err
	}
	if opts.MaxResponseBytes < 0 {
		return nil, errors.New("egress: MaxResponseBytes must not be negative")
	}
	d := newDialer(p, opts)
	var tc *tls.Config
	if opts.TLSConfig != nil {
		tc = opts.TLSConfig.Clone()
	} else {
		tc = &tls.Config{}
	}
	tc.MinVersion = max(tc.MinVersion, tls.VersionTLS12)
	return &Transport{
		policy:   p,
		maxBytes: opts.MaxResponseBytes,
		base: &http.Transport{
			Proxy:                  nil, // a proxy would connect on our behalf to anything
			DialContext:            d.dialContext,
			TLSClientConfig:        tc,
			TLSHandshakeTimeout:    durationOr(opts.TLSHandshakeTimeout, defaultDialTimeout),
			ResponseHeaderTimeout:  max(opts.ResponseHeaderTimeout, 0),
			MaxResponseHeaderBytes: maxHeaderBytes,
			// Nothing is asked compressed (Go would ask gzip and decompress):
			// no decoder runs on what an untrusted server sends, and answers
			// that are mostly small JSON save the work both ways.
			DisableCompression: true,
			// Kept for reuse: up to 64 connections to one host (a gateway
			// relays many people's calls to one server at once; a dial is
			// the dearest part of a relayed call), 256 in all.
			MaxIdleConns:        256,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			ForceAttemptHTTP2:   true,
		},
	}, nil
}

func durationOr(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// RoundTrip refuses a request the policy does not allow, before any
// connection, and otherwise sends it.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.policy.check(req.URL); err != nil {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper closes the body, even on errors
		}
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if t.maxBytes > 0 {
		resp.Body = CapBody(resp.Body, t.maxBytes)
	}
	return resp, nil
}

// CloseIdleConnections closes the transport's idle connections (the next
// request dials, and so resolves and checks, again).
func (t *Transport) CloseIdleConnections() { t.base.CloseIdleConnections() }
