package mcpapi

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
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
