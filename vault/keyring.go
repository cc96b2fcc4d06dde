package vault

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"credbroker/vault/internal/envelope"
)

const keySize = 32

type ringKey struct {
	id   string
	raw  []byte
	aead cipher.AEAD
}

// Keyring holds 256-bit keys by id. The first key is the primary: it seals
// everything new. The others only open what they sealed earlier.
//
// Envelope (version 1, vault/internal/envelope): 0x01 | len(id) | id |
// 12-byte random nonce | AES-256-GCM ciphertext and tag, with
// caller-supplied additional data.
type Keyring struct {
	keys []*ringKey
	byID map[string]*ringKey
	// opens counts successful Opens, so tests and benchmarks can show
	// how many records a request decrypted.
	opens atomic.Uint64
}

// Opens returns how many envelopes kr has opened since it was made.
func (kr *Keyring) Opens() uint64 { return kr.opens.Load() }

// NewKeyring builds a key ring from (id, 32-byte key) pairs; the first is primary.
func NewKeyring(ids []string, keys [][]byte) (*Keyring, error) {
	if len(ids) == 0 {
		return nil, ErrNoKeys
	}
	if len(ids) != len(keys) {
		return nil, errors.New("vault: key ids and keys differ in number")
	}
	kr := &Keyring{byID: make(map[string]*ringKey, len(ids))}
	for i, id := range ids {
		if err := validKeyID(id); err != nil {
			return nil, err
		}
		if len(keys[i]) != keySize {
			return nil, fmt.Errorf("vault: key %q is %d bytes, want %d", id, len(keys[i]), keySize)
		}
		if _, dup := kr.byID[id]; dup {
			return nil, fmt.Errorf("vault: key id %q appears twice", id)
		}
		block, err := aes.NewCipher(keys[i])
		if err != nil {
			return nil, fmt.Errorf("vault: key %q: %w", id, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("vault: key %q: %w", id, err)
		}
		k := &ringKey{id: id, raw: bytes.Clone(keys[i]), aead: aead}
		kr.keys = append(kr.keys, k)
		kr.byID[id] = k
	}
	return kr, nil
}

func validKeyID(id string) error {
	if id == "" || len(id) > envelope.MaxKeyID {
		return fmt.Errorf("vault: key id %q must be 1 to %d characters", id, envelope.MaxKeyID)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("vault: key id %q may only contain letters, digits, '-' and '_'", id)
		}
	}
	return nil
}

// ParseKeys parses key lines "id:base64(32 bytes)", separated by newlines or
// commas; blank lines and lines starting with '#' are ignored. The first key
// is primary.
func ParseKeys(text string) (*Keyring, error) {
	var ids []string
	var keys [][]byte
	sc := bufio.NewScanner(strings.NewReader(strings.ReplaceAll(text, ",", "\n")))
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		id, enc, ok := strings.Cut(s, ":")
		if !ok {
			return nil, fmt.Errorf("vault: key entry %d: want id:base64key", line)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
		if err != nil {
			raw, err = base64.RawURLEncoding.DecodeString(strings.TrimSpace(enc))
		}
		if err != nil {
			return nil, fmt.Errorf("vault: key entry %d (%s): key is not base64", line, strings.TrimSpace(id))
		}
		ids = append(ids, strings.TrimSpace(id))
		keys = append(keys, raw)
	}
	return NewKeyring(ids, keys)
}

// GenerateKey returns a new random key line "id:base64key".
func GenerateKey() string {
	var id [4]byte
	var key [keySize]byte
	rand.Read(id[:])
	rand.Read(key[:])
	return "k" + hex.EncodeToString(id[:]) + ":" + base64.StdEncoding.EncodeToString(key[:])
}

// WithNewPrimary returns a key ring whose primary is a new random key and
// whose other keys are kr's, in order (decrypt-only).
func (kr *Keyring) WithNewPrimary() (*Keyring, error) {
	nk, err := ParseKeys(GenerateKey())
	if err != nil {
		return nil, err
	}
	ids, keys := []string{nk.keys[0].id}, [][]byte{nk.keys[0].raw}
	for _, k := range kr.keys {
		ids = append(ids, k.id)
		keys = append(keys, k.raw)
	}
	return NewKeyring(ids, keys)
}

