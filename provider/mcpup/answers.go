package mcpup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/sse"
	"credbroker/provider/redact"
)

// What an upstream answers passes through answers before the go-sdk reads
// any of it:
//
//   - It is redacted of the tokens the session's requests carried (the
//     connection's access token, and the refresh token that came with it,
//     the latest maxSecrets of them), in every encoding provider/redact
//     knows: bodies (results, errors, every event of a stream, whatever
//     the go-sdk later turns into an error's text) and headers. JSON
//     escapes of printable ASCII (\u0041 for A) are written as the
//     characters first, so a token spelled with them is found too. What
//     the upstream echoes of the broker's tokens never reaches the host.
//   - The progress notifications of an event stream are routed (OnProgress)
//     as each event is read, in the order they came on the wire: always
//     before the response that ends the stream reaches the go-sdk, which
//     ends its call at once while handing notifications to a queue of its
//     own (so a notification sent right before the result could otherwise
//     arrive after the caller stopped listening).

// maxSecrets bounds the tokens a session redacts.
const maxSecrets = 8

// maxAnswerLine bounds one line of an answer (a JSON body is usually one
// line; an event stream's data lines are its messages): a line is
// redacted whole, so it is held until it ends.
const maxAnswerLine = 64 << 20

// errAnswerLine is reading past maxAnswerLine.
var errAnswerLine = errors.New("mcpup: the upstream answered with a line over 64 MiB")

// secrets are a session's tokens, which its answers are redacted of.
type secrets struct {
	mu   sync.Mutex  // guards the fields below
	toks []string    // oldest first
	set  *redact.Set // redact.Forms(toks...), indexed
}

// add records the tokens of t (a no-op when they are known).
func (s *secrets) add(t Token) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	for _, v := range []string{t.Access, t.Refresh} {
		if v != "" && !slices.Contains(s.toks, v) {
			s.toks = append(s.toks, v)
			changed = true
		}
	}
	if !changed {
		return
	}
	if len(s.toks) > maxSecrets {
		s.toks = slices.Clone(s.toks[len(s.toks)-maxSecrets:])
	}
	s.set = redact.NewSet(redact.Forms(s.toks...))
}

// current returns the forms to redact (nil for none).
func (s *secrets) current() *redact.Set {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.set
}

// answers is a session's RoundTripper: it puts the connection's token
// (auth) and a call's Mcp-Param headers (WithParamHeaders) on it, sends
// nothing more in an exchange answered 403 insufficient_scope, notes a
// 401 (in refused, and after a forced refresh in the request's recorder),
// and hands the go-sdk the upstream's answer redacted of the session's
// secrets, its progress routed.
type answers struct {
	next    http.RoundTripper
	secrets *secrets // nil for a server that takes no token
	// auth puts the token on each request, at the version the request's
	// caller listed (Target.Version): nil for a server that takes no
	// token, and for the pool's own exchange, which puts it on itself.
	auth *oauthHandler
	pool *Pool
	// noProgress: the pool's own exchange, whose calls ask for no
	// progress (direct), so an event stream is only redacted, and handed
	// on as it is when there is nothing to redact it of.
	noProgress bool
	// refused is set by any 401 (the go-sdk opens a session on a context
	// of its own, so opening is not followed by a recorder).
	refused *atomic.Bool
}

