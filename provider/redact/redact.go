// Package redact finds a secret in text that may echo it, in any of the
// encodings an echo uses (as is, JSON- and URL-escaped, hex, base64 of
// the secret and of "Bearer <secret>", and base64 of a longer text that
// holds it), and replaces it. The provider layer redacts API answers with
// it (provider), and the gateway's upstream client every answer of an
// upstream MCP server of the tokens its requests carried (provider/mcpup).
package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/url"
	"strings"
)

// Replacement is what replaces a secret.
const Replacement = "REDACTED"

// minEncodedForm is the shortest fragment of an encoded secret worth
// redacting: shorter ones would match innocent text.
const minEncodedForm = 8

// Forms returns the byte strings an API might echo one of secrets
// as: as is; JSON-escaped (with and without HTML escaping, with "\/");
// URL-encoded; hex (both cases); and base64 (standard and URL alphabets,
// with and without padding) of the secret and of "Bearer <secret>", plus,
// for a secret buried in a longer base64 text at any offset, the part of
// its encoding that does not depend on the bytes around it. Empty secrets
// are skipped, and each form appears once, in that order.
//
// The forms are built into one buffer and handed out as slices of it,
// each capped at its own end.
func Forms(secrets ...string) [][]byte {
	size := 0
	for _, secret := range secrets {
		size += 20*len(secret) + 128
	}
	// A secret has at most 23 forms.
	fb := formBuilder{buf: make([]byte, 0, size), ends: make([]int, 0, 23*len(secrets))}
	for _, secret := range secrets {
		if secret != "" {
			fb.addSecret(secret)
		}
	}
	forms := make([][]byte, len(fb.ends))
	start := 0
	for i, end := range fb.ends {
		forms[i] = fb.buf[start:end:end]
		start = end
	}
	return forms
}

// formBuilder collects distinct forms in buf: form i ends at ends[i] and
// starts where form i-1 ends.
type formBuilder struct {
	buf  []byte
	ends []int
}

// keep makes buf[start:] a form, unless it is empty or one already.
func (fb *formBuilder) keep(start int) {
	f := fb.buf[start:]
	if len(f) == 0 {
		return
	}
	prev := 0
	for _, end := range fb.ends {
		if bytes.Equal(fb.buf[prev:end], f) {
			fb.buf = fb.buf[:start]
			return
		}
		prev = end
	}
	fb.ends = append(fb.ends, len(fb.buf))
}

// add appends f as a form.
func (fb *formBuilder) add(f string) {
	start := len(fb.buf)
	fb.buf = append(fb.buf, f...)
	fb.keep(start)
}

// addSecret adds secret's forms.
func (fb *formBuilder) addSecret(secret string) {
	fb.add(secret)
	// JSON: a secret of printable ASCII without '"' or '\\' is its own
	// escape, and without '<', '>' or '&' its own HTML-safe escape too;
	// any other goes through encoding/json.
	var jsonHTML, jsonPlain string
	switch plain, html := jsonVerbatim(secret); {
	case html:
		jsonHTML, jsonPlain = secret, secret
	case plain:
		jsonHTML, jsonPlain = jsonEscape(secret, true), secret
	default:
		jsonHTML, jsonPlain = jsonEscape(secret, true), jsonEscape(secret, false)
	}
	fb.add(jsonHTML)
	fb.add(jsonPlain)
	for _, j := range []string{jsonHTML, jsonPlain} {
		start := len(fb.buf)
		for i := range len(j) {
			if j[i] == '/' {
				fb.buf = append(fb.buf, '\\')
			}
			fb.buf = append(fb.buf, j[i])
		}
		fb.keep(start)
	}
	// URL escaping leaves letters, digits and "-_.~" as they are.
	if urlVerbatim(secret) {
		fb.add(secret)
		fb.add(secret)
	} else {
		fb.add(url.QueryEscape(secret))
		fb.add(url.PathEscape(secret))
	}
	for _, digits := range []string{"0123456789abcdef", "0123456789ABCDEF"} {
		start := len(fb.buf)
		for i := range len(secret) {
			fb.buf = append(fb.buf, digits[secret[i]>>4], digits[secret[i]&0x0f])
		}
		fb.keep(start)
	}
	// "Bearer <secret>" and secret, as bytes to encode, in one array.
	var stack [128]byte
	bearer := append(append(stack[:0], "Bearer "...), secret...)
	raw := bearer[len("Bearer "):]
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		for _, src := range [][]byte{raw, bearer} {
			start := len(fb.buf)
			fb.buf = enc.AppendEncode(fb.buf, src)
			fb.keep(start)
		}
	}
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		// For each of the three offsets (mod 3) at which secret can sit
		// inside a longer byte string, the part of that string's base64
		// encoding made of secret's bytes alone: whatever surrounds the
		// secret, its encoding contains this text.
		for lead := range 3 {
			// The first group that holds only secret bytes starts after
			// (3-lead)%3 secret bytes; groups are 3 bytes → 4 characters.
			skip := (3 - lead) % 3
			if len(raw)-skip < 3 {
				continue
			}
			whole := (len(raw) - skip) / 3 * 3
			if enc.EncodedLen(whole) < minEncodedForm {
				continue
			}
			start := len(fb.buf)
			fb.buf = enc.AppendEncode(fb.buf, raw[skip:skip+whole])
			fb.keep(start)
		}
	}
}

// jsonVerbatim reports whether encoding/json writes s as it is inside a
// JSON string without HTML escaping (plain) and with it (html).
func jsonVerbatim(s string) (plain, html bool) {
	plain, html = true, true
	for i := range len(s) {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f || c == '"' || c == '\\':
			return false, false
		case c == '<' || c == '>' || c == '&':
			html = false
		}
	}
	return plain, html
}

