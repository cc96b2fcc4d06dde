package record

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"credbroker/vault"
)

// spentRecord is the exported form of a spent assertion: the backends
// keep the key and the expiry in shapes of their own (a bolt value, two
// columns) and export this record, so a migration carries replay
// protection over.
type spentRecord struct {
	V         int    `json:"v"`
	Key       string `json:"key"`
	ExpiresNS int64  `json:"expires_ns"`
}

// CheckAssertionKey reports whether key has the form of a
// vault.AssertionKey: every backend's SpendAssertion refuses any other.
func CheckAssertionKey(key string) error {
	if len(key) != 43 {
		return fmt.Errorf("vault: assertion key must be 43 base64url characters, not %d", len(key))
	}
	if _, err := base64.RawURLEncoding.DecodeString(key); err != nil {
		return fmt.Errorf("vault: assertion key is not base64url: %w", err)
	}
	return nil
}

// EncodeSpentAssertion renders a spent assertion: key, a
// vault.AssertionKey, kept until expires.
func EncodeSpentAssertion(key string, expires time.Time) ([]byte, error) {
	if err := CheckAssertionKey(key); err != nil {
		return nil, err
	}
	return json.Marshal(spentRecord{V: 1, Key: key, ExpiresNS: expires.UnixNano()})
}

// DecodeSpentAssertion parses EncodeSpentAssertion's output; the expiry
// is in UTC.
func DecodeSpentAssertion(b []byte) (key string, expires time.Time, err error) {
	var r spentRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return "", time.Time{}, fmt.Errorf("vault: spent assertion record: %w (%v)", vault.ErrMalformed, err)
	}
	if r.V != 1 {
		return "", time.Time{}, fmt.Errorf("vault: spent assertion record version %d: %w", r.V, vault.ErrMalformed)
	}
	if err := CheckAssertionKey(r.Key); err != nil {
		return "", time.Time{}, fmt.Errorf("vault: spent assertion record: %w", err)
	}
	return r.Key, time.Unix(0, r.ExpiresNS).UTC(), nil
}
