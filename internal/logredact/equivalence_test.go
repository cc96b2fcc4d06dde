package logredact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
)

// scrubCases are texts for the reference comparisons: ordinary log text,
// every shape of secret, near misses, and the non-ASCII spellings Go's
// (?i) folds onto ASCII letters (K U+212A Kelvin sign for k, ſ U+017F
// long s for s), which a byte pre-scan for ASCII words would miss.
var scrubCases = []string{
	"",
	"provider request",
	"mcpapi: provider_request GET https://api.github.com/repos/acme/widgets/issues?per_page=50&page=2 -> 200 in 83ms",
	"sidecar: user token rejected",
	"the bearer token has expired",
	"Basic authentication is not supported",
	// schemes
	"Authorization: Bearer gho_SuperSecretTokenValue123",
	"authorization: BEARER abc12345",
	"Bearer abcdefgh",
	"bearer REDACTED",
	"token abc.def-123",
	"DPoP eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln",
	"basic dXNlcjpwYXNz",
	"BeArer 0000000=0",
	"xbearer abcdef1234",
	"bearer\tabcdef1234",
	"to\u212Aen abcdef1234",           // Kelvin sign: (?i) token
	"ba\u017Fic dXNlcjpwYXNzd29yZA==", // long s: (?i) basic
	"BEARER\u00a0abcdef1234",          // no-break space is not \s
	"héllo, bearer abcdef1234 and to\u212Aen x1234567",
	// key=value
	"https://x/cb?state=abc&code=gho_SuperSecretTokenValue123",
	"grant_type=refresh_token&refresh_token=s3cr3t-value&client_id=x",
	"ACCESS_TOKEN=abc",
	"Password=hunter2; next",
	"api_key=",
	"my_token=abc",
	"token=abc",
	"x=1&y=2&z=3",
	"to\u212Aen=abc",
	"\u017Fecret=abc",
	"api_\u212Aey=abc&pa\u017F\u017Fword=x",
	"request_\u017Ftate=abc",
	"nonce=1 state=2 code_verifier=3 assertion=4 requeststate=5",
	// JSON
	`unexpected answer {"access_token":"plain-looking","token_type":"bearer"}`,
	`{"client_secret" : "a\"b\\c"}`,
	`{"requestState":"x"}`,
	`{"api_\u212Aey":"x"}`,
	`{"client_\u017Fecret": "x"}`,
	`{"password": 5}`,
	`"password":`,
	// token shapes
	"gho_12345678 ghp_abcdefgh ghs_x ghu_abcdefghij ghr_abcdefgh ghx_abcdefgh",
	"github_pat_11ABCDEFG0123456789_abcdefghijklmnop",
	"glpat-abcdefgh1234 xoxb-12345678 xoxz-12345678",
	"ya29.a0AfH6SMBx-example",
	"refresh 1//0abcdefghijk",
	"eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLXZhbHVl",
	"eyJabcd.efgh.",
	"xeyJabcd.efgh.ij",
	// opaque
	"unexpected value Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa",
	"Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jK",    // 31
	"Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa==", // padded
	"abcdefghijklmnopqrstuvwxyzabcdefghij",
	"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
	"/repos/acme/widgets/issues/comments/1234567890/reactions",
	"AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ",
	"Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa=Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa",
	"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.B1",
	"é" + "Zk3qP9xLm2RtY7vB4nW8cD1sF6gH0jKa" + "é",
	// no separator at all
	"nospacesordelimiters",
	"\xff\xfe invalid UTF-8 token=\xff",
}

func TestScrubMatchesReference(t *testing.T) {
	changed := 0
	for _, s := range scrubCases {
		if got, want := Scrub(s), refScrub(s); got != want {
			t.Errorf("Scrub(%q) = %q, reference %q", s, got, want)
		}
		got, want := ScrubText(s), refScrubText(s)
		if got != want {
			t.Errorf("ScrubText(%q) = %q, reference %q", s, got, want)
		}
		if want != s {
			changed++
		}
	}
	// The table must exercise masking, not only pass-through.
	if changed < len(scrubCases)/2 {
		t.Fatalf("only %d of %d cases mask anything", changed, len(scrubCases))
	}
}

