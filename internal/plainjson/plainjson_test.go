package plainjson

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"unsafe"
)

// samples cover every class the functions decide on: plain ASCII, valid
// and invalid UTF-8, escapes, controls, HTML characters, U+2028/9.
var samples = []string{
	"", "abc", "gr_0123", "héllo", "日本", "a\"b", `a\b`, "a\nb", "a\x00", "a\x1f",
	"<b>", "a&b", "x>y", "\u2028", "a\u2029b", "\xff", "a\xc3", "\xed\xa0\x80", "\x7f", "~ok ",
}

// TestStringIsWhatJSONReturnsVerbatim: String accepts a quoted string
// exactly when encoding/json decodes it to its own bytes, and then gives
// those bytes.
func TestStringIsWhatJSONReturnsVerbatim(t *testing.T) {
	check := func(s string) {
		t.Helper()
		if i := strings.IndexByte(s, '"'); i >= 0 {
			s = s[:i] // a quote ends the string: what comes after is not in it
		}
		b := []byte(`x"` + s + `"y`)
		start, end, ok := String(b, 1)
		var got string
		err := json.Unmarshal(b[1:len(b)-1], &got)
		verbatim := err == nil && got == s
		if ok != verbatim {
			t.Fatalf("String(%q): ok=%v, encoding/json verbatim=%v (err %v, %q)", s, ok, verbatim, err, got)
		}
		if ok && (string(b[start:end]) != s || end != len(b)-2) {
			t.Fatalf("String(%q) = [%d:%d] %q", s, start, end, b[start:end])
		}
	}
	for _, s := range samples {
		check(s)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20000 {
		check(randomString(r))
	}
	for _, b := range []string{``, `x`, `"abc`, `abc"`} {
		if _, _, ok := String([]byte(b), 0); ok {
			t.Fatalf("String(%q) accepted", b)
		}
	}
}

// TestAppendStringIsJSONMarshal: AppendString writes exactly what
// json.Marshal writes when that is the string unchanged, and refuses
// otherwise without touching b.
func TestAppendStringIsJSONMarshal(t *testing.T) {
	check := func(s string) {
		t.Helper()
		want, _ := json.Marshal(s)
		got, ok := AppendString([]byte("k:"), s)
		verbatim := string(want) == `"`+s+`"`
		if ok != verbatim {
			t.Fatalf("AppendString(%q): ok=%v, Marshal gives %s", s, ok, want)
		}
		if ok && string(got) != "k:"+string(want) || !ok && string(got) != "k:" {
			t.Fatalf("AppendString(%q) = %q, Marshal %s", s, got, want)
		}
	}
	for _, s := range samples {
		check(s)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		check(randomString(r))
	}
}

func TestInt(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "7,": 7, "42}": 42, "999999999999999999": 999999999999999999} {
		n, next, ok := Int([]byte(in), 0)
		if !ok || n != want || next != len(in) && in[next] != ',' && in[next] != '}' {
			t.Fatalf("Int(%q) = %d, %d, %v", in, n, next, ok)
		}
	}
	for _, in := range []string{"", "-1", "01", "00", "1000000000000000000", "x"} {
		if _, next, ok := Int([]byte(in), 0); ok || next != 0 {
			t.Fatalf("Int(%q) accepted (next %d)", in, next)
		}
	}
}

// TestNumber: Number accepts the longest prefix encoding/json takes as a
// number, and nothing when there is none.
func TestNumber(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "-0": 2, "7,": 1, "42}": 2, "-12.5e+3]": 8, "1E9": 3, "0.0": 3,
		"01": 1, "1.5.": 3, "2e-0x": 4} {
		end, ok := Number([]byte(in), 0)
		if !ok || end != want || !json.Valid([]byte(in[:end])) {
			t.Errorf("Number(%q) = %d, %v; want %d", in, end, ok, want)
		}
	}
	for _, in := range []string{"-", "-x", ".5", "1.", "1.e3", "1e", "1e+", "-.1", "x"} {
		if end, ok := Number([]byte(in), 0); ok {
			t.Errorf("Number(%q) accepted up to %d", in, end)
		}
	}
}

// FuzzNumber: whatever Number accepts is a JSON number to encoding/json,
// and the byte after it cannot extend it.
func FuzzNumber(f *testing.F) {
	for _, s := range []string{"0", "-12.5e+3", "1.", "01", "1e", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" || s[0] != '-' && (s[0] < '0' || s[0] > '9') {
			return
		}
		end, ok := Number([]byte(s), 0)
		if !ok {
			return
		}
		if !json.Valid([]byte(s[:end])) {
			t.Fatalf("Number(%q) took %q, not a JSON number", s, s[:end])
		}
		if end < len(s) && strings.IndexByte("0123456789", s[end]) >= 0 && s[:end] != "0" && s[:end] != "-0" {
			t.Fatalf("Number(%q) stopped at %d before a digit", s, end)
		}
	})
}

func randomString(r *rand.Rand) string {
	const pool = "aZ09 \"\\<>&\n\x00\x7f\xc3\xa9\xe2\x80\xa8\xff\xed"
	b := make([]byte, r.IntN(12))
	for i := range b {
		b[i] = pool[r.IntN(len(pool))]
	}
	return string(b)
}

