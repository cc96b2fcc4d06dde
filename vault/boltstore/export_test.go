package boltstore

import bolt "go.etcd.io/bbolt"

// GroupUpdate is the store's group commit on a raw handle, for the Put
// benchmark's floor: the same commit scheme without the record codec.
func GroupUpdate(db *bolt.DB) func(func(*bolt.Tx) error) error {
	g := &groupCommit{db: db}
	return g.do
}
