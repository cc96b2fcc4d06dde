package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// UpstreamClients implements vault.Store: the store is its own
// UpstreamClientStore.
func (s *Store) UpstreamClients() vault.UpstreamClientStore { return s }

const insertUpstream = `INSERT INTO upstream_clients (key, sealed_with, record) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING`

// getUpstream reads the record stored under key.
func (s *Store) getUpstream(ctx context.Context, key string) ([]byte, error) {
	rec, _, err := s.readRecord(ctx, "upstream client", "SELECT record, 0::bigint FROM upstream_clients WHERE key = $1", key)
	return rec, err
}

// GetUpstreamClient implements vault.UpstreamClientStore.
func (s *Store) GetUpstreamClient(ctx context.Context, key string) (vault.UpstreamClient, error) {
	rec, err := s.getUpstream(ctx, key)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	return record.DecodeUpstreamClient(s.kr, rec)
}

// PutUpstreamClient implements vault.UpstreamClientStore: an INSERT … ON
// CONFLICT DO NOTHING, so of concurrent puts on any replica the first
// wins; the others read what it stored.
func (s *Store) PutUpstreamClient(ctx context.Context, c vault.UpstreamClient) (vault.UpstreamClient, error) {
	rec, err := record.EncodeUpstreamClient(s.kr, c)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	_, sealed, err := record.UpstreamClientMeta(rec)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	// A registration deleted between a refused insert and the read that
	// follows leaves the key free again: insert once more.
	for range 3 {
		if err := s.open.Ready(ctx); err != nil {
			return vault.UpstreamClient{}, err
		}
		tag, err := s.pool.Exec(ctx, insertUpstream, c.Key, sealed, rec)
		if err != nil {
			return vault.UpstreamClient{}, s.dbErr(fmt.Errorf("pgstore: put upstream client %q: %w", c.Key, err))
		}
		stored := rec
		if tag.RowsAffected() == 0 {
			if stored, err = s.getUpstream(ctx, c.Key); errors.Is(err, vault.ErrNotFound) {
				continue
			} else if err != nil {
				return vault.UpstreamClient{}, err
			}
		}
		return record.DecodeUpstreamClient(s.kr, stored)
	}
	return vault.UpstreamClient{}, fmt.Errorf("pgstore: put upstream client %q: deleted under every attempt: %w", c.Key, vault.ErrConflict)
}

// DeleteUpstreamClient implements vault.UpstreamClientStore: the record
// read is the version the DELETE compares, so a registration rewritten
// meanwhile (re-sealed, or deleted and made anew by another replica) is
// looked at again, never deleted unseen.
func (s *Store) DeleteUpstreamClient(ctx context.Context, key, clientID string) error {
	for range 3 {
		rec, err := s.getUpstream(ctx, key)
		if err != nil {
			return err
		}
		if err := record.UpstreamClientDeletable(rec, clientID); err != nil {
			return fmt.Errorf("pgstore: delete upstream client: %w", err)
		}
		tag, err := s.pool.Exec(ctx, "DELETE FROM upstream_clients WHERE key = $1 AND record = $2", key, rec)
		if err != nil {
			return s.dbErr(fmt.Errorf("pgstore: delete upstream client %q: %w", key, err))
		}
		if tag.RowsAffected() == 1 {
			return nil
		}
	}
	return fmt.Errorf("pgstore: delete upstream client %q: rewritten under every attempt: %w", key, vault.ErrConflict)
}

// ResealUpstreamClients implements vault.UpstreamClientStore in one
// transaction over the rows the sealed_with column names another key for.
func (s *Store) ResealUpstreamClients(ctx context.Context) (int, error) {
	primary := s.kr.Primary()
	return s.resealRows(ctx, "upstream clients", "SELECT record FROM upstream_clients WHERE sealed_with NOT IN ('', $1) ORDER BY key FOR UPDATE",
		[]any{primary}, func(b *pgx.Batch, rec []byte) (bool, error) {
			nrec, changed, err := record.ResealUpstreamClient(s.kr, rec)
			if !changed {
				return false, err
			}
			key, _, err := record.UpstreamClientMeta(nrec)
			if err == nil {
				b.Queue("UPDATE upstream_clients SET sealed_with = $2, record = $3 WHERE key = $1", key, primary, nrec)
			}
			return err == nil, err
		})
}
