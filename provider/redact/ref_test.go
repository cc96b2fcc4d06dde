package redact

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// refSecretForms is Forms as first written: each form built as its
// own string, checked against the others and copied. The tests below
// hold Forms to it.
func refSecretForms(secrets ...string) [][]byte {
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
			for _, f := range refBase64Cores(enc, []byte(secret)) {
				if len(f) >= minEncodedForm {
					add(f)
				}
			}
		}
	}
	return forms
}

// refBase64Cores returns, for each of the three offsets (mod 3) at which
// secret can sit inside a longer byte string, the part of that string's
// base64 encoding made of secret's bytes alone: whatever surrounds the
// secret, its encoding contains this text.
func refBase64Cores(enc *base64.Encoding, secret []byte) []string {
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

// refRedactCapped is Capped as first written: one bytes.Index per
// form, repeated past each occurrence. It replaces every form in b that starts before limit with
// Replacement and cuts the rest at limit (of b's original positions, so text
// shifting left after a replacement cannot bring a partial token in), and
// the result at limit bytes. It reports whether anything was cut.
func refRedactCapped(b []byte, forms [][]byte, limit int64) ([]byte, bool) {
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
		out = append(out, Replacement...)
		i = at + len(forms[form])
	}
	if int64(len(out)) > limit {
		// A replacement just before the cap ran past it.
		return out[:limit], true
	}
	return out, i < len(b)
}

// secretFormCases are secrets of every kind: provider tokens, API keys,
// basic-auth pairs, and strings with every byte JSON, URL or HTML
// escaping treats specially, invalid UTF-8 included.
var secretFormCases = [][]string{
	{"gho_16C7e42F292c6912E7710c838347Ae178B4a"},
	{"ya29.a0AfH6SMBx-example_token-value.with.dots"},
	{"ya29.a0/Bx+c=d&e<f>g"},
	{"1//0gLmN-refresh_token"},
	{"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXZhbHVl"},
	{""},
	{"", "x"},
	{"a"},
	{"abcd"},
	{"abcdefgh"},
	{"short", "short"},
	{"pass", "user:pass", "dXNlcjpwYXNz"},
	{"sk_live_abc", "sk_live_abc"},
	{"a\"b\\c/d\n\r\t\b\f\x00\x1f\x7f"},
	{"<script>&amp;</script>"},
	{"\u2028\u2029 é ü 日本 \U0001F600"},
	{"\xff\xfe\xc3(invalid utf-8)"},
	{"space and+plus%percent?q=1#frag;semi:colon@at"},
	{"~tilde_under-dash.dot!bang*star'quote(paren)"},
	{strings.Repeat("Z", 200)},
	{"gho_one_token_value", "ghr_another_token_value", "third-secret/with/slashes"},
}

func TestSecretFormsMatchReference(t *testing.T) {
	for _, secrets := range secretFormCases {
		checkSecretForms(t, secrets...)
	}
}

func checkSecretForms(t *testing.T, secrets ...string) {
	t.Helper()
	got, want := Forms(secrets...), refSecretForms(secrets...)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("Forms(%q):\n got  %q\n want %q", secrets, got, want)
	}
	// The forms share one buffer: each must end at its own end, so that
	// appending to one cannot change the next.
	for i, f := range got {
		if cap(f) != len(f) {
			t.Fatalf("Forms(%q): form %d has room past its end (%d > %d)", secrets, i, cap(f), len(f))
		}
	}
}

func FuzzSecretFormsMatchReference(f *testing.F) {
	for _, secrets := range secretFormCases {
		f.Add(secrets[0], strings.Join(secrets[1:], "\x00"))
	}
	f.Fuzz(func(t *testing.T, first, more string) {
		secrets := append([]string{first}, strings.Split(more, "\x00")...)
		if len(secrets) > 6 {
			secrets = secrets[:6]
		}
		checkSecretForms(t, secrets...)
	})
}

