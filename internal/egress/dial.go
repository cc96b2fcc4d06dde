package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// dialer resolves, checks and connects.
type dialer struct {
	policy  policy
	resolve Resolver
	net     net.Dialer
	// connect replaces net.Dialer's DialContext (tests only).
	connect func(ctx context.Context, network, address string) (net.Conn, error)
}

func (d *dialer) dialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		addrs, err = d.resolve(ctx, host)
		if err != nil {
			return nil, fmt.Errorf("egress: resolve %s: %w", host, err)
		}
		if len(addrs) == 0 {
			return nil, fmt.Errorf("egress: resolve %s: no addresses", host)
		}
	}
	if !d.policy.allowPrivate {
		for _, a := range addrs {
			if name, special := classify(a); special {
				return nil, &RefusedError{Err: ErrSpecialAddress, Host: host, Addr: a.WithZone(""), Range: name}
			}
		}
	}
	connect := d.net.DialContext
	if d.connect != nil {
		connect = d.connect
	}
	var first error
	for _, a := range addrs {
		a = a.Unmap()
		if network == "tcp4" && !a.Is4() || network == "tcp6" && !a.Is6() {
			continue
		}
		c, err := connect(ctx, network, net.JoinHostPort(a.String(), port))
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if first == nil {
		first = fmt.Errorf("egress: %s has no %s address", host, network)
	}
	return nil, first
}

// controlAddress checks the address a socket is about to connect to: the
// last word, whatever resolved it.
func controlAddress(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Err: ErrSpecialAddress, Host: address, Reason: err.Error()}
	}
	if name, special := classify(ap.Addr()); special {
		return &RefusedError{Err: ErrSpecialAddress, Addr: ap.Addr().WithZone(""), Range: name}
	}
	return nil
}
