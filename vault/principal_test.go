package vault

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"testing"
)

// TestPrincipalSame: the one comparison of principals is both fields,
// both set, and not fooled by moving bytes from one field to the other.
func TestPrincipalSame(t *testing.T) {
	alice := Principal{Issuer: "https://idp.example", Subject: "alice"}
	for _, tt := range []struct {
		a, b Principal
		want bool
	}{
		{alice, alice, true},
		{alice, Principal{Issuer: alice.Issuer, Subject: "bob"}, false},
		{alice, Principal{Issuer: "https://other.example", Subject: "alice"}, false},
		{Principal{}, Principal{}, false},
		{Principal{Issuer: "x"}, Principal{Issuer: "x"}, false},
		{Principal{Issuer: "ab", Subject: "c"}, Principal{Issuer: "a", Subject: "bc"}, false},
	} {
		if got := tt.a.Same(tt.b); got != tt.want {
			t.Errorf("%v.Same(%v) = %v", tt.a, tt.b, got)
		}
	}
}

// TestPrincipalKeyUnchanged: Principal.Key is what pgstore's connections
// trigger computes, so its one-buffer form must give the streamed hash's
// bytes, for short and long (past the stack buffer) principals, NUL and
// non-ASCII bytes included.
func TestPrincipalKeyUnchanged(t *testing.T) {
	streamed := func(p Principal) string {
		h := sha256.New()
		h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(p.Issuer))))
		h.Write([]byte(p.Issuer))
		h.Write([]byte(p.Subject))
		return hex.EncodeToString(h.Sum(nil))
	}
	for _, p := range []Principal{
		{},
		{Issuer: "https://idp.test/é", Subject: "al\x00ice"},
		{Issuer: "ab", Subject: "c"},
		{Issuer: "a", Subject: "bc"},
		{Issuer: strings.Repeat("i", 300), Subject: "s"},
		{Issuer: "https://idp.example", Subject: strings.Repeat("s", 1000)},
	} {
		if got, want := p.Key(), streamed(p); got != want {
			t.Errorf("Key(%q) = %s, want %s", p, got, want)
		}
	}
	if got := testing.AllocsPerRun(100, func() { Principal{Issuer: "https://idp.example", Subject: "alice"}.Key() }); got > 1 {
		t.Errorf("Key allocates %v times, want 1 (its string)", got)
	}
}
