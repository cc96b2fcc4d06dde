package provider

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"credbroker/provider/redact"
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
			benchForms = redact.Forms(benchToken)
		}
	})
	b.Run("basic", func(b *testing.B) {
		// An API key connection's basic-auth secrets.
		b.ReportAllocs()
		for b.Loop() {
			benchForms = redact.Forms("s3cr3t-pass/word", "user:s3cr3t-pass/word", "dXNlcjpzM2NyM3QtcGFzcy93b3Jk")
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
	forms := redact.Forms(benchToken)
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
				benchSink, _ = redact.Capped(bc.body, forms, 256<<10)
			}
		})
	}
}
