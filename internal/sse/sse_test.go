package sse

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

// errMalformed stands for the error of a malformed line (which has no
// sentinel: nothing branches on it).
var errMalformed = errors.New("malformed")

// TestReader: the message events' data, as the MCP go-sdk's client reads
// a stream.
func TestReader(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		want         []string
		err          error // after the events (io.EOF: the stream ended)
	}{
		{"one", "event: message\ndata: {\"a\":1}\n\n", []string{`{"a":1}`}, io.EOF},
		{"unnamed, no space", "data:x\n\n", []string{"x"}, io.EOF},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"a", "b"}, io.EOF},
		{"a lone carriage return is no line end", "data: a\rb\n\n", []string{"a\rb"}, io.EOF},
		{"lines joined, trimmed", "data:  a \ndata: b\n\n", []string{"a\nb"}, io.EOF},
		{"comments, ids, retry", ": hi\nid: 7\nretry: 100\ndata: a\n\n: bye\n\n", []string{"a"}, io.EOF},
		{"other names and empty data skipped", "event: ping\ndata: p\n\ndata:\n\nevent: message\ndata: m\n\n", []string{"m"}, io.EOF},
		{"the last event without its blank line", "data: a\n\ndata: b", []string{"a", "b"}, io.EOF},
		{"no data at the end", "id: 1\n", nil, io.EOF},
		{"empty", "", nil, io.EOF},
		{"malformed", "data: a\n\nno colon here\n\n", []string{"a"}, errMalformed},
		{"too large", "data: a\n\ndata: " + strings.Repeat("x", 64) + "\n\n", []string{"a"}, ErrTooLarge},
		{"too large over lines", "data: " + strings.Repeat("x", 20) + "\ndata: " + strings.Repeat("y", 20) + "\ndata: " + strings.Repeat("z", 20) + "\n\n", nil, ErrTooLarge},
		{"limit resets per event", "data: " + strings.Repeat("x", 40) + "\n\ndata: " + strings.Repeat("y", 40) + "\n\n",
			[]string{strings.Repeat("x", 40), strings.Repeat("y", 40)}, io.EOF},
	} {
		for _, oneByte := range []bool{false, true} {
			var in io.Reader = strings.NewReader(tc.stream)
			if oneByte {
				in = iotest.OneByteReader(in)
			}
			r := NewReader(in, 60)
			var got []string
			var err error
			for {
				var d []byte
				if d, err = r.Next(); err != nil {
					break
				}
				got = append(got, string(d))
			}
			matches := errors.Is(err, tc.err) || tc.err == errMalformed && err != nil && strings.Contains(err.Error(), "malformed line")
			if !slices.Equal(got, tc.want) || !matches {
				t.Errorf("%s (one byte at a time %v): %q, %v; want %q, %v", tc.name, oneByte, got, err, tc.want, tc.err)
			}
		}
	}
}

// TestReaderFailingStream: a stream that fails to read ends with its error.
func TestReaderFailingStream(t *testing.T) {
	boom := errors.New("boom")
	r := NewReader(io.MultiReader(strings.NewReader("data: a\n\ndata: b"), iotest.ErrReader(boom)), 1024)
	if d, err := r.Next(); err != nil || string(d) != "a" {
		t.Fatalf("%q, %v", d, err)
	}
	if _, err := r.Next(); !errors.Is(err, boom) {
		t.Fatalf("%v, want %v", err, boom)
	}
}

// FuzzReader: whatever the stream, the reader ends (io.EOF or an error)
// and every event's data is within the limit.
func FuzzReader(f *testing.F) {
	f.Add([]byte("event: message\ndata: {\"a\":1}\n\n"), uint8(64))
	f.Add([]byte(": c\r\nid: 1\r\ndata: a\r\ndata: b\r\n\r\nevent: x\ndata: y\n"), uint8(8))
	f.Fuzz(func(t *testing.T, stream []byte, limit uint8) {
		r := NewReader(strings.NewReader(string(stream)), int64(limit))
		for range len(stream) + 1 {
			d, err := r.Next()
			if err != nil {
				return
			}
			if len(d) == 0 || len(d) > int(limit) {
				t.Fatalf("event data %q (limit %d) from %q", d, limit, stream)
			}
		}
		t.Fatalf("more events than bytes in %q", stream)
	})
}