func (a answers) RoundTrip(req *http.Request) (*http.Response, error) {
	if r, ok := req.Context().Value(recorderKey{}).(*recorder); ok {
		if ns := r.scope(); ns != nil {
			// Nothing more is sent in an exchange the upstream answered
			// 403 insufficient_scope.
			if req.Body != nil {
				req.Body.Close()
			}
			return nil, ns
		}
	}
	h, _ := req.Context().Value(paramHeadersKey{}).(map[string]string)
	if h != nil && req.Header.Get("Mcp-Method") != "tools/call" {
		h = nil
	}
	if h != nil || a.auth != nil {
		req = req.Clone(req.Context()) // the caller's request is left as it is
		for k, v := range h {
			req.Header.Set(k, v)
		}
		if a.auth != nil {
			if err := a.auth.put(req.Context(), req.Header); err != nil {
				if req.Body != nil {
					req.Body.Close()
				}
				return nil, err
			}
		}
	}
	resp, err := a.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if resp.StatusCode == http.StatusUnauthorized {
		a.refused.Store(true)
		if r, ok := req.Context().Value(recorderKey{}).(*recorder); ok {
			r.mu.Lock()
			r.refusedAfter = r.refusedAfter || r.refreshed
			r.mu.Unlock()
		}
	}
	set := a.secrets.current()
	mt := mediaType(resp.Header.Get("Content-Type"))
	sse := mt == "text/event-stream" && !a.noProgress
	// The go-sdk's requests within Do that may be answered input_required
	// note such an answer (InputResult); the pool's own exchange reads its
	// answer itself.
	var rec *recorder
	if r, ok := req.Context().Value(recorderKey{}).(*recorder); ok && !a.noProgress && (sse || mt == "application/json") && asksInput[req.Header.Get("Mcp-Method")] {
		rec = r
	}
	if set == nil && !sse && rec == nil {
		return resp, nil
	}
	if set != nil {
		for _, vs := range resp.Header {
			for i, v := range vs {
				vs[i] = string(set.All([]byte(v)))
			}
		}
	}
	resp.Body = &answerBody{rc: resp.Body, set: set, sse: sse, pool: a.pool, rec: rec}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return resp, nil
}

// answerBody is an answer's body as the go-sdk reads it: whole lines,
// redacted, each event's progress routed before the event is handed on
// (sse; false: lines are only redacted).
type answerBody struct {
	rc   io.ReadCloser
	set  *redact.Set // nil: nothing to redact
	sse  bool
	pool *Pool

	// pending holds what was read and is not yet a whole line, with room
	// for the next read; spare is the other buffer, which holds the lines
	// out is read from until the next fill (called once out is empty).
	pending []byte
	spare   []byte
	out     []byte // ready to be read
	err     error
	event   sse.Event // the event being read

	// rec, when set, notes an answer that asks for input: an event's data,
	// or a JSON body, kept whole in body while it is at most
	// maxNotedAnswer (a longer one is not noted).
	rec  *recorder
	body []byte
	long bool
}

// asksInput are the methods whose answer may be input_required.
var asksInput = map[string]bool{"tools/call": true, "prompts/get": true, "resources/read": true}

// maxNotedAnswer bounds the JSON body or event an answerBody notes:
// an answer that asks for input holds its requests and a request state of
// at most 16 KiB (what the gateway relays), far less than this.
const maxNotedAnswer = 1 << 20

func (b *answerBody) Read(p []byte) (int, error) {
	for len(b.out) == 0 {
		if b.err != nil {
			return 0, b.err
		}
		b.fill()
	}
	n := copy(p, b.out)
	b.out = b.out[n:]
	return n, nil
}

func (b *answerBody) Close() error { return b.rc.Close() }

// minAnswerRead is the least room a read of the upstream's answer gets:
// the buffer starts that small (most answers are a few hundred bytes) and
// doubles when a line outgrows it.
const minAnswerRead = 1 << 10

