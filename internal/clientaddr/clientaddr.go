// Package clientaddr finds the address of the client behind a request: the
// connection's peer, or, when the peer is a proxy the operator trusts, the
// nearest address in X-Forwarded-For that is not a trusted proxy.
//
// X-Forwarded-For is read only from a trusted peer, and from the right: each
// trusted proxy appends the address it received the request from, so the
// rightmost entry not itself a trusted proxy is the first address no
// trusted party can have been lied to about. Entries to its left are the
// client's own claims and are never used. An entry that is not an address
// ends the walk at the last trusted hop, so a malformed or forged header
// can make the answer a proxy's address but never an address of the
// client's choosing.
package clientaddr

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// maxHops bounds the X-Forwarded-For entries examined; a chain of trusted
// proxies longer than this ends at the last one examined.
const maxHops = 16

// Trusted is the set of proxies whose X-Forwarded-For is believed. The zero
// value trusts none: Addr is then the connection's peer.
type Trusted struct {
	prefixes []netip.Prefix
}

// Parse reads a comma-separated list of addresses and CIDR prefixes
// ("10.0.0.0/8, 192.0.2.7, fd00::/8"). Blanks around items are ignored;
// an empty list trusts none.
func Parse(list string) (Trusted, error) {
	var t Trusted
	for item := range strings.SplitSeq(list, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if strings.Contains(item, "/") {
			p, err := netip.ParsePrefix(item)
			if err != nil {
				return Trusted{}, fmt.Errorf("%q is not an IP address or CIDR prefix", item)
			}
			if p.Addr().Zone() != "" {
				return Trusted{}, fmt.Errorf("%q: a prefix cannot carry a zone", item)
			}
			t.prefixes = append(t.prefixes, unmapPrefix(p.Masked()))
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return Trusted{}, fmt.Errorf("%q is not an IP address or CIDR prefix", item)
		}
		a = a.Unmap().WithZone("")
		t.prefixes = append(t.prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return t, nil
}

// unmapPrefix turns an IPv4-mapped IPv6 prefix (::ffff:10.0.0.0/104) into
// its IPv4 form, since addresses are compared unmapped.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// Empty reports whether no proxy is trusted.
func (t Trusted) Empty() bool { return len(t.prefixes) == 0 }

// String lists the trusted prefixes as Parse reads them.
func (t Trusted) String() string {
	s := make([]string, len(t.prefixes))
	for i, p := range t.prefixes {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (t Trusted) trusts(a netip.Addr) bool {
	for _, p := range t.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Addr is the client address of r (an IP address without port). When the
// peer is not a trusted proxy, or none is configured, it is the peer's
// address; r.RemoteAddr as is when that is not an IP address and port
// (a Unix socket).
func (t Trusted) Addr(r *http.Request) string {
	peer, ok := parse(r.RemoteAddr)
	if !ok {
		return r.RemoteAddr
	}
	if !t.trusts(peer) {
		return peer.String()
	}
	addr := peer
	hops := 0
	values := r.Header.Values("X-Forwarded-For")
	for i := len(values) - 1; i >= 0; i-- {
		rest := values[i]
		for rest != "" {
			var item string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				rest, item = rest[:j], rest[j+1:]
			} else {
				rest, item = "", rest
			}
			a, ok := parse(strings.TrimSpace(item))
			if !ok || hops == maxHops {
				return addr.String()
			}
			hops++
			addr = a
			if !t.trusts(a) {
				return a.String()
			}
		}
	}
	return addr.String()
}

// parse reads an X-Forwarded-For entry or a RemoteAddr: an IP address,
// optionally with a port ("192.0.2.1:443", "[2001:db8::1]:443"), returned
// unmapped and without zone.
func parse(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}
