package record

import (
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
)

// connRecord is the stored form of a Connection: metadata in the clear,
// token material sealed in Tokens. Format 1 is its JSON rendering; format
// 2 (format2.go) is binary.
type connRecord struct {
	V            int      `json:"v"`
	ID           string   `json:"id"`
	Issuer       string   `json:"iss"`
	Subject      string   `json:"sub"`
	Provider     string   `json:"provider"`
	AccountID    string   `json:"account_id"`
	AccountLogin string   `json:"account_login,omitempty"`
	Scopes       []string `json:"scopes,omitempty"`
	// Requested is Connection.Requested: extension field 1 in format 2.
	Requested     []string               `json:"requested,omitempty"`
	Status        vault.ConnectionStatus `json:"status"`
	Created       time.Time              `json:"created"`
	Updated       time.Time              `json:"updated"`
	LastUsed      time.Time              `json:"last_used,omitzero"`
	LastRefreshed time.Time              `json:"last_refreshed,omitzero"`
	// RefreshExpires is Connection.RefreshExpires; NoRefresh records, in
	// the clear, that the sealed token set has no refresh token.
	RefreshExpires time.Time `json:"refresh_expires,omitzero"`
	NoRefresh      bool      `json:"no_refresh,omitempty"`
	Version        uint64    `json:"version"`
	Tokens         []byte    `json:"tokens"`
	// Ext is the record's extension area as stored (format2.go): fields
	// of a newer broker that this one skips, and writes again as they are.
	Ext []byte `json:"ext,omitempty"`
}

// tokenPlain is the plaintext that gets sealed. It exists only inside
// EncodeConnection / DecodeConnection.
type tokenPlain struct {
	AccessToken  string    `json:"at,omitempty"`
	RefreshToken string    `json:"rt,omitempty"`
	TokenType    string    `json:"tt,omitempty"`
	Expiry       time.Time `json:"exp,omitzero"`
	IDToken      string    `json:"idt,omitempty"`
	// Fields are an API-key connection's entered values; absent in
	// records written before API keys existed, which open as before.
	Fields map[string]string `json:"f,omitempty"`
	// Ext is the token set's extension area as stored (format 2 only).
	Ext string `json:"-"`
}

// extAreas are the extension areas of a stored connection, carried from
// the record an update reads to the one it writes.
type extAreas struct {
	rec    []byte // the record's
	tokens string // the sealed token set's
}

const recordV1 = 1

// connectionAAD binds a ciphertext to the record that holds it: moving it to
// another connection (other id, principal, provider or account) fails to open.
func connectionAAD(c *connRecord) []byte {
	return boundAAD("credbroker/connection/v1", c.ID, c.Issuer, c.Subject, c.Provider, c.AccountID)
}

