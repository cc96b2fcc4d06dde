package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Connector implements vault.Store: the store connects in one transaction.
func (s *Store) Connector() vault.GrantConnector { return s }

// errAbort rolls back Connect's transaction after an expected failure,
// which opErr carries.
var errAbort = errors.New("pgstore: connect aborted")

// Connect implements vault.GrantConnector in one transaction: the grant's
// row (and an updated connection's) is locked FOR UPDATE, so a racing
// completion waits and then sees the grant completed.
func (s *Store) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, grant func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	t, err := s.open.ConnectTarget(ctx, s.kr, w)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	id := t.ID
	if !storable(id) {
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("pgstore: connection %q: %w", id, vault.ErrNotFound)
	}
	if !storable(grantID) {
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("pgstore: grant %q: %w", grantID, vault.ErrNotFound)
	}
	var (
		outC  vault.Connection
		outG  vault.Grant
		opErr error
	)
	fail := func(err error) error { opErr = err; return errAbort }
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		outC, outG, opErr = vault.Connection{}, vault.Grant{}, nil
		grec, gversion, err := forUpdate(ctx, tx, fail, "grants", "grant", grantID)
		if err != nil {
			return err
		}
		og, err := record.DecodeGrant(grec)
		if err == nil && og.ID != grantID {
			err = fmt.Errorf("pgstore: grant %s: stored record names id %s: %w", grantID, og.ID, vault.ErrMalformed)
		}
		if err != nil {
			return fail(err)
		}
		ng, err := record.Grants.Apply(og, grant)
		if err != nil {
			return fail(err)
		}
		gargs, err := s.grantArgs(ng)
		if err != nil {
			return fail(err)
		}

		var old []byte
		rec := t.Rec
		if w.Create != nil {
			row, err := rowFromRecord(rec)
			if err != nil {
				return fail(err)
			}
			tag, err := tx.Exec(ctx, insertConn, row.args()...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return fail(fmt.Errorf("pgstore: connection %s: %w", id, vault.ErrExists))
			}
			outC = t.Created
			outC.SealedWith = s.kr.Primary()
		} else {
			var version int64
			if old, version, err = forUpdate(ctx, tx, fail, "connections", "connection", id); err != nil {
				return err
			}
			nrec, nc, err := record.ApplyConnectionRecordUpdate(s.kr, old, id, w.Update)
			if err != nil {
				return fail(err)
			}
			if int64(nc.Version) != version+1 {
				return fail(fmt.Errorf("pgstore: connection %s: record version %d, column says %d: %w", id, nc.Version-1, version, vault.ErrMalformed))
			}
			row, err := rowFromRecord(nrec)
			if err != nil {
				return fail(err)
			}
			if _, err := tx.Exec(ctx, updateConn, append(updateConnArgs(row), version)...); err != nil {
				return err
			}
			rec, outC = nrec, nc
		}
		ds, err := record.ChangeDeliveries(s.changes, old, rec)
		if err != nil {
			return fail(err)
		}
		if _, err := tx.Exec(ctx, updateGrant, append(updateGrantArgs(gargs), gversion)...); err != nil {
			return err
		}
		if len(ds) > 0 {
			b := &pgx.Batch{}
			queueDeliveries(b, ds)
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
		}
		outG = ng
		return nil
	})
	switch {
	case errors.Is(err, errAbort):
		return vault.Connection{}, vault.Grant{}, opErr
	case err != nil:
		return vault.Connection{}, vault.Grant{}, s.dbErr(fmt.Errorf("pgstore: connect %s: %w", id, err))
	}
	return outC, outG, nil
}

// forUpdate reads, in tx, the record and version of row id of table and
// locks the row FOR UPDATE; what names the record in errors. No such row
// is an expected failure, handed to fail.
func forUpdate(ctx context.Context, tx pgx.Tx, fail func(error) error, table, what, id string) (rec []byte, version int64, err error) {
	err = tx.QueryRow(ctx, "SELECT record, version FROM "+table+" WHERE id = $1 FOR UPDATE", id).Scan(&rec, &version)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, 0, fail(fmt.Errorf("pgstore: %s %s: %w", what, id, vault.ErrNotFound))
	}
	return rec, version, err
}
