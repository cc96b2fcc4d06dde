package clientaddr

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func request(remote string, xff ...string) *http.Request {
	r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	return r
}

func mustParse(t testing.TB, list string) Trusted {
	t.Helper()
	tr, err := Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestAddr(t *testing.T) {
	lb := mustParse(t, "10.0.0.0/8, 192.0.2.7, fd00::/8")
	for _, c := range []struct {
		name    string
		trusted Trusted
		remote  string
		xff     []string
		want    string
	}{
		{"no proxies trusted: the peer, header ignored", Trusted{}, "203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer: its own address, header ignored", lb, "203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		{"trusted peer, one hop", lb, "10.1.2.3:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"the rightmost untrusted entry wins over the client's claims", lb, "10.1.2.3:5000", []string{"6.6.6.6, 198.51.100.1"}, "198.51.100.1"},
		{"trusted hops are skipped", lb, "10.1.2.3:5000", []string{"6.6.6.6, 198.51.100.1, 192.0.2.7, 10.9.9.9"}, "198.51.100.1"},
		{"several header lines read as one list", lb, "10.1.2.3:5000", []string{"6.6.6.6", "198.51.100.1, 10.9.9.9"}, "198.51.100.1"},
		{"all trusted: the leftmost", lb, "10.1.2.3:5000", []string{"10.5.5.5, 192.0.2.7"}, "10.5.5.5"},
		{"no header: the peer", lb, "10.1.2.3:5000", nil, "10.1.2.3"},
		{"empty header: the peer", lb, "10.1.2.3:5000", []string{""}, "10.1.2.3"},
		{"malformed entry stops at the last trusted hop", lb, "10.1.2.3:5000", []string{"198.51.100.1, bogus, 10.9.9.9"}, "10.9.9.9"},
		{"malformed rightmost entry: the peer", lb, "10.1.2.3:5000", []string{"198.51.100.1, not-an-ip"}, "10.1.2.3"},
		{"trailing comma: the peer", lb, "10.1.2.3:5000", []string{"198.51.100.1,"}, "10.1.2.3"},
		{"entries with ports", lb, "10.1.2.3:5000", []string{"[2001:db8::5]:443, 10.9.9.9:80"}, "2001:db8::5"},
		{"IPv6 peer and entry", lb, "[fd00::1]:5000", []string{"2001:db8::5"}, "2001:db8::5"},
		{"IPv4-mapped peer is the IPv4 address", lb, "[::ffff:10.1.2.3]:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"IPv4-mapped entry is unmapped", lb, "10.1.2.3:5000", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		{"zone dropped", lb, "[fe80::1%eth0]:5000", nil, "fe80::1"},
		{"unix socket peer as is", lb, "@", []string{"198.51.100.1"}, "@"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.trusted.Addr(request(c.remote, c.xff...)); got != c.want {
				t.Fatalf("Addr = %q, want %q", got, c.want)
			}
		})
	}
}

func TestAddrStopsAfterMaxHops(t *testing.T) {
	lb := mustParse(t, "10.0.0.0/8")
	hops := []string{"198.51.100.1"}
	for range maxHops + 4 {
		hops = append(hops, "10.0.0.1")
	}
	if got := lb.Addr(request("10.1.2.3:5000", strings.Join(hops, ", "))); got != "10.0.0.1" {
		t.Fatalf("Addr = %q, want the last trusted hop examined", got)
	}
}

func TestParse(t *testing.T) {
	tr := mustParse(t, " 10.0.0.0/8 ,192.0.2.7,, fd00::/8, ::ffff:172.16.0.0/108, 10.1.2.3/8 ")
	if got, want := tr.String(), "10.0.0.0/8,192.0.2.7/32,fd00::/8,172.16.0.0/12,10.0.0.0/8"; got != want {
		t.Fatalf("String = %q, want %q", got, want)
	}
	if e := mustParse(t, " , "); !e.Empty() {
		t.Fatal("a list of blanks trusts something")
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", "10.0.0", "fe80::/10%eth0", "10.0.0.0/8/8", "*"} {
		if _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "IP address or CIDR prefix") && !strings.Contains(err.Error(), "zone") {
			t.Errorf("Parse(%q) = %v, want a precise error", bad, err)
		}
	}
}

// reference is Addr for a trusted peer and one header line, written the
// plain way: split the list, walk it from the right.
func reference(t Trusted, peer netip.Addr, xff string) string {
	addr := peer
	if xff == "" {
		return addr.String()
	}
	items := strings.Split(xff, ",")
	for i, hops := len(items)-1, 0; i >= 0; i, hops = i-1, hops+1 {
		a, ok := parse(strings.TrimSpace(items[i]))
		if !ok || hops == maxHops {
			return addr.String()
		}
		if addr = a; !t.trusts(a) {
			break
		}
	}
	return addr.String()
}

// FuzzAddr: whatever the peer and the header say, Addr never panics, from
// a peer it does not trust answers the peer, and from a trusted one agrees
// with the plain reference walk, so it never answers an entry left of the
// rightmost untrusted one (the client's own claims).
func FuzzAddr(f *testing.F) {
	f.Add("10.1.2.3:5000", "6.6.6.6, 198.51.100.1, 10.9.9.9")
	f.Add("203.0.113.9:5000", "198.51.100.1")
	f.Add("[fd00::1]:1", "[2001:db8::5]:443,,")
	f.Add("@", "x")
	lb := mustParse(f, "10.0.0.0/8, fd00::/8")
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := request(remote, xff)
		got := lb.Addr(r)
		peer, ok := parse(remote)
		if !ok {
			if got != remote {
				t.Fatalf("unparsable peer %q: Addr = %q", remote, got)
			}
			return
		}
		if !lb.trusts(peer) {
			if got != peer.String() {
				t.Fatalf("untrusted peer %q: Addr = %q", remote, got)
			}
			return
		}
		if want := reference(lb, peer, xff); got != want {
			t.Fatalf("Addr = %q, the reference says %q (peer %q, header %q)", got, want, remote, xff)
		}
	})
}
