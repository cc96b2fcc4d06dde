package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"credbroker/internal/buffered"
)

// providerOverhead compares GET /user through provider_request (default
// mode) with the same call straight to the fake API, and through a bare
// forwarder, one client at a time.
func (st *stack) providerOverhead(cfg config) error {
	body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"provider_request","arguments":{"provider":"github","method":"GET","path":"/user"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"elicitation":{"url":{}}}}}}`)
	brokerReq := func() *http.Request {
		r := st.newRequest(st.endpoint(modeBroker), st.aliceAuth[modeBroker], body)
		r.Header.Set("Mcp-Name", "provider_request")
		return r
	}
	// Check once that the broker really reaches the API.
	resp, err := http.DefaultClient.Do(brokerReq())
	if err != nil {
		return err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`\"login\":\"octocat\"`)) {
		return fmt.Errorf("provider_request: HTTP %d %s", resp.StatusCode, b)
	}
	directReq := func() *http.Request {
		r, _ := http.NewRequest(http.MethodGet, st.apiURL+"/user", nil)
		r.Header.Set("Authorization", "Bearer "+benchAccessToken)
		return r
	}
	proxyReq := func() *http.Request {
		r := st.newRequest(st.proxyURL+"/mcp", nil, body)
		r.Header.Set("Mcp-Name", "provider_request")
		return r
	}
	fmt.Printf("\n## provider_request overhead (%s, default path): GET /user through the broker vs straight to the fake API, and through a bare net/http forwarder (c=1, %s each, alternating 1s slices)\n\n", storeTitle(st.kind), cfg.duration)
	fmt.Println("| path | req/s | p50 ms | p99 ms |")
	fmt.Println("|---|---|---|---|")
	stopProfile, err := cfg.cpuProfile("." + st.kind + ".provider")
	if err != nil {
		return err
	}
	// The profile covers all three paths.
	st.waits.reset()
	r := alternate(cfg.duration, cfg.warmup,
		func(w, d time.Duration) loadResult {
			st.waits.on.Store(true)
			defer st.waits.on.Store(false)
			return st.counted(func() loadResult { return hammerWith(brokerReq, 1, w, d, nil) })
		},
		func(w, d time.Duration) loadResult { return hammerWith(directReq, 1, w, d, nil) },
		func(w, d time.Duration) loadResult { return hammerWith(proxyReq, 1, w, d, nil) })
	if err := stopProfile(); err != nil {
		return err
	}
	br, dr, pr := r[0], r[1], r[2]
	fmt.Printf("| broker provider_request | %.0f | %s | %s |\n| direct | %.0f | %s | %s |\n| bare forwarder (floor) | %.0f | %s | %s |\n",
		br.rps, ms(br.p50), ms(br.p99), dr.rps, ms(dr.p50), ms(dr.p99), pr.rps, ms(pr.p50), ms(pr.p99))
	added, floor := br.p50-dr.p50, pr.p50-dr.p50
	fmt.Printf("\nadded at p50: %s ms; the bare forwarder adds %s ms (a second HTTP hop, one JSON decode and encode), so the broker's own work adds %s ms\n",
		ms(added), ms(floor), ms(added-floor))
	read, upstream := st.waits.p50s()
	fmt.Printf("\nwhat the broker waits for in a call, at p50 (its slices, warm-up included): the token read %s ms (the store's GetConnection as its observers time it: on PostgreSQL one SQL round trip and the decryption), the upstream call %s ms (the provider client's round trip to the fake API)\n",
		ms(read), ms(upstream))
	st.sum.add(storeTitle(st.kind)+", provider_request: added p50 ms", fmt.Sprintf("%s (bare forwarder %s)", ms(added), ms(floor)), "≤ 0.1", added <= 100*time.Microsecond && br.errors == 0)
	if st.kind != storePostgres || !st.pg.stmts {
		return nil
	}
	if br.stmts == nil || br.all == 0 {
		return errors.New("provider_request: no statement counts")
	}
	// The token read is the one statement a call needs: the connection it
	// picks comes from the listing cache, its last use is written at most
	// once a minute (which the figure, to two decimals, absorbs).
	per := math.Round(float64(br.stmts.work())/float64(br.all)*100) / 100
	fmt.Printf("\nStatements of provider_request (pg_stat_statements over every answered call of its slices, warm-up included; %d calls; the target leaves out the change feeds' heartbeats, `%s`, five a second per feed):\n", br.all, heartbeat)
	br.stmts.print(br.all, "call")
	st.sum.add(storeTitle(st.kind)+", provider_request: SQL statements per call", fmt.Sprintf("%.2f", per), fmt.Sprintf("≤ %.0f", maxStatements), per <= maxStatements)
	return nil
}

