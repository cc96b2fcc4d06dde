package mcpapi

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

// Additional data for the two sealed values the broker hands to clients;
// distinct so one can never be replayed as the other.
const (
	requestStateAAD  = "credbroker/requestState/v1"
	legacySessionAAD = "credbroker/legacySession/v1"
	// maxSealedLen bounds what is accepted for opening (a real state is ~200 bytes).
	maxSealedLen = 4096
)

// errBadState is the one answer to every requestState failure, whatever the cause.
var errBadState = errors.New("Invalid or expired requestState")

// requestState is the plaintext sealed into an MRTR requestState.
type requestState struct {
	V         int    `json:"v"`
	Issuer    string `json:"iss"`
	Subject   string `json:"sub"`
	Tool      string `json:"tool"`
	ArgDigest []byte `json:"args"`
	GrantID   string `json:"grant"`
	Expires   int64  `json:"exp"`
}

// canonicalArgs renders tool arguments in a canonical form (object keys
// sorted, insignificant space removed, numbers as written) so a digest does
// not depend on the client's formatting. Absent or null arguments are {}.
func canonicalArgs(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}"), nil
	}
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

func argDigest(raw json.RawMessage) ([]byte, error) {
	c, err := canonicalArgs(raw)
	if err != nil {
		return nil, err
	}
	d := sha256.Sum256(c)
	return d[:], nil
}

// sealState seals st with the requestState keys.
func sealState(keys *vault.Keyring, st requestState) string {
	st.V = 1
	pt, err := json.Marshal(st)
	if err != nil {
		panic("mcpapi: marshal requestState: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(keys.Seal(pt, []byte(requestStateAAD)))
}

// openState authenticates and decrypts a requestState and checks that it
// was issued to principal p for tool with arguments whose digest is digest,
// and has not expired. Nothing is parsed before authentication succeeds.
func openState(keys *vault.Keyring, sealed string, p vault.Principal, tool string, digest []byte, now time.Time) (requestState, error) {
	if len(sealed) == 0 || len(sealed) > maxSealedLen {
		return requestState{}, errBadState
	}
	ct, err := base64.RawURLEncoding.DecodeString(sealed)
	if err != nil {
		return requestState{}, errBadState
	}
	pt, _, err := keys.Open(ct, []byte(requestStateAAD))
	if err != nil {
		return requestState{}, errBadState
	}
	var st requestState
	if err := json.Unmarshal(pt, &st); err != nil || st.V != 1 {
		return requestState{}, errBadState
	}
	same := subtle.ConstantTimeCompare([]byte(st.Issuer), []byte(p.Issuer)) &
		subtle.ConstantTimeCompare([]byte(st.Subject), []byte(p.Subject)) &
		subtle.ConstantTimeCompare([]byte(st.Tool), []byte(tool)) &
		subtle.ConstantTimeCompare(st.ArgDigest, digest)
	if same != 1 || !now.Before(time.Unix(st.Expires, 0)) || st.GrantID == "" {
		return requestState{}, errBadState
	}
	return st, nil
}

// legacySession is sealed into the Mcp-Session-Id the broker returns on a
// legacy initialize: the go-sdk's stateless handler forgets the client's
// initialize capabilities, and the client echoes this header on every later
// request of its session.
type legacySession struct {
	V          int    `json:"v"`
	Issuer     string `json:"iss"`
	Subject    string `json:"sub"`
	URLCapable bool   `json:"url,omitempty"`
	ClientName string `json:"client,omitempty"`
	Expires    int64  `json:"exp"`
}

func sealSession(keys *vault.Keyring, ls legacySession) string {
	ls.V = 1
	pt, err := json.Marshal(ls)
	if err != nil {
		panic("mcpapi: marshal session: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(keys.Seal(pt, []byte(legacySessionAAD)))
}

// openSession returns the session sealed in id when it is authentic,
// unexpired and issued to p.
func openSession(keys *vault.Keyring, id string, p vault.Principal, now time.Time) (legacySession, bool) {
	if id == "" || len(id) > maxSealedLen {
		return legacySession{}, false
	}
	ct, err := base64.RawURLEncoding.DecodeString(id)
	if err != nil {
		return legacySession{}, false
	}
	pt, _, err := keys.Open(ct, []byte(legacySessionAAD))
	if err != nil {
		return legacySession{}, false
	}
	var ls legacySession
	if json.Unmarshal(pt, &ls) != nil || ls.V != 1 || !now.Before(time.Unix(ls.Expires, 0)) ||
		ls.Issuer != p.Issuer || ls.Subject != p.Subject {
		return legacySession{}, false
	}
	return ls, true
}
