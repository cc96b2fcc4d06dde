package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"testing"
)

func TestIsSpecialUse(t *testing.T) {
	special := []string{
		// IPv4: each range's first and last address.
		"0.0.0.0", "0.255.255.255", "10.0.0.0", "10.255.255.255", "100.64.0.0", "100.127.255.255",
		"127.0.0.1", "127.255.255.255", "169.254.0.0", "169.254.169.254", "172.16.0.0", "172.31.255.255",
		"192.0.0.0", "192.0.0.255", "192.0.2.1", "192.88.99.1", "192.168.0.0", "192.168.255.255",
		"198.18.0.0", "198.19.255.255", "198.51.100.7", "203.0.113.9", "224.0.0.1", "239.255.255.255",
		"240.0.0.0", "255.255.255.255",
		// IPv6.
		"::", "::1", "::127.0.0.1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "::ffff:169.254.169.254",
		"64:ff9b::a00:1", "64:ff9b:1::1", "100::1", "2001::1", "2001:1ff:ffff::1", "2001:db8::1",
		"2002:7f00:1::1", "3fff::1", "3fff:fff:ffff::1", "5f00::1", "fc00::1", "fd12:3456::1", "fe80::1",
		"fe80::1%eth0", "fec0::1", "ff02::1", "4000::1", "1fff:ffff::1",
	}
	public := []string{
		"1.1.1.1", "8.8.8.8", "9.255.255.255", "11.0.0.0", "100.63.255.255", "100.128.0.0", "126.255.255.255",
		"128.0.0.0", "169.253.255.255", "169.255.0.0", "172.15.255.255", "172.32.0.0", "192.0.1.0", "192.0.3.0",
		"192.88.98.255", "192.88.100.0", "192.167.255.255", "192.169.0.0", "198.17.255.255", "198.20.0.0",
		"198.51.99.255", "198.51.101.0", "203.0.112.255", "203.0.114.0", "223.255.255.255", "93.184.216.34",
		"::ffff:8.8.8.8",
		"2000::1", "2001:200::1", "2001:db7:ffff::1", "2001:db9::1", "2003::1", "2606:4700::1111",
		"2a00:1450:4001::1", "3ffe::1", "3fff:1000::1",
	}
	for _, s := range special {
		if !IsSpecialUse(netip.MustParseAddr(s)) {
			t.Errorf("%s: public, want special-use", s)
		}
	}
	for _, s := range public {
		if IsSpecialUse(netip.MustParseAddr(s)) {
			n, _ := classify(netip.MustParseAddr(s))
			t.Errorf("%s: special-use (%s), want public", s, n)
		}
	}
	if !IsSpecialUse(netip.Addr{}) {
		t.Error("the zero Addr is public")
	}
}

// refSpecialUse is the classifier written another way: netip's
// predicates and the remaining IPv4 ranges, and IPv6 by its bytes.
func refSpecialUse(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() {
		return true
	}
	if a.Is4() {
		if a.IsPrivate() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsMulticast() || a.IsUnspecified() {
			return true
		}
		b := a.As4()
		switch {
		case b[0] == 0, b[0] >= 240,
			b[0] == 100 && b[1]&0xc0 == 64,
			b[0] == 192 && b[1] == 0 && (b[2] == 0 || b[2] == 2),
			b[0] == 192 && b[1] == 88 && b[2] == 99,
			b[0] == 198 && (b[1] == 18 || b[1] == 19),
			b[0] == 198 && b[1] == 51 && b[2] == 100,
			b[0] == 203 && b[1] == 0 && b[2] == 113:
			return true
		}
		return false
	}
	b := a.As16()
	switch {
	case b[0]&0xe0 != 0x20: // not 2000::/3
		return true
	case b[0] == 0x20 && b[1] == 0x01 && b[2] <= 0x01, // 2001::/23
		b[0] == 0x20 && b[1] == 0x01 && b[2] == 0x0d && b[3] == 0xb8, // 2001:db8::/32
		b[0] == 0x20 && b[1] == 0x02,                                 // 2002::/16
		b[0] == 0x3f && b[1] == 0xff && b[2]&0xf0 == 0:               // 3fff::/20
		return true
	}
	return false
}

