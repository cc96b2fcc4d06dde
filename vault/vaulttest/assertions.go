package vaulttest

import (
	"errors"
	"testing"
	"time"

	"credbroker/vault"
)

// RunAssertions is the conformance suite of vault.AssertionLedger: an
// assertion is spent once, across handles and under concurrency; a
// refused or malformed spend stores nothing; expired records are
// collected and only they.
func RunAssertions(t *testing.T, newLedgers NewHandles[vault.AssertionLedger]) {
	t.Run("SpendOnce", func(t *testing.T) {
		a, b := newLedgers(t)
		k := vault.AssertionKey("https://idp.example", "jti-1")
		exp := time.Now().Add(5 * time.Minute)
		if err := a.SpendAssertion(t.Context(), k, exp); err != nil {
			t.Fatal(err)
		}
		for i, l := range []vault.AssertionLedger{a, b} {
			if err := l.SpendAssertion(t.Context(), k, exp); !errors.Is(err, vault.ErrAssertionSpent) {
				t.Fatalf("second spend on handle %d: %v, want ErrAssertionSpent", i, err)
			}
		}
		// The same jti from another issuer is another assertion.
		if err := b.SpendAssertion(t.Context(), vault.AssertionKey("https://other.example", "jti-1"), exp); err != nil {
			t.Fatalf("the same jti of another issuer: %v", err)
		}
	})
	t.Run("ConcurrentSpendsOneWins", func(t *testing.T) {
		a, b := newLedgers(t)
		k := vault.AssertionKey("https://idp.example", "raced")
		exp := time.Now().Add(5 * time.Minute)
		won := concurrently(t, 16, vault.ErrAssertionSpent, func(i int) error {
			if i%2 == 1 {
				return b.SpendAssertion(t.Context(), k, exp)
			}
			return a.SpendAssertion(t.Context(), k, exp)
		})
		if won != 1 {
			t.Fatalf("%d spends succeeded and %d were refused; want 1 and 15", won, 16-won)
		}
	})
	t.Run("MalformedKeyStoresNothing", func(t *testing.T) {
		a, _ := newLedgers(t)
		for _, k := range []string{"", "jti-in-clear", vault.AssertionKey("i", "j") + "x", "!" + vault.AssertionKey("i", "j")[1:]} {
			if err := a.SpendAssertion(t.Context(), k, time.Now().Add(time.Minute)); err == nil || errors.Is(err, vault.ErrAssertionSpent) {
				t.Errorf("key %q: %v, want a malformed-key error", k, err)
			}
		}
		if n, err := a.DeleteSpentAssertions(t.Context(), time.Now().Add(time.Hour)); err != nil || n != 0 {
			t.Fatalf("a malformed key was stored: %d records, %v", n, err)
		}
	})
	t.Run("DeleteExpired", func(t *testing.T) {
		a, b := newLedgers(t)
		now := time.Now()
		old, live := vault.AssertionKey("i", "old"), vault.AssertionKey("i", "live")
		if err := a.SpendAssertion(t.Context(), old, now.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if err := a.SpendAssertion(t.Context(), live, now.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		n, err := b.DeleteSpentAssertions(t.Context(), now)
		if err != nil || n != 1 {
			t.Fatalf("DeleteSpentAssertions = %d, %v; want 1", n, err)
		}
		if err := a.SpendAssertion(t.Context(), live, now.Add(time.Minute)); !errors.Is(err, vault.ErrAssertionSpent) {
			t.Fatalf("the live record was collected: %v", err)
		}
		if err := a.SpendAssertion(t.Context(), old, now.Add(time.Minute)); err != nil {
			t.Fatalf("the collected record still refuses: %v", err)
		}
	})
}
