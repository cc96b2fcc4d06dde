package mcpup

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/egress"
)

var soakCalls = flag.Int("soak-calls", 0, "calls TestSoak makes (default 10,000; 2,000 under the race detector)")

// TestSoak: 10,000 calls over 50 sessions (half to a modern upstream, half
// to a legacy one, each session a connection with its own token; the
// modern calls by turns through the session and the pool's own exchange)
// from 8 callers at once. Every call answers what it was asked; the pool holds
// the 50 sessions and opened each once; and once they are forgotten and
// the idle HTTP connections closed, the goroutines and open files are
// back where they were before the first call (polled until they settle).
//
// Under the race detector the default is 2,000 calls, so that `make
// test` stays quick; -soak-calls sets the number.
func TestSoak(t *testing.T) {
	calls := *soakCalls
	if calls == 0 {
		calls = 10000
		if raceEnabled {
			calls = 2000
		}
	}
	const sessions, callers = 50, 8
	modern, legacy := newUpstream(t, false), newUpstream(t, true)
	modern.quiet, legacy.quiet = true, true
	tokens := &fakeTokens{tok: map[string]string{}}
	var targets []Target
	var toks []string
	for i := range sessions {
		conn, up := fmt.Sprintf("conn-%d", i), modern
		if i%2 == 1 {
			up = legacy
		}
		tokens.tok[conn] = "tok-" + conn
		toks = append(toks, "tok-"+conn)
		targets = append(targets, Target{Provider: "up", URL: up.url(), Conn: conn})
	}
	modern.setTokens(toks...)
	legacy.setTokens(toks...)
	client, err := egress.New(egress.Options{AllowPrivate: true, AllowLoopbackHTTP: true})
	if err != nil {
		t.Fatal(err)
	}

	runtime.GC()
	goroutines, fds := runtime.NumGoroutine(), openFiles(t)
	start := time.Now()
	p := New(Options{HTTPClient: client, Tokens: tokens})
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				n := next.Add(1) - 1
				if n >= int64(calls) || failed.Load() > 0 {
					return
				}
				arg := fmt.Sprint(n)
				// Calls to the modern upstream go through the session and
				// through the pool's own exchange by turns.
				v := viaSession
				if n%sessions%2 == 0 && n/sessions%2 == 1 {
					v = viaDirect
				}
				out, _, err := echoVia(context.Background(), p, targets[n%sessions], arg, v)
				if err != nil || out != `echo {"x":"`+arg+`"}` {
					if failed.Add(1) == 1 {
						t.Errorf("call %d: %q, %v", n, out, err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if t.Failed() {
		return
	}
	if p.Len() != sessions || modern.count("server/discover") != sessions/2 || legacy.count("initialize") != sessions/2 {
		t.Fatalf("%d sessions held, %d modern and %d legacy opened; want %d, %d, %d",
			p.Len(), modern.count("server/discover"), legacy.count("initialize"), sessions, sessions/2, sessions/2)
	}
	t.Logf("%d calls over %d sessions in %v (%.0f calls/s)", calls, sessions, elapsed.Round(time.Millisecond), float64(calls)/elapsed.Seconds())

	for _, tg := range targets {
		p.Forget(tg)
	}
	waitFor(t, "the legacy sessions to be closed", func() bool { return legacy.count("DELETE") == sessions/2 })
	var g, f int
	waitFor(t, "goroutines and open files to settle", func() bool {
		client.CloseIdleConnections()
		g, f = runtime.NumGoroutine(), openFiles(t)
		return g <= goroutines+2 && f <= fds+2
	})
	t.Logf("goroutines %d → %d, open files %d → %d", goroutines, g, fds, f)
}

// openFiles counts the process's open file descriptors.
func openFiles(t testing.TB) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting open files: %v", err)
	}
	return len(es)
}
