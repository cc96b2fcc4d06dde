package pgstore_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/internal/record"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// The benchmark fixture mirrors boltstore's: benchConns connections, four
// per principal, loaded once per run through ImportRecords into
// one schema of the shared throwaway server. BENCH_CONNS overrides the
// size (default 100,000). Plain `go test` never builds it.
var (
	fixtureOnce sync.Once
	fixtureURL  string
	fixtureErr  error
)

func benchConns() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_CONNS")); err == nil && n > 0 {
		return n
	}
	return 100_000
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

func openFixture(b *testing.B) *pgstore.Store {
	b.Helper()
	srv := pgtest.Shared(b)
	fixtureOnce.Do(func() {
		if fixtureURL, _, fixtureErr = srv.NewSchema(); fixtureErr != nil { // dropped with the server
			return
		}
		start := time.Now()
		kr := benchKeyring(b)
		s, err := pgstore.Open(context.Background(), fixtureURL, kr, pgstore.Options{})
		if err != nil {
			fixtureErr = err
			return
		}
		defer s.Close()
		n := benchConns()
		recs := make([][]byte, 0, 5000)
		for i := range n {
			c := vaulttest.Conn(benchID(i), benchPrincipal(i), "github", strconv.Itoa(i))
			c.Version = 1
			rec, err := record.EncodeConnection(kr, c)
			if err != nil {
				fixtureErr = err
				return
			}
			recs = append(recs, rec)
			if len(recs) == cap(recs) || i == n-1 {
				if _, _, fixtureErr = s.ImportRecords(context.Background(), transfer.Records{Kind: transfer.KindConnection, Recs: recs}); fixtureErr != nil {
					return
				}
				recs = recs[:0]
			}
		}
		_, fixtureErr = s.Pool().Exec(context.Background(), "VACUUM ANALYZE connections")
		fmt.Fprintf(os.Stderr, "bench fixture: %d connections in PostgreSQL, built in %v\n", n, time.Since(start).Round(time.Millisecond))
	})
	if fixtureErr != nil {
		b.Fatalf("bench fixture: %v", fixtureErr)
	}
	s, err := pgstore.Open(context.Background(), fixtureURL, benchKeyring(b), pgstore.Options{})
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
	for b.Loop() {
		id := benchID(rng.IntN(n))
		t0 := time.Now()
		c, err := s.GetConnection(ctx, id)
		durs = append(durs, time.Since(t0))
		if err != nil || c.ID != id {
			b.Fatalf("get %s: %v", id, err)
		}
	}
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
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0))) // 16 goroutines in all
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

func BenchmarkUpdate(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	n := benchConns()
	rng := rand.New(rand.NewPCG(5, 6))
	for b.Loop() {
		if _, err := s.UpdateConnection(ctx, benchID(rng.IntN(n)), func(c vault.Connection) (vault.Connection, error) {
			c.LastUsed = time.Now()
			return c, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkListOnePrincipal(b *testing.B) {
	s := openFixture(b)
	ctx := context.Background()
	n := benchConns()
	rng := rand.New(rand.NewPCG(3, 4))
	for b.Loop() {
		list, err := s.ListConnections(ctx, benchPrincipal(rng.IntN(n)))
		if err != nil || len(list) == 0 {
			b.Fatalf("list: %d, %v", len(list), err)
		}
	}
}

// BenchmarkGetOverBareQuery sets GetConnection next to the bare read of
// the same row through the same pool (what it adds: the decoding, the
// decryption, the checks), in turns so that the machine's load hits both
// alike, back to back and after the caller slept (a round trip that
// starts from an idle process, as a call that waited on the network
// does): the p50 of each.
func BenchmarkGetOverBareQuery(b *testing.B) {
	s := openFixture(b)
	id := benchID(0)
	bare := func(ctx context.Context) error {
		var rec []byte
		var version int64
		return s.Pool().QueryRow(ctx, "SELECT record, version FROM connections WHERE id = $1", id).Scan(&rec, &version)
	}
	get := func(ctx context.Context) error { _, err := s.GetConnection(ctx, id); return err }
	for _, idle := range []time.Duration{0, time.Millisecond} {
		b.Run(fmt.Sprintf("idle=%v", idle), func(b *testing.B) {
			ctx := context.Background()
			var durs [2][]time.Duration
			i := 0
			for b.Loop() {
				if idle > 0 {
					b.StopTimer()
					time.Sleep(idle)
					b.StartTimer()
				}
				read := [2]func(context.Context) error{bare, get}[i%2]
				t0 := time.Now()
				err := read(ctx)
				durs[i%2] = append(durs[i%2], time.Since(t0))
				if err != nil {
					b.Fatal(err)
				}
				i++
			}
			b.ReportMetric(percentile(durs[0], 0.50), "bare-p50-ns")
			b.ReportMetric(percentile(durs[1], 0.50), "get-p50-ns")
		})
	}
}
