package memstore

import (
	"context"
	"fmt"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Assertions implements vault.Store: the store is its own AssertionLedger.
func (s *Store) Assertions() vault.AssertionLedger { return s }

// SpendAssertion implements vault.AssertionLedger under the write lock.
func (s *Store) SpendAssertion(ctx context.Context, key string, expires time.Time) error {
	if err := record.CheckAssertionKey(key); err != nil {
		return err
	}
	return update(s, func() error {
		if _, ok := s.spent[key]; ok {
			return fmt.Errorf("memstore: %w", vault.ErrAssertionSpent)
		}
		s.spent[key] = expires
		return nil
	})
}

// DeleteSpentAssertions implements vault.AssertionLedger.
func (s *Store) DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error) {
	return deleteWhere(s, s.spent, func(exp time.Time) (bool, error) { return exp.Before(before), nil })
}
