package record

import (
	"fmt"

	"credbroker/vault"
)

// Unavailable wraps cause, a backend's failure to reach or write its
// storage, with vault.ErrUnavailable; where names the storage (a file, a
// database) without credentials. Both stay in the message for the
// operator's log.
func Unavailable(where string, cause error) error {
	return fmt.Errorf("%w: %s: %w", vault.ErrUnavailable, where, cause)
}
