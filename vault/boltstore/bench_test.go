package boltstore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

// The benchmark fixture: a database pre-filled with benchConns connections
// (four per principal), built once per test binary run the first time a
// benchmark asks for it, with large unsynced transactions, and removed by
// TestMain. Plain `go test` never builds it. BENCH_CONNS overrides the size.
var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixturePath string
	fixtureErr  error
)

func benchConns() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_CONNS")); err == nil && n > 0 {
		return n
	}
	return 1_000_000
}

func benchKeyring(tb testing.TB) *vault.Keyring {
	kr, err := vault.NewKeyring([]string{"bench"}, [][]byte{bytes.Repeat([]byte{0x42}, 32)})
	if err != nil {
		tb.Fatal(err)
	}
	return kr
}

func benchID(i int) string { return fmt.Sprintf("c%07d", i) }

func benchPrincipal(i int) vault.Principal {
	return vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("u%07d", i/4)}
}

func TestMain(m *testing.M) {
	if path := os.Getenv(crashDBEnv); path != "" {
		crashChild(path) // TestCrashSafety's child process; never returns
	}
	code := m.Run()
	if fixtureDir != "" {
		os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}

func fixture(b *testing.B) string {
	b.Helper()
	fixtureOnce.Do(func() {
		fixtureDir, fixtureErr = os.MkdirTemp("", "credbroker-bench-")
		if fixtureErr != nil {
			return
		}
		fixturePath = filepath.Join(fixtureDir, "vault-1m.db")
		start := time.Now()
		s, err := boltstore.Open(fixturePath, benchKeyring(b), boltstore.Options{NoSync: true})
		if err != nil {
			fixtureErr = err
			return
		}
		defer s.Close()
		n := benchConns()
		const chunk = 50_000
		batch := make([]vault.Connection, 0, chunk)
		for i := range n {
			batch = append(batch, vaulttest.Conn(benchID(i), benchPrincipal(i), "github", strconv.Itoa(i)))
			if len(batch) == chunk || i == n-1 {
				if fixtureErr = s.Import(context.Background(), batch); fixtureErr != nil {
					return
				}
				batch = batch[:0]
			}
		}
		if fixtureErr = s.DB().Sync(); fixtureErr != nil {
			return
		}
		fi, _ := os.Stat(fixturePath)
		fmt.Fprintf(os.Stderr, "bench fixture: %d connections, %d MB, built in %v\n", n, fi.Size()>>20, time.Since(start).Round(time.Millisecond))
	})
	if fixtureErr != nil {
		b.Fatalf("bench fixture: %v", fixtureErr)
	}
	return fixturePath
}

func openFixture(b *testing.B) *boltstore.Store {
	b.Helper()
	// BENCH_BATCH_DELAY (e.g. 200us) overrides Options.MaxBatchDelay for tuning.
	delay, _ := time.ParseDuration(os.Getenv("BENCH_BATCH_DELAY"))
	s, err := boltstore.Open(fixture(b), benchKeyring(b), boltstore.Options{MaxBatchDelay: delay})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[int(float64(len(d)-1)*p)].Nanoseconds())
}

func BenchmarkGet(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	n := benchConns()
	rng := rand.New(rand.NewPCG(1, 2))
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		id := benchID(rng.IntN(n))
		t0 := time.Now()
		c, err := s.GetConnection(ctx, id)
		durs = append(durs, time.Since(t0))
		if err != nil || c.ID != id {
			b.Fatalf("get %s: %v", id, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(percentile(durs, 0.50), "p50-ns")
	b.ReportMetric(percentile(durs, 0.99), "p99-ns")
}

var putSeq atomic.Int64

func newPutConn() vault.Connection {
	i := putSeq.Add(1)
	id := fmt.Sprintf("put-%d-%09d", os.Getpid(), i)
	return vaulttest.Conn(id, vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("putter%d", i%1000)}, "github", id)
}

func BenchmarkPutSingleWriter(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if _, err := s.CreateConnection(ctx, newPutConn()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
}

func BenchmarkPut16Writers(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	b.SetParallelism(max(1, 16/runtimeProcs())) // 16 goroutines in all
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.CreateConnection(ctx, newPutConn()); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "writes/s")
}

func BenchmarkListOnePrincipal(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	n := benchConns()
	rng := rand.New(rand.NewPCG(3, 4))
	b.ResetTimer()
	for b.Loop() {
		i := rng.IntN(n)
		list, err := s.ListConnections(ctx, benchPrincipal(i))
		if err != nil || len(list) == 0 {
			b.Fatalf("list: %d, %v", len(list), err)
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	path := fixture(b)
	kr := benchKeyring(b)
	b.ResetTimer()
	for b.Loop() {
		s, err := boltstore.Open(path, kr, boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.GetConnection(context.Background(), benchID(0)); err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
