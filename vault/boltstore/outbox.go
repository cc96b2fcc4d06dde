package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

var (
	bOutbox         = []byte("outbox")
	bOutboxDue      = []byte("outbox_due")
	bRetired        = []byte("retired")
	bRetiredByPrinc = []byte("retired_by_principal")
)

// Outbox implements vault.Store: the store is its own Outbox.
func (s *Store) Outbox() vault.Outbox { return s }

// outboxKey is a delivery's key in the outbox bucket: the id's length
// keeps ids that are prefixes of each other apart.
func outboxKey(id, endpoint string) []byte {
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(id)+len(endpoint)), uint32(len(id)))
	return append(append(b, id...), endpoint...)
}

func dueKey(d vault.Delivery) []byte {
	k := outboxKey(d.ID, d.Endpoint)
	return append(timeKey(make([]byte, 0, timeKeyLen+len(k)), d.Due), k...)
}

// putDeliveries stores ds (each unless already stored) with their due
// index entries, inside tx.
func putDeliveries(tx *bolt.Tx, ds []vault.Delivery) error {
	ob, db := tx.Bucket(bOutbox), tx.Bucket(bOutboxDue)
	for _, d := range ds {
		k := outboxKey(d.ID, d.Endpoint)
		if ob.Get(k) != nil {
			continue
		}
		rec, err := record.EncodeDelivery(d)
		if err != nil {
			return err
		}
		if err := ob.Put(k, rec); err != nil {
			return err
		}
		if err := db.Put(dueKey(d), nil); err != nil {
			return err
		}
	}
	return nil
}

// EnqueueDeliveries implements vault.Outbox.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []vault.Delivery) error {
	if err := s.open.CheckDeliveries(ctx, ds); err != nil {
		return err
	}
	return s.batch(func(tx *bolt.Tx) error { return putDeliveries(tx, ds) })
}

