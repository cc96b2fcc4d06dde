package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"credbroker/vault"
)

// grantRecord is the stored form of a Grant (no secrets).
type grantRecord struct {
	V            int              `json:"v"`
	ID           string           `json:"id"`
	Issuer       string           `json:"iss"`
	Subject      string           `json:"sub"`
	Provider     string           `json:"provider"`
	Scopes       []string         `json:"scopes,omitempty"`
	ClientName   string           `json:"client_name,omitempty"`
	Server       string           `json:"server,omitempty"`
	Created      time.Time        `json:"created"`
	Expires      time.Time        `json:"expires"`
	State        vault.GrantState `json:"state"`
	ConnectionID string           `json:"connection_id,omitempty"`
	Rounds       int              `json:"rounds,omitempty"`
	Attempts     int              `json:"attempts,omitempty"`
	Why          string           `json:"why,omitempty"`
	Version      uint64           `json:"version"`
}

// EncodeGrant renders g for storage.
func EncodeGrant(g vault.Grant) ([]byte, error) {
	if g.ID == "" {
		return nil, errors.New("vault: grant without id")
	}
	if err := validUTF8(g.ID, g.Principal.Issuer, g.Principal.Subject, g.Provider, g.ClientName,
		g.Server, string(g.State), g.ConnectionID, g.Why); err != nil {
		return nil, fmt.Errorf("vault: grant %q: %w", g.ID, err)
	}
	if err := validUTF8(g.Scopes...); err != nil {
		return nil, fmt.Errorf("vault: grant %q: scopes: %w", g.ID, err)
	}
	r := grantRecord{
		V: recordV1, ID: g.ID, Issuer: g.Principal.Issuer, Subject: g.Principal.Subject,
		Provider: g.Provider, Scopes: g.Scopes, ClientName: g.ClientName, Server: g.Server, Created: g.Created,
		Expires: g.Expires, State: g.State, ConnectionID: g.ConnectionID, Rounds: g.Rounds, Attempts: g.Attempts,
		Why: g.Why, Version: g.Version,
	}
	if b, ok := encodeGrantRecord(&r); ok {
		return b, nil
	}
	return json.Marshal(r)
}

// DecodeGrant parses a stored grant.
func DecodeGrant(b []byte) (vault.Grant, error) {
	var r grantRecord
	if !decodeGrantRecord(b, &r) {
		r = grantRecord{}
		if err := json.Unmarshal(b, &r); err != nil {
			return vault.Grant{}, fmt.Errorf("vault: decode grant record: %w", err)
		}
	}
	if r.V != recordV1 {
		return vault.Grant{}, fmt.Errorf("vault: grant record version %d is not supported", r.V)
	}
	if r.ID == "" {
		return vault.Grant{}, errors.New("vault: grant record without id")
	}
	return vault.Grant{
		ID: r.ID, Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject}, Provider: r.Provider,
		Scopes: r.Scopes, ClientName: r.ClientName, Server: r.Server, Created: r.Created, Expires: r.Expires,
		State: r.State, ConnectionID: r.ConnectionID, Rounds: r.Rounds, Attempts: r.Attempts, Why: r.Why, Version: r.Version,
	}, nil
}

// Grants are the stored grants; an update keeps a grant's id and
// principal.
var Grants = Kind[vault.Grant]{Name: "grant", Encode: EncodeGrant, Decode: DecodeGrant,
	Owner: func(g vault.Grant) (string, vault.Principal) { return g.ID, g.Principal },
	clone: vault.Grant.Clone, immutable: "id or principal",
	same:        func(o, n vault.Grant) bool { return o.ID == n.ID && o.Principal == n.Principal },
	version:     func(g vault.Grant) uint64 { return g.Version },
	withVersion: func(g vault.Grant, v uint64) vault.Grant { g.Version = v; return g }}
