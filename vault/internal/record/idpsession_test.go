package record_test

import (
	"errors"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/internal/record"
)

// TestIdPSessionBoundToItsPerson: the sealed tokens of one person's
// session do not open in a record naming another person.
func TestIdPSessionBoundToItsPerson(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	rec, err := record.EncodeIdPSession(kr, vault.IdPSession{Principal: alice, RefreshToken: "rt", IDToken: "idt", Updated: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	moved := []byte(string(rec))
	i := len(`{"v":1,"iss":"https://idp.example","sub":"`)
	if string(moved[:i]) != `{"v":1,"iss":"`+alice.Issuer+`","sub":"` {
		t.Fatalf("unexpected record shape %s", rec)
	}
	moved[i] = 'm' // alice → mlice
	if _, err := record.DecodeIdPSession(kr, moved); !errors.Is(err, vault.ErrDecrypt) {
		t.Fatalf("a session moved to another person: %v, want ErrDecrypt", err)
	}
	if _, err := record.DecodeIdPSession(kr, rec); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeIdPSession(f *testing.F) {
	kr := fuzzKeyring(f)
	rec, err := record.EncodeIdPSession(kr, vault.IdPSession{Principal: alice, RefreshToken: "rt", IDToken: "idt",
		IDTokenExpires: time.Unix(1900000000, 0), Version: 3})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"iss":"i","sub":"s","tokens":""}`))
	f.Add([]byte(`{"v":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := record.DecodeIdPSession(kr, b)
		meta, metaErr := record.IdPSessionMeta(b)
		if err != nil {
			return
		}
		// What opens reads the same as metadata and encodes to a record
		// that opens to the same session.
		if metaErr != nil || meta.Principal != s.Principal || meta.Version != s.Version {
			t.Fatalf("opened %+v but metadata %+v, %v", s, meta, metaErr)
		}
		again, err := record.EncodeIdPSession(kr, s)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		s2, err := record.DecodeIdPSession(kr, again)
		if err != nil || s2.RefreshToken != s.RefreshToken || s2.IDToken != s.IDToken || s2.Principal != s.Principal {
			t.Fatalf("round trip: %+v, %v", s2, err)
		}
	})
}
