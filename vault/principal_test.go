package vault

import "testing"

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
