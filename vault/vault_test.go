package vault_test

import (
	"bytes"
	"errors"
	"testing"

	"credbroker/vault"
)

// fuzzKeyring is fixed so committed fuzz seeds stay valid.
func fuzzKeyring(t testing.TB) *vault.Keyring {
	t.Helper()
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

var (
	fuzzAAD       = []byte("credbroker/fuzz-aad")
	fuzzPlaintext = []byte("fuzz plaintext")
)

func TestKeyringWrongAndUnknownKey(t *testing.T) {
	kr := fuzzKeyring(t)
	ct := kr.Seal(fuzzPlaintext, fuzzAAD)
	other, _ := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{2}, 32)})
	unknown, _ := vault.NewKeyring([]string{"zz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	tests := []struct {
		name string
		kr   *vault.Keyring
		aad  []byte
		want error
	}{
		{"wrong key same id", other, fuzzAAD, vault.ErrDecrypt},
		{"unknown key id", unknown, fuzzAAD, vault.ErrUnknownKey},
		{"other aad", kr, []byte("credbroker/other"), vault.ErrDecrypt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pt, _, err := tt.kr.Open(ct, tt.aad)
			if !errors.Is(err, tt.want) || pt != nil {
				t.Fatalf("Open = %q, %v; want %v", pt, err, tt.want)
			}
		})
	}
	if pt, id, err := kr.Open(ct, fuzzAAD); err != nil || id != "fz" || !bytes.Equal(pt, fuzzPlaintext) {
		t.Fatalf("Open = %q %q %v", pt, id, err)
	}
	if _, err := kr.SealWith("nope", nil, nil); !errors.Is(err, vault.ErrUnknownKey) {
		t.Fatalf("SealWith unknown: %v", err)
	}
}
