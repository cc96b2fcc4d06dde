// Command bench is credbroker's reproducible load run (`make bench`), on
// loopback only and bounded in time. It measures what a default deployment
// runs: the MCP endpoint with bearer tokens from the broker's own
// authorization server (`--mcp-auth broker`), which an MCP host gets the
// way hosts do (dynamic registration, the person's sign-in at the IdP and
// consent in a browser, the code redeemed with PKCE); the IdP's JWTs
// (`--mcp-auth issuer`) are the second row. Each store named by -store
// (bbolt, and a throwaway PostgreSQL the bench starts as the tests do) gets
// its own broker, and for each:
//
//   - load: tools/call connect_account for an already connected person
//     over HTTP, at several concurrencies, both modes in turns with the
//     floor in the same run: a bare net/http handler decoding the same
//     JSON-RPC body and answering fixed JSON (on PostgreSQL also the floor
//     plus one SQL round trip, a primary-key read on the same server, for
//     reference); throughput, p50, p99, the ratios to the floor and, on
//     PostgreSQL, the server's CPU and the SQL statements per request
//     (pg_stat_statements);
//   - provider: provider_request's added latency at p50 (c=1);
//   - opens: token-set decryptions per list_connections and per
//     provider_request for a person with five connections;
//   - gateway: tools/call test_simple_text through /mcp/u/{provider}
//     against the same call straight to the upstream and through a bare
//     forwarder, at c=1 and c=16, and the cached tools/list: for the
//     go-sdk's conformance everything-server (auth: none, a child process
//     built from the module cache; once) and for a go-sdk server behind
//     auth.RequireBearerToken with a stored connection per person (auth:
//     oauth; the token read and refresh check in every call; each store),
//     the host's tokens the broker's own for each endpoint, got through
//     the host flow (the default path);
//   - mrtr: the full MRTR round trip (first call, input_required, the
//     consent form's grant check, the callback's connections.Save, which
//     approves and completes the grant, retry, complete) in both modes,
//     CPU time (and its kernel part; on PostgreSQL also the server's) and
//     durable commits per round trip, server side only (the handler is
//     called in-process), for 400 people in turns with the default limits
//     on connect requests, in turns with two bare durable commits on the
//     same store;
//   - revocation (PostgreSQL): -revocations app removals on one replica,
//     each timed from its acknowledgement to the first refusal of the
//     app's token by a second replica on the same database (invariant 12,
//     apps.Bound): p50, p99, the slowest;
//   - vault: a bolt store with -vault-conns connections: open time, Get
//     p50/p99 and process RSS (measured in a fresh child process).
//
// It ends with a table of the performance targets next to their measures:
// every row is checked; what has no target is printed in its section only.
//
// The broker is built as `serve` builds it: the store, telemetry (metrics,
// every store operation timed) on, JSON logs at info level to io.Discard
// behind the redacting handler, the authorization server on the same
// observed store.
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "vault-measure" {
		if err := vaultMeasure(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	flag.StringVar(&cfg.stores, "store", "bolt,postgres", "stores to run on, in order: bolt, postgres (a throwaway server the bench starts from the local PostgreSQL binaries, or CREDBROKER_TEST_POSTGRES)")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "measured time per server and concurrency")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "unmeasured warm-up per server and concurrency")
	flag.StringVar(&cfg.concs, "c", "1,16", "concurrencies of the load and gateway rows")
	flag.StringVar(&cfg.cpuprofile, "cpuprofile", "", "write CPU profiles, per store (FILE.bolt, FILE.postgres): the default path alone at c=16 for -duration after the load rows, the provider_request run (+ \".provider\"), the MRTR run with its floor (+ \".mrtr\")")
	flag.IntVar(&cfg.mrtrN, "mrtr", 1000, "MRTR round trips to time per mode (0 skips)")
	flag.IntVar(&cfg.vaultN, "vault-conns", 1_000_000, "connections in the vault fixture (0 skips)")
	flag.IntVar(&cfg.revocations, "revocations", 100, "app removals of the revocation run across two PostgreSQL replicas (0 skips)")
	flag.BoolVar(&cfg.twoSteps, "two-step-connect", false, "hide the store's one-transaction connect (compare with the callback's two writes)")
	flag.StringVar(&cfg.only, "only", "", "run only these parts, comma-separated: load, provider, opens, gateway, mrtr, revocation, vault")
	flag.StringVar(&cfg.memprofile, "memprofile", "", "write an allocation profile of the MRTR run (every allocation sampled) to this file + \".<store>.mrtr\"")
	flag.BoolVar(&cfg.tracing, "tracing", false, "trace as serve does with OTEL_EXPORTER_OTLP_ENDPOINT set: batched OTLP/HTTP export to a loopback sink the bench runs")
	flag.Parse()
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	stores, concs, cpuprofile, only, memprofile string
	duration, warmup                            time.Duration
	mrtrN, vaultN, revocations                  int
	twoSteps, tracing                           bool
	levels                                      []int // -c, parsed
}

