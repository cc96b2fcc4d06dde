package provider

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"credbroker/vault"
)

// Keep-alive (providers.yaml):
//
//	keep_alive: 30d          # connections used within 30 days are kept alive
//	keep_alive_refresh: 1d   # by refreshing tokens last refreshed longer ago than this (default 1d)
//
// A provider that expires refresh tokens nobody used for a while (idle
// expiry), or that rotates them, silently ends connections of people who
// did not use them; with keep_alive the broker refreshes them in the
// background, before that happens. keep_alive_refresh must be shorter
// than the provider's idle expiry.

// KeepAliveSpec is the keep-alive setting of a provider entry.
type KeepAliveSpec struct {
	// Window: connections used (or connected) within it are kept alive;
	// zero: keep-alive is off.
	Window time.Duration
	// Every: a kept connection is refreshed once its tokens were last
	// refreshed this long ago.
	Every time.Duration
}

// DefaultKeepAliveRefresh is keep_alive_refresh when it is not given.
const DefaultKeepAliveRefresh = 24 * time.Hour

// keepAlive checks keep_alive and keep_alive_refresh.
func (v *entryCheck) keepAlive(p *Provider, window, every string) {
	if window == "" {
		if every != "" {
			v.fail("keep_alive_refresh", "keep_alive_refresh needs keep_alive")
		}
		return
	}
	w, err := ParseDuration(window)
	if err != nil || w <= 0 {
		v.fail("keep_alive", "keep_alive %q: want a positive duration such as 30d or 12h", window)
		return
	}
	e := DefaultKeepAliveRefresh
	if every != "" {
		if e, err = ParseDuration(every); err != nil || e <= 0 {
			v.fail("keep_alive_refresh", "keep_alive_refresh %q: want a positive duration such as 1d or 6h", every)
			return
		}
	}
	if e > w {
		if every == "" {
			e = w
		} else {
			v.fail("keep_alive_refresh", "keep_alive_refresh %s is longer than keep_alive %s", every, window)
			return
		}
	}
	p.KeepAlive = KeepAliveSpec{Window: w, Every: e}
}

// ParseDuration is time.ParseDuration that also takes whole days ("30d").
func ParseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("bad number of days %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	return time.ParseDuration(s)
}

// RefreshedAt is when c's tokens were last issued: its last refresh, or
// when it was connected or reconnected.
func RefreshedAt(c vault.Connection) time.Time {
	if c.LastRefreshed.After(c.Updated) {
		return c.LastRefreshed
	}
	return c.Updated
}

// KeepAlive refreshes connection id when its tokens were last refreshed
// before olderThan, even though its access token is still fresh: the same
// single flight, lock, re-check and compare-and-swap as a refresh before
// use, so it never races one. It reports whether it refreshed. Failures
// are those of a refresh: ErrNeedsReconnect (the connection is marked),
// ErrProviderUnavailable.
func (k *Client) KeepAlive(ctx context.Context, id string, olderThan time.Time) (bool, error) {
	f, _ := k.join(ctx, id, "", olderThan)
	select {
	case <-f.done:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	if f.err != nil {
		return false, f.err
	}
	if f.conn.Token.RefreshToken == "" {
		return false, ErrNothingToKeepAlive
	}
	return !RefreshedAt(f.conn).Before(olderThan), nil
}
