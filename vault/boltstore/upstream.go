package boltstore

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// bUpstream holds the broker's registrations at upstream authorization
// servers: vault.UpstreamClient.Key -> record (its secret sealed).
var bUpstream = []byte("upstream_clients")

// UpstreamClients implements vault.Store: the store is its own
// UpstreamClientStore.
func (s *Store) UpstreamClients() vault.UpstreamClientStore { return s }

// GetUpstreamClient implements vault.UpstreamClientStore.
func (s *Store) GetUpstreamClient(ctx context.Context, key string) (vault.UpstreamClient, error) {
	return getDecoded(ctx, s, bUpstream, "upstream client", key, func(b []byte) (vault.UpstreamClient, error) {
		return record.DecodeUpstreamClient(s.kr, b)
	})
}

// PutUpstreamClient implements vault.UpstreamClientStore: the check and
// the insert are one write transaction, so the first put of a key wins.
func (s *Store) PutUpstreamClient(ctx context.Context, c vault.UpstreamClient) (vault.UpstreamClient, error) {
	rec, err := record.EncodeUpstreamClient(s.kr, c)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	if err := s.open.Ready(ctx); err != nil {
		return vault.UpstreamClient{}, err
	}
	var stored []byte
	err = s.batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(bUpstream)
		if old := b.Get([]byte(c.Key)); old != nil {
			stored = bytes.Clone(old)
			return nil
		}
		stored = rec
		return b.Put([]byte(c.Key), rec)
	})
	if err != nil {
		return vault.UpstreamClient{}, fmt.Errorf("boltstore: put upstream client %q: %w", c.Key, err)
	}
	return record.DecodeUpstreamClient(s.kr, stored)
}

// DeleteUpstreamClient implements vault.UpstreamClientStore: the compare
// and the delete are one write transaction.
func (s *Store) DeleteUpstreamClient(ctx context.Context, key, clientID string) error {
	return s.deleteKeyIf(ctx, bUpstream, key, "upstream client", func(_ *bolt.Tx, old []byte) error {
		if err := record.UpstreamClientDeletable(old, clientID); err != nil {
			return refuse(fmt.Errorf("boltstore: delete upstream client: %w", err))
		}
		return nil
	})
}

// ResealUpstreamClients implements vault.UpstreamClientStore in one write
// transaction (the broker keeps a few registrations, one per upstream
// authorization server).
func (s *Store) ResealUpstreamClients(ctx context.Context) (int, error) {
	return s.resealBucket(ctx, bUpstream, "upstream clients", func(k, v []byte) ([]byte, bool, error) {
		nrec, changed, err := record.ResealUpstreamClient(s.kr, v)
		if err != nil {
			return nil, false, fmt.Errorf("upstream client %q: %w", k, err)
		}
		return nrec, changed, nil
	})
}

// resealBucket rewrites, in one write transaction, the records of bucket
// that reseal seals again with the primary key (changed), and returns how
// many; what names them in errors.
func (s *Store) resealBucket(ctx context.Context, bucket []byte, what string, reseal func(k, v []byte) ([]byte, bool, error)) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		b := tx.Bucket(bucket)
		c := b.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			nrec, changed, err := reseal(k, v)
			if err != nil {
				return err
			}
			if !changed {
				continue
			}
			at := bytes.Clone(k)
			if err := b.Put(at, nrec); err != nil {
				return err
			}
			n++
			c.Seek(at) // a write moves the cursor: back to where it was
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("boltstore: reseal %s: %w", what, err)
	}
	return n, nil
}

// upstreamKeyUsage adds to usage the keys that seal upstream client
// secrets (KeyUsage).
func upstreamKeyUsage(tx *bolt.Tx, usage map[string]int) error {
	return tx.Bucket(bUpstream).ForEach(func(k, v []byte) error {
		_, sealed, err := record.UpstreamClientMeta(v)
		if err != nil {
			return fmt.Errorf("boltstore: upstream client %q: %w", k, err)
		}
		if sealed != "" {
			usage[sealed]++
		}
		return nil
	})
}
