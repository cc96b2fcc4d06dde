package egress

import "net/netip"

// block is one range of the IANA special-purpose address registries
// (RFC 6890 and its successors) that egress never connects to.
type block struct {
	prefix netip.Prefix
	name   string
}

func blocks(rows ...[2]string) []block {
	out := make([]block, len(rows))
	for i, r := range rows {
		out[i] = block{netip.MustParsePrefix(r[0]), r[1]}
	}
	return out
}

// v4Special is every IPv4 block of the IANA IPv4 Special-Purpose Address
// Registry that is not globally reachable unicast, plus multicast and the
// reserved 240/4 (which holds the limited broadcast address).
var v4Special = blocks(
	[2]string{"0.0.0.0/8", "this network (RFC 791)"},
	[2]string{"10.0.0.0/8", "private-use (RFC 1918)"},
	[2]string{"100.64.0.0/10", "shared address space (RFC 6598)"},
	[2]string{"127.0.0.0/8", "loopback (RFC 1122)"},
	[2]string{"169.254.0.0/16", "link-local (RFC 3927)"},
	[2]string{"172.16.0.0/12", "private-use (RFC 1918)"},
	[2]string{"192.0.0.0/24", "IETF protocol assignments (RFC 6890)"},
	[2]string{"192.0.2.0/24", "documentation (RFC 5737)"},
	[2]string{"192.88.99.0/24", "6to4 relay anycast (RFC 7526)"},
	[2]string{"192.168.0.0/16", "private-use (RFC 1918)"},
	[2]string{"198.18.0.0/15", "benchmarking (RFC 2544)"},
	[2]string{"198.51.100.0/24", "documentation (RFC 5737)"},
	[2]string{"203.0.113.0/24", "documentation (RFC 5737)"},
	[2]string{"224.0.0.0/4", "multicast (RFC 5771)"},
	[2]string{"240.0.0.0/4", "reserved (RFC 1112), limited broadcast (RFC 919)"},
)

// v6Global is IPv6 global unicast (RFC 4291); everything outside it
// (unspecified, loopback, IPv4-compatible, NAT64, discard-only, SRv6 SIDs,
// unique local, link-local, site-local, multicast, unassigned) is special.
var v6Global = netip.MustParsePrefix("2000::/3")

// v6Special are the special-purpose blocks inside 2000::/3.
var v6Special = blocks(
	[2]string{"2001::/23", "IETF protocol assignments (RFC 2928)"},
	[2]string{"2001:db8::/32", "documentation (RFC 3849)"},
	[2]string{"2002::/16", "6to4 (RFC 3056)"},
	[2]string{"3fff::/20", "documentation (RFC 9637)"},
)

// IsSpecialUse reports whether a is an address egress refuses to connect
// to unless AllowPrivate is set: anything but globally reachable unicast.
// IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry;
// zones are ignored; the zero Addr is special.
func IsSpecialUse(a netip.Addr) bool {
	_, special := classify(a)
	return special
}

// classify names the block a falls in ("" for a public address).
func classify(a netip.Addr) (string, bool) {
	a = a.Unmap().WithZone("")
	switch {
	case a.Is4():
		for _, b := range v4Special {
			if b.prefix.Contains(a) {
				return b.name, true
			}
		}
		return "", false
	case a.Is6():
		if !v6Global.Contains(a) {
			return "outside IPv6 global unicast (RFC 4291)", true
		}
		for _, b := range v6Special {
			if b.prefix.Contains(a) {
				return b.name, true
			}
		}
		return "", false
	}
	return "not an address", true
}
