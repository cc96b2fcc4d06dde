package requeststate

import (
	"bytes"
	"unicode/utf8"

	"credbroker/internal/plainjson"
)

// isCanonical reports whether b is already what reencode makes of it
// (json.Marshal of its decoding with UseNumber), so Canonical can skip the
// decode and re-encode: no insignificant space; object keys in strictly
// increasing byte order (Marshal sorts map keys so; a repeated key would
// be merged); strings without escapes and without what Marshal escapes or
// rewrites (<, >, &, invalid UTF-8, U+2028, U+2029); numbers, which
// Marshal writes as written, valid. Anything else is false, and the
// caller re-encodes (TestIsCanonical, FuzzCanonical).
func isCanonical(b []byte) bool {
	c := canonScan{plainjson.Reader{B: b}}
	return c.value(0) && c.I == len(b)
}

// maxCanonDepth bounds the nesting checked; deeper input is re-encoded.
const maxCanonDepth = 64

type canonScan struct{ plainjson.Reader }

func (c *canonScan) value(depth int) bool {
	if depth > maxCanonDepth || c.I >= len(c.B) {
		return false
	}
	switch ch := c.B[c.I]; {
	case ch == '{':
		c.I++
		if c.Byte('}') {
			return true
		}
		var prev []byte
		for first := true; ; first = false {
			key, ok := c.str()
			if !ok || !first && bytes.Compare(prev, key) >= 0 {
				return false
			}
			prev = key
			if !c.Byte(':') || !c.value(depth+1) {
				return false
			}
			if done, ok := c.next('}'); done || !ok {
				return ok
			}
		}
	case ch == '[':
		c.I++
		if c.Byte(']') {
			return true
		}
		for {
			if !c.value(depth + 1) {
				return false
			}
			if done, ok := c.next(']'); done || !ok {
				return ok
			}
		}
	case ch == '"':
		_, ok := c.str()
		return ok
	case ch == '-' || ch >= '0' && ch <= '9':
		return c.Number()
	case ch == 't':
		return c.Literal("true")
	case ch == 'f':
		return c.Literal("false")
	case ch == 'n':
		return c.Literal("null")
	}
	return false
}

// next passes over what follows a member or element: close (done) or a
// comma; anything else is not ok.
func (c *canonScan) next(close byte) (done, ok bool) {
	if c.Byte(close) {
		return true, true
	}
	return false, c.Byte(',')
}

// str reads a string that Marshal would write back byte for byte and
// returns its contents.
func (c *canonScan) str() ([]byte, bool) {
	if c.I >= len(c.B) || c.B[c.I] != '"' {
		return nil, false
	}
	start := c.I + 1
	for j := start; j < len(c.B); {
		ch := c.B[j]
		switch {
		case ch == '"':
			c.I = j + 1
			return c.B[start:j], true
		case ch < 0x20, ch == '\\', ch == '<', ch == '>', ch == '&':
			return nil, false
		case ch < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(c.B[j:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return nil, false
			}
			j += size
		}
	}
	return nil, false
}
