package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

func openRaw(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "g.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	return db
}

// holdLeader starts a write whose function blocks until release is
// closed, and returns once that write leads (its transaction is open).
func holdLeader(t *testing.T, g *groupCommit) (release chan struct{}, done chan error) {
	release, done, inTx := make(chan struct{}), make(chan error, 1), make(chan struct{})
	go func() {
		done <- g.do(func(tx *bolt.Tx) error {
			close(inTx)
			<-release
			return tx.Bucket([]byte("b")).Put([]byte("leader"), []byte("1"))
		})
	}()
	<-inTx
	return release, done
}

// waitQueued returns once n writes wait in g's queue.
func waitQueued(g *groupCommit, n int) {
	for {
		g.mu.Lock()
		q := len(g.queue)
		g.mu.Unlock()
		if q >= n {
			return
		}
		runtime.Gosched()
	}
}

func put(key string) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error { return tx.Bucket([]byte("b")).Put([]byte(key), []byte("v")) }
}

func TestGroupCommitSharesOneCommit(t *testing.T) {
	db := openRaw(t)
	g := &groupCommit{db: db}
	release, leaderDone := holdLeader(t, g)

	const n = 15
	var wg sync.WaitGroup
	txs := make([]*bolt.Tx, n)
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.do(func(tx *bolt.Tx) error {
				txs[i] = tx
				return put(fmt.Sprint("k", i))(tx)
			})
		}()
	}
	waitQueued(g, n)
	close(release)
	wg.Wait()
	if err := <-leaderDone; err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("write %d: %v", i, errs[i])
		}
		if txs[i] != txs[0] {
			t.Fatalf("write %d committed in another transaction than write 0", i)
		}
	}
	err := db.View(func(tx *bolt.Tx) error {
		for i := range n {
			if tx.Bucket([]byte("b")).Get([]byte(fmt.Sprint("k", i))) == nil {
				return fmt.Errorf("k%d was acknowledged but is not stored", i)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.leading || len(g.queue) != 0 {
		t.Fatalf("after the last write: leading %v, queue %d", g.leading, len(g.queue))
	}
}

// A failing function gets its own error, its writes are not kept, and
// the writes that shared its transaction commit without it.
func TestGroupCommitFailureIsItsOwn(t *testing.T) {
	db := openRaw(t)
	g := &groupCommit{db: db}
	release, leaderDone := holdLeader(t, g)

	boom := errors.New("boom")
	var mu sync.Mutex
	runs := map[string]int{}
	fn := func(key string, fail bool) func(*bolt.Tx) error {
		return func(tx *bolt.Tx) error {
			mu.Lock()
			runs[key]++
			mu.Unlock()
			if err := put(key)(tx); err != nil {
				return err
			}
			if fail {
				return boom
			}
			return nil
		}
	}
	keys := []string{"a", "bad", "c"}
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.do(fn(k, k == "bad")) }()
		waitQueued(g, i+1) // queue in order
	}
	close(release)
	wg.Wait()
	if err := <-leaderDone; err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], boom) {
		t.Fatalf("errors: %v", errs)
	}
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("b"))
		if b.Get([]byte("a")) == nil || b.Get([]byte("c")) == nil {
			return errors.New("a successful write was lost")
		}
		if b.Get([]byte("bad")) != nil {
			return errors.New("the failed write was kept")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// "bad" ran in the group and alone; "a" ran before it failed and again
	// without it.
	if runs["bad"] != 2 || runs["a"] != 2 || runs["c"] != 1 {
		t.Fatalf("runs: %v", runs)
	}
}

// A function that panics panics in its own caller's goroutine; the others
// in its group commit.
func TestGroupCommitPanicIsItsOwn(t *testing.T) {
	db := openRaw(t)
	g := &groupCommit{db: db}
	release, leaderDone := holdLeader(t, g)

	var wg sync.WaitGroup
	var okErr error
	var recovered any
	wg.Add(2)
	go func() {
		defer wg.Done()
		defer func() { recovered = recover() }()
		_ = g.do(func(*bolt.Tx) error { panic("page 7 is not a leaf") })
	}()
	waitQueued(g, 1)
	go func() { defer wg.Done(); okErr = g.do(put("ok")) }()
	waitQueued(g, 2)
	close(release)
	wg.Wait()
	if err := <-leaderDone; err != nil {
		t.Fatal(err)
	}
	if recovered != "page 7 is not a leaf" || okErr != nil {
		t.Fatalf("recovered %v, other write %v", recovered, okErr)
	}
}

func TestGroupCommitClosed(t *testing.T) {
	db := openRaw(t)
	g := &groupCommit{db: db}
	db.Close()
	if err := g.do(put("x")); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Fatalf("closed: %v", err)
	}
	// The lead was given up: a second call does not hang.
	if err := g.do(put("x")); !errors.Is(err, berrors.ErrDatabaseNotOpen) {
		t.Fatalf("closed again: %v", err)
	}
}

