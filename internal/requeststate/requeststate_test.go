package requeststate

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"credbroker/vault"
)

var epoch = time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)

func testKeys(t testing.TB) *vault.Keyring {
	kr, err := vault.NewKeyring([]string{"k1"}, [][]byte{bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	return kr.Derive("requestState")
}

func TestSealOpen(t *testing.T) {
	keys := testKeys(t)
	alice := vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	bob := vault.Principal{Issuer: "https://idp.test", Subject: "bob"}
	d1, _ := Digest(json.RawMessage(`{"provider":"github","scopes":["a"]}`))
	d2, _ := Digest(json.RawMessage(`{ "scopes" : ["a"], "provider":"github" }`))
	if !bytes.Equal(d1, d2) {
		t.Fatal("the digest depends on formatting and key order")
	}
	other, _ := Digest(json.RawMessage(`{"provider":"google"}`))
	st := Seal(keys, State{Principal: alice, Operation: "connect_account", ArgDigest: d1, Ref: "g1", Expires: epoch.Add(time.Minute)})
	got, err := Open(keys, st, alice, "connect_account", d2, epoch)
	if err != nil || got.Ref != "g1" || got.Principal != alice || !got.Expires.Equal(epoch.Add(time.Minute)) {
		t.Fatalf("Open = %+v, %v", got, err)
	}
	otherKeys, _ := vault.ParseKeys(vault.GenerateKey())
	for name, try := range map[string]func() error{
		"another person":    func() error { _, err := Open(keys, st, bob, "connect_account", d1, epoch); return err },
		"another operation": func() error { _, err := Open(keys, st, alice, "provider_request", d1, epoch); return err },
		"other arguments":   func() error { _, err := Open(keys, st, alice, "connect_account", other, epoch); return err },
		"expired": func() error {
			_, err := Open(keys, st, alice, "connect_account", d1, epoch.Add(time.Minute))
			return err
		},
		"another key": func() error { _, err := Open(otherKeys, st, alice, "connect_account", d1, epoch); return err },
		"truncated":   func() error { _, err := Open(keys, st[:len(st)-2], alice, "connect_account", d1, epoch); return err },
		"empty":       func() error { _, err := Open(keys, "", alice, "connect_account", d1, epoch); return err },
	} {
		if err := try(); err != ErrInvalid {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
}

// FuzzOpen opens arbitrary strings: nothing but a state sealed for this
// principal, operation and arguments opens, and every failure is ErrInvalid.
func FuzzOpen(f *testing.F) {
	keys := testKeys(f)
	p := vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	digest, _ := Digest(json.RawMessage(`{"provider":"github"}`))
	valid := Seal(keys, State{Principal: p, Operation: "connect_account", ArgDigest: digest, Ref: "g", Expires: epoch.Add(time.Minute)})
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(string(keys.Seal([]byte(`{"v":1}`), []byte("credbroker/legacySession/v1"))))
	f.Fuzz(func(t *testing.T, s string) {
		st, err := Open(keys, s, p, "connect_account", digest, epoch)
		if err != nil {
			if err != ErrInvalid {
				t.Fatalf("error %v is not the uniform error", err)
			}
			return
		}
		if st.Principal != p || st.Operation != "connect_account" || !bytes.Equal(st.ArgDigest, digest) {
			t.Fatalf("opened a state not bound to this call: %+v", st)
		}
	})
}