var keyCases = []string{
	"", "msg", "provider", "status_code", "STATUS_CODE", "token", "Access-Token", "x.secret.y", "tokenish",
	"to\u212Aen",  // lower-cases to "token"
	"\u017Fecret", // ſ lower-cases to itself: not "secret"
	"KEY_ID", "grant_state", "__code__", "İstate", "api_key", "code_challenge_method",
	strings.Repeat("a", 100) + "_token",
	strings.Repeat("A", 100),
}

func TestSensitiveKeyMatchesReference(t *testing.T) {
	for _, k := range append(keyCases, scrubCases...) {
		if got, want := SensitiveKey(k), refSensitiveKey(k); got != want {
			t.Errorf("SensitiveKey(%q) = %t, reference %t", k, got, want)
		}
	}
}

// stringValuer resolves to a string (as a config value or a wrapped
// secret might).
type stringValuer string

func (v stringValuer) LogValue() slog.Value { return slog.StringValue(string(v)) }

// verboseErr prints more with %+v than Error() says (as errors carrying
// stack traces do): the handler must log Error(), scrubbed.
type verboseErr struct{ msg string }

func (e verboseErr) Error() string { return e.msg }
func (e verboseErr) Format(f fmt.State, verb rune) {
	io.WriteString(f, e.msg)
	if f.Flag('+') {
		io.WriteString(f, " [stack: access_token=leaked-by-format]")
	}
}

// records builds, for text s, records and handler setups that put s in
// every place the handler looks.
func handlerScenarios(s string) []func(h slog.Handler) error {
	ctx := context.Background()
	rec := func(msg string, as ...slog.Attr) slog.Record {
		r := slog.NewRecord(time.Time{}, slog.LevelInfo, msg, 0)
		r.AddAttrs(as...)
		return r
	}
	realistic := []slog.Attr{
		slog.String("provider", "github"), slog.String("connection", "conn_Qm9vbGVhbkZhbHNlVHJ1ZQ"),
		slog.String("method", "GET"), slog.String("url", "https://api.github.com/repos/acme/widgets/issues?per_page=50"),
		slog.Int("status", 200), slog.Duration("duration", 83*time.Millisecond), slog.String("detail", s),
	}
	return []func(h slog.Handler) error{
		func(h slog.Handler) error { return h.Handle(ctx, rec(s)) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.String("value", s))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.String(s, "v"))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.Any("err", errors.New(s)))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.Any("err", verboseErr{s}))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.Any("list", []string{s}))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.Any("v", stringValuer(s)))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec("x", slog.Any("v", vault.Secret(s)))) },
		func(h slog.Handler) error { return h.Handle(ctx, rec(s, realistic...)) },
		func(h slog.Handler) error {
			return h.Handle(ctx, rec("x", slog.Group("g", slog.String("a", s), slog.Int("n", 1),
				slog.Group(s, slog.String("b", "c")), slog.Group("token", slog.String("d", "e")), slog.Group("empty"))))
		},
		func(h slog.Handler) error {
			return h.Handle(ctx, rec(s, slog.Bool("b", true), slog.Float64("f", 1.5), slog.Uint64("u", 7),
				slog.Time("t", time.Unix(0, 0).UTC()), slog.Int64("i", -1), slog.Group("empty")))
		},
		func(h slog.Handler) error {
			return h.WithAttrs([]slog.Attr{slog.String("w", s), slog.String(s, s)}).Handle(ctx, rec("x", slog.String("v", s)))
		},
		func(h slog.Handler) error {
			return h.WithGroup("grp").WithAttrs([]slog.Attr{slog.Any("err", errors.New(s))}).Handle(ctx, rec(s, slog.String("v", s)))
		},
	}
}

var (
	textHandler = func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, nil) }
	jsonHandler = func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, nil) }
)

