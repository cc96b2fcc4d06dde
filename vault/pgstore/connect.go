package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// Connector implements vault.Store: the store connects in one transaction.
func (s *Store) Connector() vault.GrantConnector { return s }

// errAbort rolls back Connect's transaction after an expected failure,
// which opErr carries.
var errAbort = errors.New("pgstore: connect aborted")

// Connect implements vault.GrantConnector, atomically. A new connection
// is one statement (connectCreate): the grant's compare-and-swap and the
// connection's insert, which happens only when the swap landed; a racing
// completion's swap then finds another version, and its rerun sees the
// grant completed. An update of a connection runs in one transaction
// that locks the grant's row and the connection's FOR UPDATE, so a racing
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
	if w.Create != nil {
		return s.connectCreate(ctx, t, grantID, w.Known, grant)
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

		old, version, err := forUpdate(ctx, tx, fail, "connections", "connection", id)
		if err != nil {
			return err
		}
		rec, nc, err := record.ApplyConnectionRecordUpdate(s.kr, old, id, w.Update)
		if err != nil {
			return fail(err)
		}
		if int64(nc.Version) != version+1 {
			return fail(fmt.Errorf("pgstore: connection %s: record version %d, column says %d: %w", id, nc.Version-1, version, vault.ErrMalformed))
		}
		row, err := rowFromRecord(rec)
		if err != nil {
			return fail(err)
		}
		if _, err := tx.Exec(ctx, updateConn, append(updateConnArgs(row), version)...); err != nil {
			return err
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
		outC, outG = nc, ng
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

// connectCreate is Connect for a new connection, t: cas on the grant,
// whose write (connectCreateSQL, with the change's deliveries) inserts the
// connection only when the grant's swap lands. The connection's id taken
// fails the statement, so the grant is not completed then. The grant the
// caller knows (known, when it is grant grantID) is cas's first read.
func (s *Store) connectCreate(ctx context.Context, t record.Target, grantID string, known *vault.Grant, grant func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	row, err := rowFromRecord(t.Rec)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	ds, err := record.ChangeDeliveries(s.changes, nil, t.Rec)
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	useKnown := known != nil && known.ID == grantID // the caller's copy goes first, once
	g, err := cas(ctx, s, "grant", grantID, connectCreateSQL, func(ctx context.Context, id string) (vault.Grant, int64, error) {
		if useKnown {
			return *known, int64(known.Version), nil
		}
		return s.getGrant(ctx, id)
	}, func(og vault.Grant, _ int64) (vault.Grant, casWrite, error) {
		fromKnown := useKnown
		useKnown = false
		ng, err := record.Grants.Apply(og, grant)
		if err != nil && fromKnown {
			return vault.Grant{}, casWrite{}, errStaleKnown // the refusal is the stored grant's to make
		}
		if err != nil {
			return vault.Grant{}, casWrite{}, err
		}
		gargs, err := s.grantArgs(ng)
		if err != nil {
			return vault.Grant{}, casWrite{}, err
		}
		return ng, casWrite{args: append(row.args(), updateGrantArgs(gargs)...), ds: ds}, nil
	})
	if errors.Is(err, errStaleKnown) {
		return s.connectCreate(ctx, t, grantID, nil, grant)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == uniqueViolation && pe.TableName == "connections" {
		return vault.Connection{}, vault.Grant{}, fmt.Errorf("pgstore: connection %s: %w", t.ID, vault.ErrExists)
	}
	if err != nil {
		return vault.Connection{}, vault.Grant{}, err
	}
	c := t.Created
	c.SealedWith = s.kr.Primary()
	return c, g, nil
}

// errStaleKnown: the grant function refused the caller's copy of the
// grant, which the store's may have moved past.
var errStaleKnown = errors.New("pgstore: the known grant was refused")

// uniqueViolation is PostgreSQL's SQLSTATE for a key already taken.
const uniqueViolation = "23505"

// connectCreateSQL is connectCreate's write: updateGrant's swap with its
// parameters moved after the connection's ($15 to $22, the version read
// last), then insertConn's row, without ON CONFLICT, from the swapped
// row only.
const connectCreateSQL = `WITH g AS (UPDATE grants SET provider = $16, state = $17, created_ns = $18,
	expires_ns = $19, version = $20, record = $21
	WHERE id = $15 AND version = $22 RETURNING 1)
	INSERT INTO ` + connColumns + `
	SELECT ` + connValues + ` FROM g`

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
