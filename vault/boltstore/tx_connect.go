package boltstore

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Connector implements vault.Store: the store connects in one transaction.
func (s *Store) Connector() vault.GrantConnector { return s }

// Connect implements vault.GrantConnector: the connection write and the
// grant update share one batched write transaction, so one fsync.
func (s *Store) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, grant func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	t, err := s.open.ConnectTarget(ctx, s.kr, w)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	var (
		outC vault.Connection
		outG vault.Grant
	)
	err = s.decide(func(tx *bolt.Tx) error {
		outC, outG = vault.Connection{}, vault.Grant{}
		old := tx.Bucket(bConns).Get([]byte(t.ID))
		rec, c, err := t.Onto(old)
		if err != nil {
			return refuse(err)
		}
		og, ng, ngrec, err := grantUpdate(tx, grantID, grant)
		if err != nil {
			return refuse(err)
		}
		// Past the deliveries' check every expected failure is behind
		// us: write both.
		if err := s.writeConnection(tx, t.ID, t.Created.Principal, old, rec); err != nil {
			return err
		}
		if err := tx.Bucket(bGrants).Put([]byte(grantID), ngrec); err != nil {
			return err
		}
		if err := reindexGrant(tx, og, ng); err != nil {
			return err
		}
		outC, outG = c, ng
		return nil
	})
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	return outC, outG, nil
}

// grantUpdate reads grant id in tx and applies fn with UpdateGrant's rules,
// returning the old and new grant and the new record; writing is the
// caller's (Connect's, whose transaction writes a connection too). Its errors are the operation's answer (nothing was written).
func grantUpdate(tx *bolt.Tx, id string, fn func(vault.Grant) (vault.Grant, error)) (old, ng vault.Grant, rec []byte, err error) {
	cur := tx.Bucket(bGrants).Get([]byte(id))
	if cur == nil {
		return old, ng, nil, fmt.Errorf("boltstore: grant %s: %w", id, vault.ErrNotFound)
	}
	rec, old, ng, err = record.Grants.Update(cur, fn)
	return old, ng, rec, err
}

// reindexGrant keeps the grant indexes in step when an update changed
// Created or Expires (as UpdateGrant does).
func reindexGrant(tx *bolt.Tx, old, ng vault.Grant) error {
	if !old.Created.Equal(ng.Created) {
		if err := moveKey(tx.Bucket(bGrantByPrin), grantPrincipalKey(old), grantPrincipalKey(ng)); err != nil {
			return err
		}
	}
	if !old.Expires.Equal(ng.Expires) {
		return moveKey(tx.Bucket(bGrantByExp), grantExpiryKey(old), grantExpiryKey(ng))
	}
	return nil
}

// moveKey moves the index entry from to to in index b.
func moveKey(b *bolt.Bucket, from, to []byte) error {
	if err := b.Delete(from); err != nil {
		return err
	}
	return b.Put(to, nil)
}
