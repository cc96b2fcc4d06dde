package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

type loadResult struct {
	n        int // measured requests
	all      int // every answered request, warm-up and ramp-down included
	errors   int
	elapsed  time.Duration
	lats     []time.Duration // sorted
	rps      float64
	p50, p99 time.Duration
	srvCPU   time.Duration // PostgreSQL's CPU in the measured window; negative: not measured
	stmts    statementCounts
}

// merge adds o's requests to r and recomputes the figures.
func (r *loadResult) merge(o loadResult) {
	if r.n == 0 && r.all == 0 {
		r.srvCPU = o.srvCPU
	} else if r.srvCPU >= 0 && o.srvCPU >= 0 {
		r.srvCPU += o.srvCPU
	} else {
		r.srvCPU = -1
	}
	if o.stmts != nil {
		if r.stmts == nil {
			r.stmts = statementCounts{}
		}
		r.stmts.add(o.stmts)
	}
	r.n += o.n
	r.all += o.all
	r.errors += o.errors
	r.elapsed += o.elapsed
	r.lats = append(r.lats, o.lats...)
	slices.Sort(r.lats)
	r.rps = float64(r.n) / r.elapsed.Seconds()
	if r.n > 0 {
		r.p50 = r.lats[r.n/2]
		r.p99 = r.lats[min(r.n-1, r.n*99/100)]
	}
}

// alternate measures each of runs for duration in one-second slices taken
// by turns (warm-up before the first slice of each), so that a change in
// machine load hits all alike, and merges each one's slices.
func alternate(duration, warmup time.Duration, runs ...func(warmup, d time.Duration) loadResult) []loadResult {
	out := make([]loadResult, len(runs))
	parts := max(1, int(duration/time.Second))
	for i := range parts {
		w := time.Duration(0)
		if i == 0 {
			w = warmup
		}
		for k, run := range runs {
			out[k].merge(run(w, duration/time.Duration(parts)))
		}
	}
	return out
}

// hammerWith sends newReq() from c keep-alive clients for d (after
// warmup). sample, when set, is read as the measured window opens and
// closes (the PostgreSQL server's CPU).
func hammerWith(newReq func() *http.Request, c int, warmup, d time.Duration, sample func() time.Duration) loadResult {
	tr := &http.Transport{MaxIdleConns: c, MaxIdleConnsPerHost: c, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var measuring atomic.Bool
	var stop atomic.Bool
	var answered atomic.Int64
	lats := make([][]time.Duration, c)
	errs := make([]int, c)
	var wg sync.WaitGroup
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, 1<<16)
			for !stop.Load() {
				t0 := time.Now()
				ok := roundTrip(client, newReq())
				el := time.Since(t0)
				if ok {
					answered.Add(1)
				}
				if measuring.Load() {
					if ok {
						own = append(own, el)
					} else {
						errs[i]++
					}
				}
			}
			lats[i] = own
		}()
	}
	time.Sleep(warmup)
	s0 := time.Duration(-1)
	if sample != nil {
		s0 = sample()
	}
	measuring.Store(true)
	t0 := time.Now()
	time.Sleep(d)
	measuring.Store(false)
	el := time.Since(t0)
	srv := time.Duration(-1)
	if sample != nil && s0 >= 0 {
		srv = sample() - s0
	}
	stop.Store(true)
	wg.Wait()
	var all []time.Duration
	r := loadResult{}
	for i := range c {
		all = append(all, lats[i]...)
		r.errors += errs[i]
	}
	out := loadResult{}
	out.merge(loadResult{n: len(all), all: int(answered.Load()), errors: r.errors, elapsed: el, lats: all, srvCPU: srv})
	return out
}

// roundTrip sends req with client and reads the answer to its end: ok
// when it came, whole, with status 200.
func roundTrip(client *http.Client, req *http.Request) bool {
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == http.StatusOK
}

func ms(d time.Duration) string { return fmt.Sprintf("%.3f", float64(d.Microseconds())/1000) }

// loadTarget is issue 34's targets for a store: throughput at c=16 and
// c=1 and p99 at c=16 (0: none) over the floor, the bare net/http JSON
// handler, on either store (the issue's own figures are over that floor;
// the PostgreSQL floor with one SQL round trip is a reference row: what
// one statement per call costs). They are the default path's; the issuer
// mode, which does less (no token-family read), is held to the same.
type loadTarget struct {
	c16, c16p99, c1 float64
}

var loadTargets = map[string]loadTarget{
	storeBolt:     {c16: 0.85, c16p99: 1.3, c1: 0.9},
	storePostgres: {c16: 0.5, c1: 0.65},
}

// maxStatements is the goal for SQL statements per call on a warm cache.
const maxStatements = 1.0

