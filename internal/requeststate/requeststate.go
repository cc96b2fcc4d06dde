// Package requeststate seals the continuation a front door hands a client
// when it answers "the person must act first" (MCP's requestState, the
// sidecar's request_state): which connect request the retry continues,
// bound to the person, the operation and a digest of its arguments, with
// an expiry. The client echoes it unread; the broker keeps no state.
//
// The sealed value is attacker-controlled input: it is authenticated
// before anything in it is parsed, and every failure (tampered, expired,
// another person, another operation, other arguments) is the one error
// ErrInvalid, so a caller learns nothing from the difference.
package requeststate

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"time"

	"credbroker/vault"
)

const (
	// aad separates these values from every other sealed value the broker
	// hands out (cookies, legacy MCP session ids).
	aad = "credbroker/requestState/v1"
	// maxSealedLen bounds what is accepted for opening (a real state is
	// about 200 bytes).
	maxSealedLen = 4096
)

// ErrInvalid is the one answer to every failure to open a state; the
// words a client reads are its front door's.
var ErrInvalid = errors.New("requeststate: invalid or expired state")

// State is what a continuation says.
type State struct {
	Principal vault.Principal
	// Operation names what is continued (an MCP tool name, "sidecar/require").
	Operation string
	// ArgDigest is Digest of the operation's arguments.
	ArgDigest []byte
	// Ref is what the retry continues: a connect request id, or a marker
	// of the front door's own (never a valid grant id).
	Ref     string
	Expires time.Time
}

// wire is the sealed plaintext (field names kept stable so states issued
// before an upgrade still open).
type wire struct {
	V         int    `json:"v"`
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Tool      string `json:"tool"`
	ArgDigest []byte `json:"args"`
	GrantID   string `json:"grant"`
	Expires   int64  `json:"exp"`
}

// Seal seals st with keys (a ring derived for this purpose).
func Seal(keys *vault.Keyring, st State) string {
	w := wire{V: 1, Issuer: st.Principal.Issuer, Subject: st.Principal.Subject, Tool: st.Operation,
		ArgDigest: st.ArgDigest, GrantID: st.Ref, Expires: st.Expires.Unix()}
	pt, ok := encodeWire(&w)
	if !ok {
		var err error
		if pt, err = json.Marshal(w); err != nil {
			panic("requeststate: marshal: " + err.Error())
		}
	}
	return seal(keys, pt, aad)
}

// Open authenticates and decrypts sealed and checks that it was issued to
// p for operation with arguments whose digest is digest, and has not
// expired at now. Nothing is parsed before authentication succeeds.
func Open(keys *vault.Keyring, sealed string, p vault.Principal, operation string, digest []byte, now time.Time) (State, error) {
	pt, ok := unseal(keys, sealed, maxSealedLen, aad)
	if !ok {
		return State{}, ErrInvalid
	}
	var w wire
	if !decodeWire(pt, &w) {
		w = wire{}
		if err := json.Unmarshal(pt, &w); err != nil {
			return State{}, ErrInvalid
		}
	}
	if w.V != 1 {
		return State{}, ErrInvalid
	}
	same := eq(w.Issuer, p.Issuer) & eq(w.Subject, p.Subject) & eq(w.Tool, operation) &
		subtle.ConstantTimeCompare(w.ArgDigest, digest)
	exp := time.Unix(w.Expires, 0)
	if same != 1 || !now.Before(exp) || w.GrantID == "" {
		return State{}, ErrInvalid
	}
	return State{Principal: p, Operation: w.Tool, ArgDigest: w.ArgDigest, Ref: w.GrantID, Expires: exp}, nil
}

// seal encrypts and authenticates pt under additional data ad, base64url
// as unseal reads it.
func seal(keys *vault.Keyring, pt []byte, ad string) string {
	return base64.RawURLEncoding.EncodeToString(keys.Seal(pt, []byte(ad)))
}

// eq compares a field of an opened state with what the caller wants, in
// constant time: 1 when they are equal, else 0.
func eq(a, b string) int { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) }

// unseal authenticates and decrypts sealed (base64url, at most maxLen
// characters) under additional data ad.
func unseal(keys *vault.Keyring, sealed string, maxLen int, ad string) ([]byte, bool) {
	if len(sealed) == 0 || len(sealed) > maxLen {
		return nil, false
	}
	ct, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return nil, false
	}
	pt, _, err := keys.Open(ct, []byte(ad))
	return pt, err == nil
}

// Canonical renders JSON arguments in a canonical form (object keys
// sorted, insignificant space removed, numbers as written) so a digest
// does not depend on the client's formatting. Absent or null arguments are
// {}.
func Canonical(raw json.RawMessage) ([]byte, error) {
	b, shared, err := canonical(raw)
	if shared {
		b = bytes.Clone(b)
	}
	return b, err
}

// canonical is Canonical without the copy: shared reports that b is raw's
// own bytes, which are canonical already.
func canonical(raw []byte) (b []byte, shared bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}"), false, nil
	}
	if isCanonical(raw) {
		return raw, true, nil
	}
	b, err = reencode(raw)
	return b, false, err
}

// reencode is Canonical's general path: decode, then json.Marshal.
func reencode(raw []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, errors.New("trailing data after arguments")
	}
	return json.Marshal(v)
}

// Digest is the SHA-256 of Canonical(raw).
func Digest(raw json.RawMessage) ([]byte, error) {
	c, _, err := canonical(raw)
	if err != nil {
		return nil, err
	}
	d := sha256.Sum256(c)
	return d[:], nil
}
