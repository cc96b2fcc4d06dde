package boltstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// bSpent holds spent assertions: vault.AssertionKey -> expiry (Unix
// nanoseconds, big endian: spentValue).
var bSpent = []byte("spent_assertions")

// spentValue is a spent assertion's value in bSpent.
func spentValue(expires time.Time) []byte {
	return binary.BigEndian.AppendUint64(nil, uint64(expires.UnixNano()))
}

// spentExpiry reads a value of bSpent; false when it is not one.
func spentExpiry(v []byte) (time.Time, bool) {
	if len(v) != 8 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), true
}

// spentRecord is the exported record of the spent assertion under k.
func spentRecord(k, v []byte) ([]byte, error) {
	exp, ok := spentExpiry(v)
	if !ok {
		return nil, fmt.Errorf("spent assertion %s: %d bytes of expiry: %w", k, len(v), vault.ErrMalformed)
	}
	return record.EncodeSpentAssertion(string(k), exp)
}

// Assertions implements vault.Store: the store is its own AssertionLedger.
func (s *Store) Assertions() vault.AssertionLedger { return s }

// SpendAssertion implements vault.AssertionLedger: the check and the
// insert are one write transaction (through the group commit, so it is
// durable when this returns).
func (s *Store) SpendAssertion(ctx context.Context, key string, expires time.Time) error {
	if err := record.CheckAssertionKey(key); err != nil {
		return err
	}
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	val := spentValue(expires)
	return s.decide(func(tx *bolt.Tx) error {
		b := tx.Bucket(bSpent)
		if b.Get([]byte(key)) != nil {
			return refuse(fmt.Errorf("boltstore: %w", vault.ErrAssertionSpent))
		}
		return b.Put([]byte(key), val)
	})
}

// DeleteSpentAssertions implements vault.AssertionLedger. The bucket only
// holds assertions of the last few minutes, so it is scanned whole.
func (s *Store) DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error) {
	return s.deleteWhere(ctx, bSpent, func(v []byte) (bool, error) {
		exp, ok := spentExpiry(v)
		return !ok || exp.Before(before), nil
	})
}