// boundAAD is the additional data of a sealed field: prefix (the kind of
// record and its version), then each of ss length-prefixed, so no two
// identities give the same bytes.
func boundAAD(prefix string, ss ...string) []byte {
	n := len(prefix)
	for _, s := range ss {
		n += binary.MaxVarintLen64 + len(s)
	}
	b := append(make([]byte, 0, n), prefix...)
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// EncodeConnection renders c for storage, sealing its token set with kr's
// primary key.
func EncodeConnection(kr *vault.Keyring, c vault.Connection) ([]byte, error) {
	return encodeConnection(kr, c, extAreas{})
}

// encodeConnection is EncodeConnection writing the extension areas ext
// (those of the record c was read from, when it replaces one).
func encodeConnection(kr *vault.Keyring, c vault.Connection, ext extAreas) ([]byte, error) {
	if c.ID == "" {
		return nil, errors.New("vault: connection without id")
	}
	if err := validUTF8(c.ID, c.Principal.Issuer, c.Principal.Subject, c.Provider, c.AccountID,
		c.AccountLogin, string(c.Status), c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(),
		c.Token.TokenType, c.Token.IDToken.Reveal()); err != nil {
		return nil, fmt.Errorf("vault: connection %q: %w", c.ID, err)
	}
	if err := cmp.Or(validUTF8(c.Scopes...), validUTF8(c.Requested...)); err != nil {
		return nil, fmt.Errorf("vault: connection %q: scopes: %w", c.ID, err)
	}
	var fields map[string]string
	if len(c.Token.Fields) > 0 {
		fields = make(map[string]string, len(c.Token.Fields))
		for k, v := range c.Token.Fields {
			if k == "" {
				return nil, fmt.Errorf("vault: connection %q: token field without a name", c.ID)
			}
			if err := validUTF8(k, v.Reveal()); err != nil {
				return nil, fmt.Errorf("vault: connection %q: token field: %w", c.ID, err)
			}
			fields[k] = v.Reveal()
		}
	}
	r := connRecord{
		V: recordV2, ID: c.ID, Issuer: c.Principal.Issuer, Subject: c.Principal.Subject,
		Provider: c.Provider, AccountID: c.AccountID, AccountLogin: c.AccountLogin,
		Scopes: c.Scopes, Requested: c.Requested, Status: c.Status, Created: c.Created, Updated: c.Updated,
		LastUsed: c.LastUsed, LastRefreshed: c.LastRefreshed, Version: c.Version,
		RefreshExpires: c.RefreshExpires, NoRefresh: c.Token.RefreshToken == "",
		Ext: ext.rec,
	}
	pt, err := encodeTokensV2(&tokenPlain{
		AccessToken: c.Token.AccessToken.Reveal(), RefreshToken: c.Token.RefreshToken.Reveal(),
		TokenType: c.Token.TokenType, Expiry: c.Token.Expiry, IDToken: c.Token.IDToken.Reveal(),
		Fields: fields, Ext: ext.tokens,
	})
	if err != nil {
		return nil, fmt.Errorf("vault: connection %q: %w", c.ID, err)
	}
	r.Tokens = kr.Seal(pt, connectionAAD(&r))
	clear(pt)
	rec, err := encodeRecordV2(&r)
	if err != nil {
		return nil, fmt.Errorf("vault: connection %q: %w", c.ID, err)
	}
	return rec, nil
}

// parseRecord decodes a stored connection record of either format without
// opening its token set: version 1 is JSON (its first byte is '{'),
// version 2 starts with its version byte.
func parseRecord(b []byte) (connRecord, error) {
	var (
		r   connRecord
		err error
	)
	switch {
	case len(b) == 0:
		return r, fmt.Errorf("%w: empty", vault.ErrRecordFormat)
	case b[0] == recordV2:
		r, err = decodeRecordV2(b)
	case b[0] == '{':
		r, err = parseRecordV1(b)
	default:
		return r, fmt.Errorf("%w: unknown format version %d (first byte 0x%02x); this broker reads versions 1 and 2, a newer broker wrote it", vault.ErrRecordFormat, b[0], b[0])
	}
	if err != nil {
		return r, err
	}
	if r.ID == "" {
		return r, fmt.Errorf("%w: no id", vault.ErrRecordFormat)
	}
	return r, nil
}

// parseRecordV1 decodes a format 1 (JSON) record. A function of its own:
// the record json.Unmarshal decodes into escapes to the heap, which the
// format 2 path should not pay for.
func parseRecordV1(b []byte) (connRecord, error) {
	var r connRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: v1 (JSON): %v", vault.ErrRecordFormat, err)
	}
	if r.V != recordV1 {
		return r, fmt.Errorf("%w: JSON record says version %d; this broker reads version 1 as JSON and version 2", vault.ErrRecordFormat, r.V)
	}
	// Format 1 was written before the extension area existed; its JSON
	// form (RecordJSON) carries a format 2 record's area, held to the
	// same rules.
	if err := checkExt("format 1", r.Ext); err != nil {
		return r, err
	}
	return r, nil
}