// redactCases are answers to scrub, with the secrets whose forms are
// scrubbed from them and the caps to cut them at.
var redactCases = []struct {
	body    string
	secrets []string
}{
	{"", []string{"gho_16C7e42F292c6912E7710c838347Ae178B4a"}},
	{`{"login":"octocat","id":583231}`, []string{"gho_16C7e42F292c6912E7710c838347Ae178B4a"}},
	{`{"echo":"gho_16C7e42F292c6912E7710c838347Ae178B4a"}`, []string{"gho_16C7e42F292c6912E7710c838347Ae178B4a"}},
	{"gho_16C7e42F292c6912E7710c838347Ae178B4agho_16C7e42F292c6912E7710c838347Ae178B4a", []string{"gho_16C7e42F292c6912E7710c838347Ae178B4a"}},
	{"Authorization: Basic dXNlcjpzM2NyM3Q= user:s3cr3t s3cr3t", []string{"s3cr3t", "user:s3cr3t", "dXNlcjpzM2NyM3Q="}},
	{"abcabcab abc ab a", []string{"a", "ab", "abc"}},
	{"aaaaaaa", []string{"aa"}},
	{"xxabxx", []string{"b", "ab"}},
	{"tail ends with the secret: sec", []string{"sec"}},
	{"c", []string{"c"}},
	{"636363 Yw== Y2Nj", []string{"c", "cc"}},
	{"no secrets at all", nil},
	{"no secrets at all", []string{""}},
	{`a\u003cb a<b a\/\u003cb`, []string{"a<b/"}},
	{"\xff\xfe\xff", []string{"\xff"}},
}

func checkRedactCapped(t *testing.T, body []byte, forms [][]byte, limit int64) {
	t.Helper()
	got, gotCut := Capped(body, forms, limit)
	want, wantCut := refRedactCapped(body, forms, limit)
	if !bytes.Equal(got, want) || gotCut != wantCut {
		t.Fatalf("Capped(%q, %q, %d) = %q, %t; reference %q, %t", body, forms, limit, got, gotCut, want, wantCut)
	}
	// An answer handed back as it is must not reach past the cap into
	// bytes the caller was not to see.
	if len(got) > 0 && len(body) > 0 && &got[0] == &body[0] && cap(got) != len(got) {
		t.Fatalf("Capped(%q, %q, %d) = %q with %d bytes of body behind it", body, forms, limit, got, cap(got)-len(got))
	}
	// The forms indexed once redact as they do each time.
	if set, whole := NewSet(forms).All(body), All(body, forms); !bytes.Equal(set, whole) {
		t.Fatalf("NewSet(%q).All(%q) = %q; All %q", forms, body, set, whole)
	}
}

func TestRedactCappedMatchesReference(t *testing.T) {
	for _, tc := range redactCases {
		forms := Forms(tc.secrets...)
		for limit := int64(1); limit <= int64(len(tc.body))+2; limit++ {
			checkRedactCapped(t, []byte(tc.body), forms, limit)
		}
		// Forms as a caller might pass them: short ones, repeats,
		// prefixes of each other.
		checkRedactCapped(t, []byte(tc.body), append(forms, []byte("a"), []byte("ab"), []byte("a")), 1<<20)
	}
	// A 4 KiB JSON answer, clean and with the token at its end.
	const token = "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	body := []byte("[" + strings.Repeat(`{"url":"https://api.github.com/repos/acme/widgets/issues/1","title":"Widget does not spin","state":"open"},`, 40) + "{}]")
	for _, limit := range []int64{1, 100, 1000, int64(len(body)) - 1, int64(len(body)), 1 << 20} {
		checkRedactCapped(t, body, Forms(token), limit)
		checkRedactCapped(t, append(body, token...), Forms(token), limit)
	}
}

func FuzzRedactCappedMatchesReference(f *testing.F) {
	for _, tc := range redactCases {
		f.Add(tc.body, strings.Join(tc.secrets, "\x00"), int64(len(tc.body)))
	}
	f.Fuzz(func(t *testing.T, body, secrets string, limit int64) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		ss := strings.Split(secrets, "\x00")
		if len(ss) > 4 {
			ss = ss[:4]
		}
		checkRedactCapped(t, []byte(body), Forms(ss...), limit)
		// The same forms as raw byte strings, short ones included.
		var raw [][]byte
		for _, s := range ss {
			if s != "" {
				raw = append(raw, []byte(s))
			}
		}
		checkRedactCapped(t, []byte(body), raw, limit)
		// body as a recipe for an answer full of forms, whole and in
		// pieces, overlapping and back to back.
		forms := Forms(ss...)
		if len(forms) == 0 {
			return
		}
		var built []byte
		for i := 0; i+1 < len(body); i += 2 {
			f := forms[int(body[i])%len(forms)]
			switch cut := int(body[i+1]); cut % 4 {
			case 0:
				built = append(built, f...)
			case 1:
				built = append(built, f[:cut%len(f)]...)
			case 2:
				built = append(built, f[cut%len(f):]...)
			default:
				built = append(built, body[i+1])
			}
		}
		checkRedactCapped(t, built, forms, limit%int64(len(built)+2))
	})
}
