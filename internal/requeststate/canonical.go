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
	c := canonScan{b: b}
	return c.value(0) && c.i == len(b)
}

// maxCanonDepth bounds the nesting checked; deeper input is re-encoded.
const maxCanonDepth = 64

type canonScan struct {
	b []byte
	i int
}

func (c *canonScan) value(depth int) bool {
	if depth > maxCanonDepth || c.i >= len(c.b) {
		return false
	}
	switch ch := c.b[c.i]; {
	case ch == '{':
		c.i++
		if c.i < len(c.b) && c.b[c.i] == '}' {
			c.i++
			return true
		}
		var prev []byte
		for first := true; ; first = false {
			key, ok := c.str()
			if !ok || !first && bytes.Compare(prev, key) >= 0 {
				return false
			}
			prev = key
			if c.i >= len(c.b) || c.b[c.i] != ':' {
				return false
			}
			c.i++
			if !c.value(depth + 1) {
				return false
			}
			if done, ok := c.next('}'); done || !ok {
				return ok
			}
		}
	case ch == '[':
		c.i++
		if c.i < len(c.b) && c.b[c.i] == ']' {
			c.i++
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
		return c.number()
	case ch == 't':
		return c.literal("true")
	case ch == 'f':
		return c.literal("false")
	case ch == 'n':
		return c.literal("null")
	}
	return false
}

// next passes over what follows a member or element: close (done) or a
// comma; anything else is not ok.
func (c *canonScan) next(close byte) (done, ok bool) {
	if c.i >= len(c.b) || c.b[c.i] != close && c.b[c.i] != ',' {
		return false, false
	}
	c.i++
	return c.b[c.i-1] == close, true
}

// str reads a string that Marshal would write back byte for byte and
// returns its contents.
func (c *canonScan) str() ([]byte, bool) {
	if c.i >= len(c.b) || c.b[c.i] != '"' {
		return nil, false
	}
	start := c.i + 1
	for j := start; j < len(c.b); {
		ch := c.b[j]
		switch {
		case ch == '"':
			c.i = j + 1
			return c.b[start:j], true
		case ch < 0x20, ch == '\\', ch == '<', ch == '>', ch == '&':
			return nil, false
		case ch < utf8.RuneSelf:
			j++
		default:
			r, size := utf8.DecodeRune(c.b[j:])
			if r == utf8.RuneError && size == 1 || r == '\u2028' || r == '\u2029' {
				return nil, false
			}
			j += size
		}
	}
	return nil, false
}

func (c *canonScan) literal(lit string) bool {
	if !bytes.HasPrefix(c.b[c.i:], []byte(lit)) {
		return false
	}
	c.i += len(lit)
	return true
}

func (c *canonScan) number() bool {
	end, ok := plainjson.Number(c.b, c.i)
	if ok {
		c.i = end
	}
	return ok
}