// RecordJSON renders a stored connection record of either format as the
// format 1 JSON object, its token set still sealed (base64 in "tokens")
// and its extension area, if any, in "ext": for inspection tools and for
// tests that edit stored records.
func RecordJSON(rec []byte) ([]byte, error) {
	r, err := parseRecord(rec)
	if err != nil {
		return nil, err
	}
	r.V = recordV1
	return json.Marshal(&r)
}

// RecordFromJSON is RecordJSON's inverse: the format 2 record of a format
// 1 JSON object, its token set copied, not opened.
func RecordFromJSON(b []byte) ([]byte, error) {
	if len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", vault.ErrRecordFormat)
	}
	r, err := parseRecord(b)
	if err != nil {
		return nil, err
	}
	return encodeRecordV2(&r)
}

// openTokens decodes an opened token set: JSON (sealed by format 1, or
// carried over into a format 2 record by a metadata update) or binary.
func openTokens(pt []byte) (tokenPlain, error) {
	switch {
	case len(pt) > 0 && pt[0] == recordV2:
		return decodeTokensV2(pt)
	case len(pt) > 0 && pt[0] == '{':
		return openTokensV1(pt)
	}
	return tokenPlain{}, fmt.Errorf("%w: token set of unknown format", vault.ErrRecordFormat)
}

// openTokensV1 is parseRecordV1 for token sets (its own function for the
// same reason).
func openTokensV1(pt []byte) (tokenPlain, error) {
	var tp tokenPlain
	if err := json.Unmarshal(pt, &tp); err != nil {
		return tp, fmt.Errorf("%w: token set v1 (JSON): %v", vault.ErrRecordFormat, err)
	}
	return tp, nil
}

// ConnectionMeta decodes a stored connection's metadata without opening its
// tokens; Token is empty and SealedWith names the sealing key.
func ConnectionMeta(b []byte) (vault.Connection, error) {
	r, err := parseRecord(b)
	if err != nil {
		return vault.Connection{}, err
	}
	kid, err := envelope.KeyID(r.Tokens)
	if err != nil {
		return vault.Connection{}, fmt.Errorf("vault: connection %s: %w", r.ID, err)
	}
	return r.meta(kid), nil
}

// meta is the connection r describes, without its token set, sealed with
// key kid.
func (r *connRecord) meta(kid string) vault.Connection {
	return vault.Connection{
		ID: r.ID, Principal: vault.Principal{Issuer: r.Issuer, Subject: r.Subject},
		Provider: r.Provider, AccountID: r.AccountID, AccountLogin: r.AccountLogin,
		Scopes: r.Scopes, Requested: r.Requested, Status: r.Status, Created: r.Created, Updated: r.Updated,
		LastUsed: r.LastUsed, LastRefreshed: r.LastRefreshed, Version: r.Version,
		RefreshExpires: r.RefreshExpires, NoRefreshToken: r.NoRefresh,
		SealedWith: kid,
	}
}

// DecodeConnection parses a stored connection and opens its token set.
// Tampered, moved or wrongly keyed ciphertexts return an error wrapping
// ErrDecrypt, ErrUnknownKey or ErrMalformed; never garbage plaintext.
func DecodeConnection(kr *vault.Keyring, b []byte) (vault.Connection, error) {
	c, _, err := decodeConnection(kr, b)
	return c, err
}

