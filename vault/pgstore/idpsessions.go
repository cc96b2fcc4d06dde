package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// IdPSessions implements vault.Store: the store is its own
// IdPSessionStore.
func (s *Store) IdPSessions() vault.IdPSessionStore { return s }

// readSession returns p's stored record and its version (nil when none).
func (s *Store) readSession(ctx context.Context, p vault.Principal) ([]byte, int64, error) {
	if err := s.open.Ready(ctx); err != nil {
		return nil, 0, err
	}
	var rec []byte
	var version int64
	err := s.pool.QueryRow(ctx, "SELECT record, version FROM idp_sessions WHERE iss = $1 AND sub = $2",
		[]byte(p.Issuer), []byte(p.Subject)).Scan(&rec, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, s.dbErr(fmt.Errorf("pgstore: get IdP session: %w", err))
	}
	return rec, version, nil
}

// GetIdPSession implements vault.IdPSessionStore.
func (s *Store) GetIdPSession(ctx context.Context, p vault.Principal) (vault.IdPSession, error) {
	ss, _, err := s.getSession(ctx, p)
	return ss, err
}

func (s *Store) getSession(ctx context.Context, p vault.Principal) (vault.IdPSession, int64, error) {
	rec, version, err := s.readSession(ctx, p)
	switch {
	case err != nil:
		return vault.IdPSession{}, 0, err
	case rec == nil:
		return vault.IdPSession{}, 0, fmt.Errorf("pgstore: IdP session: %w", vault.ErrNotFound)
	}
	ss, err := record.DecodeIdPSession(s.kr, rec)
	if err == nil && ss.Principal != p {
		err = fmt.Errorf("pgstore: IdP session: the stored record names another person: %w", vault.ErrMalformed)
	}
	return ss, version, err
}

const updateSession = `UPDATE idp_sessions SET version = $3, updated = $4, sealed_with = $5, record = $6
	WHERE iss = $1 AND sub = $2 AND version = $7`

const insertSession = `INSERT INTO idp_sessions (iss, sub, version, updated, sealed_with, record) VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT (iss, sub) DO NOTHING`

// sessionArgs are the columns of session s stored as rec, sealed with
// the primary key: iss, sub, version, updated, sealed_with, record.
func (s *Store) sessionArgs(ss vault.IdPSession, rec []byte) []any {
	return sessionColumns(ss, s.kr.Primary(), rec)
}

// sessionColumns are the columns of session ss stored as rec, sealed
// with the key sealedWith names.
func sessionColumns(ss vault.IdPSession, sealedWith string, rec []byte) []any {
	p := ss.Principal
	return []any{[]byte(p.Issuer), []byte(p.Subject), int64(ss.Version), ss.Updated, sealedWith, rec}
}

// PutIdPSession implements vault.IdPSessionStore: an insert, or an update
// of the stored row at the version read (retried when another writer
// came first).
func (s *Store) PutIdPSession(ctx context.Context, in vault.IdPSession) (vault.IdPSession, error) {
	p := in.Principal
	for range s.attempts {
		old, version, err := s.readSession(ctx, p)
		if err != nil {
			return vault.IdPSession{}, err
		}
		out := record.ReplaceIdPSession(old, in)
		rec, err := record.EncodeIdPSession(s.kr, out)
		if err != nil {
			return vault.IdPSession{}, err
		}
		q, args := insertSession, s.sessionArgs(out, rec)
		if old != nil {
			q, args = updateSession, append(args, version)
		}
		tag, err := s.pool.Exec(ctx, q, args...)
		if err != nil {
			return vault.IdPSession{}, s.dbErr(fmt.Errorf("pgstore: put IdP session: %w", err))
		}
		if tag.RowsAffected() == 1 {
			return out, nil
		}
	}
	return vault.IdPSession{}, fmt.Errorf("pgstore: put IdP session: still contended after %d attempts: %w", s.attempts, vault.ErrConflict)
}

// UpdateIdPSession implements vault.IdPSessionStore.
func (s *Store) UpdateIdPSession(ctx context.Context, p vault.Principal, fn func(vault.IdPSession) (vault.IdPSession, error)) (vault.IdPSession, error) {
	read := func(ctx context.Context, _ string) (vault.IdPSession, int64, error) { return s.getSession(ctx, p) }
	return cas(ctx, s, "IdP session", "of a person", updateSession, read, func(old vault.IdPSession, _ int64) (vault.IdPSession, casWrite, error) {
		kind := record.IdPSessions(s.kr)
		ns, err := kind.Apply(old, fn)
		if err != nil {
			return vault.IdPSession{}, casWrite{}, err
		}
		rec, err := kind.Encode(ns)
		if err != nil {
			return vault.IdPSession{}, casWrite{}, err
		}
		return ns, casWrite{args: s.sessionArgs(ns, rec)}, nil
	})
}

// DeleteIdPSession implements vault.IdPSessionStore.
func (s *Store) DeleteIdPSession(ctx context.Context, p vault.Principal) error {
	if err := s.open.Ready(ctx); err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, "DELETE FROM idp_sessions WHERE iss = $1 AND sub = $2", []byte(p.Issuer), []byte(p.Subject))
	if err != nil {
		return s.dbErr(fmt.Errorf("pgstore: delete IdP session: %w", err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: IdP session: %w", vault.ErrNotFound)
	}
	return nil
}

// ResealIdPSessions implements vault.IdPSessionStore in one transaction
// over the rows the sealed_with column names another key for.
func (s *Store) ResealIdPSessions(ctx context.Context) (int, error) {
	primary := s.kr.Primary()
	return s.resealRows(ctx, "IdP sessions", "SELECT record FROM idp_sessions WHERE sealed_with <> $1 ORDER BY iss, sub FOR UPDATE",
		[]any{primary}, func(b *pgx.Batch, rec []byte) (bool, error) {
			nrec, changed := record.ResealIdPSession(s.kr, rec)
			if !changed {
				return false, nil
			}
			m, err := record.IdPSessionMeta(nrec)
			if err == nil {
				b.Queue("UPDATE idp_sessions SET sealed_with = $3, record = $4 WHERE iss = $1 AND sub = $2",
					[]byte(m.Principal.Issuer), []byte(m.Principal.Subject), primary, nrec)
			}
			return err == nil, err
		})
}
