package boltstore_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"
)

// procMem is the process's resident memory from /proc/self/status, in
// bytes: all of it, anonymous (heap, stacks) and file-backed (the
// memory-mapped database's pages, shared with the page cache).
type procMem struct{ rss, anon, file uint64 }

func readProcMem(tb testing.TB) procMem {
	tb.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Fatalf("RSS needs /proc/self/status: %v", err)
	}
	defer f.Close()
	var m procMem
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var dst *uint64
		switch name {
		case "VmRSS":
			dst = &m.rss
		case "RssAnon":
			dst = &m.anon
		case "RssFile":
			dst = &m.file
		default:
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			tb.Fatalf("parse %s: %v", name, err)
		}
		*dst = kb << 10
	}
	if m.rss == 0 {
		tb.Fatal("no VmRSS in /proc/self/status")
	}
	return m
}

func heapInuse() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

const mb = 1 << 20

// BenchmarkRSS opens the 1M fixture, does 100,000 random Gets and reports
// the process's RSS next to the Go heap (HeapInuse); then it reads random
// connections for BENCH_RSS_STEADY (default 10s; the figure is
// 60s) and samples both every 5 s (every second for runs shorter than
// 20s), reporting growth from the first sample to the last. It runs once
// whatever -benchtime says. Build the fixture in an earlier run
// (BENCH_FIXTURE_DIR) so the building does not count:
//
//	BENCH_FIXTURE_DIR=/var/tmp BENCH_RSS_STEADY=60s go test -run '^$' -bench RSS ./vault/boltstore/
func BenchmarkRSS(b *testing.B) {
	steady := 10 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BENCH_RSS_STEADY")); err == nil && d > 0 {
		steady = d
	}
	every := 5 * time.Second
	if steady < 20*time.Second {
		every = time.Second
	}
	path := fixture(b)
	runtime.GC()
	debug.FreeOSMemory()
	before := readProcMem(b)
	s := openFixture(b)
	ctx := context.Background()
	n := benchConns()
	rng := rand.New(rand.NewPCG(5, 6))
	get := func() {
		id := benchID(rng.IntN(n))
		if c, err := s.GetConnection(ctx, id); err != nil || c.ID != id {
			b.Fatalf("get %s: %v", id, err)
		}
	}
	for range 100_000 {
		get()
	}
	after := readProcMem(b)
	heap := heapInuse()
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "rss: file %d MB; before open RSS %.1f MB; after 100k Gets RSS %.1f MB (anon %.1f, file-backed %.1f), Go heap in use %.1f MB\n",
		fi.Size()>>20, float64(before.rss)/mb, float64(after.rss)/mb, float64(after.anon)/mb, float64(after.file)/mb, float64(heap)/mb)
	type sample struct {
		at   time.Duration
		mem  procMem
		heap uint64
		gets int
	}
	var samples []sample
	start := time.Now()
	next := start
	gets := 0
	for {
		if now := time.Now(); !now.Before(next) {
			sm := sample{now.Sub(start).Round(time.Second), readProcMem(b), heapInuse(), gets}
			samples = append(samples, sm)
			fmt.Fprintf(os.Stderr, "rss: t=%-4v RSS %7.1f MB  anon %6.1f MB  file-backed %7.1f MB  heap in use %5.1f MB  gets %d\n",
				sm.at, float64(sm.mem.rss)/mb, float64(sm.mem.anon)/mb, float64(sm.mem.file)/mb, float64(sm.heap)/mb, sm.gets)
			if now.Sub(start) >= steady {
				break
			}
			next = next.Add(every)
		}
		for range 1000 {
			get()
		}
		gets += 1000
	}
	first, last := samples[0], samples[len(samples)-1]
	b.ReportMetric(float64(after.rss)/mb, "rss-MB")
	b.ReportMetric(float64(after.anon)/mb, "anon-MB")
	b.ReportMetric(float64(heap)/mb, "heap-MB")
	b.ReportMetric((float64(last.mem.rss)-float64(first.mem.rss))/mb, "rss-growth-MB")
	b.ReportMetric((float64(last.mem.anon)-float64(first.mem.anon))/mb, "anon-growth-MB")
	b.ReportMetric((float64(last.heap)-float64(first.heap))/mb, "heap-growth-MB")
}
