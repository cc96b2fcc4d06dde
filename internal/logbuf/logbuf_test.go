package logbuf_test

import (
	"fmt"
	"strings"
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

func TestWaitUntil(t *testing.T) {
	var b logbuf.Buffer
	count := func(s string) int { return strings.Count(s, "audit\n") }
	go func() {
		for range 3 {
			fmt.Fprintln(&b, "audit")
			fmt.Fprintln(&b, "other")
		}
	}()
	if !b.WaitUntil(func(s string) bool { return count(s) == 3 }, nil, 10*time.Second) {
		t.Fatalf("never saw three lines:\n%s", b.String())
	}
	gone := make(chan struct{})
	close(gone)
	if b.WaitUntil(func(s string) bool { return count(s) == 4 }, gone, 10*time.Second) {
		t.Fatal("a condition that never holds held")
	}
	start := time.Now()
	if b.WaitUntil(func(string) bool { return false }, nil, 50*time.Millisecond) || time.Since(start) > 5*time.Second {
		t.Fatal("the timeout did not end the wait")
	}
}
