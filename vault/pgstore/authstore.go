package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Auth implements vault.Store: the store is its own AuthStore.
func (s *Store) Auth() vault.AuthStore { return s }

// clientsLockKey serialises registrations under a cap across replicas
// (a transaction-scoped advisory lock).
var clientsLockKey = lockKey("credbroker/pgstore/oauth_clients")

func (s *Store) clientArgs(c vault.OAuthClient) ([]any, error) {
	return wholeArgs(record.OAuthClients, c, c.ID, nanos(c.Created), !c.Used.IsZero(), int64(c.Version))
}

const insertClient = `INSERT INTO oauth_clients (id, created_ns, used, version, record)
	VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`

// CreateOAuthClient implements vault.AuthStore. Under a cap, one
// statement counts the clients and inserts only under the cap, after an
// advisory lock taken in the same implicit transaction (capRule), so
// concurrent registrations on any replica cannot pass the cap together.
func (s *Store) CreateOAuthClient(ctx context.Context, c vault.OAuthClient, max int) (vault.OAuthClient, error) {
	c, args, err := fresh(ctx, s, record.OAuthClients, c, s.clientArgs)
	if err != nil {
		return vault.OAuthClient{}, err
	}
	insert, capped := insertClient, (*capRule)(nil)
	if max > 0 {
		insert, args = insertClientCapped, append(args, max)
		capped = &capRule{lock: clientsLockKey, refuse: func(n, _ int) error {
			if n >= max {
				return vault.ErrTooManyClients
			}
			return nil
		}}
	}
	if err := s.insertRow(ctx, "oauth client "+c.ID, insert, args, nil, capped); err != nil {
		return vault.OAuthClient{}, err
	}
	return c, nil
}

// insertClientCapped is CreateOAuthClient's capped insert: insertClient's
// row ($1 to $5) only while fewer than $6 clients are registered.
const insertClientCapped = `WITH n (clients) AS (SELECT count(*) FROM (SELECT 1 FROM oauth_clients LIMIT $6) c),
	ins AS (INSERT INTO oauth_clients (id, created_ns, used, version, record)
		SELECT $1, $2, $3, $4, $5 FROM n WHERE n.clients < $6 ON CONFLICT (id) DO NOTHING RETURNING 1)
	SELECT clients, 0, EXISTS (SELECT 1 FROM ins) FROM n`

func (s *Store) getClient(ctx context.Context, id string) (vault.OAuthClient, int64, error) {
	return getRecord(ctx, s, record.OAuthClients, "SELECT record, version FROM oauth_clients WHERE id = $1", id)
}

// GetOAuthClient implements vault.AuthStore.
func (s *Store) GetOAuthClient(ctx context.Context, id string) (vault.OAuthClient, error) {
	c, _, err := s.getClient(ctx, id)
	return c, err
}

// updateClient rewrites a client's row if its version is still the one
// read (the last argument; clientArgs gives the others).
const updateClient = `UPDATE oauth_clients SET created_ns = $2, used = $3, version = $4, record = $5
	WHERE id = $1 AND version = $6`

// UpdateOAuthClient implements vault.AuthStore (compare-and-swap on the
// version column).
func (s *Store) UpdateOAuthClient(ctx context.Context, id string, fn func(vault.OAuthClient) (vault.OAuthClient, error)) (vault.OAuthClient, error) {
	return cas(ctx, s, "oauth client", id, updateClient, s.getClient, applyWhole(record.OAuthClients, fn, s.clientArgs, nil))
}

// deleteRow deletes the row of table whose column equals key.
func (s *Store) deleteRow(ctx context.Context, table, column, key, what string) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	if !storable(key) {
		return fmt.Errorf("pgstore: %s %q: %w", what, key, vault.ErrNotFound)
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM "+table+" WHERE "+column+" = $1", key)
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: delete %s %s: %w", what, key, err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: %s %s: %w", what, key, vault.ErrNotFound)
	}
	return nil
}

// DeleteOAuthClient implements vault.AuthStore.
func (s *Store) DeleteOAuthClient(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "oauth_clients", "id", id, "oauth client")
}

