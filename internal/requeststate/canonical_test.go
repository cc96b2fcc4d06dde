package requeststate

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	"credbroker/internal/plainjson/plainjsontest"
)

// checkCanonical fails when isCanonical accepts raw but the general path
// (decode, json.Marshal) does not give raw back byte for byte. It reports
// whether raw was accepted.
func checkCanonical(t testing.TB, raw []byte) bool {
	t.Helper()
	if !isCanonical(raw) {
		return false
	}
	want, err := reencode(raw)
	if err != nil {
		t.Fatalf("isCanonical accepted what the decoder rejects (%v): %q", err, raw)
	}
	if !bytes.Equal(want, raw) {
		t.Fatalf("isCanonical accepted %q, which re-encodes as %q", raw, want)
	}
	return true
}

func TestIsCanonical(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want bool
	}{
		{`{}`, true},
		{`[]`, true},
		{`{"provider":"github"}`, true},
		{`{"account":"octo","provider":"github","scopes":["repo","read:org"]}`, true},
		{`{"a":{"b":[1,-0.5,2e10,1E+3,true,false,null,"é✓"]},"b":""}`, true},
		{`"x"`, true},
		{`12345678901234567890123456789`, true},
		{"{\"k\":\"\x7f\"}", true},
		{`{"provider":"github","account":"octo"}`, false}, // unsorted
		{`{"a":1,"a":2}`, false},                          // repeated
		{`{"B":1,"a":2}`, true},                           // byte order: upper case first
		{`{"a":2,"B":1}`, false},
		{`{ "a":1}`, false},
		{`{"a": 1}`, false},
		{`[1 ,2]`, false},
		{`{"a":"\u00e9"}`, false},
		{`{"a":"\/"}`, false},
		{`{"a":"<b>"}`, false},
		{`{"a":"&"}`, false},
		{"{\"a\":\"\u2028\"}", false},
		{"{\"a\":\"\xff\"}", false},
		{"{\"a\":\"\t\"}", false},
		{`{"a":01}`, false},
		{`{"a":1.}`, false},
		{`{"a":-}`, false},
		{`{"a":1e}`, false},
		{`{"a":tru}`, false},
		{`{"a":1}x`, false},
		{`{"a":1,}`, false},
		{`[1,]`, false},
		{`{"a"}`, false},
		{`{`, false},
		{``, false},
		{strings.Repeat("[", 100) + strings.Repeat("]", 100), false},
	} {
		if got := checkCanonical(t, []byte(tc.raw)); got != tc.want {
			t.Errorf("isCanonical(%q) = %v, want %v", tc.raw, got, tc.want)
		}
	}

	// Random values, half of them put through the general path first (so
	// canonical), then byte-level mutations of those.
	rng := rand.New(rand.NewPCG(16, 17))
	var accepted int
	const n = 20000
	for i := range n {
		raw := []byte(randomJSON(rng, 0))
		if i%2 == 0 {
			if c, err := reencode(raw); err == nil {
				raw = c
			}
		}
		if i%4 == 3 {
			raw = mutate(rng, raw)
		}
		if checkCanonical(t, raw) {
			accepted++
		}
	}
	if accepted < n/5 {
		t.Errorf("isCanonical accepted %d of %d random values: the corpus no longer exercises it", accepted, n)
	}
	t.Logf("accepted %d of %d", accepted, n)
}

// TestDigestUnchanged: Digest hashes what Canonical returns, on either path.
func TestDigestUnchanged(t *testing.T) {
	for _, raw := range []string{``, `null`, ` {"provider":"github"} `, `{"provider":"github"}`, `{"b":1,"a":[ 1 ]}`, `{"a":"<"}`} {
		c, err := Canonical([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		d1, err := Digest([]byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		d2, _ := Digest(c)
		if !bytes.Equal(d1, d2) {
			t.Errorf("%q: digest differs from that of its canonical form %q", raw, c)
		}
	}
	if _, err := Digest([]byte(`{"a":`)); err == nil {
		t.Error("Digest accepted broken JSON")
	}
}

func randomJSON(rng *rand.Rand, depth int) string {
	switch k := rng.IntN(10); {
	case k == 0:
		return []string{"null", "true", "false"}[rng.IntN(3)]
	case k <= 2:
		return []string{"0", "-1", "1.5", "2e10", "-0.0E-2", "1E+3", "123456789012345678901234567890"}[rng.IntN(7)]
	case k <= 5 || depth > 3:
		return randomString(rng)
	case k <= 7:
		var parts []string
		for range rng.IntN(5) {
			parts = append(parts, randomString(rng)+":"+randomJSON(rng, depth+1))
		}
		return "{" + strings.Join(parts, ",") + "}"
	default:
		var parts []string
		for range rng.IntN(4) {
			parts = append(parts, randomJSON(rng, depth+1))
		}
		return "[" + strings.Join(parts, ",") + "]"
	}
}

func randomString(rng *rand.Rand) string {
	pieces := []string{"a", "b", "B", "provider", "é", "✓", `\n`, `\"`, `\u00e9`, `\/`, "<", "&", "\u2028", "\xff", " ", "\x7f"}
	var b strings.Builder
	b.WriteByte('"')
	for range rng.IntN(4) {
		if rng.IntN(4) == 0 {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		} else {
			b.WriteString(pieces[rng.IntN(4)])
		}
	}
	b.WriteByte('"')
	return b.String()
}

// mutate is plainjsontest.Mutate with the characters this parser decides on.
func mutate(rng *rand.Rand, b []byte) []byte {
	return plainjsontest.Mutate(rng, b, "{}[]\",:\\ nx0-.eE<\x00\xff")
}

// FuzzCanonical: whenever isCanonical accepts a value, the general path
// gives it back byte for byte, so the digest is what it always was.
func FuzzCanonical(f *testing.F) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f.Add([]byte(randomJSON(rng, 0)))
	}
	f.Add([]byte(`{"account":"octo","provider":"github","scopes":["repo"]}`))
	f.Add([]byte(`{"a":"\u2028<&>","b":[1,2.5e-3]}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkCanonical(t, raw)
	})
}

// BenchmarkDigest: the arguments of a connect_account call, already in
// canonical form (as clients send them), and the general path for them.
func BenchmarkDigest(b *testing.B) {
	raw := []byte(`{"account":"octo","provider":"github","scopes":["repo","read:org"]}`)
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Digest(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("reencode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := reencode(raw); err != nil {
				b.Fatal(err)
			}
		}
	})
}
