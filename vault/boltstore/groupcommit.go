package boltstore

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// groupCommit lets concurrent writers share one durable commit without a
// fixed delay. The first writer to arrive while no commit is running leads: it
// commits every write queued so far in one transaction. Writes that arrive
// while that commit (and its fsync) runs queue up; when it ends, the leader
// hands the queue to its oldest waiter, which commits all of it at once.
// So a lone write commits at once, and under load each commit carries
// everything that arrived during the previous one: the batch size follows
// the fsync time instead of a fixed delay.
//
// That alone splits writers that write again as soon as they are answered
// (an import, a busy client) into two halves that take turns, each commit
// carrying half of them. So a leader that starts soon after a commit ends
// first waits for as many writers as that commit answered, plus those that
// queued during it, to come back. It stops waiting as soon as that many are
// queued, when no one has arrived for a twelfth of the last commit's
// duration, or a quarter of that duration after the commit ended. A write
// that comes when no commit has ended lately, or that finds as many queued
// as the last commit carried, never waits; so a lone writer never does, and
// a wait costs at most a quarter of what the commit itself costs.
//
// Like bbolt's DB.Batch, a function may run more than once: when one in a
// group fails, the transaction rolls back, the failing function is retried
// alone in its caller's goroutine (so its error, or its panic, is its own),
// and the others run again without it.
type groupCommit struct {
	db     *bolt.DB
	linger bool // wait for returning writers (see above)

	mu      sync.Mutex
	queue   []*gcCall
	leading bool
	// expect is how many writes the last commit answered plus how many
	// were queued when it ended; until is when a wait for them ends, gap
	// the longest pause between arrivals it lasts through.
	expect int
	until  time.Time
	gap    time.Duration
	// For the tests and benchmarks: transactions run, waits in gather and
	// their total time in nanoseconds.
	commits, waits, waited atomic.Int64
}

// A wait after a commit lasts at most the commit's duration over
// lingerShare, and through pauses between arrivals of at most that duration
// over gapShare. Commits (two fdatasyncs) take 1-3 ms on the disks
// measured, and most writers that come straight back do so within 100 µs
// of the commit's end. maxCommit caps the duration these shares are taken
// of.
const (
	lingerShare = 4
	gapShare    = 12
	maxCommit   = 8 * time.Millisecond
)

func newGroupCommit(db *bolt.DB, linger bool) *groupCommit {
	return &groupCommit{db: db, linger: linger}
}

type gcCall struct {
	fn  func(*bolt.Tx) error
	err error
	// wake carries what the caller does next: gcDone (err is set), gcLead
	// (commit the queue) or gcSolo (run fn alone).
	wake chan gcWake
}

type gcWake uint8

const (
	gcDone gcWake = iota
	gcLead
	gcSolo
)

var gcCalls = sync.Pool{New: func() any { return &gcCall{wake: make(chan gcWake, 1)} }}

// do runs fn in a write transaction shared with the writes queued with it
// and returns once that transaction is durable (or failed).
func (g *groupCommit) do(fn func(*bolt.Tx) error) error {
	c := gcCalls.Get().(*gcCall)
	c.fn, c.err = fn, nil
	g.mu.Lock()
	g.queue = append(g.queue, c)
	w := gcLead
	if g.leading {
		g.mu.Unlock()
		w = <-c.wake
	} else {
		g.leading = true
		g.mu.Unlock()
	}
	if w == gcLead {
		g.lead()
		w = <-c.wake
	}
	err := c.err
	c.fn, c.err = nil, nil
	gcCalls.Put(c)
	if w == gcSolo {
		return g.db.Update(fn)
	}
	return err
}

// lead commits the queue, then passes the lead to the oldest write that
// queued meanwhile, or gives it up when none did.
func (g *groupCommit) lead() {
	g.mu.Lock()
	g.gather()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()

	var start time.Time
	if g.linger {
		start = time.Now()
	}
	n := len(batch)
	g.run(batch)

	g.mu.Lock()
	if g.linger {
		end := time.Now()
		d := min(end.Sub(start), maxCommit)
		g.expect = n + len(g.queue)
		g.until = end.Add(d / lingerShare)
		g.gap = d / gapShare
	}
	if len(g.queue) == 0 {
		g.leading = false
		g.mu.Unlock()
		return
	}
	next := g.queue[0]
	g.mu.Unlock()
	next.wake <- gcLead
}

// gather waits, with g.mu held on entry and return, for the writers the
// last commit answered to queue again (see groupCommit). It yields the
// processor rather than sleeping: those writers need it to come back, and
// timers here fire a millisecond late at best, as long as a commit.
func (g *groupCommit) gather() {
	if len(g.queue) >= g.expect || !g.linger {
		return
	}
	g.waits.Add(1)
	now := time.Now()
	start, last, seen := now, now, len(g.queue)
	defer func() { g.waited.Add(int64(time.Since(start))) }()
	for len(g.queue) < g.expect && now.Before(g.until) && now.Sub(last) < g.gap {
		g.mu.Unlock()
		runtime.Gosched()
		g.mu.Lock()
		now = time.Now()
		if len(g.queue) > seen {
			last, seen = now, len(g.queue)
		}
	}
}

// run commits batch, sending each call its outcome. A call whose function
// fails is sent gcSolo and the rest run again without it.
func (g *groupCommit) run(batch []*gcCall) {
	for len(batch) > 0 {
		g.commits.Add(1)
		failed := -1
		err := g.update(func(tx *bolt.Tx) error {
			for i, c := range batch {
				if err := safely(c.fn, tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 {
			for _, c := range batch {
				c.err = err
				c.wake <- gcDone
			}
			return
		}
		batch[failed].wake <- gcSolo
		batch = append(batch[:failed], batch[failed+1:]...)
	}
}

// update is db.Update with a panic outside the functions (bbolt panics on
// some corrupt pages while committing) turned into an error, so no waiter
// is left behind.
func (g *groupCommit) update(fn func(*bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w (%v)", ErrCorrupt, r)
		}
	}()
	return g.db.Update(fn)
}

// safely calls fn, turning a panic into an error so the group goes on; the
// caller then runs fn alone and meets the panic itself.
func safely(fn func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return fn(tx)
}
