package main

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"credbroker/internal/testskip"
	"credbroker/vault/pgstore/pgtest"
)

// TestTargetsTableChecksEveryRow runs the load and gateway measures
// briefly on both stores, and the revocation run (10 removals) on
// PostgreSQL, and reads the closing table: it covers both modes on both
// stores, the gateway's auth: none upstream once and its OAuth upstream on
// both stores and the revocation across two replicas; every row's target
// is a comparison, and every row's "met" is that comparison applied to
// the figure the row prints, so no row says "met" without a check.
func TestTargetsTableChecksEveryRow(t *testing.T) {
	testskip.Short(t, "starts PostgreSQL, two brokers and the go-sdk's everything-server")
	quiet(t)
	pg, err := startPostgres()
	if err != nil {
		pgtest.Unavailable(t, err)
	}
	t.Cleanup(pg.close)
	gw, err := startGatewayUpstreams(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gw.close)
	// -c 1,16 (levels, as run parses it): the gateway's targets are at both.
	cfg := config{only: "load,gateway,revocation", duration: 500 * time.Millisecond, revocations: 10, levels: []int{1, 16}}
	sum := &summary{}
	for _, kind := range []string{storeBolt, storePostgres} {
		if err := runStore(cfg, kind, t.TempDir(), pg, gw, sum); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	want := map[string]bool{}
	for _, kind := range []string{storeBolt, storePostgres} {
		for _, m := range modes {
			what := fmt.Sprintf("%s, %s, c=16", storeTitle(kind), pathName(m))
			want[what+": throughput ÷ floor"] = true
			if kind == storeBolt {
				want[what+": p99 ÷ floor's"] = true
			} else {
				want[what+": SQL statements per call"] = true
			}
		}
	}
	gateway := func(what string) {
		for _, c := range []string{"c=1", "c=16"} {
			want[fmt.Sprintf("gateway %s, %s: p99 ÷ direct's", what, c)] = true
		}
		want["gateway "+what+", c=1: p50 ÷ direct's"] = true
		want["gateway "+what+", c=1: the broker's own work at p50 over the bare forwarder, ms"] = true
		want["gateway "+what+", c=16: throughput ÷ direct"] = true
		want["gateway "+what+", cached tools/list, c=1: p50 ms"] = true
	}
	want[fmt.Sprintf("%s, revocation across two replicas, %d app removals: p99 ms from A's acknowledgement to B's first refusal",
		storeTitle(storePostgres), cfg.revocations)] = true
	gateway("/mcp/u/" + gwOpen + " (auth: none)")
	for _, kind := range []string{storeBolt, storePostgres} {
		gateway("/mcp/u/" + gwProtected + " (OAuth upstream, " + storeTitle(kind) + ")")
	}
	for _, l := range sum.lines {
		delete(want, l.what)
		if err := checkLine(l); err != nil {
			t.Errorf("row %q: %v", l.what, err)
		}
	}
	for what := range want {
		t.Errorf("the targets table has no row %q", what)
	}
}

// checkLine reports whether l's "met" is its target's comparison applied
// to the first number of its measure. Within rounding of a ≥ or ≤
// threshold either answer is accepted.
func checkLine(l summaryLine) error {
	got, err := firstNumber(l.got)
	if err != nil {
		return fmt.Errorf("measure %q: %v", l.got, err)
	}
	op, rest := "=", l.target
	for _, p := range []string{"≥", "≤"} {
		if r, ok := strings.CutPrefix(l.target, p); ok {
			op, rest = p, r
		}
	}
	want, err := firstNumber(rest)
	if err != nil {
		return fmt.Errorf("target %q is not a comparison: %v", l.target, err)
	}
	var holds bool
	switch op {
	case "≥":
		holds = got >= want
	case "≤":
		holds = got <= want
	default:
		holds = got == want
	}
	if holds != l.met && (op == "=" || math.Abs(got-want) > 0.006) {
		return fmt.Errorf("measured %v, target %s: met says %v", got, l.target, l.met)
	}
	return nil
}

// quiet sends what the bench prints to /dev/null until tb ends.
func quiet(tb testing.TB) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		tb.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = devnull
	tb.Cleanup(func() { os.Stdout = stdout; devnull.Close() })
}

func firstNumber(s string) (float64, error) {
	f := strings.Fields(strings.NewReplacer("×", " ", "(", " ").Replace(s))
	if len(f) == 0 {
		return 0, fmt.Errorf("empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

func TestCheckLine(t *testing.T) {
	for _, tc := range []struct {
		l    summaryLine
		fail bool
	}{
		{summaryLine{"a", "0.91× (1 vs 1 req/s)", "≥ 0.90×", true}, false},
		{summaryLine{"a", "0.80× (1 vs 1 req/s)", "≥ 0.90×", false}, false},
		{summaryLine{"a", "0.80× (1 vs 1 req/s)", "≥ 0.90×", true}, true},
		{summaryLine{"a", "1.686 (user 1.2)", "≤ 1", false}, false},
		{summaryLine{"a", "2.00", "≤ 3", true}, false},
		{summaryLine{"a", "0.00", "0", true}, false},
		{summaryLine{"a", "1.00", "1", false}, true},
		// What the table printed before: a figure with no check, met.
		{summaryLine{"a", "0.84× (5609 vs 6701 req/s)", "(reported)", true}, true},
		{summaryLine{"a", "0.85×", "≥ 0.85×", false}, false}, // rounding
	} {
		if err := checkLine(tc.l); (err != nil) != tc.fail {
			t.Errorf("%+v: %v, want failure %v", tc.l, err, tc.fail)
		}
	}
}

// TestCallWaitsTimesOnlyTheCallsWhileOn: provider_request's breakdown
// counts the token reads (get_connection, no other operation) and the
// upstream round trips made while on, and nothing else.
func TestCallWaitsTimesOnlyTheCallsWhileOn(t *testing.T) {
	w := &callWaits{}
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()
	client := &http.Client{Transport: w.timed(http.DefaultTransport)}
	get := func() {
		resp, err := client.Get(api.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	ctx := t.Context()
	w.End(ctx, "get_connection", time.Hour, nil) // off: not counted
	get()
	w.on.Store(true)
	w.End(ctx, "list_connections", time.Hour, nil) // another operation
	for _, d := range []time.Duration{3, 1, 2} {
		w.End(ctx, "get_connection", d*time.Millisecond, nil)
	}
	get()
	if read, upstream := w.p50s(); read != 2*time.Millisecond || upstream <= 0 || upstream >= time.Hour || len(w.upstream) != 1 {
		t.Errorf("p50s = %v, %v over %d upstream calls; want 2ms and the one call made while on", read, upstream, len(w.upstream))
	}
	w.reset()
	if read, upstream := w.p50s(); read != 0 || upstream != 0 {
		t.Errorf("after reset: %v, %v", read, upstream)
	}
}
