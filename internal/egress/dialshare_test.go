package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestDialSharesTime: a name's addresses share the dial's time as
// net.Dialer's do: each address gets what is left divided by the
// addresses left, at least 2 s, so one that drops packets leaves time for
// the next (the last gets all that is left).
func TestDialSharesTime(t *testing.T) {
	for _, c := range []struct {
		name    string
		timeout time.Duration
		addrs   []string
		want    []time.Duration // each attempt's deadline after the start
	}{
		{"two addresses, 10 s", 10 * time.Second, []string{"192.0.2.1", "192.0.2.2"}, []time.Duration{5 * time.Second, 10 * time.Second}},
		{"three addresses, 3 s", 3 * time.Second, []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}, []time.Duration{2 * time.Second, 2 * time.Second, 3 * time.Second}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var deadlines []time.Time
			var dialled []string
			d := &dialer{policy: policy{allowPrivate: true},
				resolve: func(context.Context, string) ([]netip.Addr, error) {
					var out []netip.Addr
					for _, a := range c.addrs {
						out = append(out, netip.MustParseAddr(a))
					}
					return out, nil
				},
				connect: func(ctx context.Context, _, address string) (net.Conn, error) {
					dl, ok := ctx.Deadline()
					if !ok {
						t.Fatalf("attempt at %s has no deadline", address)
					}
					deadlines = append(deadlines, dl)
					dialled = append(dialled, address)
					if len(dialled) < len(c.addrs) {
						return nil, errors.New("dropped")
					}
					a, b := net.Pipe()
					b.Close()
					return a, nil
				}}
			d.net.Timeout = c.timeout
			start := time.Now()
			conn, err := d.dialContext(context.Background(), "tcp", "up.example.com:443")
			end := time.Now()
			if err != nil {
				t.Fatal(err)
			}
			conn.Close()
			if len(deadlines) != len(c.want) {
				t.Fatalf("dialled %v, want %d attempts", dialled, len(c.want))
			}
			for i, want := range c.want {
				// The dialer reads the clock between start and end.
				if deadlines[i].Before(start.Add(want)) || deadlines[i].After(end.Add(want)) {
					t.Errorf("attempt %d (%s): deadline %v after the start, want %v", i+1, dialled[i], deadlines[i].Sub(start), want)
				}
			}
		})
	}
}
