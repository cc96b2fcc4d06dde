// Package untrusted renders text the broker did not write (provider
// names, account logins, client names, error descriptions) for messages
// and pages: bounded, and quoted where it sits inside a sentence.
package untrusted

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Clip returns s cut to at most n runes, with "…" when it was cut, and
// never splits a UTF-8 sequence (invalid bytes become U+FFFD).
func Clip(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

// ClipBytes returns s cut to at most n bytes, "…" included when it was
// cut, and never splits a UTF-8 sequence (invalid bytes become U+FFFD):
// a bound on what is relayed, where Clip bounds what is read.
func ClipBytes(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	const more = "…"
	cut := max(n-len(more), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	if cut == 0 && n < len(more) {
		return ""
	}
	return s[:cut] + more
}

// Quote renders s for a message: clipped to 64 runes, Go-quoted so
// control characters and quotes are escaped.
func Quote(s string) string {
	return fmt.Sprintf("%q", Clip(s, 64))
}