// decodeConnection is DecodeConnection that also returns the record's
// extension areas.
func decodeConnection(kr *vault.Keyring, b []byte) (vault.Connection, extAreas, error) {
	r, err := parseRecord(b)
	if err != nil {
		return vault.Connection{}, extAreas{}, err
	}
	pt, kid, err := kr.Open(r.Tokens, connectionAAD(&r))
	if err != nil {
		return vault.Connection{}, extAreas{}, fmt.Errorf("vault: connection %s: %w", r.ID, err)
	}
	tp, err := openTokens(pt)
	clear(pt)
	if err != nil {
		return vault.Connection{}, extAreas{}, fmt.Errorf("vault: connection %s: %w", r.ID, err)
	}
	var fields map[string]vault.Secret
	if len(tp.Fields) > 0 {
		fields = make(map[string]vault.Secret, len(tp.Fields))
		for k, v := range tp.Fields {
			fields[k] = vault.Secret(v)
		}
	}
	c := r.meta(kid)
	c.Token = vault.TokenSet{
		AccessToken: vault.Secret(tp.AccessToken), RefreshToken: vault.Secret(tp.RefreshToken),
		TokenType: tp.TokenType, Expiry: tp.Expiry, IDToken: vault.Secret(tp.IDToken),
		Fields: fields,
	}
	return c, extAreas{rec: r.Ext, tokens: tp.Ext}, nil
}

// validUTF8 rejects strings that are not UTF-8: the record formats hold
// text (JSON would silently rewrite such a string, and format 2's decoder
// refuses it), and a record must read back byte for byte, or its AAD would
// no longer match its ciphertext.
func validUTF8(ss ...string) error {
	for _, s := range ss {
		if !utf8.ValidString(s) {
			return errors.New("field is not valid UTF-8")
		}
	}
	return nil
}

// NewConnection returns c as CreateConnection stores it (a copy, Version
// 1) and its record, sealed with kr's primary key.
func NewConnection(kr *vault.Keyring, c vault.Connection) (vault.Connection, []byte, error) {
	c = c.Clone()
	c.Version = 1
	c.SealedWith = ""
	rec, err := EncodeConnection(kr, c)
	return c, rec, err
}

// Target is the connection half of a GrantConnector.Connect: ID is the
// connection the write names and, when it creates one, Created is the new
// connection (NewConnection) and Rec its record.
type Target struct {
	ID      string
	Created vault.Connection
	Rec     []byte

	kr *vault.Keyring
	w  vault.ConnectionWrite
}

// ConnectTarget is the Target of w, sealed with kr's primary key. A write
// of nothing is an error.
func ConnectTarget(kr *vault.Keyring, w vault.ConnectionWrite) (Target, error) {
	t := Target{kr: kr, w: w}
	switch {
	case w.Create != nil:
		var err error
		t.Created, t.Rec, err = NewConnection(kr, *w.Create)
		t.ID = t.Created.ID
		return t, err
	case w.Update != nil:
		t.ID = w.UpdateID
		return t, nil
	}
	return Target{}, errors.New("vault: connect: no connection to write")
}

// Onto is the write of t for a backend that read old, the record stored
// under t.ID (nil when there is none): the record to store and the
// connection to answer. A create is refused with ErrExists when there is
// a record, and gives Rec and Created (sealed with the primary key); an
// update is refused with ErrNotFound when there is none, and applies the
// write's Update to old (ApplyConnectionRecordUpdate). An error leaves
// nothing to store.
func (t Target) Onto(old []byte) ([]byte, vault.Connection, error) {
	switch {
	case t.w.Create != nil && old != nil:
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %s: %w", t.ID, vault.ErrExists)
	case t.w.Create != nil:
		c := t.Created
		c.SealedWith = t.kr.Primary()
		return t.Rec, c, nil
	case old == nil:
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %s: %w", t.ID, vault.ErrNotFound)
	}
	return ApplyConnectionRecordUpdate(t.kr, old, t.ID, t.w.Update)
}

// DecodePrincipalConnections decodes the metadata of the stored records a
// backend listed for p (from its per-principal index), opening no token
// set, and checks each really belongs to p (decodeOwned).
func DecodePrincipalConnections(p vault.Principal, recs [][]byte) ([]vault.Connection, error) {
	return decodeOwned(p, recs, "connection", ConnectionMeta, connectionOwner)
}

