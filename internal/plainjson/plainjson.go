// Package plainjson holds the pieces the broker's reflection-free JSON
// fast paths share (grant records in vault, the request state's plaintext
// in requeststate, requests in mcpapi, upstream answers in mcpup): reading
// a string that encoding/json would return verbatim, reading a small
// non-negative integer, passing over any value as encoding/json's scanner
// checks it, writing a string that encoding/json would write verbatim, and
// keeping a fast path's usual strings without a copy (Intern); and Reader,
// which walks a compact text with them.
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

// Intern is string(b), without a copy when b is one of known: a fast
// path's usual names and values, kept as strings without allocating one
// per message.
func Intern(b []byte, known []string) string {
	for _, k := range known {
		if string(b) == k {
			return k
		}
	}
	return string(b)
}

// MaxDepth bounds the nesting ValueEnd passes over; deeper input is refused
// (and a fast path falls back).
const MaxDepth = 200

// Space returns where the whitespace starting at b[i] ends.
func Space(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// ValueEnd validates the JSON value starting at b[i] (the grammar of RFC
// 8259 as encoding/json's scanner checks it: strings may hold any bytes
// but controls, escapes must be valid; at most MaxDepth levels of
// nesting) and returns where it ends.
func ValueEnd(b []byte, i int) (end int, ok bool) {
	return skip(b, i, 0)
}

func skip(b []byte, i, depth int) (int, bool) {
	if depth > MaxDepth || i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '{', c == '[':
		close := byte('}')
		if c == '[' {
			close = ']'
		}
		if i = Space(b, i+1); i < len(b) && b[i] == close {
			return i + 1, true
		}
		for {
			var ok bool
			if c == '{' {
				if i, ok = skipString(b, Space(b, i)); !ok {
					return i, false
				}
				if i = Space(b, i); i >= len(b) || b[i] != ':' {
					return i, false
				}
				i++
			}
			if i, ok = skip(b, Space(b, i), depth+1); !ok {
				return i, false
			}
			switch i = Space(b, i); {
			case i < len(b) && b[i] == close:
				return i + 1, true
			case i < len(b) && b[i] == ',':
				i++
			default:
				return i, false
			}
		}
	case c == '"':
		return skipString(b, i)
	case c == '-' || c >= '0' && c <= '9':
		return Number(b, i)
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	}
	return i, false
}

func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

func skipString(b []byte, i int) (int, bool) {
	if i >= len(b) || b[i] != '"' {
		return i, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			j++
			if j >= len(b) {
				return i, false
			}
			switch b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(b) {
					return i, false
				}
				for _, h := range b[j+1 : j+5] {
					if !isHex(h) {
						return i, false
					}
				}
				j += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// Reader walks a compact JSON text (no space between tokens, as
// json.Marshal writes it) with the readers above. The decoders of what
// the broker itself wrote (vault's grant records, the request state's
// plaintext, the canonical check of tool arguments) are built on it.
type Reader struct {
	B []byte
	I int // where the next token starts
}

// Byte consumes c when it comes next.
func (r *Reader) Byte(c byte) bool {
	if r.I < len(r.B) && r.B[r.I] == c {
		r.I++
		return true
	}
	return false
}

// String reads the string that comes next as String does; its contents
// are B[start:end].
func (r *Reader) String() (start, end int, ok bool) {
	if start, end, ok = String(r.B, r.I); ok {
		r.I = end + 1
	}
	return start, end, ok
}

// Int reads the integer that comes next as Int does.
func (r *Reader) Int() (n int64, ok bool) {
	n, next, ok := Int(r.B, r.I)
	if ok {
		r.I = next
	}
	return n, ok
}

// Number passes over the number that comes next (Number).
func (r *Reader) Number() bool {
	end, ok := Number(r.B, r.I)
	if ok {
		r.I = end
	}
	return ok
}

// Literal consumes lit (true, false or null) when it comes next.
func (r *Reader) Literal(lit string) bool {
	if len(r.B)-r.I < len(lit) || string(r.B[r.I:r.I+len(lit)]) != lit {
		return false
	}
	r.I += len(lit)
	return true
}

// Object reads an object that runs to the end of B: '{', members
// "key":value separated by ',', '}'. member is called for each, with the
// key as String reads it (B[start:end]) and positioned at the value,
// which it must consume. Anything else, bytes after the object
// included, is not ok.
func (r *Reader) Object(member func(start, end int) bool) bool {
	if !r.Byte('{') {
		return false
	}
	if !r.Byte('}') {
		for {
			start, end, ok := r.String()
			if !ok || !r.Byte(':') || !member(start, end) {
				return false
			}
			if r.Byte('}') {
				break
			}
			if !r.Byte(',') {
				return false
			}
		}
	}
	return r.I == len(r.B)
}
