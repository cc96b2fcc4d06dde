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
	got, err := DecodePrincipalConnections(kr, alice, recs)
	if err != nil || len(got) != 2 || got[0].ID != "c1" || got[1].Token.AccessToken.Reveal() != "at" {
		t.Fatalf("got %v %v", got, err)
	}
	// An index entry that leads to someone else's record is corruption.
	bob := Principal{Issuer: "https://idp", Subject: "bob"}
	if _, err := DecodePrincipalConnections(kr, bob, recs); !errors.Is(err, ErrMalformed) {
		t.Fatalf("listing alice's records as bob: %v, want ErrMalformed", err)
	}
}
