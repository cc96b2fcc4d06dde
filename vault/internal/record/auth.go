package record

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"credbroker/vault"
)

// decodeV1 parses a stored JSON record of kind what, refusing one of
// another version or without its id (id gives both).
func decodeV1[R any](b []byte, what string, id func(*R) (int, string)) (R, error) {
	var r R
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("vault: decode %s record: %w", what, err)
	}
	if v, key := id(&r); v != recordV1 || key == "" {
		return r, fmt.Errorf("vault: %s record version %d without id or unsupported: %w", what, v, vault.ErrMalformed)
	}
	return r, nil
}

// The stored forms of the authorization server's records. Like grants,
// they hold no token material: secrets appear only as SecretKey hashes.

type oauthClientRecord struct {
	V               int       `json:"v"`
	ID              string    `json:"id"`
	SecretHash      []byte    `json:"secret_hash,omitempty"`
	AuthMethod      string    `json:"auth_method"`
	Name            string    `json:"name,omitempty"`
	URI             string    `json:"uri,omitempty"`
	RedirectURIs    []string  `json:"redirect_uris"`
	GrantTypes      []string  `json:"grant_types"`
	ApplicationType string    `json:"application_type,omitempty"`
	Created         time.Time `json:"created"`
	Used            time.Time `json:"used,omitzero"`
	Version         uint64    `json:"version"`
}

// EncodeOAuthClient renders c for storage.
func EncodeOAuthClient(c vault.OAuthClient) ([]byte, error) {
	if c.ID == "" {
		return nil, errors.New("vault: oauth client without id")
	}
	if err := validUTF8(append([]string{c.ID, c.AuthMethod, c.Name, c.URI, c.ApplicationType}, append(c.RedirectURIs, c.GrantTypes...)...)...); err != nil {
		return nil, fmt.Errorf("vault: oauth client %q: %w", c.ID, err)
	}
	return json.Marshal(oauthClientRecord{
		V: recordV1, ID: c.ID, SecretHash: c.SecretHash, AuthMethod: c.AuthMethod, Name: c.Name, URI: c.URI,
		RedirectURIs: c.RedirectURIs, GrantTypes: c.GrantTypes, ApplicationType: c.ApplicationType,
		Created: c.Created, Used: c.Used, Version: c.Version,
	})
}

// DecodeOAuthClient parses a stored client.
func DecodeOAuthClient(b []byte) (vault.OAuthClient, error) {
	r, err := decodeV1(b, "oauth client", func(r *oauthClientRecord) (int, string) { return r.V, r.ID })
	if err != nil {
		return vault.OAuthClient{}, err
	}
	return vault.OAuthClient{
		ID: r.ID, SecretHash: r.SecretHash, AuthMethod: r.AuthMethod, Name: r.Name, URI: r.URI,
		RedirectURIs: r.RedirectURIs, GrantTypes: r.GrantTypes, ApplicationType: r.ApplicationType,
		Created: r.Created, Used: r.Used, Version: r.Version,
	}, nil
}

// OAuthClients are the stored registered clients, no one's; an update
// keeps a client's id.
var OAuthClients = Kind[vault.OAuthClient]{Name: "oauth client", Encode: EncodeOAuthClient, Decode: DecodeOAuthClient,
	Owner: func(c vault.OAuthClient) (string, vault.Principal) { return c.ID, vault.Principal{} },
	clone: vault.OAuthClient.Clone, immutable: "id",
	same:        func(o, n vault.OAuthClient) bool { return o.ID == n.ID },
	version:     func(c vault.OAuthClient) uint64 { return c.Version },
	withVersion: func(c vault.OAuthClient, v uint64) vault.OAuthClient { c.Version = v; return c }}