// DecodeRetired opens p's retired connections, whose records a backend's
// index found for p (decodeOwned).
func DecodeRetired(kr *vault.Keyring, p vault.Principal, recs [][]byte) ([]vault.Connection, error) {
	return decodeOwned(p, recs, "retired connection", func(rec []byte) (vault.Connection, error) { return DecodeConnection(kr, rec) }, connectionOwner)
}

func connectionOwner(c vault.Connection) (string, vault.Principal) { return c.ID, c.Principal }

// decodeOwned decodes, with decode, the records a backend listed for p
// (from a per-principal index), and checks that each belongs to p: an
// index entry pointing at another principal's record is corruption, not
// a result. owner gives a value's id and principal; what names the kind
// of record in errors.
func decodeOwned[T any](p vault.Principal, recs [][]byte, what string, decode func([]byte) (T, error), owner func(T) (string, vault.Principal)) ([]T, error) {
	out := make([]T, 0, len(recs))
	for _, rec := range recs {
		v, err := decode(rec)
		if err != nil {
			return nil, err
		}
		if id, q := owner(v); q != p {
			return nil, fmt.Errorf("vault: %s %s is indexed under another principal: %w", what, id, vault.ErrMalformed)
		}
		out = append(out, v)
	}
	return out, nil
}

// DecodeAccountConnections decodes the metadata of stored records and
// keeps those of provider's account accountID (a backend may pass every
// record, or those its index found), opening no token set.
func DecodeAccountConnections(provider, accountID string, recs [][]byte) ([]vault.Connection, error) {
	var out []vault.Connection
	for _, rec := range recs {
		c, err := ConnectionMeta(rec)
		if err != nil {
			return nil, err
		}
		if c.Provider == provider && c.AccountID == accountID {
			out = append(out, c)
		}
	}
	return out, nil
}

// applyConnectionUpdate runs an UpdateConnection closure on the current
// record and returns what the backend must store: fn's result, refused if
// it changed an immutable field or the version, with Version one past
// old's. Every backend's UpdateConnection goes through it (by way of
// ApplyConnectionRecordUpdate or ApplyConnectionMetaUpdate), so the
// contract lives in one place.
func applyConnectionUpdate(old vault.Connection, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	return connectionUpdates.Apply(old, fn)
}

// connectionUpdates are a connection's update rules (its codec needs the
// key ring, so it is not a Kind's): an update keeps its id, principal,
// provider and account.
var connectionUpdates = Kind[vault.Connection]{Name: "connection", Owner: connectionOwner,
	clone: vault.Connection.Clone, immutable: "id, principal, provider or account id",
	same: func(o, n vault.Connection) bool {
		return o.ID == n.ID && o.Principal == n.Principal && o.Provider == n.Provider && o.AccountID == n.AccountID
	},
	version:     func(c vault.Connection) uint64 { return c.Version },
	withVersion: func(c vault.Connection, v uint64) vault.Connection { c.Version = v; return c }}

// ApplyConnectionRecordUpdate runs an UpdateConnection closure on the
// stored record rec of connection id: it opens the token set, applies fn
// (with the update rules) and seals the result with kr's primary key,
// keeping the record's extension areas. Every backend's UpdateConnection
// goes through it.
func ApplyConnectionRecordUpdate(kr *vault.Keyring, rec []byte, id string, fn func(vault.Connection) (vault.Connection, error)) ([]byte, vault.Connection, error) {
	old, ext, err := decodeConnection(kr, rec)
	if err == nil && old.ID != id {
		err = fmt.Errorf("vault: connection %s: stored record names id %s: %w", id, old.ID, vault.ErrMalformed)
	}
	if err != nil {
		return nil, vault.Connection{}, err
	}
	nc, err := applyConnectionUpdate(old, fn)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	nrec, err := encodeConnection(kr, nc, ext)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	nc.SealedWith = kr.Primary()
	return nrec, nc, nil
}

// Rewrite makes of a connection's stored record the record to store and
// the connection it holds: the change a backend's UpdateConnection or
// UpdateConnectionMeta applies inside its compare-and-swap.
type Rewrite func(rec []byte) ([]byte, vault.Connection, error)

