package record_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"testing"

	"credbroker/vault"
	"credbroker/vault/internal/record"
	"credbroker/vault/vaulttest"
)

var alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

// fuzzKeyring is fixed so committed fuzz seeds stay valid.
func fuzzKeyring(t testing.TB) *vault.Keyring {
	t.Helper()
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func wantCryptoErr(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, vault.ErrDecrypt) && !errors.Is(err, vault.ErrMalformed) && !errors.Is(err, vault.ErrUnknownKey) {
		t.Fatalf("err = %v; want ErrDecrypt, ErrMalformed or ErrUnknownKey", err)
	}
}

// recordTokens returns a stored record's JSON form (record.RecordJSON) as a
// map and its sealed token set.
func recordTokens(t *testing.T, rec []byte) (map[string]any, []byte) {
	t.Helper()
	js, err := record.RecordJSON(rec)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		t.Fatal(err)
	}
	ct, err := base64.StdEncoding.DecodeString(m["tokens"].(string))
	if err != nil {
		t.Fatal(err)
	}
	return m, ct
}

// withTokens returns the record (in the format EncodeConnection writes)
// of JSON form m with token set ct.
func withTokens(t *testing.T, m map[string]any, ct []byte) []byte {
	t.Helper()
	m["tokens"] = base64.StdEncoding.EncodeToString(ct)
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := record.RecordFromJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestCodecTamperEveryByte(t *testing.T) {
	for name, c := range map[string]vault.Connection{
		"oauth":   vaulttest.Conn("c1", alice, "github", "1"),
		"api key": vaulttest.KeyConn("k1", alice, "jira", "1"),
	} {
		t.Run(name, func(t *testing.T) { tamperEveryByte(t, c) })
	}
}

func tamperEveryByte(t *testing.T, c vault.Connection) {
	kr := fuzzKeyring(t)
	rec, err := record.EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	m, ct := recordTokens(t, rec)
	for i := range ct {
		for bit := range 8 {
			bad := bytes.Clone(ct)
			bad[i] ^= 1 << bit
			_, err := record.DecodeConnection(kr, withTokens(t, m, bad))
			if err == nil {
				t.Fatalf("byte %d bit %d flipped: decoded", i, bit)
			}
			wantCryptoErr(t, err)
		}
	}
	for n := range len(ct) {
		_, err := record.DecodeConnection(kr, withTokens(t, m, ct[:n]))
		wantCryptoErr(t, err)
	}
}

// TestCodecOpensRecordsWrittenBeforeKeyFields: a record sealed by the
// codec before API-key fields existed (testdata, written with the fixed
// fuzz key) still opens, with its tokens and no fields, and re-encodes.
func TestCodecOpensRecordsWrittenBeforeKeyFields(t *testing.T) {
	kr := fuzzKeyring(t)
	rec, err := os.ReadFile("testdata/connection-before-key-fields.json")
	if err != nil {
		t.Fatal(err)
	}
	c, err := record.DecodeConnection(kr, bytes.TrimSpace(rec))
	if err != nil {
		t.Fatalf("an old record does not open: %v", err)
	}
	want := vaulttest.Conn("old1", alice, "github", "1")
	if !c.Token.Equal(want.Token) || c.Token.Fields != nil || c.AccountLogin != want.AccountLogin {
		t.Fatalf("old record opened as %+v", c)
	}
	again, err := record.EncodeConnection(kr, c)
	if err != nil {
		t.Fatal(err)
	}
	if c2, err := record.DecodeConnection(kr, again); err != nil || !c2.Token.Equal(want.Token) {
		t.Fatalf("re-encoded old record: %v", err)
	}
}

func TestCodecMovedCiphertext(t *testing.T) {
	kr := fuzzKeyring(t)
	src, _ := record.EncodeConnection(kr, vaulttest.Conn("c1", alice, "github", "1"))
	_, ct := recordTokens(t, src)
	tests := []struct {
		name string
		c    vault.Connection
	}{
		{"other id", vaulttest.Conn("c2", alice, "github", "1")},
		{"other subject", vaulttest.Conn("c1", vault.Principal{Issuer: alice.Issuer, Subject: "bob"}, "github", "1")},
		{"other issuer", vaulttest.Conn("c1", vault.Principal{Issuer: "https://evil", Subject: "alice"}, "github", "1")},
		{"other provider", vaulttest.Conn("c1", alice, "google", "1")},
		{"other account", vaulttest.Conn("c1", alice, "github", "2")},
		{"boundary shift", vaulttest.Conn("c", vault.Principal{Issuer: alice.Issuer, Subject: "1alice"}, "github", "1")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst, _ := record.EncodeConnection(kr, tt.c)
			m, _ := recordTokens(t, dst)
			_, err := record.DecodeConnection(kr, withTokens(t, m, ct))
			if !errors.Is(err, vault.ErrDecrypt) {
				t.Fatalf("err = %v, want ErrDecrypt", err)
			}
		})
	}
}
