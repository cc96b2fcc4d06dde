package vault

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"time"
)

// AssertionLedger remembers the one-time assertions the broker accepted
// (the jti of an ID-JAG redeemed at the authorization server) until they
// expire, so each is accepted once across every process sharing the
// store: the Store feature that Store.Assertions returns;
// vaulttest.RunAssertions is its conformance suite. Only AssertionKey
// hashes are stored, never an assertion.
type AssertionLedger interface {
	// SpendAssertion records key (an AssertionKey) until expires,
	// atomically: of concurrent calls with one key, on one process or
	// many sharing the store, exactly one succeeds and the others get
	// ErrAssertionSpent, as does any later call while the record is kept.
	// A key that is not an AssertionKey is an error and stores nothing.
	SpendAssertion(ctx context.Context, key string, expires time.Time) error
	// DeleteSpentAssertions removes the records whose expiry is before
	// before, and returns how many. Keep a record at least as long as the
	// assertion it names could still be accepted.
	DeleteSpentAssertions(ctx context.Context, before time.Time) (int, error)
}

// AssertionKey is the ledger key of the assertion with id jti from issuer
// iss: base64url of SHA-256 over both, each length-prefixed, so ids are
// scoped by their issuer and no attacker-chosen text is stored.
func AssertionKey(iss, jti string) string {
	h := sha256.New()
	var n [8]byte
	for _, s := range []string{iss, jti} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