// UpdateRewrite is UpdateConnection's rewrite of connection id:
// ApplyConnectionRecordUpdate with fn.
func UpdateRewrite(kr *vault.Keyring, id string, fn func(vault.Connection) (vault.Connection, error)) Rewrite {
	return func(rec []byte) ([]byte, vault.Connection, error) {
		return ApplyConnectionRecordUpdate(kr, rec, id, fn)
	}
}

// MetaRewrite is UpdateConnectionMeta's rewrite of connection id:
// ApplyConnectionMetaUpdate with fn.
func MetaRewrite(id string, fn func(vault.Connection) (vault.Connection, error)) Rewrite {
	return func(rec []byte) ([]byte, vault.Connection, error) { return ApplyConnectionMetaUpdate(rec, id, fn) }
}

// WithDeliveries applies r to rec and adds the outbox deliveries hook
// makes of the change (ChangeDeliveries). An error leaves nothing to
// store.
func (r Rewrite) WithDeliveries(hook vault.ChangeHook[vault.Connection], rec []byte) (nrec []byte, c vault.Connection, ds []vault.Delivery, err error) {
	if nrec, c, err = r(rec); err != nil {
		return nil, vault.Connection{}, nil, err
	}
	if ds, err = ChangeDeliveries(hook, rec, nrec); err != nil {
		return nil, vault.Connection{}, nil, err
	}
	return nrec, c, ds, nil
}

// Reseal seals the token set of the stored record rec again with kr's
// primary key, Version one up, keeping everything else (the extension
// areas too): key rotation's rewrite.
func Reseal(kr *vault.Keyring, rec []byte) ([]byte, vault.Connection, error) {
	c, ext, err := decodeConnection(kr, rec)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	c.Version++
	nrec, err := encodeConnection(kr, c, ext)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	c.SealedWith = kr.Primary()
	return nrec, c, nil
}

// ApplyConnectionMetaUpdate runs an UpdateConnectionMeta closure on the
// stored record rec of connection id and returns the record to store and
// its metadata. The sealed token set and the extension area are copied as
// they are: the token set's additional data binds only the immutable
// identity fields, so it still opens. fn must leave Token empty. Every
// backend's UpdateConnectionMeta goes through it.
func ApplyConnectionMetaUpdate(rec []byte, id string, fn func(vault.Connection) (vault.Connection, error)) ([]byte, vault.Connection, error) {
	r, err := parseRecord(rec)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	old, err := ConnectionMeta(rec)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	if old.ID != id {
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %s: stored record names id %s: %w", id, old.ID, vault.ErrMalformed)
	}
	nc, err := applyConnectionUpdate(old, fn)
	if err != nil {
		return nil, vault.Connection{}, err
	}
	if !nc.Token.IsZero() {
		return nil, vault.Connection{}, fmt.Errorf("vault: metadata update of connection %s set token material; use UpdateConnection", id)
	}
	if err := validUTF8(nc.AccountLogin, string(nc.Status)); err != nil {
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %q: %w", id, err)
	}
	if err := cmp.Or(validUTF8(nc.Scopes...), validUTF8(nc.Requested...)); err != nil {
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %q: scopes: %w", id, err)
	}
	r.AccountLogin, r.Scopes, r.Requested, r.Status = nc.AccountLogin, nc.Scopes, nc.Requested, nc.Status
	r.Created, r.Updated, r.LastUsed, r.LastRefreshed, r.Version = nc.Created, nc.Updated, nc.LastUsed, nc.LastRefreshed, nc.Version
	r.RefreshExpires = nc.RefreshExpires
	out, err := encodeRecordV2(&r)
	if err != nil {
		return nil, vault.Connection{}, fmt.Errorf("vault: connection %q: %w", id, err)
	}
	nc.SealedWith, nc.NoRefreshToken = old.SealedWith, old.NoRefreshToken
	return out, nc, nil
}
