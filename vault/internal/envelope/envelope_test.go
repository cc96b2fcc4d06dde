package envelope_test

import (
	"errors"
	"strings"
	"testing"

	"credbroker/vault"
	"credbroker/vault/internal/envelope"
)

func TestKeyID(t *testing.T) {
	kr, err := vault.ParseKeys("k-new:" + strings.Repeat("A", 43) + "=\nk-old:" + strings.Repeat("B", 43) + "=")
	if err != nil {
		t.Fatal(err)
	}
	sealed := kr.Seal([]byte("token"), []byte("aad"))
	if id, err := envelope.KeyID(sealed); err != nil || id != "k-new" {
		t.Fatalf("KeyID(sealed) = %q, %v; want k-new", id, err)
	}
	old, err := kr.SealWith("k-old", []byte("token"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if id, err := envelope.KeyID(old); err != nil || id != "k-old" {
		t.Fatalf("KeyID(sealed with k-old) = %q, %v", id, err)
	}
	long := append([]byte{envelope.V1, envelope.MaxKeyID + 1}, strings.Repeat("k", envelope.MaxKeyID+1)...)
	for name, ct := range map[string][]byte{
		"empty":        nil,
		"version only": {envelope.V1},
		"version 2":    append([]byte{0x02}, sealed[1:]...),
		"empty id":     {envelope.V1, 0, 'x'},
		"id too long":  long,
		"id cut short": sealed[:2+len("k-new")-1],
	} {
		if id, err := envelope.KeyID(ct); !errors.Is(err, vault.ErrMalformed) || id != "" {
			t.Errorf("%s: KeyID = %q, %v; want ErrMalformed", name, id, err)
		}
	}
	if _, rest, err := envelope.Split(sealed); err != nil || len(rest) != len(sealed)-2-len("k-new") {
		t.Errorf("Split: rest is %d bytes, %v", len(rest), err)
	}
}
