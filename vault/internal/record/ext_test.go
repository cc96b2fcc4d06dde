package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// extField appends one extension field (tag, then its value as bytes).
func extField(b []byte, tag uint64, val string) []byte {
	b = binary.AppendUvarint(b, tag)
	return appendStr(b, val)
}

// newerWriter stands for a later broker that added fields to the
// connection record: it writes c as today's EncodeConnection does, then
// the extension fields rec at the end of the record and tokens at the end
// of the token set before sealing it. (Today's writer refuses to write a
// required field it does not know; the later one knows its fields.)
func newerWriter(t *testing.T, kr *vault.Keyring, c vault.Connection, rec, tokens []byte) []byte {
	t.Helper()
	r := connRecord{
		V: recordV2, ID: c.ID, Issuer: c.Principal.Issuer, Subject: c.Principal.Subject,
		Provider: c.Provider, AccountID: c.AccountID, AccountLogin: c.AccountLogin,
		Scopes: c.Scopes, Status: c.Status, Created: c.Created, Updated: c.Updated,
		LastUsed: c.LastUsed, LastRefreshed: c.LastRefreshed, Version: c.Version,
		RefreshExpires: c.RefreshExpires, NoRefresh: c.Token.RefreshToken == "",
	}
	pt, err := encodeTokensV2(&tokenPlain{AccessToken: c.Token.AccessToken.Reveal(), RefreshToken: c.Token.RefreshToken.Reveal(),
		TokenType: c.Token.TokenType, Expiry: c.Token.Expiry, IDToken: c.Token.IDToken.Reveal()})
	if err != nil {
		t.Fatal(err)
	}
	r.Tokens = kr.Seal(append(pt, tokens...), connectionAAD(&r))
	b, err := encodeRecordV2(&r)
	if err != nil {
		t.Fatal(err)
	}
	return append(b, rec...)
}

func extConn() vault.Connection {
	t0 := time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)
	return vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "https://idp.example", Subject: "alice"},
		Provider: "github", AccountID: "1", AccountLogin: "alice@example.com", Scopes: []string{"repo"},
		Status: vault.StatusActive, Created: t0, Updated: t0, Version: 3,
		Token: vault.TokenSet{AccessToken: "at-c1-secret", RefreshToken: "rt-c1-secret", TokenType: "Bearer", Expiry: t0.Add(time.Hour)}}
}

