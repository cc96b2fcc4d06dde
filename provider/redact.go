package provider

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/url"
	"strings"
)

// redacted replaces secrets in API answers.
const redacted = "REDACTED"

// minEncodedForm is the shortest fragment of an encoded secret worth
// redacting: shorter ones would match innocent text.
const minEncodedForm = 8

// secretForms returns the byte strings an API might echo one of secrets
// as: as is; JSON-escaped (with and without HTML escaping, with "\/");
// URL-encoded; hex (both cases); and base64 (standard and URL alphabets,
// with and without padding) of the secret and of "Bearer <secret>", plus,
// for a secret buried in a longer base64 text at any offset, the part of
// its encoding that does not depend on the bytes around it. Empty secrets
// are skipped, and each form appears once, in that order.
//
// The forms are built into one buffer and handed out as slices of it,
// each capped at its own end.
func secretForms(secrets ...string) [][]byte {
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

// redactCapped replaces every form in b that starts before limit with
// redacted and cuts the rest at limit (of b's original positions, so text
// shifting left after a replacement cannot bring a partial token in), and
// the result at limit bytes. It reports whether anything was cut.
func redactCapped(b []byte, forms [][]byte, limit int64) ([]byte, bool) {
	out := make([]byte, 0, min(int64(len(b)), limit))
	// next[f] caches where form f next occurs at or after i (-1: nowhere),
	// so each form is searched for once per occurrence, not once per
	// replacement.
	next := make([]int, len(forms))
	for f := range forms {
		next[f] = -2
	}
	i := 0
	for int64(i) < limit && i < len(b) {
		at, form := -1, -1
		for f, fb := range forms {
			if next[f] == -2 || next[f] >= 0 && next[f] < i {
				next[f] = -1
				if j := bytes.Index(b[i:], fb); j >= 0 {
					next[f] = i + j
				}
			}
			if n := next[f]; n >= 0 && (at < 0 || n < at || n == at && len(fb) > len(forms[form])) {
				at, form = n, f
			}
		}
		if at < 0 || int64(at) >= limit {
			end := int(min(limit, int64(len(b))))
			out = append(out, b[i:end]...)
			i = end
			break
		}
		out = append(out, b[i:at]...)
		out = append(out, redacted...)
		i = at + len(forms[form])
	}
	if int64(len(out)) > limit {
		// A replacement just before the cap ran past it.
		return out[:limit], true
	}
	return out, i < len(b)
}
