// Package locallock is the in-process connection lock of the stores
// only one process opens (memstore, boltstore), and the first stage of
// pgstore's cross-process locks.
package locallock

import (
	"context"
	"sync"

	"credbroker/vault"
)

// Locker is an in-process vault.Locker: one mutex per connection id,
// created on demand and dropped when nobody holds or waits for it. It is
// enough for a store that only one process opens (boltstore holds a file
// lock) and is the first stage of cross-process lockers, so one process
// waits for a database lock with at most one goroutine per id.
type Locker struct {
	mu sync.Mutex // guards m
	m  map[string]*localLock
}

type localLock struct {
	ch   chan struct{} // holds one token while locked
	refs int           // holders and waiters; guarded by Locker.mu
}

var _ vault.Locker = (*Locker)(nil)

// New returns an empty Locker.
func New() *Locker { return &Locker{m: map[string]*localLock{}} }

// LockConnection implements vault.Locker.
func (l *Locker) LockConnection(ctx context.Context, id string) (func(), error) {
	l.mu.Lock()
	e := l.m[id]
	if e == nil {
		e = &localLock{ch: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	case <-ctx.Done():
		l.drop(id, e)
		return nil, ctx.Err()
	}
	return sync.OnceFunc(func() {
		<-e.ch
		l.drop(id, e)
	}), nil
}

func (l *Locker) drop(id string, e *localLock) {
	l.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(l.m, id)
	}
	l.mu.Unlock()
}

// Held reports how many ids currently have a holder or waiter (for tests).
func (l *Locker) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
