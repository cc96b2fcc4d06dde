// Package logbuf is the log sink tests hand to the broker's loggers: a
// buffer safe for the concurrent writes of many handlers, read back whole
// to grep for what must (or must never) be logged, or waited on until a
// line appears.
package logbuf

import (
	"bytes"
	"strings"
	"sync"
	"time"
)

// Buffer is a bytes.Buffer safe for concurrent use.
type Buffer struct {
	mu      sync.Mutex // guards the fields below
	buf     bytes.Buffer
	changed chan struct{} // closed (and dropped) by the next Write; made by WaitFor
}

// Write implements io.Writer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// WaitFor waits until the buffer contains text: every write wakes it to
// look again. It gives up when gone is closed (the writer has exited; nil
// means never) or after timeout, and reports whether the text arrived.
func (b *Buffer) WaitFor(text string, gone <-chan struct{}, timeout time.Duration) bool {
	return b.WaitUntil(func(s string) bool { return strings.Contains(s, text) }, gone, timeout)
}

// WaitUntil waits until cond holds for everything written so far: it looks
// at once and again after every write. It gives up when gone is closed
// (after one last look; nil means never) or after timeout, and reports
// whether cond held. cond runs without the buffer's lock held.
func (b *Buffer) WaitUntil(cond func(string) bool, gone <-chan struct{}, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		text := b.buf.String()
		if b.changed == nil {
			b.changed = make(chan struct{})
		}
		changed := b.changed
		b.mu.Unlock()
		if cond(text) {
			return true
		}
		select {
		case <-changed:
		case <-gone:
			return cond(b.String())
		case <-deadline.C:
			return false
		}
	}
}
