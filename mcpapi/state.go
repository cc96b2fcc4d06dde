package mcpapi

import (
	"encoding/base64"
	"encoding/json"
	"time"

	"credbroker/vault"
)

// Additional data of the legacy session id; distinct from every other
// sealed value (requestState, cookies) so one can never be replayed as
// another.
const (
	legacySessionAAD = "credbroker/legacySession/v1"
	// maxSealedLen bounds what is accepted for opening (a real id is ~200 bytes).
	maxSealedLen = 4096
)

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
