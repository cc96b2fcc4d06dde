package record

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"credbroker/vault"
)

// Connection record format, version 2: binary, one leading version byte,
// then the fields in this fixed order, each length-prefixed:
//
//	0x02
//	str id | str iss | str sub | str provider | str account_id | str account_login
//	uvarint n | str scope × n
//	str status
//	time created | time updated | time last_used | time last_refreshed | time refresh_expires
//	uvarint version
//	byte flags                     bit 0: no refresh token; the others must be 0
//	bytes tokens                   the sealed token set (Keyring envelope)
//	ext                            the extension area, to the end of the record
//
// str and bytes are a uvarint length then that many bytes; strings are
// UTF-8. A time is a zigzag varint of Unix seconds then a uvarint of
// nanoseconds (< 1e9); the zero time.Time is its own value. Varints are
// minimal. The sealed plaintext of a v2 record is binary too (tokensV2
// below), with an extension area of its own; a v1 record's is JSON, and a
// v2 record may carry a v1 plaintext (a metadata update of a v1 record
// copies the sealed set as is), told apart by the plaintext's first byte.
//
// The extension area is where fields added after format 2 go, so a record
// can grow without a format 3. It is zero or more fields, each
//
//	uvarint tag | bytes value
//
// with tags increasing (so each tag at most once). A tag is a field number
// (1 or more) shifted left by one, its low bit saying whether the field is
// required. A reader that does not know a required field refuses the
// record: the field changes what the rest means. A reader that does not
// know an optional field skips it, and writes it again as it was whenever
// it rewrites the record (a metadata update, a refresh, a key rotation,
// a migration), so brokers of two releases can share one store. The
// fields defined so far, all optional:
//
//	1 (tag 2)  requested: uvarint n | str scope × n   (Connection.Requested)
//
// A record without them has an empty area, byte for byte what it was
// before the area existed. Everything this reader knows is still decoded
// strictly: an area that is malformed (tag 0 or 1, tags out of order or
// repeated, a length past the end), or a known field that is, is refused
// like any other malformed record.
//
// Version 1 is the JSON connRecord; it is still read, never written.
const recordV2 = 0x02

// Field limits: a longer field is refused on write and on read.
const (
	maxRecordString = 64 << 10
	maxRecordScopes = 4096
	maxRecordTokens = 1 << 20
	maxTokenFields  = 4096
)

// recordFieldNames names the v2 fields in order, for errors.
var recordFieldNames = [...]string{"id", "iss", "sub", "provider", "account_id", "account_login"}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, t time.Time) []byte {
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

// checkLen refuses a field longer than max, naming it.
func checkLen(field string, n, max int) error {
	if n > max {
		return fmt.Errorf("%w: field %s is %d bytes, more than the %d allowed", vault.ErrRecordFormat, field, n, max)
	}
	return nil
}

// encodeRecordV2 renders r in format 2.
func encodeRecordV2(r *connRecord) ([]byte, error) {
	strs := [...]string{r.ID, r.Issuer, r.Subject, r.Provider, r.AccountID, r.AccountLogin}
	size := 1 + 5*12 + 10 + 1 + 3 + len(r.Tokens) + len(r.Ext) + 3 + len(r.Status) + 3
	for i, s := range strs {
		if err := checkLen(recordFieldNames[i], len(s), maxRecordString); err != nil {
			return nil, err
		}
		size += 3 + len(s)
	}
	if err := checkScopes("scope", r.Scopes); err != nil {
		return nil, err
	}
	for _, s := range r.Scopes {
		size += 3 + len(s)
	}
	if err := checkLen("status", len(r.Status), maxRecordString); err != nil {
		return nil, err
	}
	if err := checkLen("tokens", len(r.Tokens), maxRecordTokens); err != nil {
		return nil, err
	}
	if err := checkScopes("requested scope", r.Requested); err != nil {
		return nil, err
	}
	ext, err := appendExtRequested(nil, r.Requested)
	if err != nil {
		return nil, err
	}
	ext = append(ext, r.Ext...)
	if err := checkExt("format 2", ext); err != nil {
		return nil, err
	}
	if err := checkTimes([]string{"created", "updated", "last_used", "last_refreshed", "refresh_expires"},
		r.Created, r.Updated, r.LastUsed, r.LastRefreshed, r.RefreshExpires); err != nil {
		return nil, err
	}
	b := make([]byte, 0, size)
	b = append(b, recordV2)
	for _, s := range strs {
		b = appendStr(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(r.Scopes)))
	for _, s := range r.Scopes {
		b = appendStr(b, s)
	}
	b = appendStr(b, string(r.Status))
	for _, t := range [...]time.Time{r.Created, r.Updated, r.LastUsed, r.LastRefreshed, r.RefreshExpires} {
		b = appendTime(b, t)
	}
	b = binary.AppendUvarint(b, r.Version)
	var flags byte
	if r.NoRefresh {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(r.Tokens)))
	b = append(b, r.Tokens...)
	return append(b, ext...), nil
}

