package record

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

func TestDecodePrincipalConnections(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	alice := vault.Principal{Issuer: "https://idp", Subject: "alice"}
	var recs [][]byte
	for _, id := range []string{"c1", "c2"} {
		b, err := EncodeConnection(kr, vault.Connection{ID: id, Principal: alice, Provider: "demo", AccountID: id, Token: vault.TokenSet{AccessToken: "at"}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, b)
	}
	opens := kr.Opens()
	got, err := DecodePrincipalConnections(alice, recs)
	if err != nil || len(got) != 2 || got[0].ID != "c1" || got[1].AccountID != "c2" || got[1].SealedWith != kr.Primary() {
		t.Fatalf("got %v %v", got, err)
	}
	if !got[0].Token.IsZero() || kr.Opens() != opens {
		t.Fatalf("a listing decrypted token sets (%d opens)", kr.Opens()-opens)
	}
	// An index entry that leads to someone else's record is corruption.
	bob := vault.Principal{Issuer: "https://idp", Subject: "bob"}
	if _, err := DecodePrincipalConnections(bob, recs); !errors.Is(err, vault.ErrMalformed) {
		t.Fatalf("listing alice's records as bob: %v, want vault.ErrMalformed", err)
	}
}

// TestGrantRecordServer: the requesting server's name is stored with a
// grant, and records written before the field existed still decode (as
// no server), byte for byte otherwise.
func TestGrantRecordServer(t *testing.T) {
	old := []byte(`{"v":1,"id":"g1","iss":"https://idp","sub":"alice","provider":"demo","scopes":["repos"],` +
		`"client_name":"Claude","created":"2026-01-02T03:04:05Z","expires":"2026-01-02T03:14:05Z","state":"pending","version":1}`)
	g, err := DecodeGrant(old)
	if err != nil {
		t.Fatal(err)
	}
	if g.Server != "" || g.ClientName != "Claude" || g.Provider != "demo" || g.Version != 1 {
		t.Fatalf("old record decoded as %+v", g)
	}
	// Re-encoding a grant without a server writes no server member, so a
	// broker of the previous release reads it as before.
	again, err := EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(old) {
		t.Fatalf("re-encoded old record differs:\n%s\n%s", again, old)
	}
	g.Server = "demorepos"
	rec, err := EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeGrant(rec)
	if err != nil || back.Server != "demorepos" || back.ClientName != "Claude" {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	g.Server = "bad\xff"
	if _, err := EncodeGrant(g); err == nil {
		t.Fatal("a server name that is not UTF-8 was encoded")
	}
}

// encodeV1 writes c the way the codec did before format 2: a JSON record
// around a JSON token plaintext, sealed with the same additional data.
func encodeV1(t *testing.T, kr *vault.Keyring, c vault.Connection) []byte {
	t.Helper()
	r := connRecord{
		V: recordV1, ID: c.ID, Issuer: c.Principal.Issuer, Subject: c.Principal.Subject,
		Provider: c.Provider, AccountID: c.AccountID, AccountLogin: c.AccountLogin,
		Scopes: c.Scopes, Status: c.Status, Created: c.Created, Updated: c.Updated,
		LastUsed: c.LastUsed, LastRefreshed: c.LastRefreshed, Version: c.Version,
		RefreshExpires: c.RefreshExpires, NoRefresh: c.Token.RefreshToken == "",
	}
	tp := tokenPlain{AccessToken: c.Token.AccessToken.Reveal(), RefreshToken: c.Token.RefreshToken.Reveal(),
		TokenType: c.Token.TokenType, Expiry: c.Token.Expiry, IDToken: c.Token.IDToken.Reveal()}
	for k, v := range c.Token.Fields {
		if tp.Fields == nil {
			tp.Fields = map[string]string{}
		}
		tp.Fields[k] = v.Reveal()
	}
	pt, err := json.Marshal(tp)
	if err != nil {
		t.Fatal(err)
	}
	r.Tokens = kr.Seal(pt, connectionAAD(&r))
	rec, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// sameConnection reports how got differs from want (times by instant).
func sameConnection(got, want vault.Connection) string {
	switch {
	case got.ID != want.ID || got.Principal != want.Principal || got.Provider != want.Provider || got.AccountID != want.AccountID:
		return "identity"
	case got.AccountLogin != want.AccountLogin || got.Status != want.Status || got.Version != want.Version:
		return "login, status or version"
	case !slices.Equal(got.Scopes, want.Scopes):
		return fmt.Sprintf("scopes %q, want %q", got.Scopes, want.Scopes)
	case !got.Created.Equal(want.Created) || !got.Updated.Equal(want.Updated) || !got.LastUsed.Equal(want.LastUsed) ||
		!got.LastRefreshed.Equal(want.LastRefreshed) || !got.RefreshExpires.Equal(want.RefreshExpires):
		return "times"
	case got.NoRefreshToken != (want.Token.RefreshToken == ""):
		return "no-refresh flag"
	case !got.Token.IsZero() && !got.Token.Equal(want.Token):
		return "tokens"
	}
	return ""
}

// TestCodecRecordVersions: records of format 1 (JSON) still read; format 2
// (binary) is what is written and round-trips; rewriting a format 1
// record (a full or a metadata update) writes format 2; a malformed or
// unknown record fails with a precise ErrRecordFormat.
func TestCodecRecordVersions(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 7, 28, 12, 0, 0, 123456789, time.UTC)
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	conns := map[string]vault.Connection{
		"oauth": {ID: "c1", Principal: alice, Provider: "github", AccountID: "1", AccountLogin: "1@example.com",
			Scopes: []string{"repo", "read:user"}, Status: vault.StatusActive, Created: t0, Updated: t0.Add(time.Minute),
			LastUsed: t0.Add(time.Hour), LastRefreshed: t0.Add(2 * time.Hour), RefreshExpires: t0.AddDate(0, 6, 0), Version: 7,
			Token: vault.TokenSet{AccessToken: "at-c1-secret", RefreshToken: "rt-c1-secret", TokenType: "Bearer",
				Expiry: t0.Add(3 * time.Hour), IDToken: "idt-c1-secret"}},
		"api key": {ID: "k1", Principal: alice, Provider: "jira", AccountID: "k", Status: vault.StatusActive, Created: t0, Updated: t0,
			Token: vault.TokenSet{Fields: map[string]vault.Secret{"email": "a@example.com", "api_token": "key-k1-secret", "z": ""}}},
		"zero times, no refresh, other zone, NUL": {ID: "z1", Principal: vault.Principal{Issuer: "i\x00", Subject: "s\x00"},
			Provider: "p", AccountID: "a", Updated: t0.In(time.FixedZone("x", 3600)),
			Token: vault.TokenSet{AccessToken: "at-z1-secret"}},
	}
	for name, c := range conns {
		t.Run(name, func(t *testing.T) {
			// Format 1 reads, metadata and tokens.
			v1 := encodeV1(t, kr, c)
			got, err := DecodeConnection(kr, v1)
			if err != nil {
				t.Fatalf("v1 record: %v", err)
			}
			if d := sameConnection(got, c); d != "" {
				t.Fatalf("v1 record decoded with other %s", d)
			}
			meta, err := ConnectionMeta(v1)
			if err != nil || sameConnection(meta, c) != "" || !meta.Token.IsZero() || meta.SealedWith != "fz" {
				t.Fatalf("v1 metadata: %+v %v", meta, err)
			}
			// Format 2 is written and round-trips.
			v2, err := EncodeConnection(kr, c)
			if err != nil {
				t.Fatal(err)
			}
			if v2[0] != recordV2 {
				t.Fatalf("EncodeConnection wrote format 0x%02x", v2[0])
			}
			got, err = DecodeConnection(kr, v2)
			if err != nil || sameConnection(got, c) != "" {
				t.Fatalf("v2 round trip: %s %v", sameConnection(got, c), err)
			}
			if got.Created != got.Created.UTC() || got.LastUsed.IsZero() != c.LastUsed.IsZero() {
				t.Fatalf("v2 times: created %v, last used %v", got.Created, got.LastUsed)
			}
			again, err := EncodeConnection(kr, got)
			if err != nil {
				t.Fatal(err)
			}
			meta, err = ConnectionMeta(again)
			if err != nil || sameConnection(meta, got) != "" || len(again) != len(v2) {
				t.Fatalf("re-encoding a decoded record changed it")
			}
			// A full rewrite of a format 1 record writes format 2.
			nrec, nc, err := ApplyConnectionRecordUpdate(kr, v1, c.ID, func(c vault.Connection) (vault.Connection, error) {
				c.AccountLogin = "renamed"
				return c, nil
			})
			if err != nil || nrec[0] != recordV2 || nc.Version != c.Version+1 {
				t.Fatalf("update of a v1 record: first byte 0x%02x, %v", nrec[0], err)
			}
			if got, err := DecodeConnection(kr, nrec); err != nil || !got.Token.Equal(c.Token) || got.AccountLogin != "renamed" {
				t.Fatalf("updated v1 record: %v", err)
			}
			// A metadata rewrite writes format 2 around the same sealed
			// set (its JSON plaintext), opening nothing.
			opens := kr.Opens()
			mrec, _, err := ApplyConnectionMetaUpdate(v1, c.ID, func(c vault.Connection) (vault.Connection, error) {
				c.Status = vault.StatusNeedsReconnect
				return c, nil
			})
			if err != nil || mrec[0] != recordV2 || kr.Opens() != opens {
				t.Fatalf("metadata update of a v1 record: %v, %d opens", err, kr.Opens()-opens)
			}
			r1, _ := parseRecord(v1)
			r2, _ := parseRecord(mrec)
			if !bytes.Equal(r1.Tokens, r2.Tokens) {
				t.Fatal("metadata update re-sealed the token set")
			}
			if got, err := DecodeConnection(kr, mrec); err != nil || !got.Token.Equal(c.Token) || got.Status != vault.StatusNeedsReconnect {
				t.Fatalf("v1 record after a metadata update: %v", err)
			}
			// Every proper prefix of a format 2 record is refused.
			for n := range len(v2) {
				if _, err := ConnectionMeta(v2[:n]); !errors.Is(err, vault.ErrRecordFormat) {
					t.Fatalf("prefix of %d bytes: %v, want vault.ErrRecordFormat", n, err)
				}
			}
		})
	}

	good, err := EncodeConnection(kr, conns["oauth"])
	if err != nil {
		t.Fatal(err)
	}
	long := append([]byte{recordV2}, binary.AppendUvarint(nil, maxRecordString+1)...)
	long = append(long, bytes.Repeat([]byte{'x'}, maxRecordString+1)...)
	tests := []struct {
		name string
		rec  []byte
		want string
	}{
		{"empty", nil, "empty"},
		{"unknown version", append([]byte{3}, good[1:]...), "unknown format version 3 (first byte 0x03); this broker reads versions 1 and 2"},
		{"JSON of another version", []byte(`{"v":2,"id":"x"}`), "JSON record says version 2"},
		{"trailing byte", append(bytes.Clone(good), 0), "extension tag 0 at byte"},
		{"truncated", good[:len(good)-1], "truncated in tokens"},
		{"truncated in a length", []byte{recordV2, 0x80}, "truncated in id length"},
		{"overlong field", long, "field id is 65537 bytes, more than the 65536 allowed"},
		{"non-minimal varint", []byte{recordV2, 0x81, 0x00}, "id length is not minimally encoded"},
		{"varint overflow", []byte{recordV2, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, "overflows 64 bits"},
		{"length past the end", []byte{recordV2, 5, 'a', 'b'}, "truncated in id: 5 bytes, 2 left"},
		{"not UTF-8", []byte{recordV2, 1, 0xff}, "field id is not valid UTF-8"},
		{"no id", []byte{recordV2, 0}, "truncated in iss"},
		{"too many scopes", append([]byte{recordV2, 1, 'x', 0, 0, 0, 0, 0}, binary.AppendUvarint(nil, maxRecordScopes+1)...), "4097 scopes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ConnectionMeta(tt.rec)
			_, derr := DecodeConnection(kr, tt.rec)
			if !errors.Is(err, vault.ErrRecordFormat) || !errors.Is(derr, vault.ErrRecordFormat) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v (decode: %v); want vault.ErrRecordFormat saying %q", err, derr, tt.want)
			}
		})
	}
	// Flags, nanoseconds: a record whose fields are fine but one value.
	c := conns["api key"]
	rec, _ := EncodeConnection(kr, c)
	r, _ := parseRecord(rec)
	flagAt := len(rec) - len(r.Tokens) - len(binary.AppendUvarint(nil, uint64(len(r.Tokens)))) - 1
	bad := bytes.Clone(rec)
	bad[flagAt] = 0x82
	if _, err := ConnectionMeta(bad); !errors.Is(err, vault.ErrRecordFormat) || !strings.Contains(err.Error(), "unknown flags 0x82") {
		t.Fatalf("unknown flag: %v", err)
	}
	// An overlong field is refused on write too, naming it.
	c.AccountLogin = strings.Repeat("x", maxRecordString+1)
	if _, err := EncodeConnection(kr, c); !errors.Is(err, vault.ErrRecordFormat) || !strings.Contains(err.Error(), "account_login") {
		t.Fatalf("overlong login written: %v", err)
	}
}

// TestCodecRefusesUnreadableWrites: what the format 2 reader refuses
// (invalid UTF-8, an empty token-field name, too many token fields) is
// refused on write, so no connection is stored that could never be read
// back.
func TestCodecRefusesUnreadableWrites(t *testing.T) {
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)
	base := vault.Connection{ID: "c1", Principal: vault.Principal{Issuer: "https://idp.example", Subject: "alice"}, Provider: "github",
		AccountID: "1", Status: vault.StatusActive, Created: t0, Updated: t0, Token: vault.TokenSet{AccessToken: "at"}}
	if _, err := EncodeConnection(kr, base); err != nil {
		t.Fatalf("the valid base: %v", err)
	}
	many := map[string]vault.Secret{}
	for i := range maxTokenFields + 1 {
		many[fmt.Sprintf("f%d", i)] = "v"
	}
	for name, mutate := range map[string]func(*vault.Connection){
		"login not UTF-8":        func(c *vault.Connection) { c.AccountLogin = "a\xffb" },
		"scope not UTF-8":        func(c *vault.Connection) { c.Scopes = []string{"repo", "\xc3"} },
		"access token not UTF-8": func(c *vault.Connection) { c.Token.AccessToken = "at\xfe" },
		"field value not UTF-8":  func(c *vault.Connection) { c.Token.Fields = map[string]vault.Secret{"api_key": "k\xff"} },
		"empty field name":       func(c *vault.Connection) { c.Token.Fields = map[string]vault.Secret{"": "v"} },
		"too many fields":        func(c *vault.Connection) { c.Token.Fields = many },
	} {
		c := base.Clone()
		mutate(&c)
		if _, err := EncodeConnection(kr, c); err == nil {
			t.Errorf("%s: EncodeConnection accepted a record the reader refuses", name)
		}
	}
}
