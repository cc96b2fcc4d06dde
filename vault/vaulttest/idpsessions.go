package vaulttest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"credbroker/vault"
)

// RunIdPSessions is the conformance suite of vault.IdPSessionStore: a
// session round-trips with its tokens; a sign-in replaces it (Created
// kept, version one up); updates are compare-and-swaps that refuse a
// stale version or another person, change nothing when they fail and
// lose nothing under concurrency across handles; people whose issuer and
// subject run into each other stay apart; a deleted session is gone.
func RunIdPSessions(t *testing.T, newStores NewHandles[vault.IdPSessionStore]) {
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	session := func(p vault.Principal, rt string) vault.IdPSession {
		return vault.IdPSession{Principal: p, RefreshToken: vault.Secret(rt), IDToken: vault.Secret("idt-" + rt),
			IDTokenExpires: t0.Add(time.Hour), Created: t0, Updated: t0}
	}
	t.Run("Missing", func(t *testing.T) {
		a, _ := newStores(t)
		if _, err := a.GetIdPSession(t.Context(), alice); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("get: %v, want ErrNotFound", err)
		}
		_, err := a.UpdateIdPSession(t.Context(), alice, func(s vault.IdPSession) (vault.IdPSession, error) { return s, nil })
		if !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("update: %v, want ErrNotFound", err)
		}
		if err := a.DeleteIdPSession(t.Context(), alice); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("delete: %v, want ErrNotFound", err)
		}
	})
	t.Run("PutGetReplace", func(t *testing.T) {
		a, b := newStores(t)
		put, err := a.PutIdPSession(t.Context(), session(alice, "rt-1"))
		if err != nil {
			t.Fatal(err)
		}
		if put.Version != 1 {
			t.Errorf("first put: version %d, want 1", put.Version)
		}
		got, err := b.GetIdPSession(t.Context(), alice)
		if err != nil {
			t.Fatal(err)
		}
		if got.RefreshToken != "rt-1" || got.IDToken != "idt-rt-1" || !got.IDTokenExpires.Equal(t0.Add(time.Hour)) ||
			!got.Created.Equal(t0) || !got.Updated.Equal(t0) || got.Version != 1 || got.Principal != alice {
			t.Errorf("read back %+v", got)
		}
		again := session(alice, "rt-2")
		again.Created, again.Updated = t0.Add(time.Minute), t0.Add(time.Minute)
		if put, err = b.PutIdPSession(t.Context(), again); err != nil {
			t.Fatal(err)
		}
		got, err = a.GetIdPSession(t.Context(), alice)
		if err != nil {
			t.Fatal(err)
		}
		if put.Version != 2 || got.Version != 2 || got.RefreshToken != "rt-2" || !got.Created.Equal(t0) || !got.Updated.Equal(t0.Add(time.Minute)) {
			t.Errorf("a sign-in replaced it with %+v (answered %+v): want rt-2, version 2, Created kept", got, put)
		}
	})
	t.Run("UpdateRules", func(t *testing.T) {
		a, b := newStores(t)
		if _, err := a.PutIdPSession(t.Context(), session(alice, "rt-1")); err != nil {
			t.Fatal(err)
		}
		up, err := b.UpdateIdPSession(t.Context(), alice, func(s vault.IdPSession) (vault.IdPSession, error) {
			s.RefreshToken, s.IDToken, s.Updated = "rt-2", "idt-2", t0.Add(time.Minute)
			return s, nil
		})
		if err != nil || up.Version != 2 || up.RefreshToken != "rt-2" {
			t.Fatalf("update: %+v, %v", up, err)
		}
		refusals := map[string]func(vault.IdPSession) (vault.IdPSession, error){
			"stale version": func(s vault.IdPSession) (vault.IdPSession, error) {
				s.Version--
				s.RefreshToken = "stale"
				return s, nil
			},
			"another person": func(s vault.IdPSession) (vault.IdPSession, error) {
				s.Principal.Subject = "mallory"
				return s, nil
			},
			"fn's error": func(s vault.IdPSession) (vault.IdPSession, error) {
				s.RefreshToken = "from a failed update"
				return s, errSentinel
			},
		}
		for name, fn := range refusals {
			_, err := a.UpdateIdPSession(t.Context(), alice, fn)
			switch {
			case err == nil:
				t.Errorf("%s: accepted", name)
			case name == "stale version" && !errors.Is(err, vault.ErrConflict):
				t.Errorf("%s: %v, want ErrConflict", name, err)
			case name == "fn's error" && !errors.Is(err, errSentinel):
				t.Errorf("%s: %v, want fn's error as is", name, err)
			}
		}
		got, err := b.GetIdPSession(t.Context(), alice)
		if err != nil || got.RefreshToken != "rt-2" || got.Version != 2 {
			t.Errorf("after refused updates: %+v, %v; want rt-2 at version 2", got, err)
		}
		if _, err := a.GetIdPSession(t.Context(), vault.Principal{Issuer: alice.Issuer, Subject: "mallory"}); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("a refused update stored a session for another person: %v", err)
		}
	})
	t.Run("ConcurrentUpdatesLoseNothing", func(t *testing.T) {
		a, b := newStores(t)
		if _, err := a.PutIdPSession(t.Context(), session(alice, "")); err != nil {
			t.Fatal(err)
		}
		const n = 16
		var wg sync.WaitGroup
		for i := range n {
			st := a
			if i%2 == 1 {
				st = b
			}
			wg.Go(func() {
				_, err := st.UpdateIdPSession(t.Context(), alice, func(s vault.IdPSession) (vault.IdPSession, error) {
					s.RefreshToken += "x"
					return s, nil
				})
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		got, err := a.GetIdPSession(t.Context(), alice)
		if err != nil || len(got.RefreshToken) != n || got.Version != n+1 {
			t.Fatalf("after %d concurrent updates: %q at version %d (%v)", n, got.RefreshToken.Reveal(), got.Version, err)
		}
	})
	t.Run("PeopleApart", func(t *testing.T) {
		a, b := newStores(t)
		people := []vault.Principal{{Issuer: "a", Subject: "bc"}, {Issuer: "ab", Subject: "c"}, {Issuer: "a\x00b", Subject: "c"},
			{Issuer: "https://idp.example", Subject: "alice\x00"}, alice}
		for i, p := range people {
			if _, err := a.PutIdPSession(t.Context(), session(p, string(rune('A'+i)))); err != nil {
				t.Fatalf("%q: %v", p, err)
			}
		}
		for i, p := range people {
			got, err := b.GetIdPSession(t.Context(), p)
			if err != nil || got.Principal != p || got.RefreshToken.Reveal() != string(rune('A'+i)) {
				t.Errorf("%q: %+v, %v", p, got, err)
			}
		}
		if err := b.DeleteIdPSession(t.Context(), alice); err != nil {
			t.Fatal(err)
		}
		if _, err := a.GetIdPSession(t.Context(), alice); !errors.Is(err, vault.ErrNotFound) {
			t.Errorf("deleted, then: %v", err)
		}
		if _, err := a.GetIdPSession(t.Context(), people[0]); err != nil {
			t.Errorf("deleting alice's took another's: %v", err)
		}
	})
	t.Run("NoPersonRefused", func(t *testing.T) {
		a, _ := newStores(t)
		if _, err := a.PutIdPSession(t.Context(), session(vault.Principal{Issuer: "https://idp.example"}, "rt")); err == nil {
			t.Error("a session without a subject was stored")
		}
	})
}

var errSentinel = errors.New("vaulttest: the update function's own error")

// RunIdPSessionRotation checks that key rotation covers IdP sessions
// (runRotation). open opens the one store of the test with kr, each time
// anew.
func RunIdPSessionRotation(t *testing.T, open func(t *testing.T, kr *vault.Keyring) KeyUser) {
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	check := func(s KeyUser, when string) {
		got, err := s.IdPSessions().GetIdPSession(t.Context(), alice)
		if err != nil || got.RefreshToken != "rt" || got.IDToken != "idt" {
			t.Fatalf("%s: %+v, %v", when, got, err)
		}
	}
	runRotation(t, open, func(s KeyUser) {
		if _, err := s.IdPSessions().PutIdPSession(t.Context(), vault.IdPSession{Principal: alice, RefreshToken: "rt", IDToken: "idt",
			Updated: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}, func(s KeyUser, _ string) { check(s, "before the rotation") }, func(s KeyUser, _ string) { check(s, "with the old key gone") })
}
