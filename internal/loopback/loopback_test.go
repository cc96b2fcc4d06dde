package loopback

import "testing"

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
