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
	if !got[0].Token.IsZero() || kr.Opens() != opens {
		t.Fatalf("a listing decrypted token sets (%d opens)", kr.Opens()-opens)
	}
	// An index entry that leads to someone else's record is corruption.
	bob := Principal{Issuer: "https://idp", Subject: "bob"}
	if _, err := DecodePrincipalConnections(bob, recs); !errors.Is(err, ErrMalformed) {
		t.Fatalf("listing alice's records as bob: %v, want ErrMalformed", err)
	}
}

// TestGrantRecordServer: the requesting server's name is stored with a
// grant, and records written before the field existed still decode (as
// no server), byte for byte otherwise.
func TestGrantRecordServer(t *testing.T) {
	old := []byte(`{"v":1,"id":"g1","iss":"https://idp","sub":"alice","provider":"demo","scopes":["repos"],` +
		`"client_name":"Claude","created":"2026-01-02T03:04:05Z","expires":"2026-01-02T03:14:05Z","state":"pending","version":1}`)
	g, err := DecodeGrant(old)
	if err != nil {
		t.Fatal(err)
	}
	if g.Server != "" || g.ClientName != "Claude" || g.Provider != "demo" || g.Version != 1 {
		t.Fatalf("old record decoded as %+v", g)
	}
	// Re-encoding a grant without a server writes no server member, so a
	// broker of the previous release reads it as before.
	again, err := EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(old) {
		t.Fatalf("re-encoded old record differs:\n%s\n%s", again, old)
	}
	g.Server = "demorepos"
	rec, err := EncodeGrant(g)
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeGrant(rec)
	if err != nil || back.Server != "demorepos" || back.ClientName != "Claude" {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	g.Server = "bad\xff"
	if _, err := EncodeGrant(g); err == nil {
		t.Fatal("a server name that is not UTF-8 was encoded")
	}
}
