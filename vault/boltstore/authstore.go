package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// The authorization server's buckets (see the package doc). They are
// created at open like the others, so a database written before they
// existed gains them on its first open by this version.
var (
	bOAuthClients     = []byte("oauth_clients")
	bOAuthCodes       = []byte("oauth_codes")
	bOAuthApps        = []byte("oauth_apps")
	bOAuthAppByClient = []byte("oauth_app_by_client")
)

// Auth implements vault.Store: the store is its own AuthStore.
func (s *Store) Auth() vault.AuthStore { return s }

func appClientKey(p vault.Principal, clientID string) []byte {
	return append(principalKey(p, len(clientID)), clientID...)
}

// CreateOAuthClient implements vault.AuthStore: the count and the insert
// share one transaction.
func (s *Store) CreateOAuthClient(ctx context.Context, c vault.OAuthClient, max int) (vault.OAuthClient, error) {
	c, rec, err := fresh(ctx, s, record.OAuthClients, c)
	if err != nil {
		return vault.OAuthClient{}, err
	}
	err = s.decide(func(tx *bolt.Tx) error {
		b := tx.Bucket(bOAuthClients)
		if b.Get([]byte(c.ID)) != nil {
			return refuse(fmt.Errorf("boltstore: oauth client %s: %w", c.ID, vault.ErrExists))
		}
		if max > 0 && countKeys(b, max) >= max {
			return refuse(fmt.Errorf("boltstore: oauth client %s: %w", c.ID, vault.ErrTooManyClients))
		}
		return b.Put([]byte(c.ID), rec)
	})
	if err != nil {
		return vault.OAuthClient{}, err
	}
	return c, nil
}

// fresh is Kind.New on a ready store: the copy of v a create stores, and
// its record.
func fresh[T any](ctx context.Context, s *Store, k record.Kind[T], v T) (T, []byte, error) {
	if err := s.open.Ready(ctx); err != nil {
		return *new(T), nil, err
	}
	return k.New(v)
}

// countKeys counts b's keys, stopping at limit. (Bucket.Stats does not
// see the writes of the transaction in progress.)
func countKeys(b *bolt.Bucket, limit int) int {
	n := 0
	c := b.Cursor()
	for k, _ := c.First(); k != nil && n < limit; k, _ = c.Next() {
		n++
	}
	return n
}

// getKind returns the record of kind k stored under id in bucket.
func getKind[T any](ctx context.Context, s *Store, bucket []byte, k record.Kind[T], id string) (T, error) {
	return getDecoded(ctx, s, bucket, k.Name, id, k.Decode)
}

// getDecoded returns the record stored under id in bucket, decoded with
// decode; what names the kind of record in errors.
func getDecoded[T any](ctx context.Context, s *Store, bucket []byte, what, id string, decode func([]byte) (T, error)) (T, error) {
	var zero T
	if err := s.open.Ready(ctx); err != nil {
		return zero, err
	}
	rec, err := s.get(bucket, id)
	if err != nil {
		return zero, err
	}
	if rec == nil {
		return zero, fmt.Errorf("boltstore: %s %s: %w", what, id, vault.ErrNotFound)
	}
	return decode(rec)
}

// get returns a copy of key's value in bucket, or nil.
func (s *Store) get(bucket []byte, key string) ([]byte, error) {
	var rec []byte
	err := s.view(func(tx *bolt.Tx) error {
		rec = bytes.Clone(tx.Bucket(bucket).Get([]byte(key)))
		return nil
	})
	return rec, err
}

// GetOAuthClient implements vault.AuthStore.
func (s *Store) GetOAuthClient(ctx context.Context, id string) (vault.OAuthClient, error) {
	return getKind(ctx, s, bOAuthClients, record.OAuthClients, id)
}

// UpdateOAuthClient implements vault.AuthStore.
func (s *Store) UpdateOAuthClient(ctx context.Context, id string, fn func(vault.OAuthClient) (vault.OAuthClient, error)) (vault.OAuthClient, error) {
	return casKind(ctx, s, bOAuthClients, record.OAuthClients, id, fn, nil)
}

// DeleteOAuthClient implements vault.AuthStore.
func (s *Store) DeleteOAuthClient(ctx context.Context, id string) error {
	return s.deleteKey(ctx, bOAuthClients, id, "oauth client")
}

// deleteKey removes key from bucket, ErrNotFound when absent.
func (s *Store) deleteKey(ctx context.Context, bucket []byte, key, what string) error {
	return s.deleteKeyIf(ctx, bucket, key, what, nil)
}

