package countdown

import (
	"sync"
	"testing"
)

func TestCountdown(t *testing.T) {
	var c Countdown
	if c.Take() {
		t.Fatal("the zero value took a fault")
	}
	c.Set(2)
	if !c.Take() || !c.Take() {
		t.Fatal("Set(2) did not give two faults")
	}
	if c.Take() {
		t.Fatal("a third fault after Set(2)")
	}
	c.Set(-1)
	if c.Take() {
		t.Fatal("Set(-1) gave a fault")
	}
}

// TestCountdownConcurrent: of many concurrent takes, exactly n succeed.
func TestCountdownConcurrent(t *testing.T) {
	const n, takers = 50, 8
	var c Countdown
	c.Set(n)
	var wg sync.WaitGroup
	got := make([]int, takers)
	for i := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if c.Take() {
					got[i]++
				}
			}
		}()
	}
	wg.Wait()
	sum := 0
	for _, g := range got {
		sum += g
	}
	if sum != n {
		t.Fatalf("%d takes succeeded, want %d", sum, n)
	}
}
