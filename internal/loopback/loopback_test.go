package loopback

import (
	"net"
	"strconv"
	"testing"
)

func TestHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.8.9.10": true, "::1": true,
		"": false, "localhost.evil.example": false, "127.0.0.1.nip.io": false, "10.0.0.1": false,
		"[::1]": false, "0.0.0.0": false, "::": false, "example.com": false, "LOCALHOST": false,
	} {
		if got := Host(host); got != want {
			t.Errorf("Host(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestFreeAddr(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 20; i++ {
		addr, err := FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("FreeAddr() = %q", addr)
		}
		if p, _ := strconv.Atoi(port); p >= ephemeralLow() {
			t.Errorf("port %d is in the ephemeral range (from %d)", p, ephemeralLow())
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("FreeAddr() gave %s, which is taken: %v", addr, err)
		}
		ln.Close()
		seen[addr] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 calls gave %d distinct addresses", len(seen))
	}
}