// extRequested is the tag of extension field 1, requested (optional).
const extRequested = 1 << 1

// checkScopes refuses a scope list no record can hold.
func checkScopes(field string, scopes []string) error {
	if len(scopes) > maxRecordScopes {
		return fmt.Errorf("%w: %d %ss, more than the %d allowed", vault.ErrRecordFormat, len(scopes), field, maxRecordScopes)
	}
	for _, s := range scopes {
		if err := checkLen(field, len(s), maxRecordString); err != nil {
			return err
		}
	}
	return nil
}

// appendExtRequested appends extension field 1 holding scopes to b, or
// nothing when there are none.
func appendExtRequested(b []byte, scopes []string) ([]byte, error) {
	if len(scopes) == 0 {
		return b, nil
	}
	val := binary.AppendUvarint(nil, uint64(len(scopes)))
	for _, s := range scopes {
		val = appendStr(val, s)
	}
	if err := checkLen("requested scopes", len(val), maxRecordTokens); err != nil {
		return nil, err
	}
	b = binary.AppendUvarint(b, extRequested)
	return appendStr(b, string(val)), nil
}

// takeExtRequested decodes extension field 1 (requested) when the valid
// extension area ext starts with it, and returns the area's other fields
// (a newer broker's, carried as they are).
func takeExtRequested(ext string) (requested []string, rest string, err error) {
	rd := reader{s: ext, what: "format 2 extension field 1 (requested scopes)"}
	if tag := rd.uvarint("extension tag", ""); rd.err != nil || tag != extRequested {
		return nil, ext, nil
	}
	val := reader{s: rd.bytes("requested scopes", maxRecordTokens), what: rd.what}
	if n := val.uvarint("requested scope count", ""); n == 0 || n > maxRecordScopes {
		val.fail("%d requested scopes (1 to %d allowed)", n, maxRecordScopes)
	} else if val.err == nil {
		requested = make([]string, n)
		for i := range requested {
			requested[i] = val.str("requested scope")
		}
	}
	val.end()
	if err := errors.Join(rd.err, val.err); err != nil {
		return nil, "", err
	}
	return requested, ext[rd.off:], nil
}

// reader decodes a v2 record or token plaintext. Strings are substrings of
// one copy of the input (s), so a record costs one allocation for all of
// its strings. The first error sticks.
type reader struct {
	s    string
	off  int
	what string // "format 2" or "format 2 token set", for errors
	err  error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s: %s", vault.ErrRecordFormat, r.what, fmt.Sprintf(format, args...))
	}
}

// uvarint reads a varint of field; part ("", " length", " nanoseconds")
// says which of the field's varints it is, kept apart so that naming it
// costs nothing unless it fails.
// count reads the count of a list of field (items, at most max): zero,
// and a failure, past max.
func (r *reader) count(field, items string, max uint64) uint64 {
	n := r.uvarint(field+" count", "")
	if n > max {
		r.fail("%d %s, more than the %d allowed", n, items, max)
		return 0
	}
	return n
}

func (r *reader) uvarint(field, part string) uint64 {
	if r.err != nil {
		return 0
	}
	var x uint64
	for i := 0; ; i++ {
		if r.off+i >= len(r.s) {
			r.fail("truncated in %s%s (at byte %d of %d)", field, part, r.off, len(r.s))
			return 0
		}
		c := r.s[r.off+i]
		if i == binary.MaxVarintLen64-1 && c > 1 {
			r.fail("%s%s overflows 64 bits (at byte %d)", field, part, r.off)
			return 0
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			if i > 0 && c == 0 {
				r.fail("%s%s is not minimally encoded (at byte %d)", field, part, r.off)
				return 0
			}
			r.off += i + 1
			return x
		}
	}
}

func (r *reader) varint(field string) int64 {
	ux := r.uvarint(field, "")
	x := int64(ux >> 1)
	if ux&1 != 0 {
		x = ^x
	}
	return x
}

