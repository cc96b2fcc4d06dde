package boltstore

import (
	"bytes"
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/internal/envelope"
	"credbroker/vault/internal/record"
)

// exported are where the records of each kind live, in export order: the
// keys of bucket that start with prefix, their values the records unless
// record makes each from its key and value.
var exported = []struct {
	kind   transfer.RecordKind
	bucket []byte
	prefix []byte
	record func(k, v []byte) ([]byte, error)
}{
	{transfer.KindKeyCanary, bMeta, canaryPrefix, nil},
	{transfer.KindConnection, bConns, nil, nil},
	{transfer.KindRetiredConnection, bRetired, nil, nil},
	{transfer.KindGrant, bGrants, nil, nil},
	{transfer.KindOAuthClient, bOAuthClients, nil, nil},
	{transfer.KindAuthCode, bOAuthCodes, nil, nil},
	{transfer.KindAppAccess, bOAuthApps, nil, nil},
	{transfer.KindDelivery, bOutbox, nil, nil},
	{transfer.KindSpentAssertion, bSpent, nil, spentRecord},
	{transfer.KindUpstreamClient, bUpstream, nil, nil},
	{transfer.KindIdPSession, bSessions, nil, nil},
}

// ExportRecords hands every stored record to put, exactly as stored (a
// spent assertion's made from its key and expiry), kind by kind in the
// order of transfer.RecordKind and in key order within a kind (IdP sessions
// by the hash of the person their key is), at most batch records at a
// time (0 means 1000). Each batch is read in a read transaction of its
// own and put runs after it ends, so put may write anywhere. Index
// entries are not exported: ImportRecords makes them again.
func (s *Store) ExportRecords(ctx context.Context, batch int, put func(transfer.Records) error) error {
	if batch <= 0 {
		batch = 1000
	}
	for _, e := range exported {
		var after []byte
		for {
			if err := s.open.Ready(ctx); err != nil {
				return err
			}
			var recs [][]byte
			err := s.view(func(tx *bolt.Tx) error {
				recs = nil
				c := tx.Bucket(e.bucket).Cursor()
				var k, v []byte
				switch {
				case after != nil:
					if k, v = c.Seek(after); k != nil && bytes.Equal(k, after) {
						k, v = c.Next()
					}
				case len(e.prefix) > 0:
					k, v = c.Seek(e.prefix)
				default:
					k, v = c.First()
				}
				for ; k != nil && bytes.HasPrefix(k, e.prefix) && len(recs) < batch; k, v = c.Next() {
					rec := bytes.Clone(v)
					if e.record != nil {
						var err error
						if rec, err = e.record(k, v); err != nil {
							return err
						}
					}
					recs = append(recs, rec)
					after = bytes.Clone(k)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("boltstore: export %s: %w", e.kind, err)
			}
			if len(recs) == 0 {
				break
			}
			if err := put(transfer.Records{Kind: e.kind, Recs: recs}); err != nil {
				return err
			}
		}
	}
	return nil
}

// imported is one record ImportRecords stores: rec under key in bucket,
// with its index entries. It is skipped when the key, or an index key
// marked unique, is taken.
type imported struct {
	bucket, key, rec []byte
	index            []indexEntry
}

type indexEntry struct {
	bucket, key, val []byte
	unique           bool
}

// ImportRecords stores records another store exported (this package's
// ExportRecords or pgstore's) as they are, byte for byte, with their
// index entries, in one write transaction. A record whose key (or, for an
// app authorization, whose person and client) is taken is skipped and
// left as it is, so an interrupted or repeated import is safe. Every
// record is decoded first, opening nothing; one that does not decode, a
// connection sealed with a key the ring lacks and a key canary that a
// configured key of its id does not open are refused (so are an upstream
// client whose secret and an IdP session whose tokens are sealed with a
// key the ring lacks), and nothing of the call is stored. An IdP session
// is filed under the person its record names, to whom its tokens are
// sealed. Imports run no ChangeHook: deliveries come as records of their
// own.
func (s *Store) ImportRecords(ctx context.Context, rs transfer.Records) (added, skipped int, err error) {
	if err := s.open.Ready(ctx); err != nil {
		return 0, 0, err
	}
	items := make([]imported, 0, len(rs.Recs))
	for _, rec := range rs.Recs {
		it, err := s.importItem(rs.Kind, rec)
		if err != nil {
			return 0, 0, fmt.Errorf("boltstore: import %s: %w", rs.Kind, err)
		}
		items = append(items, it)
	}
	err = s.update(func(tx *bolt.Tx) error {
		added, skipped = 0, 0
	next:
		for _, it := range items {
			b := tx.Bucket(it.bucket)
			if b.Get(it.key) != nil {
				skipped++
				continue
			}
			for _, ix := range it.index {
				if ix.unique && tx.Bucket(ix.bucket).Get(ix.key) != nil {
					skipped++
					continue next
				}
			}
			if err := b.Put(it.key, it.rec); err != nil {
				return err
			}
			for _, ix := range it.index {
				if err := tx.Bucket(ix.bucket).Put(ix.key, ix.val); err != nil {
					return err
				}
			}
			added++
		}
		if added > 0 {
			// What came in may be sealed with another key of the ring: the
			// next start's re-seal pass must look (FullySealed).
			return tx.Bucket(bMeta).Delete(keySealedAll)
		}
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("boltstore: import %s: %w", rs.Kind, err)
	}
	return added, skipped, nil
}

// importItem decodes one exported record of kind and says where it goes.
func (s *Store) importItem(kind transfer.RecordKind, rec []byte) (imported, error) {
	switch kind {
	case transfer.KindKeyCanary:
		id, err := envelope.KeyID(rec)
		if err != nil {
			return imported{}, fmt.Errorf("a key canary: %w", err)
		}
		if s.kr.Has(id) {
			if _, _, err := s.kr.Open(rec, canaryAAD(id)); err != nil {
				return imported{}, fmt.Errorf("key %s does not match the one the source was written with: %w", id, ErrWrongKey)
			}
		}
		return imported{bucket: bMeta, key: append(bytes.Clone(canaryPrefix), id...), rec: rec}, nil
	case transfer.KindConnection, transfer.KindRetiredConnection:
		m, err := record.ConnectionMeta(rec)
		if err != nil {
			return imported{}, err
		}
		if !s.kr.Has(m.SealedWith) {
			return imported{}, fmt.Errorf("connection %s: sealed with key %s, which the key ring lacks: %w", m.ID, m.SealedWith, vault.ErrUnknownKey)
		}
		bucket, idx := bConns, bConnByPrinc
		if kind == transfer.KindRetiredConnection {
			bucket, idx = bRetired, bRetiredByPrinc
		}
		return imported{bucket: bucket, key: []byte(m.ID), rec: rec,
			index: []indexEntry{{bucket: idx, key: connIndexKey(m.Principal, m.ID)}}}, nil
	case transfer.KindGrant:
		g, err := record.DecodeGrant(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bGrants, key: []byte(g.ID), rec: rec, index: []indexEntry{
			{bucket: bGrantByPrin, key: grantPrincipalKey(g)},
			{bucket: bGrantByExp, key: grantExpiryKey(g)},
		}}, nil
	case transfer.KindOAuthClient:
		c, err := record.DecodeOAuthClient(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bOAuthClients, key: []byte(c.ID), rec: rec}, nil
	case transfer.KindAuthCode:
		c, err := record.DecodeAuthCode(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bOAuthCodes, key: []byte(c.Key), rec: rec}, nil
	case transfer.KindAppAccess:
		a, err := record.DecodeAppAccess(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bOAuthApps, key: []byte(a.ID), rec: rec, index: []indexEntry{
			{bucket: bOAuthAppByClient, key: appClientKey(a.Principal, a.ClientID), val: []byte(a.ID), unique: true},
		}}, nil
	case transfer.KindDelivery:
		d, err := record.DecodeDelivery(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bOutbox, key: outboxKey(d.ID, d.Endpoint), rec: rec, index: []indexEntry{
			{bucket: bOutboxDue, key: dueKey(d)},
		}}, nil
	case transfer.KindSpentAssertion:
		key, exp, err := record.DecodeSpentAssertion(rec)
		if err != nil {
			return imported{}, err
		}
		return imported{bucket: bSpent, key: []byte(key), rec: spentValue(exp)}, nil
	case transfer.KindUpstreamClient:
		key, sealed, err := record.UpstreamClientMeta(rec)
		if err != nil {
			return imported{}, err
		}
		if sealed != "" && !s.kr.Has(sealed) {
			return imported{}, fmt.Errorf("upstream client %q: sealed with key %s, which the key ring lacks: %w", key, sealed, vault.ErrUnknownKey)
		}
		return imported{bucket: bUpstream, key: []byte(key), rec: rec}, nil
	case transfer.KindIdPSession:
		m, err := record.IdPSessionMeta(rec)
		if err != nil {
			return imported{}, err
		}
		sealed, err := record.IdPSessionSealedWith(rec)
		if err != nil {
			return imported{}, err
		}
		if !s.kr.Has(sealed) {
			return imported{}, fmt.Errorf("IdP session of %q: sealed with key %s, which the key ring lacks: %w", m.Principal.Subject, sealed, vault.ErrUnknownKey)
		}
		// Filed under the person the record names, whose identity its
		// ciphertext is sealed to: it opens for them, and for nobody else.
		return imported{bucket: bSessions, key: []byte(sessionKey(m.Principal)), rec: rec}, nil
	}
	return imported{}, fmt.Errorf("unknown record kind %d", int(kind))
}
