package boltstore

import (
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit lets concurrent writers share one durable commit without a
// timer. The first writer to arrive while no commit is running leads: it
// commits every write queued so far in one transaction. Writes that arrive
// while that commit (and its fsync) runs queue up; when it ends, the leader
// hands the queue to its oldest waiter, which commits all of it at once.
// So a lone write commits at once, and under load each commit carries
// everything that arrived during the previous one: the batch size follows
// the fsync time instead of a fixed delay.
//
// Like bbolt's DB.Batch, a function may run more than once: when one in a
// group fails, the transaction rolls back, the failing function is retried
// alone in its caller's goroutine (so its error, or its panic, is its own),
// and the others run again without it.
type groupCommit struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*gcCall
	leading bool
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
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()

	g.run(batch)

	g.mu.Lock()
	if len(g.queue) == 0 {
		g.leading = false
		g.mu.Unlock()
		return
	}
	next := g.queue[0]
	g.mu.Unlock()
	next.wake <- gcLead
}

// run commits batch, sending each call its outcome. A call whose function
// fails is sent gcSolo and the rest run again without it.
func (g *groupCommit) run(batch []*gcCall) {
	for len(batch) > 0 {
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
