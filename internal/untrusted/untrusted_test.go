package untrusted

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestClip(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc…"},
		{"ééé", 2, "éé…"},
		{"a\xffb", 5, "a\uFFFDb"},
	}
	for _, tt := range tests {
		if got := Clip(tt.in, tt.n); got != tt.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}

func TestQuote(t *testing.T) {
	got := Quote("a\"b\n" + strings.Repeat("x", 100))
	if !strings.HasPrefix(got, `"a\"b\n`) || !strings.HasSuffix(got, `…"`) || !utf8.ValidString(got) {
		t.Fatalf("Quote = %s", got)
	}
	if Quote("\xff") != `"�"` {
		t.Fatalf("Quote(invalid) = %s", Quote("\xff"))
	}
}

func FuzzClip(f *testing.F) {
	for _, s := range []string{"", "abc", "ééé", "a\xffb", "\xe2\x82"} {
		f.Add(s, 3)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 || n > 1000 {
			return
		}
		out := Clip(s, n)
		if !utf8.ValidString(out) || utf8.RuneCountInString(out) > n+1 {
			t.Fatalf("Clip(%q, %d) = %q", s, n, out)
		}
	})
}

// TestClipBytes: at most n bytes with the ellipsis, cut on a rune
// boundary, valid UTF-8 whatever came in.
func TestClipBytes(t *testing.T) {
	tests := []struct {
		in   string
		n    int
		want string
	}{
		{"", 3, ""},
		{"abc", 3, "abc"},
		{"abcdef", 5, "ab…"},
		{"ééé", 6, "ééé"},
		{"éééé", 6, "é…"},   // 3 bytes left for text: one é and half the next
		{"日本語日本語", 7, "日…"}, // 3-byte runes
		{"abcdef", 3, "…"},
		{"abcdef", 2, ""},
		{"a\xffb", 5, "a\uFFFDb"},
	}
	for _, tt := range tests {
		got := ClipBytes(tt.in, tt.n)
		if got != tt.want || len(got) > max(tt.n, len(tt.in)) || !utf8.ValidString(got) {
			t.Errorf("ClipBytes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
	long := strings.Repeat("𝄞", 1000) // 4 bytes each
	if got := ClipBytes(long, 1024); len(got) > 1024 || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("ClipBytes of 4,000 bytes to 1,024: %d bytes", len(got))
	}
}