// deleteKeyIf is deleteKey running before (if set) on the stored record
// first, in the same transaction: it may refuse (refuse: the answer, and
// nothing is deleted) or write what goes with the delete.
func (s *Store) deleteKeyIf(ctx context.Context, bucket []byte, key, what string, before func(tx *bolt.Tx, old []byte) error) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	return s.decide(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucket)
		old := b.Get([]byte(key))
		if old == nil {
			return refuse(fmt.Errorf("boltstore: %s %s: %w", what, key, vault.ErrNotFound))
		}
		if before != nil {
			if err := before(tx, old); err != nil {
				return err
			}
		}
		return b.Delete([]byte(key))
	})
}

// deleteWhere removes the records of bucket that drop says to, in one
// transaction, and returns how many. The buckets it is used on are small
// (codes live a minute; registered clients are capped).
func (s *Store) deleteWhere(ctx context.Context, bucket []byte, drop func(rec []byte) (bool, error)) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	err := s.update(func(tx *bolt.Tx) error {
		n = 0
		c := tx.Bucket(bucket).Cursor()
		for k, v := c.First(); k != nil; {
			ok, err := drop(v)
			if err != nil {
				return err
			}
			if !ok {
				k, v = c.Next()
				continue
			}
			at := bytes.Clone(k)
			if err := c.Delete(); err != nil {
				return err
			}
			n++
			// After a delete, seek back: the cursor lands on the next key.
			k, v = c.Seek(at)
		}
		return nil
	})
	return n, err
}

// DeleteUnusedOAuthClients implements vault.AuthStore.
func (s *Store) DeleteUnusedOAuthClients(ctx context.Context, createdBefore time.Time) (int, error) {
	return s.deleteWhere(ctx, bOAuthClients, func(rec []byte) (bool, error) {
		c, err := record.DecodeOAuthClient(rec)
		return err == nil && c.Used.IsZero() && c.Created.Before(createdBefore), err
	})
}

// CreateAuthCode implements vault.AuthStore.
func (s *Store) CreateAuthCode(ctx context.Context, c vault.AuthCode) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	rec, err := record.EncodeAuthCode(c)
	if err != nil {
		return err
	}
	return s.decide(func(tx *bolt.Tx) error {
		b := tx.Bucket(bOAuthCodes)
		if b.Get([]byte(c.Key)) != nil {
			return refuse(fmt.Errorf("boltstore: authorization code: %w", vault.ErrExists))
		}
		return b.Put([]byte(c.Key), rec)
	})
}

// RedeemAuthCode implements vault.AuthStore: read, check and mark happen in
// one write transaction, so one redemption wins.
func (s *Store) RedeemAuthCode(ctx context.Context, key string) (vault.AuthCode, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.AuthCode{}, err
	}
	var (
		out      vault.AuthCode
		redeemed bool // before: out comes with the refusal
	)
	err := s.decide(func(tx *bolt.Tx) error {
		out, redeemed = vault.AuthCode{}, false
		b := tx.Bucket(bOAuthCodes)
		rec := b.Get([]byte(key))
		if rec == nil {
			return refuse(fmt.Errorf("boltstore: authorization code: %w", vault.ErrNotFound))
		}
		c, err := record.DecodeAuthCode(rec)
		if err != nil {
			return refuse(err)
		}
		if c.Redeemed {
			out, redeemed = c, true
			return refuse(fmt.Errorf("boltstore: %w", vault.ErrCodeRedeemed))
		}
		c.Redeemed = true
		nrec, err := record.EncodeAuthCode(c)
		if err != nil {
			return refuse(err)
		}
		out = c
		return b.Put([]byte(key), nrec)
	})
	if err != nil && !redeemed {
		return vault.AuthCode{}, err
	}
	return out, err
}

// DeleteExpiredAuthCodes implements vault.AuthStore.
func (s *Store) DeleteExpiredAuthCodes(ctx context.Context, before time.Time) (int, error) {
	return s.deleteWhere(ctx, bOAuthCodes, func(rec []byte) (bool, error) {
		c, err := record.DecodeAuthCode(rec)
		return err == nil && c.Expires.Before(before), err
	})
}