// TestCodecReadsNewerOptionalFields: a record a newer broker wrote with
// optional fields this one does not know (in the record and in the sealed
// token set) reads without error, as the same connection, and every
// rewrite of it (metadata update, full update, key rotation, the JSON
// form) keeps the unknown fields byte for byte.
func TestCodecReadsNewerOptionalFields(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	c := extConn()
	// Today's writer leaves both areas empty: its records are what they
	// were before the area existed.
	plain, err := EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := parseRecord(plain); err != nil || r.Ext != nil {
		t.Fatalf("today's record has an extension area %q (%v)", r.Ext, err)
	}
	if _, ext, err := decodeConnection(kr, plain); err != nil || ext.tokens != "" {
		t.Fatalf("today's token set has an extension area %q (%v)", ext.tokens, err)
	}

	recExt := extField(extField(nil, 2<<1, "a newer field"), 7<<1, "\x00\xff binary")
	tokExt := extField(nil, 3<<1, "a newer secret")
	newer := newerWriter(t, kr, c, recExt, tokExt)
	if !bytes.HasSuffix(newer, recExt) || len(newer) != len(plain)+len(recExt)+len(tokExt) {
		t.Fatal("the newer record is not today's with the fields at the end of the record and of the token set")
	}

	meta, err := ConnectionMeta(newer)
	if err != nil {
		t.Fatalf("today's reader refuses a newer record's metadata: %v", err)
	}
	if d := sameConnection(meta, c); d != "" {
		t.Fatalf("newer record's metadata has another %s", d)
	}
	got, err := DecodeConnection(kr, newer)
	if err != nil {
		t.Fatalf("today's reader refuses a newer record: %v", err)
	}
	if d := sameConnection(got, c); d != "" || !got.Token.Equal(c.Token) {
		t.Fatalf("newer record decoded with another %s", d)
	}

	keeps := func(t *testing.T, what string, kr *vault.Keyring, rec []byte) {
		t.Helper()
		r, err := parseRecord(rec)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !bytes.Equal(r.Ext, recExt) {
			t.Fatalf("%s: record fields %q, want %q", what, r.Ext, recExt)
		}
		if _, ext, err := decodeConnection(kr, rec); err != nil || ext.tokens != string(tokExt) {
			t.Fatalf("%s: token set fields %q, want %q (%v)", what, ext.tokens, tokExt, err)
		}
	}
	keeps(t, "the newer record", kr, newer)

	mrec, _, err := ApplyConnectionMetaUpdate(newer, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	keeps(t, "a metadata update", kr, mrec)

	frec, _, err := ApplyConnectionRecordUpdate(kr, newer, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Token.AccessToken = "at-c1-refreshed"
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	keeps(t, "a full update", kr, frec)
	if got, err := DecodeConnection(kr, frec); err != nil || got.Token.AccessToken != "at-c1-refreshed" || got.Version != c.Version+1 {
		t.Fatalf("full update of a newer record: %+v %v", got.Token, err)
	}

	rotated, err := kr.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	rrec, rc, err := Reseal(rotated, newer)
	if err != nil || rc.SealedWith != rotated.Primary() || rc.Version != c.Version+1 {
		t.Fatalf("reseal: %+v %v", rc, err)
	}
	keeps(t, "a reseal", rotated, rrec)

	js, err := RecordJSON(newer)
	if err != nil {
		t.Fatal(err)
	}
	back, err := RecordFromJSON(js)
	if err != nil || !bytes.Equal(back, newer) {
		t.Fatalf("the JSON form lost the newer fields: %v", err)
	}
}

// TestCodecRefusesUnknownRequiredFields: a field a newer broker marked
// required (the tag's low bit) is refused with an error naming it, in the
// record (nothing reads it) and in the token set (the metadata reads; the
// token set does not open, and a metadata update keeps it sealed as is).
func TestCodecRefusesUnknownRequiredFields(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	c := extConn()
	optional := extField(nil, 2<<1, "skipped")

	rec := newerWriter(t, kr, c, extField(bytes.Clone(optional), 4<<1|1, "needed"), nil)
	const wantRec = "format 2: required extension field 4 (tag 9, at byte "
	for name, read := range map[string]func() error{
		"metadata":        func() error { _, err := ConnectionMeta(rec); return err },
		"decode":          func() error { _, err := DecodeConnection(kr, rec); return err },
		"metadata update": func() error { _, _, err := ApplyConnectionMetaUpdate(rec, c.ID, keep); return err },
		"update":          func() error { _, _, err := ApplyConnectionRecordUpdate(kr, rec, c.ID, keep); return err },
		"reseal":          func() error { _, _, err := Reseal(kr, rec); return err },
		"JSON form":       func() error { _, err := RecordJSON(rec); return err },
	} {
		err := read()
		if !errors.Is(err, vault.ErrRecordFormat) || !strings.Contains(err.Error(), wantRec) ||
			!strings.Contains(err.Error(), "is unknown to this broker; a newer broker wrote it") {
			t.Errorf("%s of a record with a required field: %v; want ErrRecordFormat saying %q", name, err, wantRec)
		}
	}

	tok := newerWriter(t, kr, c, nil, extField(nil, 1<<1|1, "needed"))
	if _, err := ConnectionMeta(tok); err != nil {
		t.Fatalf("metadata of a record whose token set has a required field: %v", err)
	}
	const wantTok = "format 2 token set: required extension field 1 (tag 3, at byte "
	for name, read := range map[string]func() error{
		"decode": func() error { _, err := DecodeConnection(kr, tok); return err },
		"update": func() error { _, _, err := ApplyConnectionRecordUpdate(kr, tok, c.ID, keep); return err },
		"reseal": func() error { _, _, err := Reseal(kr, tok); return err },
	} {
		err := read()
		if !errors.Is(err, vault.ErrRecordFormat) || !strings.Contains(err.Error(), wantTok) {
			t.Errorf("%s of a token set with a required field: %v; want ErrRecordFormat saying %q", name, err, wantTok)
		}
	}
	mrec, _, err := ApplyConnectionMetaUpdate(tok, c.ID, func(c vault.Connection) (vault.Connection, error) {
		c.Status = vault.StatusNeedsReconnect
		return c, nil
	})
	if err != nil {
		t.Fatalf("metadata update of a record whose token set has a required field: %v", err)
	}
	r0, _ := parseRecord(tok)
	r1, _ := parseRecord(mrec)
	if !bytes.Equal(r0.Tokens, r1.Tokens) {
		t.Fatal("a metadata update re-sealed a token set it cannot read")
	}
}

func keep(c vault.Connection) (vault.Connection, error) { return c, nil }

// TestCodecRefusesMalformedExtensions: the extension area is decoded as
// strictly as the rest: each malformed shape is refused on read with a
// precise error, and refused on write.
func TestCodecRefusesMalformedExtensions(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	c := extConn()
	good, err := EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	at := len(good)
	tests := []struct {
		name string
		ext  []byte
		want string
	}{
		{"tag 0", []byte{0, 0}, "extension tag 0 at byte " + strconv.Itoa(at) + " is not a field"},
		{"tag 1", []byte{1, 0}, "extension tag 1 at byte " + strconv.Itoa(at) + " is not a field"},
		{"tags out of order", extField(extField(nil, 6, "a"), 4, "b"), "extension tag 4 at byte " + strconv.Itoa(at+3) + " follows tag 6"},
		{"tag repeated", extField(extField(nil, 4, "a"), 4, "b"), "extension tag 4 at byte " + strconv.Itoa(at+3) + " follows tag 4"},
		{"value past the end", []byte{4, 5, 'a'}, "truncated in extension field: 5 bytes, 1 left"},
		{"no length", []byte{4}, "truncated in extension field length"},
		{"non-minimal tag", []byte{0x84, 0x00, 0}, "extension tag is not minimally encoded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ConnectionMeta(append(bytes.Clone(good), tt.ext...))
			if !errors.Is(err, vault.ErrRecordFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("read: %v; want ErrRecordFormat saying %q", err, tt.want)
			}
			if _, err := encodeConnection(kr, c, extAreas{rec: tt.ext}); !errors.Is(err, vault.ErrRecordFormat) {
				t.Fatalf("a malformed record area was written: %v", err)
			}
			if _, err := encodeConnection(kr, c, extAreas{tokens: string(tt.ext)}); !errors.Is(err, vault.ErrRecordFormat) {
				t.Fatalf("a malformed token set area was written: %v", err)
			}
		})
	}
}

// TestCodecRequestedScopes: extension field 1 holds the scopes a connect
// request asked for (Connection.Requested). It reads back from every
// decoder, survives every rewrite (metadata update, full update, key
// rotation, the JSON form) next to a newer broker's fields, a metadata
// update may change it, a record with it is today's with the field at its
// end, and a malformed one is refused.
func TestCodecRequestedScopes(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	c := extConn()
	plain, err := EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	c.Requested = []string{"repo", "read:org"}
	rec, err := EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	field := extField(nil, extRequested, string(appendStr(appendStr([]byte{2}, "repo"), "read:org")))
	if !bytes.HasSuffix(rec, field) || len(rec) != len(plain)+len(field) {
		t.Fatalf("the record is not today's with field 1 appended:\n%x\n%x", rec, plain)
	}
	newer := extField(nil, 2<<1, "a newer field") // field 2, unknown here
	withNewer := append(bytes.Clone(rec), newer...)
	check := func(what string, b []byte, want []string) {
		t.Helper()
		m, err := ConnectionMeta(b)
		if err != nil || !slices.Equal(m.Requested, want) {
			t.Fatalf("%s: meta requested %q (%v), want %q", what, m.Requested, err, want)
		}
		full, err := DecodeConnection(kr, b)
		if err != nil || !slices.Equal(full.Requested, want) {
			t.Fatalf("%s: requested %q (%v), want %q", what, full.Requested, err, want)
		}
		if r, err := parseRecord(b); err != nil || !bytes.Equal(r.Ext, newer) {
			t.Fatalf("%s: the newer field is %q (%v)", what, r.Ext, err)
		}
	}
	check("as written", withNewer, c.Requested)
	meta, _, err := ApplyConnectionMetaUpdate(withNewer, c.ID, func(o vault.Connection) (vault.Connection, error) { return o, nil })
	if err != nil {
		t.Fatal(err)
	}
	check("after a metadata update", meta, c.Requested)
	changed, _, err := ApplyConnectionMetaUpdate(withNewer, c.ID, func(o vault.Connection) (vault.Connection, error) {
		o.Requested = []string{"repo"}
		return o, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	check("after a metadata update changing it", changed, []string{"repo"})
	full, _, err := ApplyConnectionRecordUpdate(kr, withNewer, c.ID, func(o vault.Connection) (vault.Connection, error) { return o, nil })
	if err != nil {
		t.Fatal(err)
	}
	check("after a full update", full, c.Requested)
	resealed, _, err := Reseal(kr, withNewer)
	if err != nil {
		t.Fatal(err)
	}
	check("after a reseal", resealed, c.Requested)
	js, err := RecordJSON(withNewer)
	if err != nil {
		t.Fatal(err)
	}
	back, err := RecordFromJSON(js)
	if err != nil || !bytes.Equal(back, withNewer) {
		t.Fatalf("the JSON form does not round-trip: %v", err)
	}
	for name, bad := range map[string][]byte{
		"no scopes":      extField(nil, extRequested, "\x00"),
		"truncated":      extField(nil, extRequested, "\x02\x04repo"),
		"not UTF-8":      extField(nil, extRequested, "\x01\x02\xff\xfe"),
		"trailing bytes": extField(nil, extRequested, "\x01\x04repo!"),
	} {
		if _, err := ConnectionMeta(append(bytes.Clone(plain), bad...)); !errors.Is(err, vault.ErrRecordFormat) {
			t.Errorf("%s: %v, want ErrRecordFormat", name, err)
		}
	}
	// Nor is one written: a requested scope that is not UTF-8.
	notText := extConn()
	notText.Requested = []string{"repo", "\xc0"}
	if _, err := EncodeConnection(kr, notText); err == nil {
		t.Error("a requested scope that is not UTF-8 was encoded")
	}
	if _, _, err := ApplyConnectionMetaUpdate(rec, c.ID, func(o vault.Connection) (vault.Connection, error) {
		o.Requested = notText.Requested
		return o, nil
	}); err == nil {
		t.Error("a metadata update to a requested scope that is not UTF-8 was applied")
	}
}