func (st *stack) load(cfg config) error {
	pg := st.kind == storePostgres
	var sample func() time.Duration
	if pg && st.pg.cpu() >= 0 {
		sample = st.pg.cpu
	}
	body := callBody(1, "github", "")
	server := func(url string, auth []string, counted bool) func(c int, w, d time.Duration) loadResult {
		return func(c int, w, d time.Duration) loadResult {
			run := func() loadResult {
				return hammerWith(func() *http.Request { return st.newRequest(url, auth, body) }, c, w, d, sample)
			}
			if counted {
				return st.counted(run)
			}
			return run()
		}
	}
	type row struct {
		name string
		run  func(c int, w, d time.Duration) loadResult
	}
	rows := []row{
		{"broker, " + modeLabel(modeBroker), server(st.endpoint(modeBroker), st.aliceAuth[modeBroker], true)},
		{"broker, " + modeLabel(modeIssuer), server(st.endpoint(modeIssuer), st.aliceAuth[modeIssuer], true)},
		{"floor: bare net/http, JSON", server(st.baseline+"/mcp", nil, false)},
	}
	if pg {
		rows = append(rows, row{"floor + one SQL round trip", server(st.sqlFloor+"/mcp", nil, false)})
	}
	fmt.Printf("\n## Load (%s): tools/call connect_account, connected person, %s per server and concurrency (alternating 1s slices, +%s warm-up), loopback\n\n",
		storeTitle(st.kind), cfg.duration, cfg.warmup)
	head := "| c | server | req/s | p50 ms | p99 ms | ÷ floor | p99 ÷ floor's |"
	sep := "|---|---|---|---|---|---|---|"
	if pg {
		head += " ÷ floor + SQL | server CPU µs/req | SQL statements/req |"
		sep += "---|---|---|"
	}
	fmt.Println(head)
	fmt.Println(sep)
	tg := loadTargets[st.kind]
	perCall := map[string]map[int]loadResult{modeBroker: {}, modeIssuer: {}}
	for _, c := range cfg.levels {
		runs := make([]func(w, d time.Duration) loadResult, len(rows))
		for i, r := range rows {
			runs[i] = func(w, d time.Duration) loadResult { return r.run(c, w, d) }
		}
		res := alternate(cfg.duration, cfg.warmup, runs...)
		floor := res[2]
		for i, r := range res {
			line := fmt.Sprintf("| %d | %s | %.0f | %s | %s | %.2f | %.2f |", c, rows[i].name, r.rps, ms(r.p50), ms(r.p99),
				r.rps/floor.rps, float64(r.p99)/float64(max(floor.p99, 1)))
			if pg {
				cpu, stm := "n/a", "—"
				if r.srvCPU >= 0 && r.n > 0 {
					cpu = fmt.Sprintf("%.0f", float64(r.srvCPU.Microseconds())/float64(r.n))
				}
				if r.stmts != nil && r.all > 0 {
					stm = fmt.Sprintf("%.2f", float64(r.stmts.total())/float64(r.all))
				}
				line += fmt.Sprintf(" %.2f | %s | %s |", r.rps/res[3].rps, cpu, stm)
			}
			fmt.Println(line)
			if r.errors > 0 {
				fmt.Printf("|  | (%d errors) |\n", r.errors)
			}
		}
		for i, m := range modes {
			b := res[i]
			perCall[m][c] = b
			ratio, p99 := b.rps/floor.rps, float64(b.p99)/float64(max(floor.p99, 1))
			what := fmt.Sprintf("%s, %s, c=%d", storeTitle(st.kind), pathName(m), c)
			got := fmt.Sprintf("%.2f× (%.0f vs %.0f req/s)", ratio, b.rps, floor.rps)
			if pg {
				got = fmt.Sprintf("%.2f× (%.0f vs %.0f req/s; %.2f× the floor + SQL)", ratio, b.rps, floor.rps, b.rps/res[3].rps)
			}
			switch c {
			case 16:
				st.sum.add(what+": throughput ÷ floor", got, fmt.Sprintf("≥ %.2f×", tg.c16), ratio >= tg.c16 && b.errors == 0)
				if tg.c16p99 > 0 {
					st.sum.add(what+": p99 ÷ floor's", fmt.Sprintf("%.2f× (%s vs %s ms)", p99, ms(b.p99), ms(floor.p99)), fmt.Sprintf("≤ %.1f×", tg.c16p99), p99 <= tg.c16p99)
				}
			case 1:
				st.sum.add(what+": throughput ÷ floor", got, fmt.Sprintf("≥ %.2f×", tg.c1), ratio >= tg.c1 && b.errors == 0)
			}
			if pg && (c == 1 || c == 16) {
				if b.stmts == nil || b.all == 0 {
					return fmt.Errorf("no statement counts for %s at c=%d", m, c)
				}
				per := float64(b.stmts.total()) / float64(b.all)
				st.sum.add(what+": SQL statements per call", fmt.Sprintf("%.2f", per), fmt.Sprintf("≤ %.0f", maxStatements), per <= maxStatements)
			}
		}
	}
	if pg {
		fmt.Printf("\nfloor + one SQL round trip is the floor plus `SELECT record FROM connections WHERE id = $1` (the raw record, not decoded) through its own pool of 16 on the broker's database. Server CPU: every PostgreSQL process, from /proc, over the measured windows. SQL statements per request: pg_stat_statements' calls over every answered request of the server's slices (BEGIN and COMMIT count; the pool's empty `-- ping` does not)\n")
		for _, m := range modes {
			c := cfg.levels[len(cfg.levels)-1]
			if r, ok := perCall[m][c]; ok && r.stmts != nil && r.all > 0 {
				fmt.Printf("\nStatements of the %s at c=%d (%d requests):\n", pathName(m), c, r.all)
				r.stmts.print(r.all, "request")
			}
		}
	}
	if cfg.cpuprofile != "" {
		run := server(st.endpoint(modeBroker), st.aliceAuth[modeBroker], false)
		stop, err := cfg.cpuProfile("." + st.kind)
		if err != nil {
			return err
		}
		r := run(16, cfg.warmup, cfg.duration)
		if err := stop(); err != nil {
			return err
		}
		fmt.Printf("\nCPU profile of the default path alone at c=16 (%s, %.0f req/s, load generator in the same process): %s\n", cfg.duration, r.rps, cfg.cpuprofile+"."+st.kind)
	}
	return nil
}

// pathName names a mode in the targets table.
func pathName(m string) string {
	if m == modeBroker {
		return "default path (--mcp-auth broker)"
	}
	return "issuer mode (--mcp-auth issuer)"
}
