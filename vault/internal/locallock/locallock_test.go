package locallock_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/vault/internal/locallock"
)

func TestLocker(t *testing.T) {
	l := locallock.New()
	ctx := t.Context()
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			unlock, err := l.LockConnection(ctx, "c1")
			if err != nil {
				t.Error(err)
				return
			}
			n := inside.Add(1)
			for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
			}
			time.Sleep(100 * time.Microsecond)
			inside.Add(-1)
			unlock()
			unlock() // idempotent
		})
	}
	wg.Wait()
	if maxInside.Load() != 1 {
		t.Fatalf("%d holders at once", maxInside.Load())
	}
	// Another id is independent; a waiter gives up with its context.
	u1, _ := l.LockConnection(ctx, "c1")
	u2, err := l.LockConnection(ctx, "c2")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := l.LockConnection(short, "c1"); err == nil {
		t.Fatal("took a held lock")
	}
	u1()
	u2()
	if l.Held() != 0 {
		t.Fatalf("%d ids still tracked after every unlock", l.Held())
	}
}
