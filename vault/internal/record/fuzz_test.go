package record_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"credbroker/vault"
	"credbroker/vault/internal/record"
	"credbroker/vault/vaulttest"
)

// Seeds beyond testdata/fuzz: valid records made at run time (random nonces)
// and a few hostile shapes.
func addRecordSeeds(f *testing.F, kr *vault.Keyring) {
	rec, err := record.EncodeConnection(kr, vaulttest.Conn("c1", alice, "github", "1"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	if rec, err = record.EncodeConnection(kr, vaulttest.KeyConn("k1", alice, "jira", "1")); err != nil {
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
	// Extension areas (testdata/fuzz holds one in a sealed token set): a
	// newer broker's optional fields, a required one, tags out of order.
	f.Add(append(bytes.Clone(rec), 4, 3, 'n', 'e', 'w', 6, 0))
	f.Add(append(bytes.Clone(rec), 4, 0, 9, 1, 'r'))
	f.Add(append(bytes.Clone(rec), 6, 0, 4, 0))
}

func FuzzDecodeConnection(f *testing.F) {
	kr := fuzzKeyring(f)
	addRecordSeeds(f, kr)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := record.DecodeConnection(kr, b)
		meta, metaErr := record.ConnectionMeta(b)
		for _, err := range []error{err, metaErr} {
			if err != nil && !errors.Is(err, vault.ErrRecordFormat) && !errors.Is(err, vault.ErrMalformed) &&
				!errors.Is(err, vault.ErrDecrypt) && !errors.Is(err, vault.ErrUnknownKey) {
				t.Fatalf("error of no known kind: %v", err)
			}
		}
		if metaErr == nil {
			// Whatever reads as metadata converts to the JSON form and
			// back (format 2) to the same metadata; a format 2 record,
			// extension area included, to the same bytes.
			js, err := record.RecordJSON(b)
			if err != nil {
				t.Fatalf("RecordJSON of a readable record: %v", err)
			}
			rec, err := record.RecordFromJSON(js)
			if err != nil {
				t.Fatalf("RecordFromJSON(RecordJSON): %v", err)
			}
			m2, err := record.ConnectionMeta(rec)
			if err != nil || m2.ID != meta.ID || m2.Principal != meta.Principal || m2.Version != meta.Version ||
				!m2.Updated.Equal(meta.Updated) || !slices.Equal(m2.Scopes, meta.Scopes) || m2.SealedWith != meta.SealedWith {
				t.Fatalf("metadata changed through the JSON form: %+v vs %+v, %v", m2, meta, err)
			}
			if b[0] == 2 && !bytes.Equal(rec, b) {
				t.Fatalf("a format 2 record changed through the JSON form:\n%x\n%x", b, rec)
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
		rec, err := record.EncodeConnection(kr, c)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := record.DecodeConnection(kr, rec)
		if err != nil || !again.Token.Equal(c.Token) || again.Principal != c.Principal {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzDecodeGrant(f *testing.F) {
	g := vault.Grant{ID: "g1", Principal: alice, Provider: "github", Scopes: []string{"repo"}, ClientName: "c", Server: "demorepos", State: vault.GrantPending}
	rec, err := record.EncodeGrant(g)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(rec)
	f.Add([]byte(`{"v":1,"id":"g","created":"0001-01-01T00:00:00Z","rounds":-1}`))
	f.Add([]byte(`{"v":1,"id":"\ud800"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := record.DecodeGrant(b)
		if err != nil {
			return
		}
		if g.ID == "" {
			t.Fatal("decoded a grant without id")
		}
		rec, err := record.EncodeGrant(g)
		if err != nil {
			t.Fatalf("re-encode of a decoded grant: %v", err)
		}
		again, err := record.DecodeGrant(rec)
		if err != nil || again.ID != g.ID || again.Principal != g.Principal || again.State != g.State ||
			!again.Expires.Equal(g.Expires) || again.Rounds != g.Rounds || again.Server != g.Server || again.ClientName != g.ClientName {
			t.Fatalf("round trip: %+v vs %+v, %v", again, g, err)
		}
	})
}
