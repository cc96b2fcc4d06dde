// Package loopback answers one question the broker asks in several places
// (provider URLs, public URLs, development origins, listen addresses): is
// this host name the local machine? CheckURL applies it to a configured
// endpoint (https, or http on loopback only). FreeAddr also finds a loopback port for
// a process about to be started (tests and tools).
package loopback

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// CheckURL accepts an absolute https URL, or http on a loopback host,
// without user info or fragment: what the broker's configuration takes
// for an endpoint it calls.
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL", raw)
	}
	if u.Host == "" || u.User != nil || u.Fragment != "" {
		return fmt.Errorf("%q is not an absolute URL with a host (no user info, no fragment)", raw)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if Host(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%q must use https (http is allowed on loopback only)", raw)
	}
	return fmt.Errorf("%q must use https", raw)
}

// Host reports whether host (a name or an IP literal, without port or
// brackets) is "localhost" or a loopback address (127.0.0.0/8, ::1).
func Host(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// SameRedirect reports whether a and b are http redirect URIs on the same
// loopback host that differ at most in the port (RFC 8252 section 7.3: a
// native app listens on whatever port it gets).
func SameRedirect(a, b string) bool {
	ua, ea := url.Parse(a)
	ub, eb := url.Parse(b)
	if ea != nil || eb != nil || ua.Scheme != "http" || ub.Scheme != "http" || !Host(ua.Hostname()) {
		return false
	}
	return ua.Hostname() == ub.Hostname() && ua.User == nil && ub.User == nil &&
		ua.EscapedPath() == ub.EscapedPath() && ua.RawQuery == ub.RawQuery && ub.Fragment == "" &&
		!strings.Contains(b, "#") && validPort(ub.Port())
}

func validPort(p string) bool {
	if p == "" {
		return true
	}
	if len(p) > 5 {
		return false
	}
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			return false
		}
		n = n*10 + int(c-'0')
	}
	return n > 0 && n < 65536
}
