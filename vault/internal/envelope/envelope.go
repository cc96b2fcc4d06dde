// Package envelope is the layout of what vault's Keyring seals. Version 1:
//
//	0x01 | len(id) | id | nonce | AEAD ciphertext and tag
//
// The key ring writes and opens envelopes; the record codecs and the
// backends only read which key sealed one (KeyID), without opening it.
package envelope

import "errors"

const (
	// V1 is the first byte of a version 1 envelope.
	V1 = 0x01
	// MaxKeyID bounds the length of a key id, in bytes.
	MaxKeyID = 32
)

// ErrMalformed: the envelope is too short or has an unknown version. It
// is vault.ErrMalformed.
var ErrMalformed = errors.New("vault: malformed ciphertext envelope")

// AppendHeader appends the header of an envelope sealed with key id to
// dst; the nonce and the ciphertext follow it.
func AppendHeader(dst []byte, id string) []byte {
	return append(append(dst, V1, byte(len(id))), id...)
}

// Split returns the id of the key that sealed ct and what follows it (the
// nonce, the ciphertext and the tag), both slices of ct.
func Split(ct []byte) (id, rest []byte, err error) {
	if len(ct) < 2 || ct[0] != V1 {
		return nil, nil, ErrMalformed
	}
	n := int(ct[1])
	if n == 0 || n > MaxKeyID || len(ct) < 2+n {
		return nil, nil, ErrMalformed
	}
	return ct[2 : 2+n], ct[2+n:], nil
}

// KeyID returns the id of the key that sealed ct, without opening it.
func KeyID(ct []byte) (string, error) {
	id, _, err := Split(ct)
	return string(id), err
}
