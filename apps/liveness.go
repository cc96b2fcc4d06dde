package apps

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"credbroker/vault"
)

// Bound is the longest a token family's end takes to be seen by every
// replica: a family that ends (its app removed, its refresh token
// replayed, its person offboarded, its token revoked) is refused on every
// replica once the change is acknowledged plus Bound. In this process its
// end is seen at once.
const Bound = time.Second

// Errors of Alive.
var (
	// ErrAppGone: the app's access was removed.
	ErrAppGone = errors.New("apps: the app's access was removed")
	// ErrFamilyEnded: the family ended (revoked, replayed, replaced).
	ErrFamilyEnded = errors.New("apps: the token was revoked")
	// ErrNotTheirs: the app's record names another person than the token.
	ErrNotTheirs = errors.New("apps: the token's person does not match its grant")
)

// Alive checks that token family famID of app appID exists for person p,
// and returns when it ends (the caller compares with its clock and
// leeway). It answers from the liveness cache when the cache can be
// trusted (see the package doc) and reads only what the check needs from
// the store otherwise.
func (s *Service) Alive(ctx context.Context, p vault.Principal, appID, famID string) (time.Time, error) {
	var epoch uint64 // 0: do not cache what the store says
	if s.live != nil {
		var e entry
		var ok bool
		if e, epoch, ok = s.live.get(famID); ok && e.app == appID {
			if e.principal != p {
				return time.Time{}, ErrNotTheirs
			}
			return e.expires, nil
		}
	}
	l, err := s.store.GetAppLiveness(ctx, appID)
	if errors.Is(err, vault.ErrNotFound) {
		return time.Time{}, ErrAppGone
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("apps: check token family: %w", err)
	}
	for _, f := range l.Families {
		if f.ID != famID {
			continue
		}
		if l.Principal != p {
			return time.Time{}, ErrNotTheirs
		}
		if epoch != 0 {
			s.live.put(epoch, famID, entry{app: appID, principal: l.Principal, expires: f.Expires})
		}
		return f.Expires, nil
	}
	return time.Time{}, ErrFamilyEnded
}

// ended drops what the liveness cache holds of app appID after this
// process changed the record (other processes learn it through Watch).
func (s *Service) ended(appID string) {
	if s.live != nil {
		s.live.dropApp(appID)
	}
}

// Follow keeps the liveness cache in step with the changes other
// processes make, through Options.Watch, until ctx ends. Without a
// Watch it returns at once. While it does not run (or the feed is down
// longer than Bound) the cache is not trusted and every check reads the
// store.
func (s *Service) Follow(ctx context.Context) error {
	if s.watch == nil || s.live == nil {
		return nil
	}
	return s.watch.WatchApps(ctx, vault.AppWatcher{Changed: s.live.dropApp, Fresh: s.live.fresh, Lost: s.live.reset})
}

// entry is what the cache knows of a live family.
type entry struct {
	app       string
	principal vault.Principal
	expires   time.Time
}

// liveness is the per-process cache of "this token family is alive",
// keyed by family id (never by a token or anything derived from one). It
// holds only families read alive from the store, and forgets an app's the
// moment its record changes. A fill races no change: fills carry the
// epoch read before the store was, and every invalidation moves the epoch
// on, so a fill that started before an invalidation is dropped.
type liveness struct {
	max  int
	sole bool // this process is the store's only writer: always trusted

	mu     sync.RWMutex // guards the fields below
	fams   map[string]entry
	byApp  map[string][]string // app id -> its cached family ids
	epoch  uint64              // starts at 1: 0 means "do not fill"
	freshT time.Time           // every change committed before it is applied (Watch)
}

func newLiveness(max int, sole bool) *liveness {
	if max <= 0 {
		max = 50000
	}
	return &liveness{max: max, sole: sole, fams: map[string]entry{}, byApp: map[string][]string{}, epoch: 1}
}

// trusted: the cache holds every end committed more than Bound ago. The
// caller holds mu.
func (c *liveness) trusted() bool {
	return c.sole || (!c.freshT.IsZero() && time.Since(c.freshT) < Bound)
}

// get returns famID's entry when the cache is trusted, with the epoch a
// fill of what the store says must carry (0 when the cache is not
// trusted: nothing is filled).
func (c *liveness) get(famID string) (e entry, epoch uint64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.trusted() {
		return entry{}, 0, false
	}
	e, ok = c.fams[famID]
	return e, c.epoch, ok
}

// put caches e for famID unless the cache changed since epoch.
func (c *liveness) put(epoch uint64, famID string, e entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if epoch != c.epoch || !c.trusted() {
		return
	}
	if _, ok := c.fams[famID]; ok {
		return
	}
	if len(c.fams) >= c.max {
		for id, old := range c.fams { // one arbitrary entry goes
			c.forget(id, old.app)
			break
		}
	}
	c.fams[famID] = e
	c.byApp[e.app] = append(c.byApp[e.app], famID)
}

// forget removes one family. The caller holds mu.
func (c *liveness) forget(famID, appID string) {
	delete(c.fams, famID)
	ids := c.byApp[appID]
	for i, id := range ids {
		if id == famID {
			ids = append(ids[:i], ids[i+1:]...)
			break
		}
	}
	if len(ids) == 0 {
		delete(c.byApp, appID)
	} else {
		c.byApp[appID] = ids
	}
}

// dropApp forgets every family of appID: its record changed.
func (c *liveness) dropApp(appID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	for _, id := range c.byApp[appID] {
		delete(c.fams, id)
	}
	delete(c.byApp, appID)
}

// fresh records that every change committed before asOf is applied.
func (c *liveness) fresh(asOf time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if asOf.After(c.freshT) {
		c.freshT = asOf
	}
}

// reset forgets everything and distrusts the cache until the next fresh:
// the feed broke, so changes may have been missed.
func (c *liveness) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.freshT = time.Time{}
	clear(c.fams)
	clear(c.byApp)
}
