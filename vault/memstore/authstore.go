package memstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Auth implements vault.Store: the store is its own AuthStore.
func (s *Store) Auth() vault.AuthStore { return s }

// appKey is the unique (person, client) of an app access record.
type appKey struct {
	p        vault.Principal
	clientID string
}

// authMaps hold the authorization server's records, encoded as a
// persistent backend stores them; guarded by Store.mu.
type authMaps struct {
	clients map[string][]byte
	codes   map[string][]byte
	apps    map[string][]byte
	appByPC map[appKey]string
}

func newAuthMaps() authMaps {
	return authMaps{clients: map[string][]byte{}, codes: map[string][]byte{}, apps: map[string][]byte{}, appByPC: map[appKey]string{}}
}

// CreateOAuthClient implements vault.AuthStore: the count and the insert
// happen under one hold of the write lock.
func (s *Store) CreateOAuthClient(ctx context.Context, c vault.OAuthClient, max int) (vault.OAuthClient, error) {
	c, b, err := record.OAuthClients.New(c)
	if err != nil {
		return vault.OAuthClient{}, err
	}
	return write(s, func() (vault.OAuthClient, error) {
		if err := taken(s.auth.clients, c.ID, "oauth client "+c.ID); err != nil {
			return vault.OAuthClient{}, err
		}
		if max > 0 && len(s.auth.clients) >= max {
			return vault.OAuthClient{}, fmt.Errorf("memstore: oauth client %s: %w", c.ID, vault.ErrTooManyClients)
		}
		s.auth.clients[c.ID] = b
		return c, nil
	})
}

// GetOAuthClient implements vault.AuthStore.
func (s *Store) GetOAuthClient(ctx context.Context, id string) (vault.OAuthClient, error) {
	return get(s, s.auth.clients, id, "oauth client", record.DecodeOAuthClient)
}

// UpdateOAuthClient implements vault.AuthStore.
func (s *Store) UpdateOAuthClient(ctx context.Context, id string, fn func(vault.OAuthClient) (vault.OAuthClient, error)) (vault.OAuthClient, error) {
	return casKind(s, s.auth.clients, record.OAuthClients, id, fn)
}

// DeleteOAuthClient implements vault.AuthStore.
func (s *Store) DeleteOAuthClient(ctx context.Context, id string) error {
	return deleteKey(s, s.auth.clients, id, "oauth client "+id)
}

// DeleteUnusedOAuthClients implements vault.AuthStore.
func (s *Store) DeleteUnusedOAuthClients(ctx context.Context, createdBefore time.Time) (int, error) {
	return deleteWhere(s, s.auth.clients, func(b []byte) (bool, error) {
		c, err := record.DecodeOAuthClient(b)
		return err == nil && c.Used.IsZero() && c.Created.Before(createdBefore), err
	})
}

// CreateAuthCode implements vault.AuthStore.
func (s *Store) CreateAuthCode(ctx context.Context, c vault.AuthCode) error {
	b, err := record.EncodeAuthCode(c)
	if err != nil {
		return err
	}
	return update(s, func() error {
		if err := taken(s.auth.codes, c.Key, "authorization code"); err != nil {
			return err
		}
		s.auth.codes[c.Key] = b
		return nil
	})
}

// RedeemAuthCode implements vault.AuthStore.
func (s *Store) RedeemAuthCode(ctx context.Context, key string) (vault.AuthCode, error) {
	return write(s, func() (vault.AuthCode, error) {
		b, ok := s.auth.codes[key]
		if !ok {
			return vault.AuthCode{}, fmt.Errorf("memstore: authorization code: %w", vault.ErrNotFound)
		}
		c, err := record.DecodeAuthCode(b)
		if err != nil {
			return vault.AuthCode{}, err
		}
		if c.Redeemed {
			return c, fmt.Errorf("memstore: %w", vault.ErrCodeRedeemed)
		}
		c.Redeemed = true
		nb, err := record.EncodeAuthCode(c)
		if err != nil {
			return vault.AuthCode{}, err
		}
		s.auth.codes[key] = nb
		return c, nil
	})
}

// DeleteExpiredAuthCodes implements vault.AuthStore.
func (s *Store) DeleteExpiredAuthCodes(ctx context.Context, before time.Time) (int, error) {
	return deleteWhere(s, s.auth.codes, func(b []byte) (bool, error) {
		c, err := record.DecodeAuthCode(b)
		return err == nil && c.Expires.Before(before), err
	})
}

