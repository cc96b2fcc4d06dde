package provider

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"credbroker/vault"
)

// TestAPIClientPerBase: New makes one redirect-checking client per API
// base of the catalogue, and a base from elsewhere (a copy) gets one made
// on the spot that applies the same checks.
func TestAPIClientPerBase(t *testing.T) {
	const token = "gho_PERBASETOKEN0123456789"
	var (
		mu   sync.Mutex
		hits []string
	)
	reached := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(hits) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			http.Redirect(w, r, to, http.StatusTemporaryRedirect)
			return
		}
		mu.Lock()
		hits = append(hits, r.URL.Path)
		mu.Unlock()
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	k, _ := singleConnClient(t, srv.URL, ", allowed_paths: [GET /user]", 0,
		vault.TokenSet{AccessToken: token, TokenType: "bearer", Expiry: time.Now().Add(time.Hour)}, time.Now())
	p, _ := k.opts.Providers.Lookup("p")
	if len(k.apiClients) != 1 || k.apiClients[&p.APIBases[0]] == nil {
		t.Fatalf("API clients for %d bases, want the catalogue's one", len(k.apiClients))
	}
	off := p.APIBases[0] // not the catalogue's
	cred := bearerCredential(vault.Connection{Token: vault.TokenSet{AccessToken: token}})
	for _, tc := range []struct {
		to      string
		status  int
		wantHit string
	}{
		{"/api/user/x", http.StatusOK, "/api/user/x"},
		{"/api/admin", http.StatusTemporaryRedirect, ""},
		{"/elsewhere", http.StatusTemporaryRedirect, ""},
	} {
		for _, base := range []*APIBase{&p.APIBases[0], &off} {
			mu.Lock()
			hits = nil
			mu.Unlock()
			u, hdr, err := k.prepareOn(p, base, APIRequest{Method: http.MethodGet, Path: "/user", Query: url.Values{"to": {tc.to}}})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := k.send(context.Background(), p, base, cred, http.MethodGet, u, hdr, nil)
			hits := reached()
			if err != nil || resp.Status != tc.status || len(hits) > 1 || tc.wantHit != "" && (len(hits) != 1 || hits[0] != tc.wantHit) {
				t.Errorf("redirect to %s (catalogue base %t) = %d, %v, reached %q", tc.to, base != &off, resp.Status, err, hits)
			}
		}
	}
}

// TestAnswerHeaderHelpers: containsForm is strings.Contains and
// hasLowerPrefix strings.HasPrefix of strings.ToLower, on every pair of
// short strings over an alphabet that makes near misses likely, and on
// the header names that matter.
func TestAnswerHeaderHelpers(t *testing.T) {
	alphabet := []string{"", "a", "b", "ab", "aab", "ba", "K", "\u212a", "é"}
	var texts []string
	for _, x := range alphabet {
		for _, y := range alphabet {
			for _, z := range alphabet {
				texts = append(texts, x+y+z)
			}
		}
	}
	for _, s := range texts {
		for _, f := range texts {
			if got, want := containsForm(s, []byte(f)), strings.Contains(s, f); got != want {
				t.Fatalf("containsForm(%q, %q) = %t, strings.Contains %t", s, f, got, want)
			}
		}
	}
	for _, name := range append(texts, "X-Ratelimit-Remaining", "X-RateLimit-Reset", "x-ratelimit-", "X-Ratelimit",
		"Ratelimit-Policy", "RATELIMIT", "Ratelimi", "X-Rate\u212aimit-x", "Ratel\u0130mit", "Content-Type", "Set-Cookie") {
		for _, prefix := range []string{"x-ratelimit-", "ratelimit", "k", ""} {
			if got, want := hasLowerPrefix(name, prefix), strings.HasPrefix(strings.ToLower(name), prefix); got != want {
				t.Fatalf("hasLowerPrefix(%q, %q) = %t, want %t", name, prefix, got, want)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { containsForm("W/\"7a3ab0f5b5ad8e8c\"", []byte(benchToken)) }); n != 0 {
		t.Errorf("containsForm allocates %v times", n)
	}
}

// TestReadAnswer: readAnswer reads what io.ReadAll reads and fails with
// the error it fails with, whatever size it is told.
func TestReadAnswer(t *testing.T) {
	data := benchBody(3)
	readers := map[string]func() io.Reader{
		"plain":    func() io.Reader { return bytes.NewReader(data) },
		"one byte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
		"half":     func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) },
		"data+EOF": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
		"timeout":  func() io.Reader { return iotest.TimeoutReader(bytes.NewReader(data)) },
		"error": func() io.Reader {
			return io.MultiReader(bytes.NewReader(data[:100]), iotest.ErrReader(io.ErrUnexpectedEOF))
		},
		"empty":   func() io.Reader { return bytes.NewReader(nil) },
		"limited": func() io.Reader { return io.LimitReader(bytes.NewReader(data), 700) },
	}
	for name, r := range readers {
		want, wantErr := io.ReadAll(r())
		for _, size := range []int64{-1, 0, 1, 511, 512, 700, int64(len(data)) - 1, int64(len(data)), int64(len(data)) + 1, 4 * int64(len(data))} {
			got, err := readAnswer(r(), size)
			// Where a read fails depends on how much each read asks for;
			// what came before the failure is dropped by send.
			if err != wantErr || err == nil && !bytes.Equal(got, want) || !bytes.HasPrefix(data, got) {
				t.Errorf("%s, size %d: %d bytes, %v; io.ReadAll %d bytes, %v", name, size, len(got), err, len(want), wantErr)
			}
		}
	}
}
