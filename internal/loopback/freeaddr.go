package loopback

import (
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreeAddr returns a 127.0.0.1 address whose port was free a moment ago,
// for a process the caller is about to start on it (tests and tools).
//
// Asking the kernel for port 0 and closing the listener leaves a window in
// which the same port can be handed out again as the source port of any
// outgoing connection, and the later bind fails with "address already in
// use". So the port is picked at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), where the kernel never assigns one on
// its own; only another caller of FreeAddr could race for it.
func FreeAddr() (string, error) {
	hi := ephemeralLow() - 1
	lo := 10000
	if hi-lo < 1000 {
		lo, hi = 1024, 0 // no room below: fall back to the kernel's choice
	}
	for i := 0; hi > 0 && i < 50; i++ {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo+1)))
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			return addr, nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", errors.New("loopback: no free port on 127.0.0.1: " + err.Error())
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// ephemeralLow is the first port of the kernel's ephemeral range (32768,
// Linux's default, when the range cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 1025 {
		return 32768
	}
	return n
}