// CreateAppAccess implements vault.AuthStore.
func (s *Store) CreateAppAccess(ctx context.Context, a vault.AppAccess) (vault.AppAccess, error) {
	a, b, err := record.AppAccesses.New(a)
	if err != nil {
		return vault.AppAccess{}, err
	}
	ds, err := record.AppChangeDeliveries(s.appChanges, nil, &a)
	if err != nil {
		return vault.AppAccess{}, err
	}
	return write(s, func() (vault.AppAccess, error) {
		k := appKey{a.Principal, a.ClientID}
		if err := taken(s.auth.apps, a.ID, "app access "+a.ID); err != nil {
			return vault.AppAccess{}, err
		}
		if _, ok := s.auth.appByPC[k]; ok {
			return vault.AppAccess{}, fmt.Errorf("memstore: app access for client %q: %w", a.ClientID, vault.ErrExists)
		}
		s.auth.apps[a.ID] = b
		s.auth.appByPC[k] = a.ID
		s.enqueue(ds)
		return a, nil
	})
}

// GetAppAccess implements vault.AuthStore.
func (s *Store) GetAppAccess(ctx context.Context, id string) (vault.AppAccess, error) {
	return get(s, s.auth.apps, id, "app access", record.DecodeAppAccess)
}

// GetAppLiveness implements vault.AuthStore.
func (s *Store) GetAppLiveness(ctx context.Context, id string) (vault.AppAccess, error) {
	return get(s, s.auth.apps, id, "app access", record.DecodeAppLiveness)
}

// FindAppAccess implements vault.AuthStore.
func (s *Store) FindAppAccess(ctx context.Context, p vault.Principal, clientID string) (vault.AppAccess, error) {
	b, err := read(s, func() ([]byte, error) {
		id, ok := s.auth.appByPC[appKey{p, clientID}]
		if !ok {
			return nil, fmt.Errorf("memstore: app access for client %q: %w", clientID, vault.ErrNotFound)
		}
		return s.auth.apps[id], nil
	})
	if err != nil {
		return vault.AppAccess{}, err
	}
	return record.DecodeAppAccess(b)
}

// ListAppAccess implements vault.AuthStore.
func (s *Store) ListAppAccess(ctx context.Context, p vault.Principal) ([]vault.AppAccess, error) {
	return read(s, func() ([]vault.AppAccess, error) {
		var out []vault.AppAccess
		for k, id := range s.auth.appByPC {
			if k.p != p {
				continue
			}
			a, err := record.DecodeAppAccess(s.auth.apps[id])
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
		slices.SortFunc(out, func(a, b vault.AppAccess) int {
			switch {
			case a.ID < b.ID:
				return -1
			case a.ID > b.ID:
				return 1
			}
			return 0
		})
		return out, nil
	})
}

// UpdateAppAccess implements vault.AuthStore.
func (s *Store) UpdateAppAccess(ctx context.Context, id string, fn func(vault.AppAccess) (vault.AppAccess, error)) (vault.AppAccess, error) {
	return cas(s, s.auth.apps, id, "app access", func(rec []byte) (edit[vault.AppAccess], error) {
		nb, old, na, err := record.AppAccesses.Update(rec, fn)
		if err != nil {
			return edit[vault.AppAccess]{}, err
		}
		ds, err := record.AppChangeDeliveries(s.appChanges, &old, &na)
		return edit[vault.AppAccess]{rec: nb, out: na, ds: ds}, err
	})
}

// DeleteAppAccess implements vault.AuthStore.
func (s *Store) DeleteAppAccess(ctx context.Context, id string) error {
	return update(s, func() error {
		b, ok := s.auth.apps[id]
		if !ok {
			return fmt.Errorf("memstore: app access %s: %w", id, vault.ErrNotFound)
		}
		a, err := record.DecodeAppAccess(b)
		if err != nil && !errors.Is(err, vault.ErrMalformed) {
			return err
		}
		if err == nil {
			ds, err := record.AppChangeDeliveries(s.appChanges, &a, nil)
			if err != nil {
				return err
			}
			s.enqueue(ds)
		}
		delete(s.auth.apps, id)
		delete(s.auth.appByPC, appKey{a.Principal, a.ClientID})
		return nil
	})
}
