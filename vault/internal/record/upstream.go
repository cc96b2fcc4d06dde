package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
)

// upstreamClientRecord is the stored form of a vault.UpstreamClient: the
// key, client id and method in the clear, the client secret sealed.
type upstreamClientRecord struct {
	V          int       `json:"v"`
	Key        string    `json:"key"`
	ClientID   string    `json:"client_id"`
	AuthMethod string    `json:"auth_method"`
	Created    time.Time `json:"created"`
	// Secret is the envelope of the client secret (upstreamClientAAD);
	// absent for a public client.
	Secret []byte `json:"secret,omitempty"`
}

// upstreamClientAAD binds a sealed client secret to its registration:
// moved to another key or client id, it fails to open.
func upstreamClientAAD(r *upstreamClientRecord) []byte {
	return boundAAD("credbroker/upstreamClient/v1", r.Key, r.ClientID)
}

// MaxUpstreamClientKey is the longest vault.UpstreamClient.Key a store
// keeps.
const MaxUpstreamClientKey = 2048

// CheckUpstreamClientKey refuses a key no backend can keep: empty, longer
// than MaxUpstreamClientKey bytes, not UTF-8 or holding a NUL.
func CheckUpstreamClientKey(key string) error {
	switch {
	case key == "":
		return errors.New("vault: upstream client without key")
	case len(key) > MaxUpstreamClientKey:
		return fmt.Errorf("vault: upstream client key of %d bytes, more than %d", len(key), MaxUpstreamClientKey)
	case !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0:
		return errors.New("vault: upstream client key is not UTF-8 text without NUL")
	}
	return nil
}

// EncodeUpstreamClient renders c for storage, sealing its client secret
// with kr's primary key.
func EncodeUpstreamClient(kr *vault.Keyring, c vault.UpstreamClient) ([]byte, error) {
	if err := CheckUpstreamClientKey(c.Key); err != nil {
		return nil, err
	}
	if c.ClientID == "" {
		return nil, errors.New("vault: upstream client without client id")
	}
	if err := validUTF8(c.ClientID, c.AuthMethod, c.ClientSecret.Reveal()); err != nil {
		return nil, fmt.Errorf("vault: upstream client %q: %w", c.Key, err)
	}
	r := upstreamClientRecord{V: recordV1, Key: c.Key, ClientID: c.ClientID, AuthMethod: c.AuthMethod, Created: c.Created}
	if c.ClientSecret != "" {
		r.Secret = kr.Seal([]byte(c.ClientSecret.Reveal()), upstreamClientAAD(&r))
	}
	return json.Marshal(r)
}

// parseUpstreamClient parses a stored registration without opening its
// secret.
func parseUpstreamClient(b []byte) (upstreamClientRecord, error) {
	r, err := decodeV1(b, "upstream client", func(r *upstreamClientRecord) (int, string) { return r.V, r.Key })
	if err != nil {
		return r, err
	}
	if err := CheckUpstreamClientKey(r.Key); err != nil {
		return r, fmt.Errorf("%w (%w)", err, vault.ErrMalformed)
	}
	if r.ClientID == "" {
		return r, fmt.Errorf("vault: upstream client %q without client id: %w", r.Key, vault.ErrMalformed)
	}
	return r, nil
}

// DecodeUpstreamClient parses a stored registration and opens its client
// secret. A tampered, moved or wrongly keyed secret returns an error
// wrapping ErrDecrypt, ErrUnknownKey or ErrMalformed.
func DecodeUpstreamClient(kr *vault.Keyring, b []byte) (vault.UpstreamClient, error) {
	r, err := parseUpstreamClient(b)
	if err != nil {
		return vault.UpstreamClient{}, err
	}
	c := vault.UpstreamClient{Key: r.Key, ClientID: r.ClientID, AuthMethod: r.AuthMethod, Created: r.Created}
	if r.Secret != nil {
		pt, kid, err := kr.Open(r.Secret, upstreamClientAAD(&r))
		if err != nil {
			return vault.UpstreamClient{}, fmt.Errorf("vault: upstream client %q: %w", r.Key, err)
		}
		c.ClientSecret, c.SealedWith = vault.Secret(pt), kid
		clear(pt)
	}
	return c, nil
}

// UpstreamClientMeta is what a stored registration says without opening
// anything: its key and the id of the key that sealed its secret (empty
// without one).
func UpstreamClientMeta(b []byte) (key, sealedWith string, err error) {
	r, err := parseUpstreamClient(b)
	if err != nil {
		return "", "", err
	}
	if r.Secret != nil {
		if sealedWith, err = envelope.KeyID(r.Secret); err != nil {
			return "", "", fmt.Errorf("vault: upstream client %q: %w", r.Key, err)
		}
	}
	return r.Key, sealedWith, nil
}

// UpstreamClientDeletable is the rule of a compare-and-delete of the
// stored registration b (vault.UpstreamClientStore.DeleteUpstreamClient):
// nil when clientID is empty (whatever b holds) or b's client id, else
// an error wrapping vault.ErrConflict (a registration made since the one
// the caller saw).
func UpstreamClientDeletable(b []byte, clientID string) error {
	if clientID == "" {
		return nil
	}
	r, err := parseUpstreamClient(b)
	switch {
	case err != nil:
		return err
	case r.ClientID != clientID:
		return fmt.Errorf("vault: upstream client %q is another client than %q: %w", r.Key, clientID, vault.ErrConflict)
	}
	return nil
}

// ResealUpstreamClient seals a stored registration's secret again with
// kr's primary key; changed is false (and rec nil) when there is nothing
// to do: no secret, or sealed with the primary already.
func ResealUpstreamClient(kr *vault.Keyring, b []byte) (rec []byte, changed bool, err error) {
	c, err := DecodeUpstreamClient(kr, b)
	if err != nil || c.ClientSecret == "" || c.SealedWith == kr.Primary() {
		return nil, false, err
	}
	rec, err = EncodeUpstreamClient(kr, c)
	return rec, err == nil, err
}