// bytes returns the next length-prefixed field as a substring.
func (r *reader) bytes(field string, max int) string {
	n := r.uvarint(field, " length")
	if r.err != nil {
		return ""
	}
	if n > uint64(max) {
		r.fail("field %s is %d bytes, more than the %d allowed", field, n, max)
		return ""
	}
	if uint64(len(r.s)-r.off) < n {
		r.fail("truncated in %s: %d bytes, %d left", field, n, len(r.s)-r.off)
		return ""
	}
	v := r.s[r.off : r.off+int(n)]
	r.off += int(n)
	return v
}

func (r *reader) str(field string) string {
	v := r.bytes(field, maxRecordString)
	if r.err == nil && !utf8.ValidString(v) {
		r.fail("field %s is not valid UTF-8", field)
	}
	return v
}

func (r *reader) time(field string) time.Time {
	sec := r.varint(field)
	nsec := r.uvarint(field, " nanoseconds")
	if r.err != nil {
		return time.Time{}
	}
	if nsec >= 1e9 {
		r.fail("%s has %d nanoseconds", field, nsec)
		return time.Time{}
	}
	if sec < minRecordUnix || sec > maxRecordUnix {
		r.fail("%s is outside the years 0 to 9999", field)
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}

// A record's times are in the years 0 to 9999, as format 1 (RFC 3339 in
// JSON) requires, so every record converts to it.
var (
	minRecordUnix = time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	maxRecordUnix = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).Unix() - 1
)

func timeInRange(t time.Time) bool {
	sec := t.Unix()
	return sec >= minRecordUnix && sec <= maxRecordUnix
}

// checkTimes refuses times no record format can hold.
func checkTimes(names []string, ts ...time.Time) error {
	for i, t := range ts {
		if !timeInRange(t) {
			return fmt.Errorf("%w: %s is outside the years 0 to 9999", vault.ErrRecordFormat, names[i])
		}
	}
	return nil
}

func (r *reader) byte1(field string) byte {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.s) {
		r.fail("truncated in %s (at byte %d of %d)", field, r.off, len(r.s))
		return 0
	}
	c := r.s[r.off]
	r.off++
	return c
}

func (r *reader) end() {
	if r.err == nil && r.off != len(r.s) {
		r.fail("%d bytes after the last field", len(r.s)-r.off)
	}
}

// decodeRecordV2 parses a format 2 record (b[0] == recordV2).
func decodeRecordV2(b []byte) (connRecord, error) {
	rd := reader{s: string(b), off: 1, what: "format 2"}
	var c connRecord
	c.V = recordV2
	c.ID = rd.str("id")
	c.Issuer = rd.str("iss")
	c.Subject = rd.str("sub")
	c.Provider = rd.str("provider")
	c.AccountID = rd.str("account_id")
	c.AccountLogin = rd.str("account_login")
	if n := rd.count("scope", "scopes", maxRecordScopes); n > 0 && rd.err == nil {
		c.Scopes = make([]string, n)
		for i := range c.Scopes {
			c.Scopes[i] = rd.str("scope")
		}
	}
	c.Status = vault.ConnectionStatus(rd.str("status"))
	c.Created = rd.time("created")
	c.Updated = rd.time("updated")
	c.LastUsed = rd.time("last_used")
	c.LastRefreshed = rd.time("last_refreshed")
	c.RefreshExpires = rd.time("refresh_expires")
	c.Version = rd.uvarint("version", "")
	flags := rd.byte1("flags")
	if flags&^1 != 0 {
		rd.fail("unknown flags 0x%02x", flags)
	}
	c.NoRefresh = flags&1 != 0
	tokens := rd.bytes("tokens", maxRecordTokens)
	tokensEnd := rd.off
	ext := rd.ext()
	rd.end()
	if rd.err != nil {
		return connRecord{}, rd.err
	}
	// A slice of b, not a copy: the envelope is opened or copied into a
	// new record, never kept.
	c.Tokens = b[tokensEnd-len(tokens) : tokensEnd]
	requested, ext, err := takeExtRequested(ext)
	if err != nil {
		return connRecord{}, err
	}
	c.Requested = requested
	if ext != "" {
		c.Ext = []byte(ext)
	}
	return c, nil
}

