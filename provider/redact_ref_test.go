package provider

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// refSecretForms is secretForms as first written: each form built as its
// own string, checked against the others and copied. The tests below
// hold secretForms to it.
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
	got, want := secretForms(secrets...), refSecretForms(secrets...)
	if !slices.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("secretForms(%q):\n got  %q\n want %q", secrets, got, want)
	}
	// The forms share one buffer: each must end at its own end, so that
	// appending to one cannot change the next.
	for i, f := range got {
		if cap(f) != len(f) {
			t.Fatalf("secretForms(%q): form %d has room past its end (%d > %d)", secrets, i, cap(f), len(f))
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

// Benchmark results go here, so that the compiler keeps them.
var (
	benchSink  []byte
	benchForms [][]byte
)

// benchToken is a GitHub OAuth token's shape.
const benchToken = "gho_16C7e42F292c6912E7710c838347Ae178B4a"

func BenchmarkSecretForms(b *testing.B) {
	b.Run("token", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			benchForms = secretForms(benchToken)
		}
	})
	b.Run("basic", func(b *testing.B) {
		// An API key connection's basic-auth secrets.
		b.ReportAllocs()
		for b.Loop() {
			benchForms = secretForms("s3cr3t-pass/word", "user:s3cr3t-pass/word", "dXNlcjpzM2NyM3QtcGFzcy93b3Jk")
		}
	})
}

// benchBody is an API answer of the size and shape a provider_request
// usually gets: a page of GitHub issues as JSON.
func benchBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString("[")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"url":"https://api.github.com/repos/acme/widgets/issues/%d","id":%d,"node_id":"I_kwDOABCD%05d",`+
			`"number":%d,"title":"Widget %d does not spin","state":"open","user":{"login":"octocat","id":583231,`+
			`"avatar_url":"https://avatars.githubusercontent.com/u/583231?v=4"},"labels":[{"name":"bug","color":"d73a4a"}],`+
			`"created_at":"2026-01-%02dT10:00:00Z","body":"Steps to reproduce: turn it on. Expected: it spins."}`, i, 1000+i, i, i, i, 1+i%28)
	}
	b.WriteString("]")
	return b.Bytes()
}

func BenchmarkRedactCapped(b *testing.B) {
	forms := secretForms(benchToken)
	for _, bc := range []struct {
		name string
		body []byte
	}{
		{"clean-4KiB", benchBody(10)},
		{"clean-64KiB", benchBody(160)},
		{"echo-4KiB", append(benchBody(10), `{"echo":"`+benchToken+`"}`...)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			for b.Loop() {
				benchSink, _ = redactCapped(bc.body, forms, 256<<10)
			}
		})
	}
}
