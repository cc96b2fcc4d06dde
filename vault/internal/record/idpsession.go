package record

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
)

// sessionRecord is the stored form of an IdPSession: the person and the
// times in the clear, the refresh token and the ID token sealed in
// Tokens with the person as additional data (a ciphertext moved to
// another person's record fails to open).
type sessionRecord struct {
	V              int       `json:"v"`
	Issuer         string    `json:"iss"`
	Subject        string    `json:"sub"`
	IDTokenExpires time.Time `json:"idt_exp,omitzero"`
	Created        time.Time `json:"created"`
	Updated        time.Time `json:"updated"`
	Version        uint64    `json:"version"`
	Tokens         []byte    `json:"tokens"`
}

// sessionPlain is what is sealed.
type sessionPlain struct {
	RefreshToken string `json:"rt,omitempty"`
	IDToken      string `json:"idt,omitempty"`
}

const sessionV1 = 1

// sessionAAD binds a session's ciphertext to its person.
func sessionAAD(iss, sub string) []byte {
	const prefix = "credbroker/idp-session/v1"
	b := make([]byte, 0, len(prefix)+2*binary.MaxVarintLen64+len(iss)+len(sub))
	b = append(b, prefix...)
	for _, s := range []string{iss, sub} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// EncodeIdPSession renders s for storage, sealing its tokens with kr's
// primary key.
func EncodeIdPSession(kr *vault.Keyring, s vault.IdPSession) ([]byte, error) {
	p := s.Principal
	if p.Issuer == "" || p.Subject == "" {
		return nil, errors.New("vault: IdP session without a person")
	}
	if err := validUTF8(p.Issuer, p.Subject, s.RefreshToken.Reveal(), s.IDToken.Reveal()); err != nil {
		return nil, fmt.Errorf("vault: IdP session: %w", err)
	}
	pt, err := json.Marshal(sessionPlain{RefreshToken: s.RefreshToken.Reveal(), IDToken: s.IDToken.Reveal()})
	if err != nil {
		return nil, fmt.Errorf("vault: IdP session: %w", err)
	}
	r := sessionRecord{V: sessionV1, Issuer: p.Issuer, Subject: p.Subject, IDTokenExpires: s.IDTokenExpires,
		Created: s.Created, Updated: s.Updated, Version: s.Version, Tokens: kr.Seal(pt, sessionAAD(p.Issuer, p.Subject))}
	clear(pt)
	return json.Marshal(r)
}

// IdPSessionMeta parses a stored session without opening its tokens.
func IdPSessionMeta(b []byte) (vault.IdPSession, error) {
	var r sessionRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return vault.IdPSession{}, fmt.Errorf("vault: decode IdP session: %w", err)
	}
	if r.V != sessionV1 {
		return vault.IdPSession{}, fmt.Errorf("vault: IdP session record version %d is not supported", r.V)
	}
	if r.Issuer == "" || r.Subject == "" {
		return vault.IdPSession{}, errors.New("vault: IdP session record without a person")
	}
	return vault.IdPSession{Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject}, IDTokenExpires: r.IDTokenExpires,
		Created: r.Created, Updated: r.Updated, Version: r.Version}, nil
}

// DecodeIdPSession parses a stored session and opens its tokens.
// Tampered, moved or wrongly keyed ciphertexts return an error wrapping
// ErrDecrypt, ErrUnknownKey or ErrMalformed.
func DecodeIdPSession(kr *vault.Keyring, b []byte) (vault.IdPSession, error) {
	s, err := IdPSessionMeta(b)
	if err != nil {
		return vault.IdPSession{}, err
	}
	var r sessionRecord
	_ = json.Unmarshal(b, &r) // it parsed above
	pt, _, err := kr.Open(r.Tokens, sessionAAD(r.Issuer, r.Subject))
	if err != nil {
		return vault.IdPSession{}, fmt.Errorf("vault: IdP session: %w", err)
	}
	var sp sessionPlain
	err = json.Unmarshal(pt, &sp)
	clear(pt)
	if err != nil {
		return vault.IdPSession{}, fmt.Errorf("vault: IdP session tokens: %w", err)
	}
	s.RefreshToken, s.IDToken = vault.Secret(sp.RefreshToken), vault.Secret(sp.IDToken)
	return s, nil
}

// IdPSessions are the stored IdP sessions, sealed with kr; an update
// keeps a session's person.
func IdPSessions(kr *vault.Keyring) Kind[vault.IdPSession] {
	return Kind[vault.IdPSession]{Name: "IdP session",
		Encode: func(s vault.IdPSession) ([]byte, error) { return EncodeIdPSession(kr, s) },
		Decode: func(b []byte) (vault.IdPSession, error) { return DecodeIdPSession(kr, b) },
		Owner:  func(s vault.IdPSession) (string, vault.Principal) { return "of " + s.Principal.Subject, s.Principal },
		clone:  vault.IdPSession.Clone, immutable: "person",
		same:        func(o, n vault.IdPSession) bool { return o.Principal == n.Principal },
		version:     func(s vault.IdPSession) uint64 { return s.Version },
		withVersion: func(s vault.IdPSession, v uint64) vault.IdPSession { s.Version = v; return s }}
}

// ReplaceIdPSession is what PutIdPSession stores over the stored record
// old (nil: no session yet): s, keeping old's Created, one version past
// it. old's tokens are not opened (a record sealed with a retired key is
// replaced all the same); a record that does not parse is replaced as if
// absent.
func ReplaceIdPSession(old []byte, s vault.IdPSession) vault.IdPSession {
	s.Version = 1
	if old == nil {
		return s
	}
	if m, err := IdPSessionMeta(old); err == nil {
		s.Created, s.Version = m.Created, m.Version+1
	}
	return s
}

// IdPSessionSealedWith names the key that sealed a stored session's
// tokens, without opening them.
func IdPSessionSealedWith(b []byte) (string, error) {
	var r sessionRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return "", fmt.Errorf("vault: decode IdP session: %w", err)
	}
	return envelope.KeyID(r.Tokens)
}

// ResealIdPSession seals a stored session's tokens again with kr's
// primary key; changed is false (and rec nil) when they are sealed with
// it already, or do not open (a session sealed with a key no longer held
// counts as none: the person's next sign-in replaces it).
func ResealIdPSession(kr *vault.Keyring, b []byte) (rec []byte, changed bool) {
	if id, err := IdPSessionSealedWith(b); err != nil || id == kr.Primary() {
		return nil, false
	}
	s, err := DecodeIdPSession(kr, b)
	if err != nil {
		return nil, false
	}
	if rec, err = EncodeIdPSession(kr, s); err != nil {
		return nil, false
	}
	return rec, true
}