// closedLoop has 16 writers write rounds times each, every write again as
// soon as the last one is answered. Each function takes 10 ms, so a commit
// of 16 lasts 160 ms and the wait lets pauses of 13 ms between returning
// writers pass: a fresh clone's make test, compiling and testing packages
// side by side on two cores, held threads off long enough to break a 5 ms
// pause once.
// It returns the writes per commit.
func closedLoop(t *testing.T, linger bool, rounds int) float64 {
	g := newGroupCommit(openRaw(t), linger)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				err := g.do(func(tx *bolt.Tx) error {
					time.Sleep(10 * time.Millisecond)
					return put(fmt.Sprint(w, "-", r))(tx)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(16*rounds) / float64(g.commits.Load())
}

// Writers that come straight back are gathered into one commit instead of
// taking turns in two halves.
func TestGroupCommitGathersReturningWriters(t *testing.T) {
	// Without the wait the writers take turns (8 a commit); with it every
	// commit after the first two carries all 16 (128 writes in 9 commits,
	// 14.2 a commit). Under three CPU hogs on two cores it measured 11.6 to
	// 14.2 (without: 8.0 to 9.8); 10 leaves room for four commits split by
	// a writer the machine held off for longer than the pause. A fresh
	// clone's make test once measured 10.7 without the wait, the writers
	// gathered by chance, and 11.6 with it: the pair is measured again, up
	// to three times, before the test fails. The wait's logic itself is
	// checked without timing by the tests below.
	for attempt := 1; ; attempt++ {
		without := closedLoop(t, false, 8)
		with := closedLoop(t, true, 8)
		t.Logf("writes per commit: %.1f without the wait, %.1f with it", without, with)
		if with >= 10 && with >= without+1 {
			return
		}
		if attempt == 3 {
			t.Fatalf("writes per commit: %.1f with the wait, %.1f without; want at least 10 and 1 more (three measurements)", with, without)
		}
	}
}

// A writer alone never waits, however often it writes.
func TestGroupCommitLoneWriterNeverWaits(t *testing.T) {
	g := newGroupCommit(openRaw(t), true)
	for i := range 50 {
		if err := g.do(put(fmt.Sprint("k", i))); err != nil {
			t.Fatal(err)
		}
	}
	if c, w := g.commits.Load(), g.waits.Load(); c != 50 || w != 0 {
		t.Fatalf("%d commits and %d waits for 50 writes in turn, want 50 and 0", c, w)
	}
}

// expectBack sets g up as just after a commit that answered n writers:
// the next leader waits for n writers, at most until the deadline (from
// now) in all and at most gap between arrivals.
func expectBack(g *groupCommit, n int, gap, deadline time.Duration) {
	g.mu.Lock()
	g.expect, g.until, g.gap = n, time.Now().Add(deadline), gap
	g.mu.Unlock()
}

// When the writers the last commit answered do not come back, a write
// waits through one pause of gap, not until the deadline, and commits; and
// the deadline ends a wait whose pause is longer. Each bound is checked
// against one ten times its size or more, so a busy machine's delays
// cannot make either look broken.
func TestGroupCommitWaitIsBounded(t *testing.T) {
	t.Run("a pause", func(t *testing.T) {
		g := newGroupCommit(openRaw(t), true)
		const gap = 20 * time.Millisecond
		expectBack(g, 16, gap, time.Minute)
		if err := g.do(put("alone")); err != nil {
			t.Fatal(err)
		}
		w := time.Duration(g.waited.Load())
		if g.waits.Load() != 1 || w < gap || w > 10*time.Second {
			t.Fatalf("the lone write waited %d times for %v, want once for a pause of %v (the deadline a minute away)", g.waits.Load(), w, gap)
		}
		if g.commits.Load() != 1 {
			t.Fatalf("%d commits, want 1", g.commits.Load())
		}
	})
	t.Run("the deadline", func(t *testing.T) {
		g := newGroupCommit(openRaw(t), true)
		expectBack(g, 16, time.Minute, 50*time.Millisecond)
		if err := g.do(put("alone")); err != nil {
			t.Fatal(err)
		}
		if w := time.Duration(g.waited.Load()); g.waits.Load() != 1 || w > 10*time.Second {
			t.Fatalf("the lone write waited %d times for %v, want once until the deadline 50 ms away (the pause a minute)", g.waits.Load(), w)
		}
		if g.commits.Load() != 1 {
			t.Fatalf("%d commits, want 1", g.commits.Load())
		}
	})
}

// The wait ends as soon as the expected writers are queued, and they share
// the commit.
func TestGroupCommitWaitEndsWhenAllAreBack(t *testing.T) {
	g := newGroupCommit(openRaw(t), true)
	expectBack(g, 3, 10*time.Second, 30*time.Second)
	errs := make(chan error, 3)
	go func() { errs <- g.do(put("first")) }()
	for range 50 { // the first write leads and waits for two more
		if g.waits.Load() == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	go func() { errs <- g.do(put("second")) }()
	go func() { errs <- g.do(put("third")) }()
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if c, w := g.commits.Load(), time.Duration(g.waited.Load()); c != 1 || w > 5*time.Second {
		t.Fatalf("%d commits after waiting %v, want 1 commit well before the 10 s pause ends", c, w)
	}
}
