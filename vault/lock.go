package vault

import "context"

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
// store only one process opens keeps one in process (one mutex per
// connection id: vault/internal/locallock).
type Locker interface {
	LockConnection(ctx context.Context, id string) (unlock func(), err error)
}
