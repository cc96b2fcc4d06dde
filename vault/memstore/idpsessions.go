package memstore

import (
	"context"
	"strconv"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// IdPSessions implements vault.Store: the store is its own
// IdPSessionStore.
func (s *Store) IdPSessions() vault.IdPSessionStore { return s }

// sessionKey keys p's session: the issuer's length, then both parts (no
// two people share one).
func sessionKey(p vault.Principal) string {
	return strconv.Itoa(len(p.Issuer)) + ":" + p.Issuer + p.Subject
}

// GetIdPSession implements vault.IdPSessionStore.
func (s *Store) GetIdPSession(ctx context.Context, p vault.Principal) (vault.IdPSession, error) {
	return get(s, s.sessions, sessionKey(p), "IdP session of", func(b []byte) (vault.IdPSession, error) {
		return record.DecodeIdPSession(s.kr, b)
	})
}

// PutIdPSession implements vault.IdPSessionStore under the write lock.
func (s *Store) PutIdPSession(ctx context.Context, in vault.IdPSession) (vault.IdPSession, error) {
	return write(s, func() (vault.IdPSession, error) {
		key := sessionKey(in.Principal)
		out := record.ReplaceIdPSession(s.sessions[key], in)
		rec, err := record.EncodeIdPSession(s.kr, out)
		if err != nil {
			return vault.IdPSession{}, err
		}
		s.sessions[key] = rec
		return out, nil
	})
}

// UpdateIdPSession implements vault.IdPSessionStore.
func (s *Store) UpdateIdPSession(ctx context.Context, p vault.Principal, fn func(vault.IdPSession) (vault.IdPSession, error)) (vault.IdPSession, error) {
	return casKind(s, s.sessions, record.IdPSessions(s.kr), sessionKey(p), fn)
}

// DeleteIdPSession implements vault.IdPSessionStore.
func (s *Store) DeleteIdPSession(ctx context.Context, p vault.Principal) error {
	return deleteKey(s, s.sessions, sessionKey(p), "IdP session")
}

// ResealIdPSessions implements vault.IdPSessionStore under the write lock.
func (s *Store) ResealIdPSessions(ctx context.Context) (int, error) {
	return write(s, func() (int, error) {
		n := 0
		for key, rec := range s.sessions {
			if nrec, changed := record.ResealIdPSession(s.kr, rec); changed {
				s.sessions[key] = nrec
				n++
			}
		}
		return n, nil
	})
}
