// Package gate is the open state of the backends whose calls can run
// while another goroutine closes them (boltstore, pgstore): a Gate says
// whether a call may start, and the calls that build or check what they
// will write before they touch storage do both in one step, so every
// backend starts them the same way.
package gate

import (
	"context"
	"sync/atomic"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Gate is a store's open state; the zero Gate is open.
type Gate struct {
	closed atomic.Bool
}

// Ready reports why a call may not start: vault.ErrClosed once the gate
// is closed, else ctx's error.
func (g *Gate) Ready(ctx context.Context) error {
	if g.closed.Load() {
		return vault.ErrClosed
	}
	return ctx.Err()
}

// Close closes the gate; it reports whether it was closed already, so
// only the first of several Close calls releases the store.
func (g *Gate) Close() (already bool) { return g.closed.Swap(true) }

// Closed reports whether the gate is closed.
func (g *Gate) Closed() bool { return g.closed.Load() }

// NewConnection is the start of a store's CreateConnection: once the
// store is ready, c with its fields set and its record sealed with kr's
// primary key (record.NewConnection).
func (g *Gate) NewConnection(ctx context.Context, kr *vault.Keyring, c vault.Connection) (vault.Connection, []byte, error) {
	if err := g.Ready(ctx); err != nil {
		return vault.Connection{}, nil, err
	}
	return record.NewConnection(kr, c)
}

// ConnectTarget is the start of a store's Connect: once the store is
// ready, w's target sealed with kr's primary key (record.ConnectTarget).
func (g *Gate) ConnectTarget(ctx context.Context, kr *vault.Keyring, w vault.ConnectionWrite) (record.Target, error) {
	if err := g.Ready(ctx); err != nil {
		return record.Target{}, err
	}
	return record.ConnectTarget(kr, w)
}

// CheckDeliveries is the start of a store's EnqueueDeliveries: once the
// store is ready, record.CheckDeliveries of ds.
func (g *Gate) CheckDeliveries(ctx context.Context, ds []vault.Delivery) error {
	if err := g.Ready(ctx); err != nil {
		return err
	}
	return record.CheckDeliveries(ds)
}
