package authserver

import (
	"errors"
	"testing"
	"time"

	"credbroker/internal/bearer"
	"credbroker/vault"
)

// TestAudienceChecked: the verifier accepts only tokens whose aud names
// this broker's MCP resource. Each token below is otherwise valid (the
// broker's issuer, keys the broker trusts, a live token family in the
// store), so the audience check is the only thing that refuses it.
func TestAudienceChecked(t *testing.T) {
	h := newHarness(t)
	alice := vault.Principal{Issuer: testIdP, Subject: "alice"}

	t.Run("own keys, another audience", func(t *testing.T) {
		good, _, err := h.as.MintAccessToken(t.Context(), alice, "urn:credbroker:test", "Test", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.verify(good); err != nil {
			t.Fatalf("the untouched token: %v", err)
		}
		c, err := h.as.keys.parse(good)
		if err != nil {
			t.Fatal(err)
		}
		for _, aud := range [][]string{{"https://other.example/mcp"}, {h.srv.URL + "/mcp/u/github"}, {h.srv.URL}, {}} {
			c.Audience = aud
			forged, err := h.as.keys.sign(c)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.verify(forged); !errors.Is(err, bearer.ErrInvalidToken) {
				t.Errorf("aud %q: %v, want ErrInvalidToken", aud, err)
			}
		}
	})

	t.Run("second broker sharing the key file, another resource", func(t *testing.T) {
		// The second broker shares the key ring, the store and even the
		// public URL (as a gateway endpoint of the same deployment
		// would); only its resource differs.
		o := h.opts
		o.Resource = h.srv.URL + "/other-mcp"
		other, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		tok, _, err := other.MintAccessToken(t.Context(), alice, "urn:credbroker:test-other", "Other", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Verifier()(t.Context(), tok); err != nil {
			t.Fatalf("the second broker refuses its own token: %v", err)
		}
		if err := h.verify(tok); !errors.Is(err, bearer.ErrInvalidToken) {
			t.Fatalf("the second broker's token at the first: %v, want ErrInvalidToken", err)
		}
		// And the other way round.
		mine, _, err := h.as.MintAccessToken(t.Context(), alice, "urn:credbroker:test", "Test", "", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := other.Verifier()(t.Context(), mine); !errors.Is(err, bearer.ErrInvalidToken) {
			t.Fatalf("the first broker's token at the second: %v, want ErrInvalidToken", err)
		}
	})
}
