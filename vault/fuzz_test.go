package vault_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"credbroker/vault"
	"credbroker/vault/vaulttest"
)

// Seeds beyond testdata/fuzz: valid records made at run time (random nonces)
// and a few hostile shapes.
func addRecordSeeds(f *testing.F, kr *vault.Keyring) {
	rec, err := vault.EncodeConnection(kr, vaulttest.Conn("c1", alice, "github", "1"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	if rec, err = vault.EncodeConnection(kr, vaulttest.KeyConn("k1", alice, "jira", "1")); err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"id":"x","tokens":"AQJmeg=="}`))
	f.Add([]byte(`{"v":1,"id":"x","tokens":"AP8="}`))
	f.Add([]byte(`{"v":2}`))
	f.Add([]byte(`null`))
	f.Add([]byte{})
	// Format 2 shapes: bare version bytes, a cut and an extended record,
	// a length running past the end, a non-minimal varint.
	f.Add([]byte{2})
	f.Add([]byte{3})
	f.Add(rec[:len(rec)/2])
	f.Add(append(bytes.Clone(rec), 0))
	f.Add([]byte{2, 0xff, 0xff, 0xff, 0xff, 0x0f, 'x'})
	f.Add([]byte{2, 0x81, 0x00})
}

func FuzzDecodeConnection(f *testing.F) {
	kr := fuzzKeyring(f)
	addRecordSeeds(f, kr)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := vault.DecodeConnection(kr, b)
		meta, metaErr := vault.ConnectionMeta(b)
		for _, err := range []error{err, metaErr} {
			if err != nil && !errors.Is(err, vault.ErrRecordFormat) && !errors.Is(err, vault.ErrMalformed) &&
				!errors.Is(err, vault.ErrDecrypt) && !errors.Is(err, vault.ErrUnknownKey) {
				t.Fatalf("error of no known kind: %v", err)
			}
		}
		if metaErr == nil {
			// Whatever reads as metadata converts to the JSON form and
			// back (format 2) to the same metadata.
			js, err := vault.RecordJSON(b)
			if err != nil {
				t.Fatalf("RecordJSON of a readable record: %v", err)
			}
			rec, err := vault.RecordFromJSON(js)
			if err != nil {
				t.Fatalf("RecordFromJSON(RecordJSON): %v", err)
			}
			m2, err := vault.ConnectionMeta(rec)
			if err != nil || m2.ID != meta.ID || m2.Principal != meta.Principal || m2.Version != meta.Version ||
				!m2.Updated.Equal(meta.Updated) || !slices.Equal(m2.Scopes, meta.Scopes) || m2.SealedWith != meta.SealedWith {
				t.Fatalf("metadata changed through the JSON form: %+v vs %+v, %v", m2, meta, err)
			}
		}
		if err != nil {
			if strings.Contains(err.Error(), "-secret") {
				t.Fatalf("error leaks token material: %v", err)
			}
			return
		}
		// Anything that opens must have authenticated under the fixed key,
		// so it is one of the seeds, and it must survive a round trip.
		if metaErr != nil || meta.ID != c.ID || c.SealedWith != "fz" {
			t.Fatalf("decoded %q but ConnectionMeta = %q, %v", c.ID, meta.ID, metaErr)
		}
		rec, err := vault.EncodeConnection(kr, c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := vault.DecodeConnection(kr, rec)
		if err != nil || !again.Token.Equal(c.Token) || again.Principal != c.Principal {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzDecodeGrant(f *testing.F) {
	g := vault.Grant{ID: "g1", Principal: alice, Provider: "github", Scopes: []string{"repo"}, ClientName: "c", Server: "demorepos", State: vault.GrantPending}
	rec, err := vault.EncodeGrant(g)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"id":"g","created":"0001-01-01T00:00:00Z","rounds":-1}`))
	f.Add([]byte(`{"v":1,"id":"\ud800"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := vault.DecodeGrant(b)
		if err != nil {
			return
		}
		if g.ID == "" {
			t.Fatal("decoded a grant without id")
		}
		rec, err := vault.EncodeGrant(g)
		if err != nil {
			t.Fatalf("re-encode of a decoded grant: %v", err)
		}
		again, err := vault.DecodeGrant(rec)
		if err != nil || again.ID != g.ID || again.Principal != g.Principal || again.State != g.State ||
			!again.Expires.Equal(g.Expires) || again.Rounds != g.Rounds || again.Server != g.Server || again.ClientName != g.ClientName {
			t.Fatalf("round trip: %+v vs %+v, %v", again, g, err)
		}
	})
}

func FuzzKeyringOpen(f *testing.F) {
	kr := fuzzKeyring(f)
	f.Add(kr.Seal(fuzzPlaintext, fuzzAAD), fuzzAAD)
	f.Add([]byte{1, 2, 'f', 'z'}, fuzzAAD)
	f.Add([]byte{1, 0}, []byte{})
	f.Add([]byte{1, 255, 'f'}, []byte{})
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, ct, aad []byte) {
		pt, id, err := kr.Open(ct, aad)
		if err != nil {
			if pt != nil {
				t.Fatal("plaintext returned with an error")
			}
			return
		}
		// Forging is infeasible: success means a genuine seed envelope.
		if id != "fz" || !bytes.Equal(pt, fuzzPlaintext) || !bytes.Equal(aad, fuzzAAD) {
			t.Fatalf("opened %q under key %q with aad %q", pt, id, aad)
		}
	})
}
