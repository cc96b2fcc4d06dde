// Package replicache is the per-replica cache of what a process read from
// a store several processes may write, kept true by a change feed
// (vault.AppWatcher: Changed, Fresh, Lost). It is written once for the
// caches that need it: token-family liveness (apps) and each person's
// connection listing (connections).
//
// A value is cached under a key and belongs to a group; a change
// announced for a group forgets every value of the group. The cache is
// trusted only while the feed is current: every change committed more
// than Bound ago has been applied (Fresh within Bound), or the process is
// the store's only writer and forgets on its own writes (sole). An
// untrusted cache answers nothing and takes nothing: the caller reads the
// store. A fill races no change: Get hands out the epoch a fill must
// carry, read before the store is, and every change moves the epoch on,
// so a fill that started before a change is dropped.
package replicache

import (
	"sync"
	"time"

	"credbroker/vault"
)

// Bound is the longest a change committed by another process takes to be
// seen through a trusted cache: past it without a Fresh the cache is not
// trusted.
const Bound = time.Second

type item[V any] struct {
	group string
	v     V
}

// Cache holds values of type V. The zero value is not usable; see New.
type Cache[V any] struct {
	max  int
	sole bool

	mu     sync.RWMutex // guards the fields below
	vals   map[string]item[V]
	groups map[string][]string // group -> its cached keys
	epoch  uint64              // starts at 1: 0 means "do not fill"
	freshT time.Time           // every change committed before it is applied
}

// New returns a cache of at most max values (def when max <= 0). sole:
// this process is the store's only writer and tells the cache of each of
// its writes (Drop), so the cache is always trusted.
func New[V any](max, def int, sole bool) *Cache[V] {
	if max <= 0 {
		max = def
	}
	return &Cache[V]{max: max, sole: sole, vals: map[string]item[V]{}, groups: map[string][]string{}, epoch: 1}
}

// trusted: the cache holds every change committed more than Bound ago.
// The caller holds mu.
func (c *Cache[V]) trusted() bool {
	return c.sole || (!c.freshT.IsZero() && time.Since(c.freshT) < Bound)
}

// Get returns key's value and group when the cache is trusted, with the
// epoch a fill of what the store says must carry (0 when the cache is
// not trusted: nothing is filled).
func (c *Cache[V]) Get(key string) (v V, group string, epoch uint64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.trusted() {
		return v, "", 0, false
	}
	it, ok := c.vals[key]
	return it.v, it.group, c.epoch, ok
}

// Put caches v under key in group unless the cache changed since epoch
// (or is not trusted, or already holds key).
func (c *Cache[V]) Put(epoch uint64, key, group string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch || !c.trusted() {
		return
	}
	if _, ok := c.vals[key]; ok {
		return
	}
	if len(c.vals) >= c.max {
		for k, old := range c.vals { // one arbitrary value goes
			c.forget(k, old.group)
			break
		}
	}
	c.vals[key] = item[V]{group: group, v: v}
	c.groups[group] = append(c.groups[group], key)
}

// forget removes one value. The caller holds mu.
func (c *Cache[V]) forget(key, group string) {
	delete(c.vals, key)
	keys := c.groups[group]
	for i, k := range keys {
		if k == key {
			keys = append(keys[:i], keys[i+1:]...)
			break
		}
	}
	if len(keys) == 0 {
		delete(c.groups, group)
	} else {
		c.groups[group] = keys
	}
}

// Drop forgets every value of group: something of it changed.
func (c *Cache[V]) Drop(group string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	for _, k := range c.groups[group] {
		delete(c.vals, k)
	}
	delete(c.groups, group)
}

// Fresh records that every change committed before asOf is applied.
func (c *Cache[V]) Fresh(asOf time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if asOf.After(c.freshT) {
		c.freshT = asOf
	}
}

// Reset forgets everything and distrusts the cache until the next Fresh:
// the feed broke, so changes may have been missed.
func (c *Cache[V]) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.freshT = time.Time{}
	clear(c.vals)
	clear(c.groups)
}

// Watcher is the feed's view of c: each announced group is dropped.
func (c *Cache[V]) Watcher() vault.AppWatcher {
	return vault.AppWatcher{Changed: c.Drop, Fresh: c.Fresh, Lost: c.Reset}
}