// opens counts token-set decryptions per tools/call for bob, who has five
// connections: list_connections should open none, provider_request (GET
// /user at github) exactly the one it uses. Calls run in-process, one at a
// time, in the default mode, so the keyring's counter is exact.
func (st *stack) opens() error {
	const n = 200
	call := func(tool, args string) (float64, error) {
		body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `,` +
			`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
		do := func() error {
			r := st.newRequest(st.endpoint(modeBroker), st.bobAuth[modeBroker], body)
			r.Header.Set("Mcp-Name", tool)
			rr := buffered.NewResponse()
			st.srv[modeBroker].ServeHTTP(rr, r)
			if rr.Status != 200 || bytes.Contains(rr.Body.Bytes(), []byte(`"isError":true`)) {
				return fmt.Errorf("%s: HTTP %d %s", tool, rr.Status, rr.Body.Bytes())
			}
			return nil
		}
		if err := do(); err != nil { // warm: token cache, last use
			return 0, err
		}
		before := st.keys.Opens()
		for range n {
			if err := do(); err != nil {
				return 0, err
			}
		}
		return float64(st.keys.Opens()-before) / n, nil
	}
	list, err := call("list_connections", "{}")
	if err != nil {
		return err
	}
	req, err := call("provider_request", `{"provider":"github","method":"GET","path":"/user"}`)
	if err != nil {
		return err
	}
	fmt.Printf("\n## Decryptions per call (%s; bob: five connections, %d calls each)\n\nlist_connections: %.2f opens per call; provider_request: %.2f opens per call\n", storeTitle(st.kind), n, list, req)
	st.sum.add(storeTitle(st.kind)+", list_connections, 5 connections: opens per call", fmt.Sprintf("%.2f", list), "0", list == 0)
	st.sum.add(storeTitle(st.kind)+", provider_request: opens per call", fmt.Sprintf("%.2f", req), "1", req == 1)
	return nil
}

// callWaits times, while on, the two waits of a provider_request call:
// the token read (the store's get_connection, as a vault.Observer sees it)
// and the upstream call (every round trip of the provider's HTTP client),
// so the added latency can be split into them and the rest.
type callWaits struct {
	on             atomic.Bool
	mu             sync.Mutex // guards the fields below
	read, upstream []time.Duration
}

func (*callWaits) Begin(ctx context.Context, _ string) context.Context { return ctx }

func (w *callWaits) End(_ context.Context, op string, took time.Duration, _ error) {
	if op == "get_connection" && w.on.Load() {
		w.mu.Lock()
		w.read = append(w.read, took)
		w.mu.Unlock()
	}
}

// timed wraps the provider client's transport with the upstream timing.
func (w *callWaits) timed(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if !w.on.Load() {
			return next.RoundTrip(r)
		}
		t0 := time.Now()
		resp, err := next.RoundTrip(r)
		took := time.Since(t0)
		w.mu.Lock()
		w.upstream = append(w.upstream, took)
		w.mu.Unlock()
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (w *callWaits) reset() {
	w.mu.Lock()
	w.read, w.upstream = nil, nil
	w.mu.Unlock()
}

// p50s is the median token read and upstream call timed so far.
func (w *callWaits) p50s() (read, upstream time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return median(w.read), median(w.upstream)
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
