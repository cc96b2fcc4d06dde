// Package plainjson holds the pieces the broker's reflection-free JSON
// fast paths share (grant records in vault, the request state's plaintext
// in requeststate, requests in mcpapi): reading a string that
// encoding/json would return verbatim, reading a small non-negative
// integer, and writing a string that encoding/json would write verbatim.
// Each fast path hands anything these refuse to encoding/json, so they
// only ever decide "simple enough", never what a value means.
package plainjson

import "unicode/utf8"

// String reads the string starting at b[i], which must be '"', when it has
// no escape and no control byte and is valid UTF-8: what encoding/json
// returns unchanged. Its contents are b[start:end]; the next value starts
// at end+1.
func String(b []byte, i int) (start, end int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return 0, 0, false
	}
	start, ascii := i+1, true
	for j := start; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !ascii && !utf8.Valid(b[start:j]) {
				return 0, 0, false
			}
			return start, j, true
		case c == '\\' || c < 0x20:
			return 0, 0, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return 0, 0, false
}

// Int reads 0 or [1-9][0-9]{0,17} at b[i]: no sign, fraction, exponent or
// overflow to consider. The next value starts at next.
func Int(b []byte, i int) (n int64, next int, ok bool) {
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		n = n*10 + int64(b[j]-'0')
		j++
	}
	switch digits := j - i; {
	case digits == 0, digits > 18, digits > 1 && b[i] == '0':
		return 0, i, false
	}
	return n, j, true
}

// Number reads the JSON number at b[i], which must be '-' or a digit
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?), and returns where it
// ends; ok is false when b[i:] does not start with one.
func Number(b []byte, i int) (end int, ok bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return 0, false
	case b[i] == '0':
		i++
	default:
		if i = digits(b, i); i < 0 {
			return 0, false
		}
	}
	if i < len(b) && b[i] == '.' {
		if i = digits(b, i+1); i < 0 {
			return 0, false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i = digits(b, i); i < 0 {
			return 0, false
		}
	}
	return i, true
}

// digits skips one or more digits from b[i]; -1 when there are none.
func digits(b []byte, i int) int {
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}

// AppendString appends s quoted when encoding/json, escaping HTML as it
// does by default, would write it unchanged: no quote, backslash, control,
// <, >, &, U+2028, U+2029 or invalid UTF-8. ok is false otherwise, and b
// is returned as it was.
func AppendString(b []byte, s string) ([]byte, bool) {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return b, false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
			return b, false
		}
		i += size
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), true
}
