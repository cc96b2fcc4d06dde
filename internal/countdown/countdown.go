// Package countdown counts down the faults a test stand-in (the demo
// provider, the fake GitHub and Google) was told to inject: a test sets
// "the next n requests fail", each request that would fail takes one.
package countdown

import "sync/atomic"

// Countdown is how many more times a fault is still to happen. The zero
// value is none. It is safe for concurrent use and needs no lock of its
// owner's.
type Countdown struct {
	n atomic.Int64
}

// Set makes the next n takes succeed (n <= 0: none).
func (c *Countdown) Set(n int) {
	c.n.Store(int64(n))
}

// Take consumes one fault and reports whether there was one left.
func (c *Countdown) Take() bool {
	for {
		n := c.n.Load()
		if n <= 0 {
			return false
		}
		if c.n.CompareAndSwap(n, n-1) {
			return true
		}
	}
}
