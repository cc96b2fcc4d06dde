package provider

import (
	"slices"
	"strings"
)

// canonicalScope returns the catalogue's name for s (s itself unless it is
// one of the provider's aliases for another scope).
func (p *Provider) canonicalScope(s string) string {
	if c, ok := p.ScopeAliases[s]; ok {
		return c
	}
	return s
}

// NormalizeScopes returns scopes under their catalogue names (aliases
// replaced), deduplicated, in their first order. Use it on what a provider
// answers before storing or comparing it.
func (p *Provider) NormalizeScopes(scopes []string) []string {
	var out []string
	for _, s := range scopes {
		if c := p.canonicalScope(s); !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

// implied returns every scope granted covers: granted under its catalogue
// names plus, transitively, what scope_implies says each includes.
func (p *Provider) implied(granted []string) map[string]bool {
	cover := map[string]bool{}
	queue := p.NormalizeScopes(granted)
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		if cover[s] {
			continue
		}
		cover[s] = true
		queue = append(queue, p.ScopeImplies[s]...)
	}
	return cover
}

// MissingScopes returns the scopes of want that granted does not cover:
// names are compared under their catalogue names (scope_aliases), and a
// granted scope covers the scopes it implies (scope_implies).
func (p *Provider) MissingScopes(granted, want []string) []string {
	if p.holdsByName(granted, want) {
		return nil // what most checks find, without building the implied set
	}
	cover := p.implied(granted)
	var m []string
	for _, s := range want {
		if !cover[p.canonicalScope(s)] {
			m = append(m, s)
		}
	}
	return m
}

// holdsByName reports whether granted names every scope of want itself,
// under their catalogue names (then MissingScopes has nothing to say).
func (p *Provider) holdsByName(granted, want []string) bool {
	for _, s := range want {
		c := p.canonicalScope(s)
		if !slices.ContainsFunc(granted, func(g string) bool { return p.canonicalScope(g) == c }) {
			return false
		}
	}
	return true
}

// UnionScopes returns a followed by the scopes of b that a does not
// already cover, under their catalogue names: what to ask for when a
// connection holding a must also cover b.
func (p *Provider) UnionScopes(a, b []string) []string {
	out := p.NormalizeScopes(a)
	cover := p.implied(out)
	for _, s := range p.NormalizeScopes(b) {
		if !cover[s] {
			out = append(out, s)
			cover[s] = true
		}
	}
	return out
}

// ParseScopeAnswer splits a token endpoint's scope answer (space-separated
// per RFC 6749, comma-separated at GitHub).
func ParseScopeAnswer(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ' ' || r == ',' })
}