type authCodeRecord struct {
	V           int       `json:"v"`
	Key         string    `json:"key"`
	ClientID    string    `json:"client_id"`
	RedirectURI string    `json:"redirect_uri"`
	Issuer      string    `json:"iss"`
	Subject     string    `json:"sub"`
	Scopes      []string  `json:"scopes,omitempty"`
	Resource    string    `json:"resource"`
	Challenge   string    `json:"challenge"`
	AppID       string    `json:"app"`
	FamilyID    string    `json:"family"`
	Created     time.Time `json:"created"`
	Expires     time.Time `json:"expires"`
	Redeemed    bool      `json:"redeemed,omitempty"`
}

// EncodeAuthCode renders c for storage.
func EncodeAuthCode(c vault.AuthCode) ([]byte, error) {
	if c.Key == "" {
		return nil, errors.New("vault: authorization code without key")
	}
	if err := validUTF8(append([]string{c.Key, c.ClientID, c.RedirectURI, c.Principal.Issuer, c.Principal.Subject,
		c.Resource, c.Challenge, c.AppID, c.FamilyID}, c.Scopes...)...); err != nil {
		return nil, fmt.Errorf("vault: authorization code: %w", err)
	}
	return json.Marshal(authCodeRecord{
		V: recordV1, Key: c.Key, ClientID: c.ClientID, RedirectURI: c.RedirectURI,
		Issuer: c.Principal.Issuer, Subject: c.Principal.Subject, Scopes: c.Scopes, Resource: c.Resource,
		Challenge: c.Challenge, AppID: c.AppID, FamilyID: c.FamilyID, Created: c.Created, Expires: c.Expires,
		Redeemed: c.Redeemed,
	})
}

// DecodeAuthCode parses a stored authorization code.
func DecodeAuthCode(b []byte) (vault.AuthCode, error) {
	r, err := decodeV1(b, "authorization code", func(r *authCodeRecord) (int, string) { return r.V, r.Key })
	if err != nil {
		return vault.AuthCode{}, err
	}
	return vault.AuthCode{
		Key: r.Key, ClientID: r.ClientID, RedirectURI: r.RedirectURI,
		Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject}, Scopes: r.Scopes, Resource: r.Resource,
		Challenge: r.Challenge, AppID: r.AppID, FamilyID: r.FamilyID, Created: r.Created, Expires: r.Expires,
		Redeemed: r.Redeemed,
	}, nil
}

type appAccessRecord struct {
	V           int            `json:"v"`
	ID          string         `json:"id"`
	Issuer      string         `json:"iss"`
	Subject     string         `json:"sub"`
	ClientID    string         `json:"client_id"`
	ClientName  string         `json:"client_name,omitempty"`
	RedirectURI string         `json:"redirect_uri"`
	Scopes      []string       `json:"scopes,omitempty"`
	Resources   []string       `json:"resources,omitempty"`
	Created     time.Time      `json:"created"`
	Updated     time.Time      `json:"updated"`
	LastUsed    time.Time      `json:"last_used,omitzero"`
	Families    []familyRecord `json:"families,omitempty"`
	Version     uint64         `json:"version"`
}

type familyRecord struct {
	ID          string    `json:"id"`
	Scopes      []string  `json:"scopes,omitempty"`
	Resource    string    `json:"resource"`
	Created     time.Time `json:"created"`
	Expires     time.Time `json:"expires"`
	RefreshHash string    `json:"refresh_hash,omitempty"`
	Refreshed   time.Time `json:"refreshed,omitzero"`
	Spent       []string  `json:"spent,omitempty"`
	Via         string    `json:"via,omitempty"`
}

