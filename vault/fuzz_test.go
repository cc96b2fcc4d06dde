package vault_test

import (
	"bytes"
	"testing"
)

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