// tokensV2 is the binary token plaintext of version 2:
//
//	0x02 | str access | str refresh | str token_type | time expiry | str id_token
//	uvarint n | (str name | str value) × n, names sorted, distinct and non-empty
//	ext, the extension area (as the record's), to the end of the plaintext
func encodeTokensV2(tp *tokenPlain) ([]byte, error) {
	if err := checkTimes([]string{"token expiry"}, tp.Expiry); err != nil {
		return nil, err
	}
	if len(tp.Fields) > maxTokenFields {
		// The reader refuses more: never store what cannot be read back.
		return nil, fmt.Errorf("%w: %d token fields, more than the %d allowed", vault.ErrRecordFormat, len(tp.Fields), maxTokenFields)
	}
	if err := checkExt("format 2 token set", []byte(tp.Ext)); err != nil {
		return nil, err
	}
	size := 1 + 5*3 + len(tp.AccessToken) + len(tp.RefreshToken) + len(tp.TokenType) + len(tp.IDToken) + 12 + 3 + len(tp.Ext)
	names := make([]string, 0, len(tp.Fields))
	for k, v := range tp.Fields {
		names = append(names, k)
		size += 6 + len(k) + len(v)
	}
	slices.Sort(names)
	b := make([]byte, 0, size)
	b = append(b, recordV2)
	b = appendStr(b, tp.AccessToken)
	b = appendStr(b, tp.RefreshToken)
	b = appendStr(b, tp.TokenType)
	b = appendTime(b, tp.Expiry)
	b = appendStr(b, tp.IDToken)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, k := range names {
		b = appendStr(b, k)
		b = appendStr(b, tp.Fields[k])
	}
	return append(b, tp.Ext...), nil
}

func decodeTokensV2(pt []byte) (tokenPlain, error) {
	rd := reader{s: string(pt), off: 1, what: "format 2 token set"}
	var tp tokenPlain
	tp.AccessToken = rd.tok("access token")
	tp.RefreshToken = rd.tok("refresh token")
	tp.TokenType = rd.tok("token type")
	tp.Expiry = rd.time("expiry")
	tp.IDToken = rd.tok("id token")
	if n := rd.count("field", "fields", maxTokenFields); n > 0 && rd.err == nil {
		tp.Fields = make(map[string]string, n)
		prev := ""
		for i := range n {
			k := rd.tok("field name")
			v := rd.tok("field value")
			if rd.err == nil && (k == "" || i > 0 && k <= prev) {
				rd.fail("field names empty, repeated or out of order")
			}
			tp.Fields[k], prev = v, k
		}
	}
	tp.Ext = rd.ext()
	rd.end()
	if rd.err != nil {
		return tokenPlain{}, rd.err
	}
	return tp, nil
}

// tok reads a token string; token material may be as long as the whole
// sealed set.
func (r *reader) tok(field string) string {
	v := r.bytes(field, maxRecordTokens)
	if r.err == nil && !utf8.ValidString(v) {
		r.fail("field %s is not valid UTF-8", field)
	}
	return v
}

// requiredExt is an extension tag's low bit: the field is required.
const requiredExt = 1

// ext reads an extension area, which runs to the end of the input, and
// returns it as stored (empty when there is none); a value is at most
// maxRecordTokens bytes. It refuses a malformed
// area and a required field: this broker knows no extension field yet, so
// a required one is one a newer broker added and this one cannot read.
func (r *reader) ext() string {
	start := r.off
	var prev uint64
	for r.err == nil && r.off < len(r.s) {
		at := r.off
		tag := r.uvarint("extension tag", "")
		switch {
		case r.err != nil:
		case tag < 2:
			r.fail("extension tag %d at byte %d is not a field (field numbers start at 1)", tag, at)
		case at > start && tag <= prev:
			r.fail("extension tag %d at byte %d follows tag %d (tags increase, each appears at most once)", tag, at, prev)
		case tag&requiredExt != 0:
			r.fail("required extension field %d (tag %d, at byte %d) is unknown to this broker; a newer broker wrote it", tag>>1, tag, at)
		default:
			prev = tag
			r.bytes("extension field", maxRecordTokens)
		}
	}
	if r.err != nil {
		return ""
	}
	return r.s[start:r.off]
}

// checkExt refuses an extension area the reader would refuse, so none is
// written that could not be read back.
func checkExt(what string, ext []byte) error {
	if len(ext) == 0 {
		return nil
	}
	rd := reader{s: string(ext), what: what + " extension area"}
	rd.ext()
	return rd.err
}
