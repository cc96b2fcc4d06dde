package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// NewDialer returns the dial-time check of a transport applying opts, as
// an http.Transport's DialContext, for a client that builds its own
// transport: the host is resolved (Options.Resolver), every address it
// resolves to is checked against the special-use ranges unless
// AllowPrivate is set, only checked addresses are dialled (within
// DialTimeout, default 10 seconds), and the address a socket connects to
// is checked once more. Only those three options apply. The caller's
// transport must use no proxy (its Proxy nil), and the checks before
// dialling (scheme, allowed hosts) and at redirects are the caller's.
// A refusal is a *RefusedError wrapping ErrSpecialAddress.
func NewDialer(opts Options) func(ctx context.Context, network, address string) (net.Conn, error) {
	return newDialer(policy{allowPrivate: opts.AllowPrivate}, opts).dialContext
}

// newDialer returns the dialer of policy p with opts' resolver and dial
// timeout.
func newDialer(p policy, opts Options) *dialer {
	d := &dialer{policy: p, resolve: opts.Resolver}
	d.net.Timeout = durationOr(opts.DialTimeout, defaultDialTimeout)
	d.net.KeepAlive = 30 * time.Second
	if !p.allowPrivate {
		d.net.Control = controlAddress
	}
	if d.resolve == nil {
		d.resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	return d
}

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
	var tries []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if network == "tcp4" && !a.Is4() || network == "tcp6" && !a.Is6() {
			continue
		}
		tries = append(tries, a)
	}
	// The dial's time is shared among the addresses, as net.Dialer
	// shares it (each gets what is left divided by the addresses left,
	// at least 2 s): an address that drops packets leaves time to try
	// the next.
	deadline := time.Time{}
	if d.net.Timeout > 0 {
		deadline = time.Now().Add(d.net.Timeout)
	}
	if dl, ok := ctx.Deadline(); ok && (deadline.IsZero() || dl.Before(deadline)) {
		deadline = dl
	}
	var first error
	for i, a := range tries {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			actx, cancel = context.WithDeadline(ctx, partialDeadline(time.Now(), deadline, len(tries)-i))
		}
		c, err := connect(actx, network, net.JoinHostPort(a.String(), port))
		cancel()
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

// partialDeadline is the deadline of one of left addresses still to try
// before deadline: an equal share of what is left, at least
// minAddressTime (all of it when less is left).
func partialDeadline(now, deadline time.Time, left int) time.Time {
	remaining := deadline.Sub(now)
	share := remaining / time.Duration(left)
	if share < minAddressTime {
		share = min(minAddressTime, remaining)
	}
	return now.Add(share)
}

// minAddressTime is the least time an address is given (net's own).
const minAddressTime = 2 * time.Second

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
