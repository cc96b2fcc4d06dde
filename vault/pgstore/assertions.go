package pgstore

import (
	"context"
	"fmt"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Assertions implements vault.Store: the store is its own AssertionLedger.
func (s *Store) Assertions() vault.AssertionLedger { return s }

const insertSpent = `INSERT INTO spent_assertions (key, expires_ns) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING`

// SpendAssertion implements vault.AssertionLedger: one INSERT … ON
// CONFLICT DO NOTHING, so of concurrent spends on any replica exactly one
// inserts the row.
func (s *Store) SpendAssertion(ctx context.Context, key string, expires time.Time) error {
	if err := record.CheckAssertionKey(key); err != nil {
		return err
	}
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, insertSpent, key, nanos(expires))
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: spend assertion: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %w", vault.ErrAssertionSpent)
	}
	return nil
}

// DeleteSpentAssertions implements vault.AssertionLedger.
func (s *Store) DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM spent_assertions WHERE expires_ns < $1`, nanos(before))
	if err != nil {
		return 0, s.dbErr(fmt.Errorf("pgstore: delete spent assertions: %w", err))
	}
	return int(tag.RowsAffected()), nil
}
