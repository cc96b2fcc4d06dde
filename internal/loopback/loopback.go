// Package loopback answers one question the broker asks in several places
// (provider URLs, public URLs, development origins, listen addresses): is
// this host name the local machine? FreeAddr also finds a loopback port for
// a process about to be started (tests and tools).
package loopback

import "net"

// Host reports whether host (a name or an IP literal, without port or
// brackets) is "localhost" or a loopback address (127.0.0.0/8, ::1).
func Host(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