// FuzzIsSpecialUse: the table-driven classifier agrees with the reference
// on any address, and an IPv4 address is judged the same mapped or not.
func FuzzIsSpecialUse(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "10.0.0.1", "8.8.8.8", "::1", "2001:db8::1", "2606:4700::1111", "::ffff:192.168.1.1", "fe80::1"} {
		b := netip.MustParseAddr(s).As16()
		f.Add(b[:])
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		a, ok := netip.AddrFromSlice(raw)
		if !ok {
			a = netip.Addr{}
		}
		got, want := IsSpecialUse(a), refSpecialUse(a)
		if got != want {
			t.Fatalf("IsSpecialUse(%s) = %v, reference %v", a, got, want)
		}
		if name, special := classify(a); special != got || special && name == "" {
			t.Fatalf("classify(%s) = %q, %v", a, name, special)
		}
		if a.Is4() {
			if IsSpecialUse(netip.AddrFrom16(a.As16())) != got {
				t.Fatalf("%s and its IPv4-mapped form differ", a)
			}
		}
		if a.Is6() && !a.Is4In6() {
			if IsSpecialUse(a.WithZone("eth0")) != got {
				t.Fatalf("%s with a zone differs", a)
			}
		}
	})
}

// TestRebindingRefusedOnNextDial: a name that resolved to a public address
// and later resolves to a private one is refused at the next dial, for a
// new request and for a redirect hop on a new connection alike. (The
// public address is connected to the loopback test server by the
// dialer's test hook; the checks are the real ones.)
func TestRebindingRefusedOnNextDial(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hop" {
			w.Header().Set("Connection", "close") // the next hop dials again
			http.Redirect(w, r, "/ok", http.StatusFound)
			return
		}
		io.WriteString(w, "ok")
	}))
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())

	var mu sync.Mutex
	answers := map[string][]string{}
	setDNS := func(host, addr string) {
		mu.Lock()
		defer mu.Unlock()
		answers[host] = []string{addr}
	}
	resolve := func(_ context.Context, host string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		var out []netip.Addr
		for _, s := range answers[host] {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}
	tr, err := NewTransport(Options{Resolver: resolve, TLSConfig: &tls.Config{RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	var dialled []string
	hook := func(ctx context.Context, network, address string) (net.Conn, error) {
		mu.Lock()
		dialled = append(dialled, address)
		mu.Unlock()
		if address != "93.184.216.34:"+port {
			return nil, errors.New("the hook connects the public test address only")
		}
		return (&net.Dialer{}).DialContext(ctx, network, srv.Listener.Addr().String())
	}
	tr.base.DialContext = (&dialer{policy: tr.policy, resolve: resolve, connect: hook}).dialContext
	c := &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		return tr.policy.checkRedirect(req, via, true, 5)
	}}
	defer c.CloseIdleConnections()
	get := func(path string) error {
		resp, err := c.Get("https://rebind.example.com:" + port + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body) // read to the end: the connection is kept
		return err
	}

	setDNS("rebind.example.com", "93.184.216.34")
	if err := get("/ok"); err != nil {
		t.Fatalf("public answer: %v", err)
	}
	setDNS("rebind.example.com", "127.0.0.1")
	// The open connection is reused (no new lookup): nothing to check.
	if err := get("/ok"); err != nil {
		t.Fatalf("kept connection: %v", err)
	}
	c.CloseIdleConnections()
	if err := get("/ok"); !errors.Is(err, ErrSpecialAddress) {
		t.Fatalf("after rebinding: %v", err)
	}
	// A redirect hop on a new connection is checked again.
	setDNS("rebind.example.com", "93.184.216.34")
	c.CloseIdleConnections()
	if err := get("/ok"); err != nil {
		t.Fatal(err)
	}
	c.CloseIdleConnections()
	hopsBefore := len(dialled)
	// First hop answers the redirect and closes; rebind before the second.
	tr.base.DialContext = (&dialer{policy: tr.policy, resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
		addrs, err := resolve(ctx, host)
		setDNS("rebind.example.com", "10.0.0.1") // the next lookup answers private
		return addrs, err
	}, connect: hook}).dialContext
	if err := get("/hop"); !errors.Is(err, ErrSpecialAddress) {
		t.Fatalf("redirect hop after rebinding: %v", err)
	}
	if len(dialled) != hopsBefore+1 {
		t.Fatalf("dialled %v after the first hop", dialled[hopsBefore:])
	}
}
