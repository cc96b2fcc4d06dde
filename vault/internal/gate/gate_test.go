package gate

import (
	"context"
	"errors"
	"testing"

	"credbroker/vault"
)

// TestGate: an open gate lets a live call start and answers a cancelled
// one with its context's error; a closed gate answers ErrClosed before
// looking at the context, and only the first Close finds it open.
func TestGate(t *testing.T) {
	var g Gate
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := g.Ready(t.Context()); err != nil || g.Closed() {
		t.Fatalf("open gate: Ready = %v, Closed = %v", err, g.Closed())
	}
	if err := g.Ready(cancelled); !errors.Is(err, context.Canceled) {
		t.Fatalf("open gate, cancelled call: Ready = %v, want context.Canceled", err)
	}
	if g.Close() {
		t.Fatal("first Close found the gate closed")
	}
	if !g.Close() {
		t.Fatal("second Close found the gate open")
	}
	if !g.Closed() {
		t.Fatal("closed gate: Closed = false")
	}
	for _, ctx := range []context.Context{t.Context(), cancelled} {
		if err := g.Ready(ctx); !errors.Is(err, vault.ErrClosed) {
			t.Fatalf("closed gate: Ready = %v, want ErrClosed", err)
		}
	}
}

// TestStartsRefuseWhenClosed: the starts of the writes refuse on a
// closed gate before they build or check anything (nil key ring, empty
// write: either would be an error of its own).
func TestStartsRefuseWhenClosed(t *testing.T) {
	var g Gate
	g.Close()
	ctx := t.Context()
	if _, _, err := g.NewConnection(ctx, nil, vault.Connection{}); !errors.Is(err, vault.ErrClosed) {
		t.Errorf("NewConnection = %v, want ErrClosed", err)
	}
	if _, err := g.ConnectTarget(ctx, nil, vault.ConnectionWrite{}); !errors.Is(err, vault.ErrClosed) {
		t.Errorf("ConnectTarget = %v, want ErrClosed", err)
	}
	if err := g.CheckDeliveries(ctx, []vault.Delivery{{}}); !errors.Is(err, vault.ErrClosed) {
		t.Errorf("CheckDeliveries = %v, want ErrClosed", err)
	}
}