// checkHandler compares the new handler's output with the reference
// handler's for text s, through each of the given output handlers.
func checkHandler(t *testing.T, s string, outs ...func(io.Writer) slog.Handler) {
	t.Helper()
	for _, mk := range outs {
		for i, sc := range handlerScenarios(s) {
			var got, want bytes.Buffer
			if err := sc(New(mk(&got))); err != nil {
				t.Fatal(err)
			}
			if err := sc(&refHandler{next: mk(&want)}); err != nil {
				t.Fatal(err)
			}
			if got.String() != want.String() {
				t.Fatalf("scenario %d for %q:\n got  %s\n want %s", i, s, got.String(), want.String())
			}
		}
	}
}

func TestHandlerMatchesReference(t *testing.T) {
	for _, s := range append(scrubCases, keyCases...) {
		checkHandler(t, s, textHandler, jsonHandler)
	}
}

func FuzzScrubMatchesReference(f *testing.F) {
	for _, s := range scrubCases {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Scrub(s), refScrub(s); got != want {
			t.Fatalf("Scrub(%q) = %q, reference %q", s, got, want)
		}
		if got, want := ScrubText(s), refScrubText(s); got != want {
			t.Fatalf("ScrubText(%q) = %q, reference %q", s, got, want)
		}
		if got, want := SensitiveKey(s), refSensitiveKey(s); got != want {
			t.Fatalf("SensitiveKey(%q) = %t, reference %t", s, got, want)
		}
		// One output format is enough here (the table test runs both): the
		// reference is slow, and the fuzzer should try many inputs.
		checkHandler(t, s, jsonHandler)
	})
}

// A provider_request log line as the broker writes it, without and with
// a secret in it.
const (
	benchCleanText  = `mcpapi: provider_request GET https://api.github.com/repos/acme/widgets/issues?per_page=50&page=2 -> 200 in 83.4ms`
	benchSecretText = `mcpapi: provider_request GET https://api.github.com/repos/acme/widgets/issues?access_token=gho_16C7e42F292c6912E7710c838347Ae178B4a -> 200 in 83.4ms`
)

func benchRecord(url string) slog.Record {
	r := slog.NewRecord(time.Now(), slog.LevelInfo, "mcpapi: provider_request", 0)
	r.AddAttrs(slog.String("tool", "provider_request"), slog.String("provider", "github"),
		slog.String("connection", "conn_Qm9vbGVhbkZhbHNlVHJ1ZQ"), slog.String("method", "GET"),
		slog.String("url", url), slog.Int("status", 200), slog.Duration("duration", 83400*time.Microsecond))
	return r
}

func BenchmarkScrubText(b *testing.B) {
	for _, bc := range []struct{ name, text string }{{"clean", benchCleanText}, {"secret", benchSecretText}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ScrubText(bc.text)
			}
		})
	}
}

func BenchmarkHandler(b *testing.B) {
	for _, bc := range []struct{ name, url string }{
		{"clean", "https://api.github.com/repos/acme/widgets/issues?per_page=50&page=2"},
		{"secret", "https://api.github.com/repos/acme/widgets/issues?access_token=gho_16C7e42F292c6912E7710c838347Ae178B4a"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := New(slog.NewJSONHandler(io.Discard, nil))
			r := benchRecord(bc.url)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_ = h.Handle(ctx, r)
			}
		})
	}
}

// TestCleanRecordDoesNotAllocate: a record with nothing to mask goes on
// as it is, and scrubbing its texts costs no allocation.
func TestCleanRecordDoesNotAllocate(t *testing.T) {
	h := New(slog.DiscardHandler)
	r := benchRecord("https://api.github.com/repos/acme/widgets/issues?per_page=50&page=2")
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { _ = h.Handle(ctx, r) }); n != 0 {
		t.Errorf("Handle: %v allocations per clean record", n)
	}
	if n := testing.AllocsPerRun(100, func() { ScrubText(benchCleanText) }); n != 0 {
		t.Errorf("ScrubText: %v allocations per clean text", n)
	}
}
