package pgstore

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/internal/envelope"
	"credbroker/vault/internal/record"
)

// exportRow is one exported row: its key columns (where the next page
// starts) and its record.
type exportRow struct {
	key []any
	rec []byte
}

// exported are the pages ExportRecords reads, in export order: query
// selects up to its last parameter's rows after the key in the others, in
// key order, and row makes each row's record.
var exported = []struct {
	kind  transfer.RecordKind
	query string
	start []any
	row   pgx.RowToFunc[exportRow]
}{
	{transfer.KindKeyCanary, "SELECT key_id, canary FROM key_canaries WHERE key_id > $1 ORDER BY key_id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindConnection, "SELECT id, record FROM connections WHERE id > $1 ORDER BY id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindRetiredConnection, "SELECT id, record FROM retired_connections WHERE id > $1 ORDER BY id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindGrant, "SELECT id, record FROM grants WHERE id > $1 ORDER BY id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindOAuthClient, "SELECT id, record FROM oauth_clients WHERE id > $1 ORDER BY id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindAuthCode, "SELECT key, record, redeemed FROM oauth_codes WHERE key > $1 ORDER BY key LIMIT $2", []any{""}, codeRow},
	{transfer.KindAppAccess, "SELECT id, record FROM oauth_apps WHERE id > $1 ORDER BY id LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindDelivery, `SELECT id, endpoint, type, created_ns, due_ns, attempts, last_error, payload FROM outbox
		WHERE (id, endpoint) > ($1, $2) ORDER BY id, endpoint LIMIT $3`, []any{"", ""}, deliveryRow},
	{transfer.KindSpentAssertion, "SELECT key, expires_ns FROM spent_assertions WHERE key > $1 ORDER BY key LIMIT $2", []any{""}, spentRow},
	{transfer.KindUpstreamClient, "SELECT key, record FROM upstream_clients WHERE key > $1 ORDER BY key LIMIT $2", []any{""}, keyAndRecord},
	{transfer.KindIdPSession, "SELECT iss, sub, record FROM idp_sessions WHERE (iss, sub) > ($1, $2) ORDER BY iss, sub LIMIT $3",
		[]any{[]byte{}, []byte{}}, keyAndRecord}, // not nil: a nil []byte is NULL, and nothing is > NULL
}

// keyAndRecord is a row of key columns followed by the record.
func keyAndRecord(row pgx.CollectableRow) (exportRow, error) {
	n := len(row.FieldDescriptions())
	r := exportRow{key: make([]any, n-1)}
	dest := make([]any, n)
	for i := range r.key {
		dest[i] = &r.key[i]
	}
	dest[n-1] = &r.rec
	err := row.Scan(dest...)
	return r, err
}

// codeRow is a code's record as the other backends keep it: the redeemed
// column is authoritative here, the record keeps the code as issued.
func codeRow(row pgx.CollectableRow) (exportRow, error) {
	var (
		key      string
		rec      []byte
		redeemed bool
	)
	if err := row.Scan(&key, &rec, &redeemed); err != nil {
		return exportRow{}, err
	}
	c, err := record.DecodeAuthCode(rec)
	if err != nil {
		return exportRow{}, err
	}
	if c.Redeemed != redeemed {
		c.Redeemed = redeemed
		if rec, err = record.EncodeAuthCode(c); err != nil {
			return exportRow{}, err
		}
	}
	return exportRow{key: []any{key}, rec: rec}, nil
}

// deliveryRow is a delivery's record made from its columns (the outbox
// keeps no record column); times come back in UTC.
func deliveryRow(row pgx.CollectableRow) (exportRow, error) {
	var (
		d            vault.Delivery
		created, due int64
	)
	if err := row.Scan(&d.ID, &d.Endpoint, &d.Type, &created, &due, &d.Attempts, &d.LastError, &d.Payload); err != nil {
		return exportRow{}, err
	}
	d.Created, d.Due = time.Unix(0, created).UTC(), time.Unix(0, due).UTC()
	rec, err := record.EncodeDelivery(d)
	return exportRow{key: []any{d.ID, d.Endpoint}, rec: rec}, err
}

// spentRow is a spent assertion's record made from its columns.
func spentRow(row pgx.CollectableRow) (exportRow, error) {
	var (
		key     string
		expires int64
	)
	if err := row.Scan(&key, &expires); err != nil {
		return exportRow{}, err
	}
	rec, err := record.EncodeSpentAssertion(key, time.Unix(0, expires))
	return exportRow{key: []any{key}, rec: rec}, err
}

// ExportRecords hands every stored record to put, kind by kind in the
// order of transfer.RecordKind and in key order within a kind (IdP sessions
// by person), at most batch records at a time (0 means 1000): the record
// columns as they are (an authorization code's record with the redeemed
// column's state, a delivery's and a spent assertion's made from their
// columns). Each page is its own query, so export a store no broker is
// writing to.
func (s *Store) ExportRecords(ctx context.Context, batch int, put func(transfer.Records) error) error {
	if batch <= 0 {
		batch = 1000
	}
	for _, e := range exported {
		after := e.start
		for {
			if err := s.open.Ready(ctx); err != nil {
				return err
			}
			rows, err := s.pool.Query(ctx, e.query, append(after[:len(after):len(after)], batch)...)
			if err != nil {
				return s.dbErr(fmt.Errorf("pgstore: export %s: %w", e.kind, err))
			}
			page, err := pgx.CollectRows(rows, e.row)
			if err != nil {
				return s.dbErr(fmt.Errorf("pgstore: export %s: %w", e.kind, err))
			}
			if len(page) == 0 {
				break
			}
			recs := make([][]byte, len(page))
			for i, r := range page {
				recs[i] = r.rec
			}
			if err := put(transfer.Records{Kind: e.kind, Recs: recs}); err != nil {
				return err
			}
			after = page[len(page)-1].key
		}
	}
	return nil
}

// ImportRecords stores records another store exported (boltstore's
// ExportRecords or this package's) as they are, byte for byte, with their
// columns, in one transaction. A record whose key (or, for an app
// authorization, whose person and client) is taken is skipped and left as
// it is, so an interrupted or repeated import is safe. Every record is
// decoded first, opening nothing; one that does not decode, a connection
// sealed with a key the ring lacks and a key canary that a configured key
// of its id does not open are refused (so are an upstream client whose
// secret and an IdP session whose tokens are sealed with a key the ring
// lacks), and nothing of the call is stored. An IdP session's row is the
// person its record names, to whom its tokens are sealed. Imports run no
// ChangeHook: deliveries come as records of their own.
func (s *Store) ImportRecords(ctx context.Context, rs transfer.Records) (added, skipped int, err error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, 0, err
	}
	batch := &pgx.Batch{}
	for _, rec := range rs.Recs {
		sql, args, err := s.importRow(rs.Kind, rec)
		if err != nil {
			return 0, 0, fmt.Errorf("pgstore: import %s: %w", rs.Kind, err)
		}
		batch.Queue(sql, args...)
	}
	return s.runImport(ctx, batch)
}

// importRow decodes one exported record of kind and returns the insert
// that stores it unless its key is taken.
func (s *Store) importRow(kind transfer.RecordKind, rec []byte) (string, []any, error) {
	switch kind {
	case transfer.KindKeyCanary:
		id, err := envelope.KeyID(rec)
		if err != nil {
			return "", nil, fmt.Errorf("a key canary: %w", err)
		}
		if s.kr.Has(id) {
			if _, _, err := s.kr.Open(rec, canaryAAD(id)); err != nil {
				return "", nil, fmt.Errorf("key %s does not match the one the source was written with: %w", id, ErrWrongKey)
			}
		}
		return "INSERT INTO key_canaries (key_id, canary) VALUES ($1, $2) ON CONFLICT (key_id) DO NOTHING", []any{id, rec}, nil
	case transfer.KindConnection, transfer.KindRetiredConnection:
		row, err := rowFromRecord(rec)
		if err != nil {
			return "", nil, err
		}
		m := row.meta
		if !s.kr.Has(m.SealedWith) {
			return "", nil, fmt.Errorf("connection %s: sealed with key %s, which the key ring lacks: %w", m.ID, m.SealedWith, vault.ErrUnknownKey)
		}
		if kind == transfer.KindRetiredConnection {
			return `INSERT INTO retired_connections (id, iss, sub, record) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING`,
				[]any{m.ID, []byte(m.Principal.Issuer), []byte(m.Principal.Subject), rec}, nil
		}
		return insertConn, row.args(), nil
	case transfer.KindGrant:
		return importWhole(rec, insertGrant, record.DecodeGrant, s.grantArgs)
	case transfer.KindOAuthClient:
		return importWhole(rec, insertClient, record.DecodeOAuthClient, s.clientArgs)
	case transfer.KindAuthCode:
		return importWhole(rec, `INSERT INTO oauth_codes (key, expires_ns, redeemed, record) VALUES ($1, $2, $3, $4) ON CONFLICT (key) DO NOTHING`,
			record.DecodeAuthCode, importedCodeArgs)
	case transfer.KindAppAccess:
		return importWhole(rec, insertApp, record.DecodeAppAccess, s.appArgs)
	case transfer.KindDelivery:
		d, err := record.DecodeDelivery(rec)
		if err != nil {
			return "", nil, err
		}
		return insertDelivery, deliveryArgs(d), nil
	case transfer.KindSpentAssertion:
		key, exp, err := record.DecodeSpentAssertion(rec)
		if err != nil {
			return "", nil, err
		}
		return insertSpent, []any{key, nanos(exp)}, nil
	case transfer.KindUpstreamClient:
		key, sealed, err := record.UpstreamClientMeta(rec)
		if err != nil {
			return "", nil, err
		}
		if sealed != "" && !s.kr.Has(sealed) {
			return "", nil, fmt.Errorf("upstream client %q: sealed with key %s, which the key ring lacks: %w", key, sealed, vault.ErrUnknownKey)
		}
		return insertUpstream, []any{key, sealed, rec}, nil
	case transfer.KindIdPSession:
		m, err := record.IdPSessionMeta(rec)
		if err != nil {
			return "", nil, err
		}
		sealed, err := record.IdPSessionSealedWith(rec)
		if err != nil {
			return "", nil, err
		}
		if !s.kr.Has(sealed) {
			return "", nil, fmt.Errorf("IdP session of %q: sealed with key %s, which the key ring lacks: %w", m.Principal.Subject, sealed, vault.ErrUnknownKey)
		}
		// The row's person is the one the record names, whose identity its
		// ciphertext is sealed to: it opens for them, and for nobody else.
		return insertSession, sessionColumns(m, sealed, rec), nil
	}
	return "", nil, fmt.Errorf("unknown record kind %d", int(kind))
}

// importWhole is importRow for a kind stored whole with a create's
// insert: rec decoded, the insert's arguments made of it, and rec itself
// (byte for byte, as the source stored it) as the record, the last.
func importWhole[T any](rec []byte, insert string, decode func([]byte) (T, error), args func(T) ([]any, error)) (string, []any, error) {
	v, err := decode(rec)
	if err != nil {
		return "", nil, err
	}
	a, err := args(v)
	if err != nil {
		return "", nil, err
	}
	a[len(a)-1] = rec
	return insert, a, nil
}

// importedCodeArgs are the columns of an imported authorization code,
// redeemed or not as its record says, the record last.
func importedCodeArgs(c vault.AuthCode) ([]any, error) {
	return []any{c.Key, nanos(c.Expires), c.Redeemed, nil}, checkID("authorization code", c.Key)
}

func (s *Store) runImport(ctx context.Context, batch *pgx.Batch) (added, skipped int, err error) {
	if batch.Len() == 0 {
		return 0, 0, nil
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		added, skipped = 0, 0
		br := tx.SendBatch(ctx, batch)
		for range batch.Len() {
			tag, err := br.Exec()
			if err != nil {
				br.Close()
				return err
			}
			if tag.RowsAffected() == 1 {
				added++
			} else {
				skipped++
			}
		}
		return br.Close()
	})
	if err != nil {
		return 0, 0, s.dbErr(fmt.Errorf("pgstore: import: %w", err))
	}
	return added, skipped, nil
}
