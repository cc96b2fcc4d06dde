package vault

import (
	"errors"
	"fmt"

	"credbroker/vault/internal/envelope"
)

// Errors, matched with errors.Is: the sentinels every Store returns
// (wrapped), those of AuthStore, and those of the envelope.
var (
	// ErrNotFound: no record with that id.
	ErrNotFound = errors.New("vault: not found")
	// ErrExists: a record with that id already exists.
	ErrExists = errors.New("vault: already exists")
	// ErrConflict: the record changed between read and write (compare-and-swap lost).
	ErrConflict = errors.New("vault: conflict")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("vault: store closed")
	// ErrUnavailable: the storage behind the store cannot be used right
	// now: the database is down, restarting or unreachable, or the disk
	// refused a write (full, read-only, an I/O error). The call may well
	// succeed when it is made again a little later. Every backend wraps
	// its connection-level and I/O failures with it, keeping the cause in
	// the message (for the operator's log: never shown to a client), so
	// that each front door can answer an outage as one: a retryable 503
	// (errors.Is(err, ErrUnavailable) tests for it; UnavailableError
	// builds one).
	ErrUnavailable = errors.New("vault: storage unavailable")
	// ErrTooManyOpenGrants: CreateGrantLimited refused a grant because its
	// principal already holds GrantLimits.MaxOpen open grants.
	ErrTooManyOpenGrants = errors.New("vault: too many open grants")
	// ErrTooManyRecentGrants: CreateGrantLimited refused a grant because its
	// principal created GrantLimits.MaxCreated grants since GrantLimits.Since.
	ErrTooManyRecentGrants = errors.New("vault: too many grants created recently")
	// ErrRecordFormat: a stored connection record is not one this broker
	// can read: an unknown format version, truncated, an overlong field, a
	// value out of range, or a required field of a newer broker.
	ErrRecordFormat = errors.New("vault: malformed connection record")
	// Errors of AuthStore, besides the sentinels above.
	// ErrCodeRedeemed: RedeemAuthCode found a code that was redeemed
	// before. The record is returned with it, so the caller can revoke
	// what the first redemption issued.
	ErrCodeRedeemed = errors.New("vault: authorization code already redeemed")
	// ErrTooManyClients: CreateOAuthClient refused a registration because
	// the store already holds the maximum number of registered clients.
	ErrTooManyClients = errors.New("vault: too many registered clients")
	// The error of AssertionLedger.
	// ErrAssertionSpent: SpendAssertion found the assertion spent before.
	ErrAssertionSpent = errors.New("vault: assertion already spent")
	// Envelope errors.
	// ErrUnknownKey: the ciphertext names a key id the key ring does not hold.
	ErrUnknownKey = errors.New("vault: unknown key id")
	// ErrDecrypt: authentication failed (wrong key, tampered bytes, or a
	// ciphertext moved to another record).
	ErrDecrypt = errors.New("vault: decryption failed (wrong key, tampered data or ciphertext moved between records)")
	// ErrMalformed: the envelope is too short or has an unknown version.
	ErrMalformed = envelope.ErrMalformed
	// ErrNoKeys: no keys were configured.
	ErrNoKeys = errors.New("vault: no encryption keys configured")
)

// UnavailableError wraps cause, a backend's failure to reach or write its
// storage, with ErrUnavailable; where names the storage (a file, a
// database) without credentials. Both stay in the message for the
// operator's log.
func UnavailableError(where string, cause error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, where, cause)
}