// ClaimDeliveries implements vault.Outbox: a walk of the due index from
// its start, moving each claimed delivery's index entry to its lease end,
// in one write transaction.
func (s *Store) ClaimDeliveries(ctx context.Context, now time.Time, limit int, lease time.Duration) ([]vault.Delivery, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	end := timeKey(nil, now)
	var out []vault.Delivery
	err := s.update(func(tx *bolt.Tx) error {
		out = nil
		ob, db := tx.Bucket(bOutbox), tx.Bucket(bOutboxDue)
		var keys [][]byte
		c := db.Cursor()
		for k, _ := c.First(); k != nil && (limit <= 0 || len(keys) < limit); k, _ = c.Next() {
			if len(k) < timeKeyLen || bytes.Compare(k[:timeKeyLen], end) > 0 {
				break
			}
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := db.Delete(k); err != nil {
				return err
			}
			rec := ob.Get(k[timeKeyLen:])
			if rec == nil {
				continue // an index entry without its delivery: dropped
			}
			d, err := record.DecodeDelivery(rec)
			if err != nil {
				return err
			}
			d.Due = now.Add(lease)
			nrec, err := record.EncodeDelivery(d)
			if err != nil {
				return err
			}
			if err := ob.Put(k[timeKeyLen:], nrec); err != nil {
				return err
			}
			if err := db.Put(dueKey(d), nil); err != nil {
				return err
			}
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// rewriteDelivery applies fn to the stored delivery (nil result: delete
// it), keeping the due index in step.
func (s *Store) rewriteDelivery(ctx context.Context, id, endpoint string, fn func(vault.Delivery) *vault.Delivery) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	return s.decide(func(tx *bolt.Tx) error {
		ob, db := tx.Bucket(bOutbox), tx.Bucket(bOutboxDue)
		k := outboxKey(id, endpoint)
		rec := ob.Get(k)
		if rec == nil {
			return refuse(fmt.Errorf("boltstore: delivery %s to %s: %w", id, endpoint, vault.ErrNotFound))
		}
		old, err := record.DecodeDelivery(rec)
		if err != nil {
			return refuse(err)
		}
		if err := db.Delete(dueKey(old)); err != nil {
			return err
		}
		nd := fn(old)
		if nd == nil {
			return ob.Delete(k)
		}
		nrec, err := record.EncodeDelivery(*nd)
		if err != nil {
			return err
		}
		if err := ob.Put(k, nrec); err != nil {
			return err
		}
		return db.Put(dueKey(*nd), nil)
	})
}

// FinishDelivery implements vault.Outbox.
func (s *Store) FinishDelivery(ctx context.Context, id, endpoint string) error {
	return s.rewriteDelivery(ctx, id, endpoint, func(vault.Delivery) *vault.Delivery { return nil })
}

// RetryDelivery implements vault.Outbox.
func (s *Store) RetryDelivery(ctx context.Context, d vault.Delivery) error {
	return s.rewriteDelivery(ctx, d.ID, d.Endpoint, func(old vault.Delivery) *vault.Delivery {
		old.Attempts, old.Due, old.LastError = d.Attempts, d.Due, d.LastError
		return &old
	})
}

// OutboxDepth implements vault.Outbox: a walk of the outbox (it is short
// unless an endpoint has been down for long).
func (s *Store) OutboxDepth(ctx context.Context) (int, time.Time, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, time.Time{}, err
	}
	var (
		n      int
		oldest time.Time
	)
	err := s.view(func(tx *bolt.Tx) error {
		n, oldest = 0, time.Time{}
		return tx.Bucket(bOutbox).ForEach(func(_, rec []byte) error {
			d, err := record.DecodeDelivery(rec)
			if err != nil {
				return err
			}
			n++
			if oldest.IsZero() || d.Created.Before(oldest) {
				oldest = d.Created
			}
			return nil
		})
	})
	return n, oldest, err
}

// Admin implements vault.Store: the store is its own AdminStore.
func (s *Store) Admin() vault.AdminStore { return s }

// ProviderConnections implements vault.AdminStore: a walk of the
// connections from after, decoding metadata only.
func (s *Store) ProviderConnections(ctx context.Context, provider, after string, limit int) ([]vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var out []vault.Connection
	err := s.view(func(tx *bolt.Tx) error {
		out = nil
		c := tx.Bucket(bConns).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
			m, err := record.ConnectionMeta(v)
			if err != nil {
				return fmt.Errorf("boltstore: connection %s: %w", k, err)
			}
			if m.Provider == provider {
				out = append(out, m)
			}
		}
		return nil
	})
	return out, err
}

// DeleteGrants implements vault.AdminStore: a seek on the principal
// index, removing every index entry with the grant.
func (s *Store) DeleteGrants(ctx context.Context, p vault.Principal) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		prefix := principalKey(p, timeKeyLen)
		byPrin := tx.Bucket(bGrantByPrin)
		var keys [][]byte
		c := byPrin.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := byPrin.Delete(k); err != nil {
				return err
			}
			if len(k) < len(prefix)+timeKeyLen {
				continue
			}
			dropped, err := dropGrant(tx, k[len(prefix)+timeKeyLen:], bGrantByExp, grantExpiryKey)
			if err != nil {
				return err
			}
			if dropped {
				n++
			}
		}
		return nil
	})
	return n, err
}

// RetireConnection implements vault.AdminStore.
func (s *Store) RetireConnection(ctx context.Context, id string) error {
	return s.deleteConnection(ctx, id, true)
}

// RetiredConnections implements vault.AdminStore.
func (s *Store) RetiredConnections(ctx context.Context, p vault.Principal) ([]vault.Connection, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	prefix := principalKey(p, 0)
	var recs [][]byte
	err := s.view(func(tx *bolt.Tx) error {
		recs = nil
		retired := tx.Bucket(bRetired)
		c := tx.Bucket(bRetiredByPrinc).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			if rec := retired.Get(k[len(prefix):]); rec != nil {
				recs = append(recs, bytes.Clone(rec))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return record.DecodeRetired(s.kr, p, recs)
}

// ForgetRetired implements vault.AdminStore.
func (s *Store) ForgetRetired(ctx context.Context, id string) error {
	return s.dropConnection(ctx, bRetired, bRetiredByPrinc, "retired connection", id, nil)
}