// valueSamples are JSON texts and near misses for ValueEnd.
var valueSamples = []string{
	`0`, `-1.5e+3`, `"a\u00e9\n"`, `true`, `false`, `null`, `[]`, `{}`, ` [ 1 , { "a" : [ null ] } ] `,
	`{"a":1,"a":2}`, `"\xff"`, `[1,]`, `{"a"}`, `{"a":}`, `{,}`, `01`, `1.`, `.5`, `"\x01"`, `"\q"`, `"\u12"`,
	`tru`, `nul`, `[`, `{"a":1`, `"abc`, `[1 2]`, `{"a":1 "b":2}`, `{1:2}`, ``, ` `,
	strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
}

// checkValueEnd: ValueEnd takes b (with the whitespace around it) exactly when
// encoding/json finds it one valid value, but for nesting deeper than
// MaxDepth, which it refuses.
func checkValueEnd(t *testing.T, b []byte) {
	t.Helper()
	end, ok := ValueEnd(b, Space(b, 0))
	whole := ok && Space(b, end) == len(b)
	deep := strings.Count(string(b), "[")+strings.Count(string(b), "{") > MaxDepth
	if valid := json.Valid(b); whole != valid && !(valid && deep && !whole) {
		t.Fatalf("ValueEnd(%q): %v at %d, json.Valid %v", b, ok, end, valid)
	}
}

func TestValueEndIsJSONValid(t *testing.T) {
	for _, s := range valueSamples {
		checkValueEnd(t, []byte(s))
	}
}

func FuzzValueEnd(f *testing.F) {
	for _, s := range valueSamples {
		f.Add([]byte(s))
	}
	f.Fuzz(checkValueEnd)
}

// TestReaderObject: Object reads a compact object that runs to the end of
// the text, handing each member's key and value to member, and refuses
// space, a missing separator, a refused member and trailing bytes.
func TestReaderObject(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		keys string // the keys member saw, joined by "|"
	}{
		{`{}`, true, ""},
		{`{"a":1}`, true, "a"},
		{`{"a":1,"b":"x","c":2}`, true, "a|b|c"},
		{`{}x`, false, ""},
		{`{"a":1}}`, false, "a"},
		{`{"a":1,}`, false, "a"},
		{`{"a" :1}`, false, ""},
		{`{"a":1 }`, false, "a"},
		{` {}`, false, ""},
		{`{"a":1"b":2}`, false, "a"},
		{`{"a\n":1}`, false, ""},
		{`{"refused":1,"b":2}`, false, "refused"},
		{`{"a":1`, false, "a"},
		{``, false, ""},
		{`[]`, false, ""},
	} {
		r := Reader{B: []byte(tc.in)}
		var keys []string
		ok := r.Object(func(start, end int) bool {
			key := string(r.B[start:end])
			keys = append(keys, key)
			if key == "refused" {
				return false
			}
			if r.B[r.I] == '"' {
				_, _, ok := r.String()
				return ok
			}
			_, ok := r.Int()
			return ok
		})
		if ok != tc.ok || strings.Join(keys, "|") != tc.keys {
			t.Errorf("Object(%q) = %v, keys %q; want %v, keys %q", tc.in, ok, strings.Join(keys, "|"), tc.ok, tc.keys)
		}
	}
}

// TestReaderTokens: each reader consumes what it reads and nothing when it
// refuses.
func TestReaderTokens(t *testing.T) {
	r := Reader{B: []byte(`x"ab"12-1.5e3truenul`)}
	if r.Byte('y') || r.I != 0 || !r.Byte('x') || r.I != 1 {
		t.Fatalf("Byte: at %d", r.I)
	}
	if start, end, ok := r.String(); !ok || string(r.B[start:end]) != "ab" || r.I != 5 {
		t.Fatalf("String = %d, %d, %v at %d", start, end, ok, r.I)
	}
	if n, ok := r.Int(); !ok || n != 12 || r.I != 7 {
		t.Fatalf("Int = %d, %v at %d", n, ok, r.I)
	}
	if _, ok := r.Int(); ok || r.I != 7 {
		t.Fatalf("Int of -1.5e3 ok at %d", r.I)
	}
	if !r.Number() || r.I != 13 {
		t.Fatalf("Number: at %d", r.I)
	}
	if r.Literal("false") || !r.Literal("true") || r.I != 17 {
		t.Fatalf("Literal true: at %d", r.I)
	}
	if r.Literal("null") || r.I != 17 {
		t.Fatalf("Literal null of nul: at %d", r.I)
	}
}

// TestIntern: a known value comes back as the known string itself (no
// copy, no allocation); anything else as a copy of b.
func TestIntern(t *testing.T) {
	known := []string{"jsonrpc", "tools/call", ""}
	for _, k := range known {
		b := []byte(k)
		got := Intern(b, known)
		if got != k || len(k) > 0 && unsafe.StringData(got) != unsafe.StringData(k) {
			t.Errorf("Intern(%q) = %q, not the known string itself", k, got)
		}
	}
	b := []byte("tools/lisT")
	got := Intern(b, known)
	b[0] = 'X'
	if got != "tools/lisT" {
		t.Errorf("Intern of an unknown value = %q, want a copy of it", got)
	}
	in := []byte("tools/call")
	if n := testing.AllocsPerRun(100, func() { _ = Intern(in, known) }); n != 0 {
		t.Errorf("Intern of a known value allocates %.0f times", n)
	}
}
