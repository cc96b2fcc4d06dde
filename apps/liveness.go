package apps

import (
	"context"
	"errors"
	"fmt"
	"time"

	"credbroker/internal/replicache"
	"credbroker/vault"
)

// Bound is the longest a token family's end takes to be seen by every
// replica: a family that ends (its app removed, its refresh token
// replayed, its person offboarded, its token revoked) is refused on every
// replica once the change is acknowledged plus Bound. In this process its
// end is seen at once.
const Bound = replicache.Bound

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
		if e, _, epoch, ok = s.live.Get(famID); ok && e.app == appID {
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
			s.live.Put(epoch, famID, appID, entry{app: appID, principal: l.Principal, expires: f.Expires})
		}
		return f.Expires, nil
	}
	return time.Time{}, ErrFamilyEnded
}

// ended drops what the liveness cache holds of app appID after this
// process changed the record (other processes learn it through Watch).
func (s *Service) ended(appID string) {
	if s.live != nil {
		s.live.Drop(appID)
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
	return s.watch.WatchApps(ctx, s.live.Watcher())
}

// entry is what the cache knows of a live family.
type entry struct {
	app       string
	principal vault.Principal
	expires   time.Time
}

// liveness is the per-process cache of "this token family is alive",
// keyed by family id (never by a token or anything derived from one) and
// grouped by app: it holds only families read alive from the store, and
// forgets an app's the moment its record changes (replicache).
type liveness = replicache.Cache[entry]

func newLiveness(max int, sole bool) *liveness {
	return replicache.New[entry](max, 50000, sole)
}
