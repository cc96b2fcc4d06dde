package mcpapi

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var gatewaySoakCalls = flag.Int("gateway-soak-calls", 0, "tools/calls TestGatewaySoak makes (default 10,000; 1,000 under the race detector)")

// TestGatewaySoak: 10,000 tools/calls through /mcp/u/up over 50 people,
// each connected with their own upstream token, from 8 hosts at once,
// 2026-07-28 and 2025-11-25 requests by turns. Every call answers with
// the upstream's echo of its own arguments (nobody gets another's
// answer), every one reached the upstream, and once the idle HTTP
// connections are closed the goroutines and open files are back where
// they were after each person's first call (polled until they settle):
// a relayed call leaves nothing behind.
//
// Under the race detector the default is 1,000 calls, so that `make
// test` stays quick; its norace step runs the full 10,000, and
// -gateway-soak-calls sets the number.
func TestGatewaySoak(t *testing.T) {
	calls := *gatewaySoakCalls
	if calls == 0 {
		calls = 10000
		if raceEnabled {
			calls = 1000
		}
	}
	const people, callers = 50, 8
	g := newGatewayHarness(t)
	client := g.http.Client()
	bearers := make([]string, people)
	for i := range people {
		sub := fmt.Sprintf("p%02d", i)
		d := g.gwCall(sub, urlCaps, "tools/call", "echo", map[string]any{"arguments": map[string]any{}})
		_, link, _ := elicitation(t, d)
		g.connectUpAs(sub, grantIDOf(t, link), "tools")
		bearers[i] = g.gwBearer(sub)
	}
	call := func(n int) error {
		person := n % people
		arg := fmt.Sprintf("p%02d-%d", person, n)
		return soakCall(client, g.http.URL+"/mcp/u/up", bearers[person], n/people%2 == 1, n, arg)
	}
	// Each person's first call in each era opens what stays open (the
	// upstream session, the cached tool list).
	for n := range 2 * people {
		if err := call(n); err != nil {
			t.Fatal(err)
		}
	}
	settle := func() {
		client.CloseIdleConnections()
		g.http.CloseClientConnections()
		g.up.srv.CloseClientConnections()
		runtime.GC()
	}
	settle()
	goroutines, fds := settledCounts(t, settle)
	before := g.up.upstreamCalls()

	start := time.Now()
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for {
				n := int(next.Add(1) - 1)
				if n >= calls || failed.Load() > 0 {
					return
				}
				if err := call(n); err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("call %d: %v", n, err)
					}
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if t.Failed() {
		return
	}
	if got := g.up.upstreamCalls() - before; got != calls {
		t.Fatalf("the upstream was sent %d calls, want %d", got, calls)
	}
	t.Logf("%d calls for %d people through /mcp/u/up in %v (%.0f calls/s)", calls, people, elapsed.Round(time.Millisecond), float64(calls)/elapsed.Seconds())

	var gs, fs int
	deadline := time.Now().Add(30 * time.Second)
	for {
		settle()
		gs, fs = runtime.NumGoroutine(), openFiles(t)
		if gs <= goroutines+2 && fs <= fds+2 {
			break
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("goroutines %d → %d, open files %d → %d after the soak; goroutines:\n%s", goroutines, gs, fds, fs, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("goroutines %d → %d, open files %d → %d", goroutines, gs, fds, fs)
}

// soakCall makes one tools/call of echo with {"n": arg} as the person
// bearer, a 2025-11-25 request when legacy, and wants the echo of arg.
func soakCall(client *http.Client, url, bearer string, legacy bool, id int, arg string) error {
	params := map[string]any{"name": "echo", "arguments": map[string]any{"n": arg}}
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+bearer)
	var body string
	if legacy {
		req.Header.Set("MCP-Protocol-Version", versionLegacy)
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
		body = string(b)
	} else {
		req.Header.Set("MCP-Protocol-Version", versionModern)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "echo")
		body = modernBody(id, "tools/call", urlCaps, params)
	}
	req.Body = io.NopCloser(strings.NewReader(body))
	req.ContentLength = int64(len(body))
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var d struct {
		ID     int `json:"id"`
		Result struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
			IsError bool `json:"isError"`
		} `json:"result"`
	}
	want := `echo {"n":"` + arg + `"}`
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &d) != nil || d.ID != id || d.Result.IsError ||
		len(d.Result.Content) != 1 || d.Result.Content[0].Text != want {
		return fmt.Errorf("legacy %v: HTTP %d %s; want id %d and %q", legacy, resp.StatusCode, b, id, want)
	}
	return nil
}

// settledCounts is the goroutines and open files once two readings a
// moment apart agree (after settle each time).
func settledCounts(t *testing.T, settle func()) (goroutines, fds int) {
	t.Helper()
	goroutines, fds = runtime.NumGoroutine(), openFiles(t)
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		settle()
		g, f := runtime.NumGoroutine(), openFiles(t)
		if g == goroutines && f == fds {
			return g, f
		}
		goroutines, fds = g, f
	}
	return goroutines, fds
}

// openFiles counts the process's open file descriptors.
func openFiles(t testing.TB) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("counting open files: %v", err)
	}
	return len(es)
}
