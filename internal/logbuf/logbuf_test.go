package logbuf_test

import (
	"fmt"
	"testing"
	"time"

	"credbroker/internal/logbuf"
)

func TestWaitFor(t *testing.T) {
	var b logbuf.Buffer
	fmt.Fprintln(&b, "starting")
	if !b.WaitFor("starting", nil, time.Second) {
		t.Fatal("text already written was not found")
	}
	go func() {
		for i := range 100 {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		fmt.Fprintln(&b, "ready")
	}()
	if !b.WaitFor("ready", nil, 10*time.Second) {
		t.Fatalf("never saw the line written last:\n%s", b.String())
	}
	gone := make(chan struct{})
	close(gone)
	if b.WaitFor("never written", gone, 10*time.Second) {
		t.Fatal("found text that was never written")
	}
	start := time.Now()
	if b.WaitFor("never written", nil, 50*time.Millisecond) || time.Since(start) > 5*time.Second {
		t.Fatal("the timeout did not end the wait")
	}
}
