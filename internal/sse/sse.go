// Package sse reads server-sent event streams (text/event-stream) the way
// the MCP go-sdk's client reads an answer: events end at a blank line (or
// at the end of the stream); a line without a colon is malformed; lines
// starting with a colon are comments; data lines are trimmed and joined
// with newlines; events named other than "message", and events without
// data, are skipped; event ids and retry fields are read past. Each event
// is bounded in bytes.
package sse

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// ErrTooLarge: an event is longer than the reader's limit.
var ErrTooLarge = errors.New("sse: an event is larger than the limit")

// Reader reads the message events of one stream.
type Reader struct {
	br    *bufio.Reader
	limit int64
}

// NewReader reads r's events, each at most limit bytes.
func NewReader(r io.Reader, limit int64) *Reader {
	return &Reader{br: bufio.NewReader(r), limit: limit}
}

// Reset makes the reader read r's events, each at most limit bytes (a
// Reader is reused this way; Reset(nil, 0) lets go of the last stream).
func (r *Reader) Reset(rd io.Reader, limit int64) {
	r.br.Reset(rd)
	r.limit = limit
}

// Next returns the data of the next message event. At the end of the
// stream it returns io.EOF; a stream that fails to read, an event over
// the limit (ErrTooLarge) or a malformed line end it with an error.
func (r *Reader) Next() ([]byte, error) {
	var ev Event
	size := int64(0)
	for {
		line, err := r.line(r.limit - size)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, err
		}
		size += int64(len(line))
		eof := errors.Is(err, io.EOF)
		if line = bytes.TrimRight(line, "\r\n"); len(line) > 0 {
			if !ev.Line(line) {
				return nil, errors.New("sse: a malformed line in the event stream (neither a field nor a comment)")
			}
			if !eof {
				continue
			}
		}
		// The event ends here.
		if data := ev.End(); data != nil {
			return data, nil
		}
		if eof {
			return nil, io.EOF
		}
		size = 0
	}
}

// Event gathers one event from its lines, as Reader does; a reader that
// passes a stream on as it reads it (the gateway's answers, to route
// their progress) uses it too, so that both read events alike.
type Event struct {
	data []byte
	// other: the event is named, other than message (the last name
	// counts).
	other, hasData bool
}

// Line reads one line of the event, without its line end, and not
// blank (a blank line ends the event: End): false when the line is
// malformed (neither a field nor a comment).
func (e *Event) Line(line []byte) bool {
	key, value, ok := bytes.Cut(line, []byte{':'})
	if !ok {
		return false
	}
	switch string(key) {
	case "event":
		v := bytes.TrimSpace(value)
		e.other = len(v) > 0 && string(v) != "message"
	case "data":
		if e.hasData {
			e.data = append(e.data, '\n')
		}
		e.data, e.hasData = append(e.data, bytes.TrimSpace(value)...), true
	}
	return true
}

// End ends the event and starts the next: the data of a message event,
// valid until the next Line, or nil for an event named otherwise or
// without data.
func (e *Event) End() []byte {
	data, other := e.data, e.other
	e.data, e.other, e.hasData = e.data[:0], false, false
	if len(data) == 0 || other {
		return nil
	}
	return data
}

// line reads one line of at most budget bytes, valid until the next read
// (a line within the buffer is not copied).
func (r *Reader) line(budget int64) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.br.ReadSlice('\n')
		if int64(len(line)+len(frag)) > budget {
			return nil, ErrTooLarge
		}
		if line == nil && !errors.Is(err, bufio.ErrBufferFull) {
			line = frag
		} else {
			line = append(line, frag...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("sse: reading the event stream: %w", err)
		}
		return line, err
	}
}

// Discard reads the stream to its end, at most n bytes.
func (r *Reader) Discard(n int64) {
	io.CopyN(io.Discard, r.br, n)
}