// DeleteUnusedOAuthClients implements vault.AuthStore.
func (s *Store) DeleteUnusedOAuthClients(ctx context.Context, createdBefore time.Time) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM oauth_clients WHERE NOT used AND created_ns < $1", nanos(createdBefore))
	if err != nil {
		return 0, s.dbErr(fmt.Errorf("pgstore: delete unused oauth clients: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

// CreateAuthCode implements vault.AuthStore.
func (s *Store) CreateAuthCode(ctx context.Context, c vault.AuthCode) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	c.Redeemed = false // the redeemed column is authoritative
	rec, err := record.EncodeAuthCode(c)
	if err != nil {
		return err
	}
	if err := checkID("authorization code", c.Key); err != nil {
		return err
	}
	return s.insertRow(ctx, "authorization code", `INSERT INTO oauth_codes (key, expires_ns, redeemed, record)
		VALUES ($1, $2, false, $3) ON CONFLICT (key) DO NOTHING`, []any{c.Key, nanos(c.Expires), rec}, nil, nil)
}

// RedeemAuthCode implements vault.AuthStore: one conditional UPDATE marks
// the code, so exactly one of concurrent redemptions on any replica wins.
func (s *Store) RedeemAuthCode(ctx context.Context, key string) (vault.AuthCode, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.AuthCode{}, err
	}
	if !storable(key) {
		return vault.AuthCode{}, fmt.Errorf("pgstore: authorization code: %w", vault.ErrNotFound)
	}
	var rec []byte
	err := s.pool.QueryRow(ctx, "UPDATE oauth_codes SET redeemed = true WHERE key = $1 AND NOT redeemed RETURNING record", key).Scan(&rec)
	var opErr error
	if errors.Is(err, pgx.ErrNoRows) {
		err = s.pool.QueryRow(ctx, "SELECT record FROM oauth_codes WHERE key = $1", key).Scan(&rec)
		if errors.Is(err, pgx.ErrNoRows) {
			return vault.AuthCode{}, fmt.Errorf("pgstore: authorization code: %w", vault.ErrNotFound)
		}
		opErr = fmt.Errorf("pgstore: %w", vault.ErrCodeRedeemed)
	}
	if err != nil {
		return vault.AuthCode{}, s.dbErr(fmt.Errorf("pgstore: redeem authorization code: %w", err))
	}
	c, err := record.DecodeAuthCode(rec)
	if err != nil {
		return vault.AuthCode{}, err
	}
	c.Redeemed = true
	return c, opErr
}

// DeleteExpiredAuthCodes implements vault.AuthStore.
func (s *Store) DeleteExpiredAuthCodes(ctx context.Context, before time.Time) (int, error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, err
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM oauth_codes WHERE expires_ns < $1", nanos(before))
	if err != nil {
		return 0, s.dbErr(fmt.Errorf("pgstore: delete expired authorization codes: %w", err))
	}
	return int(tag.RowsAffected()), nil
}

func (s *Store) appArgs(a vault.AppAccess) ([]any, error) {
	if err := checkID("client", a.ClientID); err != nil {
		return nil, err
	}
	return wholeArgs(record.AppAccesses, a, a.ID, []byte(a.Principal.Issuer), []byte(a.Principal.Subject), a.ClientID, int64(a.Version))
}

const insertApp = `INSERT INTO oauth_apps (id, iss, sub, client_id, version, record)
	VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING`

// CreateAppAccess implements vault.AuthStore. The unique (iss, sub,
// client_id) constraint keeps one record per person and client.
func (s *Store) CreateAppAccess(ctx context.Context, a vault.AppAccess) (vault.AppAccess, error) {
	a, args, err := fresh(ctx, s, record.AppAccesses, a, s.appArgs)
	if err != nil {
		return vault.AppAccess{}, err
	}
	ds, err := record.AppChangeDeliveries(s.appChanges, nil, &a)
	if err != nil {
		return vault.AppAccess{}, err
	}
	if err := s.insertRow(ctx, fmt.Sprintf("app access %s for client %q", a.ID, a.ClientID), insertApp, args, ds, nil); err != nil {
		return vault.AppAccess{}, err
	}
	return a, nil
}

func (s *Store) getApp(ctx context.Context, id string) (vault.AppAccess, int64, error) {
	return getRecord(ctx, s, record.AppAccesses, "SELECT record, version FROM oauth_apps WHERE id = $1", id)
}

// GetAppAccess implements vault.AuthStore.
func (s *Store) GetAppAccess(ctx context.Context, id string) (vault.AppAccess, error) {
	a, _, err := s.getApp(ctx, id)
	return a, err
}

// GetAppLiveness implements vault.AuthStore.
func (s *Store) GetAppLiveness(ctx context.Context, id string) (vault.AppAccess, error) {
	rec, _, err := s.readRecord(ctx, "app access", "SELECT record, version FROM oauth_apps WHERE id = $1", id)
	if err != nil {
		return vault.AppAccess{}, err
	}
	l, err := record.DecodeAppLiveness(rec)
	if err == nil && l.ID != id {
		err = fmt.Errorf("pgstore: app access %s: stored record names id %s: %w", id, l.ID, vault.ErrMalformed)
	}
	return l, err
}

// FindAppAccess implements vault.AuthStore.
func (s *Store) FindAppAccess(ctx context.Context, p vault.Principal, clientID string) (vault.AppAccess, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.AppAccess{}, err
	}
	if !storable(clientID) {
		return vault.AppAccess{}, fmt.Errorf("pgstore: app access for client %q: %w", clientID, vault.ErrNotFound)
	}
	rec, _, err := s.scanRecord(s.pool.QueryRow(ctx, "SELECT record, version FROM oauth_apps WHERE iss = $1 AND sub = $2 AND client_id = $3",
		[]byte(p.Issuer), []byte(p.Subject), clientID), "app access", fmt.Sprintf("for client %q", clientID))
	if err != nil {
		return vault.AppAccess{}, err
	}
	a, err := record.DecodeAppAccess(rec)
	if err == nil && (a.Principal != p || a.ClientID != clientID) {
		err = fmt.Errorf("pgstore: app access %s: stored record names another person or client: %w", a.ID, vault.ErrMalformed)
	}
	return a, err
}

