package provider

import (
	"slices"
	"testing"
)

// TestMissingScopesByName: the answer without the implied set (every
// wanted scope granted by name, aliases folded) is the one the implied
// set gives, for every pair of subsets of a catalogue with aliases and
// implications, order and repeats included.
func TestMissingScopesByName(t *testing.T) {
	p := &Provider{
		ScopeAliases: map[string]string{"user:email": "read:user", "r": "repo"},
		ScopeImplies: map[string][]string{"repo": {"public_repo", "repo:status"}, "admin": {"repo"}},
	}
	// The reference: MissingScopes as it was, the implied set alone.
	reference := func(granted, want []string) []string {
		cover := p.implied(granted)
		var m []string
		for _, s := range want {
			if !cover[p.canonicalScope(s)] {
				m = append(m, s)
			}
		}
		return m
	}
	names := []string{"read:user", "user:email", "repo", "r", "public_repo", "admin", "other"}
	subsets := func(yield func([]string) bool) {
		for mask := range 1 << len(names) {
			var s []string
			for i, n := range names {
				if mask&(1<<i) != 0 {
					s = append(s, n)
				}
			}
			if !yield(s) || !yield(append(slices.Clone(s), s...)) {
				return
			}
		}
	}
	byName := 0
	for granted := range subsets {
		for want := range subsets {
			got, ref := p.MissingScopes(granted, want), reference(granted, want)
			if !slices.Equal(got, ref) || (got == nil) != (ref == nil) {
				t.Fatalf("MissingScopes(%q, %q) = %q, want %q", granted, want, got, ref)
			}
			if p.holdsByName(granted, want) {
				byName++
			}
		}
	}
	if byName == 0 {
		t.Fatal("no pair took the by-name answer")
	}
}
