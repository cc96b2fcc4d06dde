package vault

import (
	"context"
	"sync"
)

// Locker is the Store feature (Store.Locker) of exclusive use of one
// connection across every process that shares the store, for work that
// must happen at most once at a time (a token refresh with a rotating
// refresh token).
//
// LockConnection blocks until the caller holds the connection's lock or ctx
// ends; the returned unlock releases it and is safe to call more than once.
// Hold the lock only around the provider call and the write that stores
// its result, and re-read the connection after acquiring it: another
// holder may already have done the work.
//
// Backends shared by several processes (pgstore) lock in the database; a
// store only one process opens keeps one in-process LocalLocker.
type Locker interface {
	LockConnection(ctx context.Context, id string) (unlock func(), err error)
}

// LocalLocker is an in-process Locker: one mutex per connection id,
// created on demand and dropped when nobody holds or waits for it. It is
// enough for a store that only one process opens (boltstore holds a file
// lock) and is the first stage of cross-process lockers, so one process
// waits for a database lock with at most one goroutine per id.
type LocalLocker struct {
	mu sync.Mutex // guards m
	m  map[string]*localLock
}

type localLock struct {
	ch   chan struct{} // holds one token while locked
	refs int           // holders and waiters; guarded by LocalLocker.mu
}

var _ Locker = (*LocalLocker)(nil)

// NewLocalLocker returns an empty LocalLocker.
func NewLocalLocker() *LocalLocker { return &LocalLocker{m: map[string]*localLock{}} }

// LockConnection implements Locker.
func (l *LocalLocker) LockConnection(ctx context.Context, id string) (func(), error) {
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

func (l *LocalLocker) drop(id string, e *localLock) {
	l.mu.Lock()
	e.refs--
	if e.refs == 0 {
		delete(l.m, id)
	}
	l.mu.Unlock()
}

// Held reports how many ids currently have a holder or waiter (for tests).
func (l *LocalLocker) Held() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
