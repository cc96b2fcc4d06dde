package record

import (
	"fmt"

	"credbroker/vault"
)

// Kind is the codec and the update rules of one kind of record that
// backends store whole (grants, the authorization server's clients and
// app access records), so a backend's compare-and-swap is written once
// for all of them.
type Kind[T any] struct {
	// Name names the kind in errors ("grant").
	Name   string
	Encode func(T) ([]byte, error)
	Decode func([]byte) (T, error)
	// Owner is the id a value names (the key it must be stored under)
	// and the person it belongs to (zero for a kind of no one's).
	Owner func(T) (id string, p vault.Principal)

	// The update rules (Apply): clone copies a value; same reports
	// whether an update kept the immutable fields, which immutable names
	// for people; version reads a value's version and withVersion sets
	// it. (Values, never pointers, pass through them, so nothing escapes
	// to the heap on the way.)
	clone       func(T) T
	same        func(old, new T) bool
	immutable   string
	version     func(T) uint64
	withVersion func(T, uint64) T
}

// Apply is the rule every compare-and-swap update of a record follows: fn
// runs on a copy of old; its result is refused when it changed an
// immutable field or returned another version than the stored one (a
// stale copy: vault.ErrConflict); what is stored is a copy of it with the
// version one past old's. An error from fn is returned as is.
func (k Kind[T]) Apply(old T, fn func(T) (T, error)) (T, error) {
	var zero T
	nv, err := fn(k.clone(old))
	if err != nil {
		return zero, err
	}
	if !k.same(old, nv) {
		id, _ := k.Owner(old)
		return zero, fmt.Errorf("vault: update of %s %s changed an immutable field (%s)", k.Name, id, k.immutable)
	}
	if k.version(nv) != k.version(old) {
		id, _ := k.Owner(old)
		return zero, fmt.Errorf("vault: update of %s %s returned version %d, stored is %d: %w", k.Name, id, k.version(nv), k.version(old), vault.ErrConflict)
	}
	return k.withVersion(k.clone(nv), k.version(old)+1), nil
}

// Fresh is what a backend stores for a value it creates: a copy of v at
// version 1.
func (k Kind[T]) Fresh(v T) T { return k.withVersion(k.clone(v), 1) }

// New is Fresh and its record.
func (k Kind[T]) New(v T) (T, []byte, error) {
	v = k.Fresh(v)
	rec, err := k.Encode(v)
	if err != nil {
		var zero T
		return zero, nil, err
	}
	return v, rec, nil
}

// DecodeOwned decodes the records of kind k that a backend listed for p
// and checks each belongs to p (decodeOwned).
func (k Kind[T]) DecodeOwned(p vault.Principal, recs [][]byte) ([]T, error) {
	return decodeOwned(p, recs, k.Name, k.Decode, k.Owner)
}

// Update decodes the stored record rec, applies fn with the kind's rules
// and encodes the result: the record to store, the value it held and the
// one it holds now. An error leaves nothing to store.
func (k Kind[T]) Update(rec []byte, fn func(T) (T, error)) (nrec []byte, old, nv T, err error) {
	var zero T
	if old, err = k.Decode(rec); err != nil {
		return nil, zero, zero, err
	}
	if nv, err = k.Apply(old, fn); err != nil {
		return nil, old, zero, err
	}
	if nrec, err = k.Encode(nv); err != nil {
		return nil, old, zero, err
	}
	return nrec, old, nv, nil
}
