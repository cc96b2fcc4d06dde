package connections

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// everyConnectionTo yields every connection to the provider name
// (metadata, as vault.AdminStore.ProviderConnections gives them), a page
// of 200 at a time; a page that cannot be read is yielded as an error and
// ends it.
func (s *Service) everyConnectionTo(ctx context.Context, name string) iter.Seq2[vault.Connection, error] {
	return func(yield func(vault.Connection, error) bool) {
		adm := s.opts.Store.Admin()
		after := ""
		for {
			page, err := adm.ProviderConnections(ctx, name, after, 200)
			if err != nil {
				yield(vault.Connection{}, err)
				return
			}
			if len(page) == 0 {
				return
			}
			after = page[len(page)-1].ID
			for _, c := range page {
				if !yield(c, nil) {
					return
				}
			}
		}
	}
}

// KeepAliveReport is what one keep-alive pass did.
type KeepAliveReport struct {
	// Checked: connections of keep_alive providers looked at.
	Checked int
	// Refreshed, Failed, Reconnect: refreshes tried and their outcomes.
	Refreshed, Failed, Reconnect int
}

// KeepAlivePass refreshes, once, every connection that its provider's
// keep_alive says to keep: active, holding a refresh token, used (or
// connected) within keep_alive.window, with tokens last refreshed more
// than keep_alive_refresh ago. Before each refresh it calls wait, which
// bounds the rate (and may end the pass by returning an error). A refresh
// the provider refuses marks the connection needs_reconnect (and so is a
// connection.needs_reconnect event); one that fails otherwise is a
// connection.refresh_failed event and is tried again on the next pass.
// The caller runs passes in one place only (one process, or the holder of
// a lock across replicas).
func (s *Service) KeepAlivePass(ctx context.Context, wait func(context.Context) error) (KeepAliveReport, error) {
	var rep KeepAliveReport
	for _, name := range s.providers.Names() {
		p, _ := s.providers.Lookup(name)
		if p.KeepAlive.Window <= 0 {
			continue
		}
		for c, err := range s.everyConnectionTo(ctx, name) {
			if err != nil {
				return rep, fmt.Errorf("connections: keep-alive %s: %w", name, err)
			}
			rep.Checked++
			now := s.opts.Now()
			used := c.LastUsed
			if c.Created.After(used) {
				used = c.Created
			}
			olderThan := now.Add(-p.KeepAlive.Every)
			if c.Status == vault.StatusNeedsReconnect || c.NoRefreshToken ||
				now.Sub(used) > p.KeepAlive.Window || !provider.RefreshedAt(c).Before(olderThan) {
				continue
			}
			if err := wait(ctx); err != nil {
				return rep, err
			}
			_, err := s.opts.Client.KeepAlive(ctx, c.ID, olderThan)
			switch {
			case err == nil:
				rep.Refreshed++
				s.opts.Telemetry.KeepAlive(name, telemetry.KeepAliveRefreshed)
			case errors.Is(err, provider.ErrNothingToKeepAlive), errors.Is(err, vault.ErrNotFound):
			case errors.Is(err, provider.ErrNeedsReconnect):
				rep.Reconnect++
				s.opts.Telemetry.KeepAlive(name, telemetry.KeepAliveReconnect)
			case ctx.Err() != nil:
				return rep, ctx.Err()
			default:
				rep.Failed++
				s.opts.Telemetry.KeepAlive(name, telemetry.KeepAliveFailed)
				s.log.Warn("connections: keep-alive refresh failed; tried again on the next pass", "provider", name, "connection", c.ID, "err", err)
			}
		}
	}
	return rep, nil
}
