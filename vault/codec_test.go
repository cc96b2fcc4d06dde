package vault

import (
	"errors"
	"testing"
)

func TestDecodePrincipalConnections(t *testing.T) {
	kr, err := ParseKeys(GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	alice := Principal{Issuer: "https://idp", Subject: "alice"}
	var recs [][]byte
	for _, id := range []string{"c1", "c2"} {
		b, err := EncodeConnection(kr, Connection{ID: id, Principal: alice, Provider: "demo", AccountID: id, Token: TokenSet{AccessToken: "at"}})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, b)
	}
	opens := kr.Opens()
	got, err := DecodePrincipalConnections(alice, recs)
	if err != nil || len(got) != 2 || got[0].ID != "c1" || got[1].AccountID != "c2" || got[1].SealedWith != kr.Primary() {
		t.Fatalf("got %v %v", got, err)
	}
	if got[0].Token != (TokenSet{}) || kr.Opens() != opens {
		t.Fatalf("a listing decrypted token sets (%d opens)", kr.Opens()-opens)
	}
	// An index entry that leads to someone else's record is corruption.
	bob := Principal{Issuer: "https://idp", Subject: "bob"}
	if _, err := DecodePrincipalConnections(bob, recs); !errors.Is(err, ErrMalformed) {
		t.Fatalf("listing alice's records as bob: %v, want ErrMalformed", err)
	}
}
