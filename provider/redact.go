package provider

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"slices"
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
// are skipped.
func secretForms(secrets ...string) [][]byte {
	var forms [][]byte
	add := func(f string) {
		if f != "" && !slices.ContainsFunc(forms, func(g []byte) bool { return string(g) == f }) {
			forms = append(forms, []byte(f))
		}
	}
	for _, secret := range secrets {
		if secret == "" {
			continue
		}
		quoted := func(escapeHTML bool) string {
			var buf bytes.Buffer
			enc := json.NewEncoder(&buf)
			enc.SetEscapeHTML(escapeHTML)
			_ = enc.Encode(secret)
			return strings.TrimSuffix(strings.TrimSpace(buf.String()), `"`)[1:]
		}
		jsonHTML, jsonPlain := quoted(true), quoted(false)
		for _, f := range []string{secret, jsonHTML, jsonPlain, strings.ReplaceAll(jsonHTML, "/", `\/`),
			strings.ReplaceAll(jsonPlain, "/", `\/`), url.QueryEscape(secret), url.PathEscape(secret),
			hex.EncodeToString([]byte(secret)), strings.ToUpper(hex.EncodeToString([]byte(secret)))} {
			add(f)
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			add(enc.EncodeToString([]byte(secret)))
			add(enc.EncodeToString([]byte("Bearer " + secret)))
		}
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for _, f := range base64Cores(enc, []byte(secret)) {
				if len(f) >= minEncodedForm {
					add(f)
				}
			}
		}
	}
	return forms
}

// base64Cores returns, for each of the three offsets (mod 3) at which
// secret can sit inside a longer byte string, the part of that string's
// base64 encoding made of secret's bytes alone: whatever surrounds the
// secret, its encoding contains this text.
func base64Cores(enc *base64.Encoding, secret []byte) []string {
	var out []string
	for lead := range 3 {
		// The first group that holds only secret bytes starts after
		// (3-lead)%3 secret bytes; groups are 3 bytes → 4 characters.
		skip := (3 - lead) % 3
		if len(secret)-skip < 3 {
			continue
		}
		whole := (len(secret) - skip) / 3 * 3
		out = append(out, enc.EncodeToString(secret[skip:skip+whole]))
	}
	return out
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
