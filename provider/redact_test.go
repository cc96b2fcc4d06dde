package provider

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/internal/echoapi"
	"credbroker/vault"
)

// TestRedactionAtCap: the connection's token is redacted from API
// answers even when it straddles the response cap or is JSON- or
// URL-encoded, and a partial token never shows at the cut.
func TestRedactionAtCap(t *testing.T) {
	const (
		limit   = 1000
		plain   = "gho_PLAINTOKEN0123456789abcdef"
		special = "ya29.a0/Bx+c=d&e<f>g"
	)
	jsonEsc := func(s string) string { b, _ := json.Marshal(s); return string(b[1 : len(b)-1]) }
	for _, tc := range []struct {
		name, token, echo string
		// pad bytes come before echo, tail after it.
		pad, tail     int
		wantTruncated bool
	}{
		{"literal straddling the cap", plain, plain, limit - 10, 50, true},
		{"literal straddling the cap, body ends with it", plain, plain, limit - 3, 0, true},
		{"literal inside", plain, plain, 10, 10, false},
		{"JSON-escaped", special, jsonEsc(special), 10, 10, false},
		{"JSON-escaped straddling the cap", special, jsonEsc(special), limit - 12, 100, true},
		{"JSON with escaped slashes", special, strings.ReplaceAll(jsonEsc(special), "/", `\/`), 10, 10, false},
		{"URL-encoded", special, url.QueryEscape(special), 10, 10, false},
		{"URL-encoded straddling the cap", special, url.QueryEscape(special), limit - 5, 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.echo == tc.token && tc.token == special {
				t.Fatal("test needs an encoded form that differs from the token")
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "<https://api.test/next?access_token="+tc.echo+">")
				io.WriteString(w, strings.Repeat("x", tc.pad)+tc.echo+strings.Repeat("y", tc.tail))
			}))
			t.Cleanup(srv.Close)
			k, _ := singleConnClient(t, srv.URL, "", limit, vault.TokenSet{AccessToken: vault.Secret(tc.token), TokenType: "bearer",
				Expiry: time.Now().Add(time.Hour)}, time.Now())
			resp, err := k.Do(context.Background(), "c1", APIRequest{Method: "GET", Path: "/echo"})
			if err != nil {
				t.Fatal(err)
			}
			body := string(resp.Body)
			if len(body) > limit || resp.Truncated != tc.wantTruncated {
				t.Fatalf("body %d bytes, truncated %t; want at most %d, truncated %t", len(body), resp.Truncated, limit, tc.wantTruncated)
			}
			// The token is replaced whole; what followed it is kept up to the
			// cap (in the provider's bytes), and the answer is cut at the cap
			// (possibly through the replacement).
			want := strings.Repeat("x", tc.pad) + "REDACTED" + strings.Repeat("y", min(tc.tail, max(0, limit-tc.pad-len(tc.echo))))
			want = want[:min(len(want), limit)]
			if body != want {
				t.Errorf("body = ...%q (%d bytes), want ...%q (%d bytes)", body[max(0, len(body)-40):], len(body), want[max(0, len(want)-40):], len(want))
			}
			// No piece of the echoed token (6 bytes is enough to tell) survives.
			for i := 0; i+6 <= len(tc.echo); i++ {
				if piece := tc.echo[i : i+6]; strings.Contains(body, piece) || strings.Contains(resp.Header.Get("Link"), tc.echo) {
					t.Fatalf("answer still holds %q of the token: ...%q / Link %q", piece, body[max(0, len(body)-40):], resp.Header.Get("Link"))
				}
			}
		})
	}
	t.Run("token past the cap shifted by an earlier replacement", func(t *testing.T) {
		// Replacing the first token shortens the text; the second one,
		// past the cap, must not slide into the answer.
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, plain+strings.Repeat("x", limit-len(plain)+3)+plain+"tail")
		}))
		t.Cleanup(srv.Close)
		k, _ := singleConnClient(t, srv.URL, "", limit, vault.TokenSet{AccessToken: plain, TokenType: "bearer",
			Expiry: time.Now().Add(time.Hour)}, time.Now())
		resp, err := k.Do(context.Background(), "c1", APIRequest{Method: "GET", Path: "/echo"})
		if err != nil {
			t.Fatal(err)
		}
		want := "REDACTED" + strings.Repeat("x", limit-len(plain))
		if string(resp.Body) != want || !resp.Truncated {
			t.Fatalf("body = ...%q (%d bytes, truncated %t), want %d bytes ending in x", resp.Body[max(0, len(resp.Body)-40):], len(resp.Body), resp.Truncated, len(want))
		}
	})
}

// TestSecretFormsAtEveryOffset: a token buried at any offset in a longer
// text that is then base64-encoded (either alphabet, padded or not) is
// redacted, as are its hex forms and base64 of "Bearer <token>".
func TestSecretFormsAtEveryOffset(t *testing.T) {
	token := "gho_16C7e42F292c6912E7710c838347Ae178B4a"
	forms := secretForms(token)
	for pre := range 6 {
		for post := range 4 {
			plain := strings.Repeat("p", pre) + "Bearer " + token + strings.Repeat("s", post)
			for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
				blob := []byte(`{"x":"` + enc.EncodeToString([]byte(plain)) + `"}`)
				out, _ := redactCapped(blob, forms, 1<<20)
				if leaks := echoapi.Leaks(string(out), token); len(leaks) > 0 {
					t.Fatalf("prefix %d, suffix %d: %v leaked in %s", pre, post, leaks, out)
				}
			}
		}
	}
	for _, enc := range []string{hex.EncodeToString([]byte(token)), strings.ToUpper(hex.EncodeToString([]byte(token)))} {
		if out, _ := redactCapped([]byte("a"+enc+"b"), forms, 1<<20); string(out) != "a"+redacted+"b" {
			t.Fatalf("hex form not redacted: %s", out)
		}
	}
	// Short fragments are not forms: innocent text stays.
	for _, f := range secretForms("abcd") {
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
		out, _ := redactCapped([]byte(base64.StdEncoding.EncodeToString([]byte(plain))), secretForms(token), 1<<20)
		if leaks := echoapi.Leaks(string(out), token); len(leaks) > 0 {
			t.Fatalf("%v leaked", leaks)
		}
	})
}