func (c config) runs(part string) bool {
	return c.only == "" || slices.Contains(strings.Split(c.only, ","), part)
}

// cpuProfile starts a CPU profile written to -cpuprofile's name plus suffix
// when -cpuprofile is set; stop ends it and closes the file, and is a
// no-op when -cpuprofile is not set.
func (c config) cpuProfile(suffix string) (stop func() error, err error) {
	if c.cpuprofile == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(c.cpuprofile + suffix)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}

// Store kinds (-store).
const (
	storeBolt     = "bolt"
	storePostgres = "postgres"
)

func run(cfg config) error {
	var kinds []string
	for _, k := range strings.Split(cfg.stores, ",") {
		k = strings.TrimSpace(k)
		if k != storeBolt && k != storePostgres {
			return fmt.Errorf("-store: %q is neither bolt nor postgres", k)
		}
		if !slices.Contains(kinds, k) {
			kinds = append(kinds, k)
		}
	}
	levels, err := parseConcs(cfg.concs)
	if err != nil {
		return err
	}
	cfg.levels = levels
	fmt.Printf("credbroker bench: %s, GOMAXPROCS=%d, %s, stores %s, load average at start: %s\n",
		runtime.Version(), runtime.GOMAXPROCS(0), runtime.GOARCH, strings.Join(kinds, ", "), loadavg())
	dir, err := os.MkdirTemp("", "credbroker-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sum := &summary{}
	if cfg.runs("load") || cfg.runs("provider") || cfg.runs("opens") || cfg.runs("gateway") || cfg.runs("mrtr") || cfg.runs("revocation") {
		var pg *pgServer
		defer func() {
			if pg != nil {
				pg.close()
			}
		}()
		var gw *gwUpstreams
		if cfg.runs("gateway") {
			if gw, err = startGatewayUpstreams(dir); err != nil {
				return err
			}
			defer gw.close()
		}
		for _, kind := range kinds {
			if kind == storePostgres && pg == nil {
				t0 := time.Now()
				if pg, err = startPostgres(); err != nil {
					return fmt.Errorf("postgres: %w (the PostgreSQL server binaries: apt-get install -y postgresql; or -store bolt)", err)
				}
				fmt.Printf("\nPostgreSQL %s started in %s (throwaway, fsync on, synchronous_commit on, TCP on loopback, pg_stat_statements loaded)\n",
					pg.version, time.Since(t0).Round(10*time.Millisecond))
			}
			if err := runStore(cfg, kind, dir, pg, gw, sum); err != nil {
				return fmt.Errorf("%s: %w", kind, err)
			}
		}
	}
	if cfg.runs("vault") && cfg.vaultN > 0 {
		if err := vaultRun(dir, cfg.vaultN); err != nil {
			return err
		}
	}
	sum.compareMRTR()
	sum.print()
	fmt.Printf("load average at end: %s\n", loadavg())
	return nil
}

// runStore builds one broker on the store kind and runs the measures on it.
func runStore(cfg config, kind, dir string, pg *pgServer, gw *gwUpstreams, sum *summary) error {
	st, err := newStack(cfg, kind, dir, pg, gw)
	if err != nil {
		return err
	}
	defer st.close()
	st.sum = sum
	if cfg.runs("load") {
		if err := st.load(cfg); err != nil {
			return err
		}
	}
	if cfg.runs("provider") {
		if err := st.providerOverhead(cfg); err != nil {
			return err
		}
	}
	if cfg.runs("opens") {
		if err := st.opens(); err != nil {
			return err
		}
	}
	if cfg.runs("gateway") {
		if err := st.gateway(cfg); err != nil {
			return err
		}
	}
	if cfg.runs("mrtr") && cfg.mrtrN > 0 {
		if err := st.mrtr(cfg); err != nil {
			return err
		}
	}
	// Last: it removes apps (its own host's, not the other parts').
	// A bolt file has one process writing it: no second replica.
	if cfg.runs("revocation") && cfg.revocations > 0 && kind == storePostgres {
		if err := st.revocation(cfg); err != nil {
			return fmt.Errorf("revocation: %w", err)
		}
	}
	return nil
}

func parseConcs(s string) ([]int, error) {
	var levels []int
	for _, f := range strings.Split(s, ",") {
		var c int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &c); err != nil || c < 1 || c > 1024 {
			return nil, fmt.Errorf("-c: bad concurrency %q", f)
		}
		levels = append(levels, c)
	}
	return levels, nil
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// summary is the closing table: every row a measure next to its target,
// checked. A measure without a target is printed in its own section only.
type summary struct {
	lines []summaryLine
	// mrtr is each store's MRTR CPU per round trip by mode (on
	// PostgreSQL the broker's and the server's), so PostgreSQL's can be
	// set next to bbolt's once both ran.
	mrtr map[string]map[string]mrtrFigure
}

// mrtrFigure is the CPU of one store's MRTR round trip and of its floor's
// two bare durable commits, µs.
type mrtrFigure struct{ cpu, floor float64 }

func (s *summary) setMRTR(kind, mode string, f mrtrFigure) {
	if s.mrtr == nil {
		s.mrtr = map[string]map[string]mrtrFigure{}
	}
	if s.mrtr[kind] == nil {
		s.mrtr[kind] = map[string]mrtrFigure{}
	}
	s.mrtr[kind][mode] = f
}

// compareMRTR adds PostgreSQL's MRTR CPU next to bbolt's: what the round
// trip adds to each store's two bare durable commits (on PostgreSQL the
// broker's and the server's CPU together) may be no more on PostgreSQL.
// Without both figures there is no row.
func (s *summary) compareMRTR() {
	for _, m := range modes {
		p, okp := s.mrtr[storePostgres][m]
		b, okb := s.mrtr[storeBolt][m]
		if !okp || !okb {
			continue
		}
		padd, badd := (p.cpu-p.floor)/1000, (b.cpu-b.floor)/1000
		s.add(fmt.Sprintf("%s, MRTR round trip, %s: CPU ms added to the store's 2 bare commits, broker and PostgreSQL", storeTitle(storePostgres), pathName(m)),
			fmt.Sprintf("%.3f (%.3f with them; bbolt's: %.3f added, %.3f with them)", padd, p.cpu/1000, badd, b.cpu/1000),
			fmt.Sprintf("≤ %.3f (bbolt's)", badd), padd <= badd)
	}
}

type summaryLine struct {
	what, got, target string
	met               bool
}

func (s *summary) add(what, got, target string, met bool) {
	s.lines = append(s.lines, summaryLine{what, got, target, met})
}

func (s *summary) print() {
	if len(s.lines) == 0 {
		return
	}
	fmt.Printf("\n## Targets (issues 16, 31 and 34)\n\n| measure | measured | target | met |\n|---|---|---|---|\n")
	for _, l := range s.lines {
		met := "yes"
		if !l.met {
			met = "NO"
		}
		fmt.Printf("| %s | %s | %s | %s |\n", l.what, l.got, l.target, met)
	}
}
