package mcpup

import (
	"bytes"
	"encoding/json"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/provider/redact"
)

// chunkReader hands out r's bytes at most n at a time (an upstream's
// answer arriving in pieces).
type chunkReader struct {
	r io.Reader
	n int
}

func (c chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// readAnswer reads body through an answerBody for forms, n bytes at a time
// from the upstream, routing progress to p.
func readAnswer(t testing.TB, p *Pool, body []byte, forms [][]byte, sse bool, n int) []byte {
	t.Helper()
	return readNoting(t, p, body, forms, sse, n, nil)
}

// readNoting is readAnswer noting in rec (when not nil) an answer that
// asks for input.
func readNoting(t testing.TB, p *Pool, body []byte, forms [][]byte, sse bool, n int, rec *recorder) []byte {
	t.Helper()
	ab := &answerBody{rc: io.NopCloser(chunkReader{bytes.NewReader(body), n}), sse: sse, pool: p, rec: rec}
	if len(forms) > 0 {
		ab.set = redact.NewSet(forms)
	}
	out, err := io.ReadAll(ab)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return out
}

// refAnswer is what an answer reads as: each line (up to and with its
// '\n', the last one without) redacted on its own, its JSON escapes of
// printable ASCII written as the characters first when there is anything
// to redact.
func refAnswer(body []byte, forms [][]byte) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(body, []byte("\n")) {
		if len(forms) > 0 {
			line = redact.All(canonicalEscapes(line), forms)
		}
		out = append(out, line...)
	}
	return out
}

// TestAnswerBodyEvents: progress is read off an event stream whatever
// pieces it arrives in: CRLF line ends, a message split over data lines,
// an event of another name, a comment, a last event without its blank
// line (never dispatched, as the SSE rules say); the bytes pass as they
// came.
func TestAnswerBodyEvents(t *testing.T) {
	stream := ": comment\r\n" +
		"event: message\r\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cb-1\",\"progress\":1}}\r\n\r\n" +
		"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\ndata: \"params\":{\"progressToken\":\"cb-1\",\"progress\":2}}\n\n" +
		"event: other\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cb-1\",\"progress\":9}}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cb-2\",\"progress\":8}}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n" +
		"data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cb-1\",\"progress\":7}}\n"
	for _, n := range []int{1, 2, 7, 64, 1 << 20} {
		p := New(Options{})
		var got []float64
		stop := p.OnProgress("cb-1", func(pn *mcp.ProgressNotificationParams) { got = append(got, pn.Progress) })
		out := readAnswer(t, p, []byte(stream), nil, true, n)
		stop()
		if string(out) != stream {
			t.Fatalf("%d at a time: the stream read as %q", n, out)
		}
		if len(got) != 2 || got[0] != 1 || got[1] != 2 {
			t.Fatalf("%d at a time: progress %v, want [1 2]", n, got)
		}
	}
}

// FuzzAnswerBody: whatever an upstream sends, in whatever pieces, an
// answer reads as its lines each redacted of the secret's forms (no form
// is cut at a piece's edge), and reading it never fails or panics, event
// stream or not.
func FuzzAnswerBody(f *testing.F) {
	f.Add([]byte("data: {\"t\":\"s3cr3t-token-value\"}\n\n"), "s3cr3t-token-value", uint8(3), true)
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"czNjcjN0LXRva2VuLXZhbHVl"}]}}`), "s3cr3t-token-value", uint8(5), false)
	f.Add([]byte("data: {\"method\":\"notifications/progress\",\"params\":{\"progressToken\":\"cb-1\",\"progress\":1,\"message\":\"s3cr3t-token-value\"}}\r\n\r\n"), "s3cr3t-token-value", uint8(1), true)
	f.Add([]byte("no newline at all s3cr3t"), "s3cr3t", uint8(2), false)
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"q":{"method":"elicitation/create","params":{"message":"s3cr3t-token-value"}}}}}`), "s3cr3t-token-value", uint8(4), false)
	f.Add([]byte("data: {\"id\":1,\"result\":{\"resultType\":\"input_required\",\"requestState\":\"s3cr3t-token-value\"}}\n\n"), "s3cr3t-token-value", uint8(6), true)
	f.Fuzz(func(t *testing.T, body []byte, secret string, n uint8, sse bool) {
		if len(body) > 1<<16 || len(secret) > 64 || strings.Contains(secret, "\n") {
			return
		}
		var forms [][]byte
		if secret != "" {
			forms = redact.Forms(secret)
		}
		p := New(Options{})
		stop := p.OnProgress("cb-1", func(pn *mcp.ProgressNotificationParams) {
			if len(secret) >= 8 && !strings.Contains(redact.Replacement, secret) && strings.Contains(pn.Message, secret) {
				t.Errorf("progress carried the secret: %q", pn.Message)
			}
		})
		defer stop()
		rec := &recorder{}
		got := readNoting(t, p, body, forms, sse, int(n)+1, rec)
		if want := refAnswer(body, forms); !bytes.Equal(got, want) {
			t.Fatalf("%d at a time:\n got  %q\n want %q", int(n)+1, got, want)
		}
		// A noted answer is what was read (redacted): its result, valid
		// JSON, and never the secret.
		if r := rec.inputResult; r != nil {
			if !json.Valid(r) || !bytes.Contains(got, r) && !sse {
				t.Fatalf("noted %q of %q", r, got)
			}
			// (Unless redacting made the secret anew, as "REDACTEDabcdefg"
			// holds "Dabcdefg": then what was read holds it too.)
			if len(secret) >= 8 && !strings.Contains(redact.Replacement, secret) && bytes.Contains(r, []byte(secret)) && !bytes.Contains(got, []byte(secret)) {
				t.Fatalf("the noted answer carries the secret: %q", r)
			}
		}
		// Canonical escapes change no JSON document's meaning.
		var before, after any
		if json.Unmarshal(body, &before) == nil {
			if err := json.Unmarshal(canonicalEscapes(body), &after); err != nil || !reflect.DeepEqual(before, after) {
				t.Fatalf("%q decodes as %v, its canonical escapes %q as %v (%v)", body, before, canonicalEscapes(body), after, err)
			}
		}
	})
}

// TestCanonicalEscapes: a token spelled with JSON escapes is spelled
// plainly, backslashes and non-printable escapes kept.
func TestCanonicalEscapes(t *testing.T) {
	for in, want := range map[string]string{
		`"\u0073\u0033cr3t"`:   `"s3cr3t"`,
		`"\\u0073"`:            `"\\u0073"`,
		`"a\u0022b\u005cc"`:    `"a\"b\\c"`,
		`"\u0000\u00e9\u007f"`: `"\u0000\u00e9\u007f"`,
		`"\u00"`:               `"\u00"`,
		`"\uZZZZ\u0041"`:       `"\uZZZZA"`,
		`no escapes`:           `no escapes`,
	} {
		if got := string(canonicalEscapes([]byte(in))); got != want {
			t.Errorf("canonicalEscapes(%s) = %s, want %s", in, got, want)
		}
	}
}
