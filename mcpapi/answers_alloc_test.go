//go:build !race

// The race detector makes sync.Pool drop what it is given at random, so
// allocation counts mean nothing there: this file is built without -race
// only (go test ./mcpapi/).

package mcpapi

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// TestConnectedCallAllocations bounds the allocations of a connected
// tools/call in the handler (the load run's call): its answer and
// structured content are built in reused buffers, the request is not
// copied for its context, and the body is read into a buffer of its
// declared length.
func TestConnectedCallAllocations(t *testing.T) {
	h := newHarness(t)
	h.connect(h.principal("alice"), "github", "octocat", []string{"read:user"})
	proto := h.connectedCall("alice", 1)
	body, _ := io.ReadAll(proto.Body)
	rd := bytes.NewReader(body)
	w := &benchWriter{h: http.Header{}}
	call := func() {
		rd.Reset(body)
		r := *proto // only its headers are read: shared
		r.Body = readCloser{rd}
		clear(w.h)
		w.code = 0
		h.srv.ServeHTTP(w, &r)
		if w.code != http.StatusOK {
			t.Fatalf("status %d", w.code)
		}
	}
	call() // the bearer and capabilities caches warm
	// 41 before the buffers were reused (Go 1.26; this harness's store
	// has no listing cache).
	if n := testing.AllocsPerRun(200, call); n > 34 {
		t.Errorf("%.0f allocations per connected call, want at most 34", n)
	}
}