// jsonEscape returns s as encoding/json writes it inside a JSON string.
func jsonEscape(s string, escapeHTML bool) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(s)
	return strings.TrimSuffix(strings.TrimSpace(buf.String()), `"`)[1:]
}

// urlVerbatim reports whether url.QueryEscape and url.PathEscape leave s
// as it is: only letters, digits and "-_.~" (RFC 3986's unreserved
// characters), which neither escapes.
func urlVerbatim(s string) bool {
	for i := range len(s) {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.', c == '~':
		default:
			return false
		}
	}
	return true
}

// Capped replaces every form in b that starts before limit with
// Replacement and cuts the rest at limit (of b's original positions, so text
// shifting left after a replacement cannot bring a partial token in), and
// the result at limit bytes. It reports whether anything was cut. Where
// forms overlap, the one starting first is replaced, and of those starting
// at the same byte the longest. Empty forms are ignored. When there is
// nothing to replace, the result is b cut at limit, with no room past its
// end.
func Capped(b []byte, forms [][]byte, limit int64) ([]byte, bool) {
	var fi formIndex
	fi.build(forms)
	return fi.capped(b, limit)
}

// Set is forms indexed once, for redacting many texts of the same
// secrets (an upstream session's answers); safe for concurrent use.
type Set struct{ fi formIndex }

// NewSet indexes forms (which it keeps: they must not change).
func NewSet(forms [][]byte) *Set {
	s := &Set{}
	s.fi.build(forms)
	return s
}

// All is All(b, forms) for the set's forms.
func (s *Set) All(b []byte) []byte {
	out, _ := s.fi.capped(b, math.MaxInt64)
	return out
}

// capped is Capped with x's forms.
func (x *formIndex) capped(b []byte, limit int64) ([]byte, bool) {
	end := int(min(limit, int64(len(b))))
	var out []byte
	i := 0
	for i < end {
		at, n := x.next(b, i, end)
		if at < 0 {
			break
		}
		if out == nil {
			out = make([]byte, 0, end)
		}
		out = append(out, b[i:at]...)
		out = append(out, Replacement...)
		i = at + n
	}
	if out == nil {
		// Nothing to replace: b as it is, up to the cap; the bytes past it
		// stay out of reach.
		if b == nil {
			b = []byte{}
		}
		return b[:end:end], end < len(b)
	}
	if i < end {
		out = append(out, b[i:end]...)
		i = end
	}
	if int64(len(out)) > limit {
		// A replacement just before the cap ran past it.
		return out[:limit], true
	}
	return out, i < len(b)
}

// All replaces every form in b with Replacement (b itself when there is
// none).
func All(b []byte, forms [][]byte) []byte {
	out, _ := Capped(b, forms, math.MaxInt64)
	return out
}

// formIndex finds where forms start in a text without comparing them at
// every byte. Forms are long (a secret's forms are the secret and longer
// encodings of it), so a form starting anywhere covers some byte of every
// stride bytes: the text is probed at every stride-th byte only, and the
// forms are compared only around the probes whose 4 bytes could be part of
// one.
type formIndex struct {
	forms [][]byte
	// first holds the forms' first bytes.
	first [256]bool
	// stride is the shortest form's length less 3 (0, checking every
	// byte, when that is under 1); grams holds, hashed, the 4 bytes at
	// each offset from 0 to stride-1 of each form.
	stride int
	grams  [256]uint64
}

func gramBit(g uint32) uint32 { return g * 0x9E3779B1 >> 18 } // 14 bits

func (x *formIndex) build(forms [][]byte) {
	x.forms = forms
	shortest := 0
	for _, f := range forms {
		if len(f) > 0 {
			x.first[f[0]] = true
			if shortest == 0 || len(f) < shortest {
				shortest = len(f)
			}
		}
	}
	if shortest < 4 {
		return
	}
	x.stride = shortest - 3
	for _, f := range forms {
		for k := 0; len(f) > 0 && k < x.stride; k++ {
			g := gramBit(binary.LittleEndian.Uint32(f[k:]))
			x.grams[g>>6] |= 1 << (g & 63)
		}
	}
}

// next returns the first position in [i, end) at which a form starts and
// the length of the longest form starting there; -1 when there is none.
func (x *formIndex) next(b []byte, i, end int) (at, n int) {
	if x.stride == 0 {
		return x.scan(b, i, end)
	}
	// The positions from i on fall into consecutive ranges, range k being
	// the stride positions up to q = i + k*stride (range 0 is i alone). A
	// form starting at p in range k is at least stride+3 long and lies in
	// b, so it holds b[q:q+4], at offset q-p < stride: when those 4 bytes
	// are not in grams, or past the end of b, no form starts in range k
	// (nor, past the end, in any later one).
	for q := i; q-x.stride < end-1 && q+4 <= len(b); q += x.stride {
		g := gramBit(binary.LittleEndian.Uint32(b[q:]))
		if x.grams[g>>6]&(1<<(g&63)) == 0 {
			continue
		}
		if at, n := x.scan(b, max(i, q-x.stride+1), min(q+1, end)); at >= 0 {
			return at, n
		}
	}
	return -1, 0
}

// scan compares the forms at each position in [lo, hi), returning the
// first where one starts and the longest starting there.
func (x *formIndex) scan(b []byte, lo, hi int) (at, n int) {
	for p := lo; p < hi; p++ {
		if !x.first[b[p]] {
			continue
		}
		for _, f := range x.forms {
			if len(f) > n && bytes.HasPrefix(b[p:], f) {
				n = len(f)
			}
		}
		if n > 0 {
			return p, n
		}
	}
	return -1, 0
}