// EncodeAppAccess renders a for storage.
func EncodeAppAccess(a vault.AppAccess) ([]byte, error) {
	if a.ID == "" {
		return nil, errors.New("vault: app access without id")
	}
	ss := append(append([]string{a.ID, a.Principal.Issuer, a.Principal.Subject, a.ClientID, a.ClientName, a.RedirectURI}, a.Scopes...), a.Resources...)
	r := appAccessRecord{
		V: recordV1, ID: a.ID, Issuer: a.Principal.Issuer, Subject: a.Principal.Subject, ClientID: a.ClientID,
		ClientName: a.ClientName, RedirectURI: a.RedirectURI, Scopes: a.Scopes, Resources: a.Resources, Created: a.Created, Updated: a.Updated,
		LastUsed: a.LastUsed, Version: a.Version,
	}
	for _, f := range a.Families {
		if f.ID == "" {
			return nil, fmt.Errorf("vault: app access %q: token family without id", a.ID)
		}
		ss = append(append(append(ss, f.ID, f.Resource, f.RefreshHash, f.Via), f.Scopes...), f.Spent...)
		r.Families = append(r.Families, familyRecord{
			ID: f.ID, Scopes: f.Scopes, Resource: f.Resource, Created: f.Created, Expires: f.Expires,
			RefreshHash: f.RefreshHash, Refreshed: f.Refreshed, Spent: f.Spent, Via: f.Via,
		})
	}
	if err := validUTF8(ss...); err != nil {
		return nil, fmt.Errorf("vault: app access %q: %w", a.ID, err)
	}
	return json.Marshal(r)
}

// DecodeAppAccess parses a stored app access record.
func DecodeAppAccess(b []byte) (vault.AppAccess, error) {
	r, err := decodeV1(b, "app access", func(r *appAccessRecord) (int, string) { return r.V, r.ID })
	if err != nil {
		return vault.AppAccess{}, err
	}
	a := vault.AppAccess{
		ID: r.ID, Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject}, ClientID: r.ClientID,
		ClientName: r.ClientName, RedirectURI: r.RedirectURI, Scopes: r.Scopes, Resources: r.Resources, Created: r.Created,
		Updated: r.Updated, LastUsed: r.LastUsed, Version: r.Version,
	}
	for _, f := range r.Families {
		a.Families = append(a.Families, vault.TokenFamily{
			ID: f.ID, Scopes: f.Scopes, Resource: f.Resource, Created: f.Created, Expires: f.Expires,
			RefreshHash: f.RefreshHash, Refreshed: f.Refreshed, Spent: f.Spent, Via: f.Via,
		})
	}
	return a, nil
}

// appLivenessRecord is the part of appAccessRecord that GetAppLiveness
// gives: decoding into it skips the rest (scopes, refresh token hashes).
type appLivenessRecord struct {
	V        int    `json:"v"`
	ID       string `json:"id"`
	Issuer   string `json:"iss"`
	Subject  string `json:"sub"`
	ClientID string `json:"client_id"`
	Families []struct {
		ID      string    `json:"id"`
		Expires time.Time `json:"expires"`
	} `json:"families,omitempty"`
}

// DecodeAppLiveness parses what checking a token family needs from a
// stored app access record (AuthStore.GetAppLiveness): the record's
// identity and its families' ids and ends, nothing else.
func DecodeAppLiveness(b []byte) (vault.AppAccess, error) {
	r, err := decodeV1(b, "app access", func(r *appLivenessRecord) (int, string) { return r.V, r.ID })
	if err != nil {
		return vault.AppAccess{}, err
	}
	l := vault.AppAccess{ID: r.ID, Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject}, ClientID: r.ClientID}
	if len(r.Families) > 0 {
		l.Families = make([]vault.TokenFamily, len(r.Families))
		for i, f := range r.Families {
			l.Families[i] = vault.TokenFamily{ID: f.ID, Expires: f.Expires}
		}
	}
	return l, nil
}

// AppAccesses are the stored app access records; an update keeps a
// record's id, principal and client.
var AppAccesses = Kind[vault.AppAccess]{Name: "app access", Encode: EncodeAppAccess, Decode: DecodeAppAccess,
	Owner: func(a vault.AppAccess) (string, vault.Principal) { return a.ID, a.Principal },
	clone: vault.AppAccess.Clone, immutable: "id, principal or client",
	same: func(o, n vault.AppAccess) bool {
		return o.ID == n.ID && o.Principal == n.Principal && o.ClientID == n.ClientID
	},
	version:     func(a vault.AppAccess) uint64 { return a.Version },
	withVersion: func(a vault.AppAccess, v uint64) vault.AppAccess { a.Version = v; return a }}
