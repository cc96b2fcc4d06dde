package record

import (
	"fmt"

	"credbroker/vault"
)

// applyUpdate is the rule every compare-and-swap update of a record
// follows: fn runs on a copy of old; its result is refused when check
// says it changed an immutable field or returned another version than the
// stored one (a stale copy: vault.ErrConflict); what is stored is a copy of
// it with the version one past old's (next). An error from fn is returned
// as is. (Values, never pointers, pass through the function arguments, so
// nothing escapes to the heap on the way.)
func applyUpdate[T any](old T, fn func(T) (T, error), clone func(T) T, check func(old, new T) error, next func(new, old T) T) (T, error) {
	var zero T
	nv, err := fn(clone(old))
	if err != nil {
		return zero, err
	}
	if err := check(old, nv); err != nil {
		return zero, err
	}
	return next(clone(nv), old), nil
}

// checkVersion refuses an update closure's result whose version is not
// the stored one.
func checkVersion(what, id string, old, new uint64) error {
	if new != old {
		return fmt.Errorf("vault: update of %s %s returned version %d, stored is %d: %w", what, id, new, old, vault.ErrConflict)
	}
	return nil
}

// Kind is the codec and the update rules of one kind of record that
// backends store whole (grants, the authorization server's clients and
// app access records), so a backend's compare-and-swap is written once
// for all of them.
type Kind[T any] struct {
	Encode func(T) ([]byte, error)
	Decode func([]byte) (T, error)
	// Apply runs an update closure on the current value with the kind's
	// rules (applyUpdate).
	Apply func(old T, fn func(T) (T, error)) (T, error)
	// ID is the id a value names (the key it must be stored under).
	ID func(T) string
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
