package authserver

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
)

// BenchmarkVerifier measures what a broker-issued token costs an MCP
// request: a cached signature check plus the token family's liveness read
// from the store (bbolt here), which makes revocation immediate.
func BenchmarkVerifier(b *testing.B) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		b.Fatal(err)
	}
	store, err := boltstore.Open(filepath.Join(b.TempDir(), "b.db"), kr, boltstore.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	as, err := New(Options{PublicURL: "https://broker.example", IdPIssuer: testIdP, Store: store, Keys: kr,
		Person: func(*http.Request) (Person, bool) { return Person{}, false }, StartSignIn: func(http.ResponseWriter, *http.Request, string) {}})
	if err != nil {
		b.Fatal(err)
	}
	tok, _, err := as.MintAccessToken(b.Context(), vault.Principal{Issuer: testIdP, Subject: "alice"}, "urn:credbroker:bench", "bench", "", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	verify := as.Verifier()
	b.Run("cached signature, family read", func(b *testing.B) {
		for b.Loop() {
			if _, err := verify(b.Context(), tok); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("signature only, uncached", func(b *testing.B) {
		for b.Loop() {
			if _, err := as.verifySigned(b.Context(), tok, as.opts.Resource); err != nil {
				b.Fatal(err)
			}
		}
	})
}
