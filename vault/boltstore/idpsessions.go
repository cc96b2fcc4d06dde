package boltstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// bSessions holds people's IdP sessions: hex SHA-256 of the principal
// key → sealed session record (record.EncodeIdPSession). The key names
// nobody; the record holds the person.
var bSessions = []byte("idp_sessions")

var _ vault.IdPSessionStore = (*Store)(nil)

// IdPSessions implements vault.Store: the store is its own
// IdPSessionStore.
func (s *Store) IdPSessions() vault.IdPSessionStore { return s }

func sessionKey(p vault.Principal) string {
	sum := sha256.Sum256(principalKey(p, 0))
	return hex.EncodeToString(sum[:])
}

// GetIdPSession implements vault.IdPSessionStore.
func (s *Store) GetIdPSession(ctx context.Context, p vault.Principal) (vault.IdPSession, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.IdPSession{}, err
	}
	var rec []byte
	err := s.view(func(tx *bolt.Tx) error {
		rec = bytes.Clone(tx.Bucket(bSessions).Get([]byte(sessionKey(p))))
		return nil
	})
	if err != nil {
		return vault.IdPSession{}, err
	}
	if rec == nil {
		return vault.IdPSession{}, fmt.Errorf("boltstore: IdP session: %w", vault.ErrNotFound)
	}
	return record.DecodeIdPSession(s.kr, rec)
}

// PutIdPSession implements vault.IdPSessionStore: one batched write.
func (s *Store) PutIdPSession(ctx context.Context, in vault.IdPSession) (vault.IdPSession, error) {
	if err := s.open.Ready(ctx); err != nil {
		return vault.IdPSession{}, err
	}
	key := []byte(sessionKey(in.Principal))
	var out vault.IdPSession
	err := s.batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(bSessions)
		out = record.ReplaceIdPSession(b.Get(key), in)
		rec, err := record.EncodeIdPSession(s.kr, out)
		if err != nil {
			return err
		}
		return b.Put(key, rec)
	})
	if err != nil {
		return vault.IdPSession{}, err
	}
	return out, nil
}

// UpdateIdPSession implements vault.IdPSessionStore.
func (s *Store) UpdateIdPSession(ctx context.Context, p vault.Principal, fn func(vault.IdPSession) (vault.IdPSession, error)) (vault.IdPSession, error) {
	return casKind(ctx, s, bSessions, record.IdPSessions(s.kr), sessionKey(p), fn, nil)
}

// DeleteIdPSession implements vault.IdPSessionStore.
func (s *Store) DeleteIdPSession(ctx context.Context, p vault.Principal) error {
	return s.deleteKey(ctx, bSessions, sessionKey(p), "IdP session")
}

// ResealIdPSessions implements vault.IdPSessionStore in one write
// transaction (one record per person who signed in with offline access).
func (s *Store) ResealIdPSessions(ctx context.Context) (int, error) {
	return s.resealBucket(ctx, bSessions, "IdP sessions", func(_, v []byte) ([]byte, bool, error) {
		nrec, changed := record.ResealIdPSession(s.kr, v)
		return nrec, changed, nil
	})
}

// sessionKeyUsage adds to usage the keys that seal IdP sessions
// (KeyUsage).
func sessionKeyUsage(tx *bolt.Tx, usage map[string]int) error {
	return tx.Bucket(bSessions).ForEach(func(k, v []byte) error {
		id, err := record.IdPSessionSealedWith(v)
		if err != nil {
			return fmt.Errorf("boltstore: IdP session %s: %w", k, err)
		}
		usage[id]++
		return nil
	})
}
