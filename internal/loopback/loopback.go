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
