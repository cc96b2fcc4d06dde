package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
)

// bSpent holds spent assertions: vault.AssertionKey -> expiry (Unix
// nanoseconds, big endian).
var bSpent = []byte("spent_assertions")

// Assertions implements vault.Store: the store is its own AssertionLedger.
func (s *Store) Assertions() vault.AssertionLedger { return s }

// SpendAssertion implements vault.AssertionLedger: the check and the
// insert are one write transaction (through the group commit, so it is
// durable when this returns).
func (s *Store) SpendAssertion(ctx context.Context, key string, expires time.Time) error {
	if err := vault.CheckAssertionKey(key); err != nil {
		return err
	}
	if err := s.ready(ctx); err != nil {
		return err
	}
	val := binary.BigEndian.AppendUint64(nil, uint64(expires.UnixNano()))
	var opErr error
	err := s.batch(func(tx *bolt.Tx) error {
		opErr = nil
		b := tx.Bucket(bSpent)
		if b.Get([]byte(key)) != nil {
			opErr = fmt.Errorf("boltstore: %w", vault.ErrAssertionSpent)
			return nil
		}
		return b.Put([]byte(key), val)
	})
	if err == nil {
		err = opErr
	}
	return err
}

// DeleteSpentAssertions implements vault.AssertionLedger. The bucket only
// holds assertions of the last few minutes, so it is scanned whole.
func (s *Store) DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bSpent)
		var gone [][]byte
		err := b.ForEach(func(k, v []byte) error {
			if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) < before.UnixNano() {
				gone = append(gone, bytes.Clone(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range gone {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(gone)
		return nil
	})
	return n, err
}