// Format renders kr in the keys-file format, primary first.
func (kr *Keyring) Format() string {
	var b strings.Builder
	b.WriteString("# credbroker keys: the first is primary; the others are decrypt-only.\n")
	for _, k := range kr.keys {
		b.WriteString(k.id + ":" + base64.StdEncoding.EncodeToString(k.raw) + "\n")
	}
	return b.String()
}

// Primary returns the primary key's id.
func (kr *Keyring) Primary() string { return kr.keys[0].id }

// IDs returns the key ids, primary first.
func (kr *Keyring) IDs() []string {
	ids := make([]string, len(kr.keys))
	for i, k := range kr.keys {
		ids[i] = k.id
	}
	return ids
}

// Seal encrypts plaintext under the primary key with additional data aad.
func (kr *Keyring) Seal(plaintext, aad []byte) []byte {
	k := kr.keys[0]
	ns := k.aead.NonceSize()
	out := make([]byte, 0, 2+len(k.id)+ns+len(plaintext)+k.aead.Overhead())
	out = envelope.AppendHeader(out, k.id)
	nonce := out[len(out) : len(out)+ns]
	if _, err := rand.Read(nonce); err != nil {
		panic("vault: crypto/rand failed: " + err.Error())
	}
	out = out[:len(out)+ns]
	return k.aead.Seal(out, nonce, plaintext, aad)
}

// SealWith is Seal with the key named id instead of the primary (for
// per-key canaries). It fails with ErrUnknownKey when kr lacks id.
func (kr *Keyring) SealWith(id string, plaintext, aad []byte) ([]byte, error) {
	k, ok := kr.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownKey, id)
	}
	one := &Keyring{keys: []*ringKey{k}, byID: map[string]*ringKey{id: k}}
	return one.Seal(plaintext, aad), nil
}

// Has reports whether kr holds a key named id.
func (kr *Keyring) Has(id string) bool {
	_, ok := kr.byID[id]
	return ok
}

// Open authenticates and decrypts an envelope made by Seal with the same aad.
// It returns the plaintext and the id of the key that opened it.
func (kr *Keyring) Open(ct, aad []byte) ([]byte, string, error) {
	kid, rest, err := envelope.Split(ct)
	if err != nil {
		return nil, "", err
	}
	k, ok := kr.byID[string(kid)] // no copy of the id for the lookup
	if !ok {
		id := string(kid)
		return nil, id, fmt.Errorf("%w %q (the key ring holds %s)", ErrUnknownKey, id, strings.Join(kr.IDs(), ", "))
	}
	id := k.id
	ns := k.aead.NonceSize()
	if len(rest) < ns+k.aead.Overhead() {
		return nil, id, ErrMalformed
	}
	pt, err := k.aead.Open(nil, rest[:ns], rest[ns:], aad)
	if err != nil {
		return nil, id, fmt.Errorf("%w (key %q)", ErrDecrypt, id)
	}
	kr.opens.Add(1)
	return pt, id, nil
}

// Derive returns a key ring with the same ids whose keys are derived from
// kr's with HKDF-SHA256 for one purpose (e.g. "requestState", "cookie-hash"),
// so one set of master keys serves every use without key reuse.
func (kr *Keyring) Derive(purpose string) *Keyring {
	ids := kr.IDs()
	keys := make([][]byte, len(kr.keys))
	for i, k := range kr.keys {
		dk, err := hkdf.Key(sha256.New, k.raw, nil, "credbroker/v1/"+purpose, keySize)
		if err != nil {
			panic("vault: hkdf: " + err.Error())
		}
		keys[i] = dk
	}
	d, err := NewKeyring(ids, keys)
	if err != nil {
		panic("vault: derive: " + err.Error())
	}
	return d
}

// AllBytes returns copies of every key's bytes, primary first.
func (kr *Keyring) AllBytes() [][]byte {
	out := make([][]byte, len(kr.keys))
	for i, k := range kr.keys {
		out[i] = bytes.Clone(k.raw)
	}
	return out
}
