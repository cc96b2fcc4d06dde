package boltstore

import bolt "go.etcd.io/bbolt"

// GroupUpdate is the store's group commit on a raw handle, for the Put
// benchmark's floor: the same commit scheme without the record codec.
func GroupUpdate(db *bolt.DB) (update func(func(*bolt.Tx) error) error, commits func() int) {
	g := newGroupCommit(db, true)
	return g.do, func() int { return int(g.commits.Load()) }
}

// Commits is how many transactions the store's group commit has run.
func Commits(s *Store) int { return int(s.group.commits.Load()) }

// SetLinger turns the store's wait for returning writers on or off.
func SetLinger(s *Store, on bool) { s.group = newGroupCommit(s.db, on) }
