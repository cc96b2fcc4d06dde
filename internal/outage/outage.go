// Package outage is what every door of the broker says while its storage
// is unavailable (a store error wrapping vault.ErrUnavailable: the
// database is down or restarting, the disk is full): HTTP 503 with
// Retry-After, and the same words everywhere, in the door's own format
// (a JSON-RPC error, the sidecar's error body, an OAuth error, a page).
// Whether an error is such an outage is vault's to say (errors.Is with
// vault.ErrUnavailable); the cause goes to the operator's log only.
package outage

import (
	"net/http"
	"strconv"
	"time"
)

// RetryAfter is when a client should try again. A store that is back
// serves within a second (broken database sessions are dropped on first
// use), so a retry after this meets a working broker or one more short
// 503.
const RetryAfter = 2 * time.Second

// Message is what a client or a person is told.
const Message = "The broker's storage is unavailable right now, so this request did not complete. Retry in a few seconds."

// SetRetryAfter sets the Retry-After header of an outage's 503 on h.
func SetRetryAfter(h http.Header) {
	h.Set("Retry-After", strconv.Itoa(int(RetryAfter/time.Second)))
}
