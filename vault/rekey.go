package vault

import (
	"context"
	"errors"
	"fmt"
)

// Rekey re-seals every connection whose token set is not sealed with kr's
// primary key, batch ids at a time, while the store stays in use (each record
// is rewritten through UpdateConnection, so concurrent writers are safe),
// then every upstream client secret sealed with another key
// (UpstreamClientStore.ResealUpstreamClients) and every IdP session
// (IdPSessionStore.ResealIdPSessions).
// It is idempotent and resumable: records already on the primary key are
// skipped, so an interrupted run simply starts again. The store must have
// been opened with kr. It returns how many records it rewrote.
func Rekey(ctx context.Context, s Store, kr *Keyring, batch int) (int, error) {
	if batch <= 0 {
		batch = 500
	}
	primary := kr.Primary()
	rewritten := 0
	after := ""
	for {
		ids, err := s.ConnectionIDs(ctx, after, batch)
		if err != nil {
			return rewritten, fmt.Errorf("vault: rekey: list: %w", err)
		}
		if len(ids) == 0 {
			n, err := s.UpstreamClients().ResealUpstreamClients(ctx)
			rewritten += n
			if err != nil {
				return rewritten, fmt.Errorf("vault: rekey: upstream clients: %w", err)
			}
			n, err = s.IdPSessions().ResealIdPSessions(ctx)
			rewritten += n
			if err != nil {
				return rewritten, fmt.Errorf("vault: rekey: IdP sessions: %w", err)
			}
			return rewritten, nil
		}
		if r := s.Resealer(); r != nil {
			n, err := r.Reseal(ctx, ids)
			rewritten += n
			if err != nil {
				return rewritten, fmt.Errorf("vault: rekey: %w", err)
			}
			after = ids[len(ids)-1]
			continue
		}
		for _, id := range ids {
			if err := ctx.Err(); err != nil {
				return rewritten, err
			}
			changed := false
			_, err := s.UpdateConnection(ctx, id, func(c Connection) (Connection, error) {
				if c.SealedWith == primary {
					return c, errSkip
				}
				changed = true
				return c, nil
			})
			switch {
			case err == errSkip, errors.Is(err, ErrNotFound):
			case err != nil:
				return rewritten, fmt.Errorf("vault: rekey %s: %w", id, err)
			case changed:
				rewritten++
			}
		}
		after = ids[len(ids)-1]
	}
}

// Resealer is the Store feature (Store.Resealer, which may be nil) that
// re-seals the token sets of the given connections with the primary key
// in one transaction, skipping those already sealed with it and ids that
// no longer exist, and returns how many it rewrote (each rewrite
// increments Version). Rekey uses it when present so a rotation costs one
// durable write per batch instead of one per record.
type Resealer interface {
	Reseal(ctx context.Context, ids []string) (int, error)
}

type skipError struct{}

func (skipError) Error() string { return "vault: skip" }

var errSkip error = skipError{}