// ListAppAccess implements vault.AuthStore.
func (s *Store) ListAppAccess(ctx context.Context, p vault.Principal) ([]vault.AppAccess, error) {
	recs, err := queryColumn[[]byte](ctx, s, "list app access", "SELECT record FROM oauth_apps WHERE iss = $1 AND sub = $2 ORDER BY id", []byte(p.Issuer), []byte(p.Subject))
	if err != nil {
		return nil, err
	}
	return record.AppAccesses.DecodeOwned(p, recs)
}

// updateApp rewrites an app access row if its version is still the one
// read (the last argument).
const updateApp = "UPDATE oauth_apps SET version = $2, record = $3 WHERE id = $1 AND version = $4"

// UpdateAppAccess implements vault.AuthStore (compare-and-swap on the
// version column).
func (s *Store) UpdateAppAccess(ctx context.Context, id string, fn func(vault.AppAccess) (vault.AppAccess, error)) (vault.AppAccess, error) {
	return cas(ctx, s, "app access", id, updateApp, s.getApp, func(old vault.AppAccess, _ int64) (vault.AppAccess, casWrite, error) {
		na, err := record.AppAccesses.Apply(old, fn)
		if err != nil {
			return vault.AppAccess{}, casWrite{}, err
		}
		rec, err := record.EncodeAppAccess(na)
		if err != nil {
			return vault.AppAccess{}, casWrite{}, err
		}
		ds, err := record.AppChangeDeliveries(s.appChanges, &old, &na)
		if err != nil {
			return vault.AppAccess{}, casWrite{}, err
		}
		return na, casWrite{args: []any{id, int64(na.Version), rec}, ds: ds}, nil
	})
}

// DeleteAppAccess implements vault.AuthStore: the row and the change's
// deliveries go in one transaction.
func (s *Store) DeleteAppAccess(ctx context.Context, id string) error {
	if s.appChanges == nil {
		return s.deleteRow(ctx, "oauth_apps", "id", id, "app access")
	}
	return s.deleteReturning(ctx, "app access", id, "DELETE FROM oauth_apps WHERE id = $1 RETURNING record", func(rec []byte, b *pgx.Batch) error {
		a, err := record.DecodeAppAccess(rec)
		if err != nil {
			return nil // a record that does not decode goes without events
		}
		ds, err := record.AppChangeDeliveries(s.appChanges, &a, nil)
		queueDeliveries(b, ds)
		return err
	})
}
