package redact

import (
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"

	"credbroker/internal/echoapi"
)

// TestSecretFormsAtEveryOffset: a token buried at any offset in a longer
// text that is then base64-encoded (either alphabet, padded or not) is
// Replacement, as are its hex forms and base64 of "Bearer <token>".
func TestSecretFormsAtEveryOffset(t *testing.T) {
	token := "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	forms := Forms(token)
	for pre := range 6 {
		for post := range 4 {
			plain := strings.Repeat("p", pre) + "Bearer " + token + strings.Repeat("s", post)
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				blob := []byte(`{"x":"` + enc.EncodeToString([]byte(plain)) + `"}`)
				out, _ := Capped(blob, forms, 1<<20)
				if leaks := echoapi.Leaks(string(out), token); len(leaks) > 0 {
					t.Fatalf("prefix %d, suffix %d: %v leaked in %s", pre, post, leaks, out)
				}
			}
		}
	}
	for _, enc := range []string{hex.EncodeToString([]byte(token)), strings.ToUpper(hex.EncodeToString([]byte(token)))} {
		if out, _ := Capped([]byte("a"+enc+"b"), forms, 1<<20); string(out) != "a"+Replacement+"b" {
			t.Fatalf("hex form not Replacement: %s", out)
		}
	}
	// Short fragments are not forms: innocent text stays.
	for _, f := range Forms("abcd") {
		if len(f) < 4 {
			t.Fatalf("form %q is too short to redact safely", f)
		}
	}
}

func FuzzSecretForms(f *testing.F) {
	f.Add("gho_token_value_123456789", 3, 5)
	f.Add("a/b+c=d\"e<f>", 0, 0)
	f.Fuzz(func(t *testing.T, token string, pre, post int) {
		if len(token) < 12 || pre < 0 || pre > 8 || post < 0 || post > 8 {
			return
		}
		plain := strings.Repeat("p", pre) + token + strings.Repeat("s", post)
		out, _ := Capped([]byte(base64.StdEncoding.EncodeToString([]byte(plain))), Forms(token), 1<<20)
		if leaks := echoapi.Leaks(string(out), token); len(leaks) > 0 {
			t.Fatalf("%v leaked", leaks)
		}
	})
}