// fill reads what the upstream sent next and makes its whole lines ready.
func (b *answerBody) fill() {
	if free := cap(b.pending) - len(b.pending); free < minAnswerRead/2 {
		b.pending = slices.Grow(b.pending, max(minAnswerRead, len(b.pending)))
	}
	start := len(b.pending)
	n, err := b.rc.Read(b.pending[start:cap(b.pending)])
	b.pending = b.pending[:start+n]
	// pending held no line end before what was just read: only that is
	// searched (a long line costs no more than its length).
	end := 0
	if i := bytes.LastIndexByte(b.pending[start:], '\n'); i >= 0 {
		end = start + i + 1
	}
	if err != nil {
		end = len(b.pending)
	}
	if end > 0 {
		// The lines stay where they are, in the buffer out is read from
		// (emit); the rest goes on in the other one, free since out is
		// empty.
		lines := b.pending[:end]
		rest := append(b.spare[:0], b.pending[end:]...)
		b.spare, b.pending = b.pending, rest
		b.emit(lines)
	}
	switch {
	case err != nil:
		b.err = err
		if err == io.EOF && b.rec != nil && !b.sse && !b.long {
			b.rec.noteAnswer(b.body)
		}
	case len(b.pending) > maxAnswerLine:
		b.err = errAnswerLine
	}
}

// emit redacts lines (whole lines, or the answer's last bytes) into out,
// routing the progress of every event that ends in them.
func (b *answerBody) emit(lines []byte) {
	b.out = lines
	if b.set != nil {
		b.out = b.set.All(canonicalEscapes(lines))
	}
	if !b.sse {
		if b.rec != nil && !b.long {
			if b.long = len(b.body)+len(b.out) > maxNotedAnswer; b.long {
				b.body = nil
			} else {
				b.body = append(b.body, b.out...)
			}
		}
		return
	}
	for rest := b.out; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		b.field(bytes.TrimSuffix(line, []byte("\r")))
	}
}

// field reads one line of an event stream, as the exchange's own reader
// does (internal/sse): a blank line ends the event, whose data is routed
// when it is a progress notification. A malformed line is passed on as
// it is: the go-sdk's client ends the stream on it, with nothing to route.
func (b *answerBody) field(line []byte) {
	if len(line) > 0 {
		b.event.Line(line)
	} else if data := b.event.End(); data != nil {
		b.pool.progressEvent(data)
		if b.rec != nil && len(data) <= maxNotedAnswer {
			b.rec.noteAnswer(data)
		}
	}
}

// progressEvent routes data when it is a progress notification.
func (p *Pool) progressEvent(data []byte) {
	if !bytes.Contains(data, []byte(`"notifications/progress"`)) {
		return
	}
	var msg struct {
		Method string                          `json:"method"`
		Params *mcp.ProgressNotificationParams `json:"params"`
	}
	if json.Unmarshal(data, &msg) != nil || msg.Method != "notifications/progress" || msg.Params == nil {
		return
	}
	p.routeProgress(msg.Params)
}

// canonicalEscapes rewrites b's JSON escapes of printable ASCII (\u0041)
// as the characters themselves (\" and \\ for the quote and the
// backslash): the same JSON to any decoder, and one spelling of a token
// for the redaction to find. Other escapes, and any text that is not
// JSON, stay as they are; b itself is returned when it has no \u.
func canonicalEscapes(b []byte) []byte {
	if !bytes.Contains(b, []byte(`\u`)) {
		return b
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' || i+1 == len(b) {
			out = append(out, b[i])
			continue
		}
		if b[i+1] != 'u' || i+6 > len(b) {
			out = append(out, b[i], b[i+1]) // an escape of another kind (\\ included): kept whole
			i++
			continue
		}
		v, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
		switch {
		case err != nil: // not JSON: kept, the next bytes read as they come
			out = append(out, b[i], b[i+1])
			i++
			continue
		case v < 0x20 || v > 0x7e:
			out = append(out, b[i:i+6]...)
		case v == '"' || v == '\\':
			out = append(out, '\\', byte(v))
		default:
			out = append(out, byte(v))
		}
		i += 5
	}
	return out
}

type paramHeadersKey struct{}

// WithParamHeaders returns ctx whose 2026-07-28 tools/call requests carry
// headers h (the call's Mcp-Param headers, SEP-2243, written from its
// arguments and the tool's x-mcp-header bindings): the go-sdk's client
// writes them only for tools its own session has listed.
func WithParamHeaders(ctx context.Context, h map[string]string) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return context.WithValue(ctx, paramHeadersKey{}, h)
}
