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

// Quote renders s for a message: clipped to 64 runes, Go-quoted so
// control characters and quotes are escaped.
func Quote(s string) string {
	return fmt.Sprintf("%q", Clip(s, 64))
}
