package memstore

import (
	"context"
	"fmt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

var _ vault.IdPSessionStore = (*Store)(nil)

// IdPSessions returns the store's IdP sessions.
func (s *Store) IdPSessions() vault.IdPSessionStore { return s }

func sessionKey(p vault.Principal) [2]string { return [2]string{p.Issuer, p.Subject} }

// session returns p's stored record; s.mu must be held.
func (s *Store) session(p vault.Principal) ([]byte, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	rec, ok := s.sessions[sessionKey(p)]
	if !ok {
		return nil, fmt.Errorf("memstore: IdP session: %w", vault.ErrNotFound)
	}
	return rec, nil
}

// GetIdPSession implements vault.IdPSessionStore.
func (s *Store) GetIdPSession(ctx context.Context, p vault.Principal) (vault.IdPSession, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	rec, err := s.session(p)
	if err != nil {
		return vault.IdPSession{}, err
	}
	return record.DecodeIdPSession(s.kr, rec)
}

// PutIdPSession implements vault.IdPSessionStore.
func (s *Store) PutIdPSession(ctx context.Context, in vault.IdPSession) (vault.IdPSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.check(); err != nil {
		return vault.IdPSession{}, err
	}
	out := record.ReplaceIdPSession(s.sessions[sessionKey(in.Principal)], in)
	rec, err := record.EncodeIdPSession(s.kr, out)
	if err != nil {
		return vault.IdPSession{}, err
	}
	if s.sessions == nil {
		s.sessions = map[[2]string][]byte{}
	}
	s.sessions[sessionKey(in.Principal)] = rec
	return out, nil
}

// UpdateIdPSession implements vault.IdPSessionStore.
func (s *Store) UpdateIdPSession(ctx context.Context, p vault.Principal, fn func(vault.IdPSession) (vault.IdPSession, error)) (vault.IdPSession, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, err := s.session(p)
	if err != nil {
		return vault.IdPSession{}, err
	}
	nrec, _, out, err := record.IdPSessions(s.kr).Update(rec, fn)
	if err != nil {
		return vault.IdPSession{}, err
	}
	s.sessions[sessionKey(p)] = nrec
	return out, nil
}

// DeleteIdPSession implements vault.IdPSessionStore.
func (s *Store) DeleteIdPSession(ctx context.Context, p vault.Principal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.session(p); err != nil {
		return err
	}
	delete(s.sessions, sessionKey(p))
	return nil
}
