package mcpapi

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
)

// connectedCall is a modern connect_account for github as sub, id id:
// the request to serve in-process.
func (h *harness) connectedCall(sub string, id int) *http.Request {
	body := modernBody(id, "tools/call", urlCaps, map[string]any{"name": toolConnect, "arguments": map[string]any{"provider": "github"}})
	r := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
	for k, v := range h.modernHeaders(sub, "tools/call", toolConnect) {
		r.Header.Set(k, v)
	}
	return r
}

// TestConnectedAnswersOwnTheirBytes: connected answers are built in
// buffers used again from call to call (answerBufs). Many people's calls
// at once, each answer checked whole against the one its person got
// alone: a buffer handed back before its answer was written, or handed
// out twice, would mix two people's answers (or fail under -race).
func TestConnectedAnswersOwnTheirBytes(t *testing.T) {
	h := newHarness(t)
	const people = 8
	want := make([][]byte, people)
	for i := range people {
		sub := fmt.Sprintf("person%d", i)
		h.connect(h.principal(sub), "github", sub+"-gh", []string{"read:user"})
		w := httptest.NewRecorder()
		h.srv.ServeHTTP(w, h.connectedCall(sub, i))
		if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"account":"`+sub+`-gh"`)) {
			t.Fatalf("%s: HTTP %d %s", sub, w.Code, w.Body)
		}
		want[i] = w.Body.Bytes()
	}
	var wg sync.WaitGroup
	for i := range people {
		sub := fmt.Sprintf("person%d", i)
		wg.Go(func() {
			for range 50 {
				w := httptest.NewRecorder()
				h.srv.ServeHTTP(w, h.connectedCall(sub, i))
				if !bytes.Equal(w.Body.Bytes(), want[i]) {
					t.Errorf("%s got\n%s\nwant\n%s", sub, w.Body, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestConnectedCallAllocations bounds the allocations of a connected
// tools/call in the handler (the load run's call): its answer and
// structured content are built in reused buffers, the request is not
// copied for its context, and the body is read into a buffer of its
// declared length.
func TestConnectedCallAllocations(t *testing.T) {
	if bi, ok := debug.ReadBuildInfo(); ok && slices.Contains(bi.Settings, debug.BuildSetting{Key: "-race", Value: "true"}) {
		t.Skip("sync.Pool drops what it is given at random under the race detector")
	}
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