// CreateAppAccess implements vault.AuthStore.
func (s *Store) CreateAppAccess(ctx context.Context, a vault.AppAccess) (vault.AppAccess, error) {
	a, rec, err := fresh(ctx, s, record.AppAccesses, a)
	if err != nil {
		return vault.AppAccess{}, err
	}
	ds, err := record.AppChangeDeliveries(s.appChanges, nil, &a)
	if err != nil {
		return vault.AppAccess{}, err
	}
	ik := appClientKey(a.Principal, a.ClientID)
	err = s.decide(func(tx *bolt.Tx) error {
		apps, idx := tx.Bucket(bOAuthApps), tx.Bucket(bOAuthAppByClient)
		if apps.Get([]byte(a.ID)) != nil {
			return refuse(fmt.Errorf("boltstore: app access %s: %w", a.ID, vault.ErrExists))
		}
		if idx.Get(ik) != nil {
			return refuse(fmt.Errorf("boltstore: app access for client %q: %w", a.ClientID, vault.ErrExists))
		}
		if err := apps.Put([]byte(a.ID), rec); err != nil {
			return err
		}
		if err := putDeliveries(tx, ds); err != nil {
			return err
		}
		return idx.Put(ik, []byte(a.ID))
	})
	if err != nil {
		return vault.AppAccess{}, err
	}
	return a, nil
}

// GetAppAccess implements vault.AuthStore.
func (s *Store) GetAppAccess(ctx context.Context, id string) (vault.AppAccess, error) {
	return getKind(ctx, s, bOAuthApps, record.AppAccesses, id)
}

// GetAppLiveness implements vault.AuthStore.
func (s *Store) GetAppLiveness(ctx context.Context, id string) (vault.AppAccess, error) {
	return getDecoded(ctx, s, bOAuthApps, "app access", id, record.DecodeAppLiveness)
}

// FindAppAccess implements vault.AuthStore.
func (s *Store) FindAppAccess(ctx context.Context, p vault.Principal, clientID string) (vault.AppAccess, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.AppAccess{}, err
	}
	var rec []byte
	err := s.view(func(tx *bolt.Tx) error {
		if id := tx.Bucket(bOAuthAppByClient).Get(appClientKey(p, clientID)); id != nil {
			rec = bytes.Clone(tx.Bucket(bOAuthApps).Get(id))
		}
		return nil
	})
	if err != nil {
		return vault.AppAccess{}, err
	}
	if rec == nil {
		return vault.AppAccess{}, fmt.Errorf("boltstore: app access for client %q: %w", clientID, vault.ErrNotFound)
	}
	return record.DecodeAppAccess(rec)
}

// ListAppAccess implements vault.AuthStore: a prefix seek on the
// per-person index.
func (s *Store) ListAppAccess(ctx context.Context, p vault.Principal) ([]vault.AppAccess, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, err
	}
	var recs [][]byte
	prefix := principalKey(p, 0)
	err := s.view(func(tx *bolt.Tx) error {
		recs = nil
		apps := tx.Bucket(bOAuthApps)
		c := tx.Bucket(bOAuthAppByClient).Cursor()
		for k, id := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, id = c.Next() {
			if rec := apps.Get(id); rec != nil {
				recs = append(recs, bytes.Clone(rec))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out, err := record.AppAccesses.DecodeOwned(p, recs)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b vault.AppAccess) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// UpdateAppAccess implements vault.AuthStore.
func (s *Store) UpdateAppAccess(ctx context.Context, id string, fn func(vault.AppAccess) (vault.AppAccess, error)) (vault.AppAccess, error) {
	return cas(ctx, s, bOAuthApps, id, "app access", func(rec []byte) (edit[vault.AppAccess], error) {
		nrec, old, na, err := record.AppAccesses.Update(rec, fn)
		if err != nil {
			return edit[vault.AppAccess]{}, err
		}
		ds, err := record.AppChangeDeliveries(s.appChanges, &old, &na)
		return edit[vault.AppAccess]{rec: nrec, out: na, ds: ds}, err
	}, nil)
}

// DeleteAppAccess implements vault.AuthStore.
func (s *Store) DeleteAppAccess(ctx context.Context, id string) error {
	return s.deleteKeyIf(ctx, bOAuthApps, id, "app access", func(tx *bolt.Tx, rec []byte) error {
		a, err := record.DecodeAppAccess(rec)
		if err != nil {
			return nil
		}
		ds, err := record.AppChangeDeliveries(s.appChanges, &a, nil)
		if err != nil {
			return refuse(err)
		}
		if err := putDeliveries(tx, ds); err != nil {
			return err
		}
		return tx.Bucket(bOAuthAppByClient).Delete(appClientKey(a.Principal, a.ClientID))
	})
}
