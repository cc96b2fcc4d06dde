package egress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"credbroker/internal/loopback"
)

// policy is what is checked before dialling, at a dial and at a redirect.
type policy struct {
	allowPrivate bool
	loopbackHTTP bool
	hosts        []hostPort // nil: any host
}

type hostPort struct{ host, port string } // host lower-case; port "" = the scheme's default

func newPolicy(opts Options) (policy, error) {
	p := policy{allowPrivate: opts.AllowPrivate, loopbackHTTP: opts.AllowLoopbackHTTP}
	var problems []error
	for _, h := range opts.AllowedHosts {
		hp, err := parseAllowedHost(h)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		p.hosts = append(p.hosts, hp)
	}
	if opts.MaxRedirects < 0 {
		problems = append(problems, errors.New("MaxRedirects must not be negative"))
	}
	if len(problems) > 0 {
		return policy{}, fmt.Errorf("egress: %w", errors.Join(problems...))
	}
	return p, nil
}

// parseAllowedHost reads "host" or "host:port" ("[::1]:443" for IPv6).
func parseAllowedHost(s string) (hostPort, error) {
	bad := func(why string) (hostPort, error) {
		return hostPort{}, fmt.Errorf("allowed host %q: %s", s, why)
	}
	if s == "" || strings.ContainsAny(s, "/@?#\\ \t") || strings.Contains(s, "://") {
		return bad("want a host name or address, with an optional port, and nothing else")
	}
	host, port := s, ""
	if h, p, err := net.SplitHostPort(s); err == nil {
		host, port = h, p
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != p {
			return bad("the port must be a number from 1 to 65535")
		}
	} else if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		host = s[1 : len(s)-1]
	}
	if host == "" || strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && !isIP(host)) {
		return bad("want a host name or address, with an optional port, and nothing else")
	}
	return hostPort{host: strings.ToLower(host), port: port}, nil
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

func defaultPort(scheme string) string {
	if scheme == "http" {
		return "80"
	}
	return "443"
}

// check is the policy before dialling: scheme, then host.
func (p policy) check(u *url.URL) error {
	switch {
	case u.Scheme == "https":
	case u.Scheme == "http" && p.loopbackHTTP && loopback.Host(u.Hostname()):
	default:
		return &RefusedError{Err: ErrNotHTTPS, Host: u.Host, Reason: "scheme " + strconv.Quote(u.Scheme)}
	}
	if p.hosts == nil {
		return nil
	}
	host, port := strings.ToLower(u.Hostname()), u.Port()
	for _, a := range p.hosts {
		if a.host == host && (a.port == port || a.port == "" && port == defaultPort(u.Scheme) || port == "" && a.port == defaultPort(u.Scheme)) {
			return nil
		}
	}
	return &RefusedError{Err: ErrHostNotAllowed, Host: u.Host}
}

// sameOrigin reports whether a and b name the same scheme, host and port.
func sameOrigin(a, b *url.URL) bool {
	port := func(u *url.URL) string {
		if p := u.Port(); p != "" {
			return p
		}
		return defaultPort(u.Scheme)
	}
	return a.Scheme == b.Scheme && strings.EqualFold(a.Hostname(), b.Hostname()) && port(a) == port(b)
}

// checkRedirect is the client's CheckRedirect.
func (p policy) checkRedirect(req *http.Request, via []*http.Request, follow bool, limit int) error {
	first := via[0]
	refuse := func(reason string) error {
		status := 0
		if req.Response != nil {
			status = req.Response.StatusCode
		}
		return &RefusedError{Err: ErrRedirectRefused, Host: first.URL.Host, Status: status, Reason: reason}
	}
	switch {
	case !follow:
		return refuse("this client follows no redirects")
	case carriesCredentials(first):
		return refuse("the request carries credentials")
	case first.Body != nil && first.Body != http.NoBody:
		return refuse("the request has a body")
	case len(via) > limit:
		return refuse(fmt.Sprintf("more than %d redirects", limit))
	case !sameOrigin(first.URL, req.URL):
		return refuse("to another host or scheme")
	}
	return p.check(req.URL)
}

func carriesCredentials(r *http.Request) bool {
	h := r.Header
	return r.URL.User != nil || h.Get("Authorization") != "" || h.Get("Cookie") != "" || h.Get("Proxy-Authorization") != ""
}
