package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// ImportConnectionRecords stores connection records exactly as another
// backend holds them (record.EncodeConnection output), without opening them:
// the sealed token sets are copied byte for byte. Ids already present are
// skipped and left unchanged, so an interrupted or repeated import is safe.
// One transaction per call.
func (s *Store) ImportConnectionRecords(ctx context.Context, recs [][]byte) (added, skipped int, err error) {
	if err := s.ready(ctx); err != nil {
		return 0, 0, err
	}
	batch := &pgx.Batch{}
	for _, rec := range recs {
		row, err := rowFromRecord(rec)
		if err != nil {
			return 0, 0, fmt.Errorf("pgstore: import: %w", err)
		}
		if !s.kr.Has(row.meta.SealedWith) {
			return 0, 0, fmt.Errorf("pgstore: import connection %s: sealed with key %s, which the key ring lacks: %w", row.meta.ID, row.meta.SealedWith, vault.ErrUnknownKey)
		}
		batch.Queue(insertConn, row.args()...)
	}
	return s.runImport(ctx, batch)
}

// ImportGrantRecords is ImportConnectionRecords for grant records
// (record.EncodeGrant output).
func (s *Store) ImportGrantRecords(ctx context.Context, recs [][]byte) (added, skipped int, err error) {
	if err := s.ready(ctx); err != nil {
		return 0, 0, err
	}
	batch := &pgx.Batch{}
	for _, rec := range recs {
		g, err := record.DecodeGrant(rec)
		if err != nil {
			return 0, 0, fmt.Errorf("pgstore: import: %w", err)
		}
		args, err := s.grantArgs(g)
		if err != nil {
			return 0, 0, err
		}
		args[len(args)-1] = rec // byte for byte, as the source stored it
		batch.Queue(insertGrant, args...)
	}
	return s.runImport(ctx, batch)
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

// ImportKeyCanaries adds key canaries written by another backend (key id →
// canary sealed with that key) for ids the database has none for, so it
// keeps recognising keys the source was written with. It returns how many
// it added.
func (s *Store) ImportKeyCanaries(ctx context.Context, canaries map[string][]byte) (int, error) {
	if err := s.ready(ctx); err != nil {
		return 0, err
	}
	n := 0
	for id, ct := range canaries {
		if kid, err := vault.EnvelopeKeyID(ct); err != nil || kid != id {
			return n, fmt.Errorf("pgstore: canary of key %s is malformed", id)
		}
		if s.kr.Has(id) {
			if _, _, err := s.kr.Open(ct, canaryAAD(id)); err != nil {
				return n, fmt.Errorf("key %s does not match the one the source was written with: %w", id, ErrWrongKey)
			}
		}
		tag, err := s.pool.Exec(ctx, "INSERT INTO key_canaries (key_id, canary) VALUES ($1, $2) ON CONFLICT (key_id) DO NOTHING", id, ct)
		if err != nil {
			return n, s.dbErr(fmt.Errorf("pgstore: import key canary %s: %w", id, err))
		}
		n += int(tag.RowsAffected())
	}
	return n, nil
}
