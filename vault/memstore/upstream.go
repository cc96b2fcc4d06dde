package memstore

import (
	"context"
	"fmt"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// UpstreamClients implements vault.Store: the store is its own
// UpstreamClientStore.
func (s *Store) UpstreamClients() vault.UpstreamClientStore { return s }

// GetUpstreamClient implements vault.UpstreamClientStore.
func (s *Store) GetUpstreamClient(ctx context.Context, key string) (vault.UpstreamClient, error) {
	return get(s, s.upstream, key, "upstream client", func(b []byte) (vault.UpstreamClient, error) {
		return record.DecodeUpstreamClient(s.kr, b)
	})
}

// PutUpstreamClient implements vault.UpstreamClientStore under the write
// lock: the first put of a key wins.
func (s *Store) PutUpstreamClient(ctx context.Context, c vault.UpstreamClient) (vault.UpstreamClient, error) {
	rec, err := record.EncodeUpstreamClient(s.kr, c)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	stored, err := write(s, func() ([]byte, error) {
		if old, ok := s.upstream[c.Key]; ok {
			return old, nil
		}
		s.upstream[c.Key] = rec
		return rec, nil
	})
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	return record.DecodeUpstreamClient(s.kr, stored)
}

// DeleteUpstreamClient implements vault.UpstreamClientStore under the
// write lock.
func (s *Store) DeleteUpstreamClient(ctx context.Context, key, clientID string) error {
	_, err := write(s, func() (struct{}, error) {
		old, ok := s.upstream[key]
		if !ok {
			return struct{}{}, fmt.Errorf("memstore: upstream client %q: %w", key, vault.ErrNotFound)
		}
		if err := record.UpstreamClientDeletable(old, clientID); err != nil {
			return struct{}{}, fmt.Errorf("memstore: delete upstream client: %w", err)
		}
		delete(s.upstream, key)
		return struct{}{}, nil
	})
	return err
}

// ResealUpstreamClients implements vault.UpstreamClientStore under the
// write lock.
func (s *Store) ResealUpstreamClients(ctx context.Context) (int, error) {
	return write(s, func() (int, error) {
		n := 0
		for key, rec := range s.upstream {
			nrec, changed, err := record.ResealUpstreamClient(s.kr, rec)
			if err != nil {
				return n, fmt.Errorf("memstore: upstream client %q: %w", key, err)
			}
			if changed {
				s.upstream[key] = nrec
				n++
			}
		}
		return n, nil
	})
}
