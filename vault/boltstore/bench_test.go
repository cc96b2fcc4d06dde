package boltstore_test

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/internal/record"
	"credbroker/vault/vaulttest"
)

// The benchmark fixture: a database pre-filled with benchConns connections
// (four per principal), built once per test binary run the first time a
// benchmark asks for it, with large unsynced transactions, and removed by
// TestMain. Plain `go test` never builds it. BENCH_CONNS overrides the size.
// BENCH_FIXTURE_DIR keeps the fixture in that directory across runs
// (rebuilt when the record format the codec writes has changed); the Put
// benchmarks add their records to it.
var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixturePath string
	fixtureErr  error

	// The write benchmarks' copy of the fixture (openWritable).
	writableOnce sync.Once
	writableDir  string
	writablePath string
	writableErr  error
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
	for _, dir := range []string{fixtureDir, writableDir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

func fixture(b testing.TB) string {
	b.Helper()
	fixtureOnce.Do(func() { fixturePath, fixtureErr = buildFixture(b) })
	if fixtureErr != nil {
		b.Fatalf("bench fixture: %v", fixtureErr)
	}
	return fixturePath
}

func buildFixture(tb testing.TB) (string, error) {
	n := benchConns()
	kr := benchKeyring(tb)
	probe, err := record.EncodeConnection(kr, vaulttest.Conn(benchID(0), benchPrincipal(0), "github", "0"))
	if err != nil {
		return "", err
	}
	var path string
	if dir := os.Getenv("BENCH_FIXTURE_DIR"); dir != "" {
		path = filepath.Join(dir, fmt.Sprintf("vault-%d.db", n))
		if format, conns := fixtureFormat(path); format == probe[0] && conns == n {
			fmt.Fprintf(os.Stderr, "bench fixture: reusing %s\n", path)
			return path, nil
		}
		os.Remove(path)
	} else {
		dir, err := os.MkdirTemp("", "credbroker-bench-")
		if err != nil {
			return "", err
		}
		fixtureDir = dir // removed by TestMain
		path = filepath.Join(dir, "vault-1m.db")
	}
	start := time.Now()
	s, err := boltstore.Open(path, kr, boltstore.Options{NoSync: true})
	if err != nil {
		return "", err
	}
	defer s.Close()
	const chunk = 50_000
	batch := make([]vault.Connection, 0, chunk)
	for i := range n {
		batch = append(batch, vaulttest.Conn(benchID(i), benchPrincipal(i), "github", strconv.Itoa(i)))
		if len(batch) == chunk || i == n-1 {
			if err := s.Import(context.Background(), batch); err != nil {
				return "", err
			}
			batch = batch[:0]
		}
	}
	if err := s.DB().Sync(); err != nil {
		return "", err
	}
	fi, _ := os.Stat(path)
	fmt.Fprintf(os.Stderr, "bench fixture: %d connections, %d MB, built in %v\n", n, fi.Size()>>20, time.Since(start).Round(time.Millisecond))
	return path, nil
}

// fixtureFormat reports the format byte of the fixture's first record and
// how many connections it holds (0, 0 when it cannot be read), so a
// fixture of another record format or size is rebuilt.
func fixtureFormat(path string) (format byte, conns int) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return 0, 0
	}
	defer db.Close()
	_ = db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketConns); b != nil {
			if _, v := b.Cursor().First(); len(v) > 0 {
				format = v[0]
			}
			conns = b.Stats().KeyN
		}
		return nil
	})
	return format, conns
}

var (
	bucketConns       = []byte("connections")
	bucketConnByPrinc = []byte("conn_by_principal")
)

// openFixture opens the fixture, with the production options, for reading
// benchmarks: nothing may write to it, since later benchmarks (and later
// runs, with BENCH_FIXTURE_DIR) measure it as a million connections.
func openFixture(b testing.TB) *boltstore.Store {
	b.Helper()
	return openStore(b, fixture(b), benchKeyring(b))
}

// openWritable opens the write benchmarks' copy of the fixture, made once
// per process and synced to disk before anything is timed (so the copy's
// writeback does not share the disk with the measured fsyncs). The write
// benchmarks of one run share it: each adds its rows to what the ones
// before it added.
func openWritable(b testing.TB) *boltstore.Store {
	b.Helper()
	src := fixture(b)
	writableOnce.Do(func() { writableDir, writablePath, writableErr = copyFixture(src) })
	if writableErr != nil {
		b.Fatalf("bench fixture copy: %v", writableErr)
	}
	return openStore(b, writablePath, benchKeyring(b))
}

func copyFixture(src string) (dir, path string, err error) {
	if dir, err = os.MkdirTemp(filepath.Dir(src), "credbroker-bench-writes-"); err != nil {
		return "", "", err
	}
	path = filepath.Join(dir, "vault.db")
	in, err := os.Open(src)
	if err != nil {
		return dir, "", err
	}
	defer in.Close()
	out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return dir, "", err
	}
	if _, err = io.Copy(out, in); err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return dir, path, err
}

// warm reads every connection record once, so the timed reads see the
// file's pages mapped, as in a broker that has been serving for a while,
// rather than paying a page fault on their first touch. It returns the
// size of the first record.
func warm(b testing.TB, db *bolt.DB) int {
	b.Helper()
	size, sum := 0, 0
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketConns).ForEach(func(k, v []byte) error {
			if size == 0 {
				size = len(v)
			}
			sum += int(v[len(v)-1])
			return nil
		})
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sum
	return size
}

// floorAEAD returns an AES-256-GCM instance and a ciphertext of size bytes
// sealed with it, for the floors: what the store's reads and writes cost
// without the record codec.
func floorAEAD(b testing.TB, size int) (cipher.AEAD, []byte, []byte) {
	b.Helper()
	block, err := aes.NewCipher(bytes.Repeat([]byte{0x42}, 32))
	if err != nil {
		b.Fatal(err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		b.Fatal(err)
	}
	nonce := make([]byte, aead.NonceSize())
	pt := make([]byte, max(1, size-aead.Overhead()))
	return aead, nonce, aead.Seal(nil, nonce, pt, []byte("floor"))
}

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[int(float64(len(d)-1)*p)].Nanoseconds())
}

// floorGetP50 is the p50 of the last BenchmarkGet/floor run, in ns.
var floorGetP50 float64

// BenchmarkGet reads random connections of the 1M fixture. floor is raw
// bbolt (a read transaction, Get by key) plus an AES-256-GCM open of a
// ciphertext as large as the stored record, no codec; store is
// Store.GetConnection (decode and open the token set), with its p50 as a
// multiple of the floor's.
func BenchmarkGet(b *testing.B) {
	s := openFixture(b)
	size := warm(b, s.DB())
	n := benchConns()
	b.Run("floor", func(b *testing.B) {
		durs := floorGets(b, s.DB(), size, n, b.Loop)
		floorGetP50 = percentile(durs, 0.50)
		b.ReportMetric(floorGetP50, "p50-ns")
		b.ReportMetric(percentile(durs, 0.99), "p99-ns")
	})
	b.Run("store", func(b *testing.B) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		durs := make([]time.Duration, 0, 1<<20)
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
		p50 := percentile(durs, 0.50)
		b.ReportMetric(p50, "p50-ns")
		b.ReportMetric(percentile(durs, 0.99), "p99-ns")
		if floorGetP50 == 0 { // run alone: measure the floor now, untimed
			i := 0
			floorGetP50 = percentile(floorGets(b, s.DB(), size, n, func() bool { i++; return i <= 200_000 }), 0.50)
		}
		b.ReportMetric(p50/floorGetP50, "x-floor-p50")
	})
}

// floorGets times raw reads (see BenchmarkGet) for as long as more says.
func floorGets(b testing.TB, db *bolt.DB, size, n int, more func() bool) []time.Duration {
	aead, nonce, ct := floorAEAD(b, size)
	aad := []byte("floor")
	pt := make([]byte, 0, len(ct))
	rng := rand.New(rand.NewPCG(1, 2))
	durs := make([]time.Duration, 0, 1<<20)
	for more() {
		id := benchID(rng.IntN(n))
		t0 := time.Now()
		var err error
		vErr := db.View(func(tx *bolt.Tx) error {
			if tx.Bucket(bucketConns).Get([]byte(id)) == nil {
				return errors.New("not found")
			}
			_, err = aead.Open(pt[:0], nonce, ct, aad)
			return err
		})
		durs = append(durs, time.Since(t0))
		if vErr != nil {
			b.Fatalf("floor get %s: %v", id, vErr)
		}
	}
	return durs
}

var putSeq atomic.Int64

func newPutConn() vault.Connection {
	i := putSeq.Add(1)
	id := fmt.Sprintf("put-%d-%09d", os.Getpid(), i)
	return vaulttest.Conn(id, vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("putter%d", i%1000)}, "github", id)
}

func BenchmarkPutSingleWriter(b *testing.B) {
	s := openWritable(b)
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

// BenchmarkPut16Writers: 16 goroutines create connections in the 1M
// fixture, durably (fsync on every commit). The floors are raw bbolt
// putting a record-sized value and its index key, no codec or encryption:
// floor/delay=D through DB.Batch with MaxBatchDelay D, for three delays
// (BENCH_PUT_DELAYS=250us,500us,... for others), and floor/group through
// the store's group commit. ceiling is no design but a bound: 16 writes in
// every commit, one commit right after another. store is
// Store.CreateConnection, reported as a
// multiple of the best floor (x-floor) and of the best DB.Batch floor
// (x-batch).
func BenchmarkPut16Writers(b *testing.B) {
	delays := []time.Duration{500 * time.Microsecond, time.Millisecond, 2 * time.Millisecond}
	if env := os.Getenv("BENCH_PUT_DELAYS"); env != "" { // e.g. 250us,500us
		delays = nil
		for _, f := range strings.Split(env, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil || d <= 0 {
				b.Fatalf("BENCH_PUT_DELAYS: %q is not a duration", f)
			}
			delays = append(delays, d)
		}
	}
	var bestBatch, bestFloor float64
	rawPut := func(b *testing.B, commit func(func(*bolt.Tx) error) error) float64 {
		val := bytes.Repeat([]byte{0x5a}, putRecordSize(b))
		return parallel16(b, func() error { return commit(rawPutConn(val)) })
	}
	b.Run("ceiling", func(b *testing.B) {
		// One goroutine commits 16 new connections at a time: every
		// commit carries as many writes as 16 writers with one write each
		// in flight can have waiting, and the next starts the moment the
		// last ends. Commits of fewer writes get fewer writes a second
		// (a commit's cost grows by less than its writes), so 16 ÷ this
		// commit time bounds the rate of 16 writers on this disk with a
		// durable commit before each acknowledgement.
		db := openWritable(b).DB()
		val := bytes.Repeat([]byte{0x5a}, putRecordSize(b))
		b.ResetTimer()
		start := time.Now()
		for b.Loop() {
			if err := commit16(db, val); err != nil {
				b.Fatal(err)
			}
		}
		el := time.Since(start)
		b.ReportMetric(el.Seconds()*1000/float64(b.N), "ms/commit")
		b.ReportMetric(16*float64(b.N)/el.Seconds(), "writes/s")
	})
	b.Run("floor", func(b *testing.B) {
		for _, delay := range delays {
			b.Run("delay="+delay.String(), func(b *testing.B) {
				db := openWritable(b).DB()
				db.MaxBatchDelay = delay
				rate := rawPut(b, db.Batch)
				b.ReportMetric(rate, "writes/s")
				bestBatch = max(bestBatch, rate)
			})
		}
		b.Run("group", func(b *testing.B) {
			update, commits := boltstore.GroupUpdate(openWritable(b).DB())
			rate := rawPut(b, update)
			b.ReportMetric(rate, "writes/s")
			b.ReportMetric(float64(b.N)/float64(commits()), "writes/commit")
			bestFloor = max(bestBatch, rate)
		})
	})
	store := func(b *testing.B, s *boltstore.Store) {
		ctx := context.Background()
		before := boltstore.Commits(s)
		rate := parallel16(b, func() error {
			_, err := s.CreateConnection(ctx, newPutConn())
			return err
		})
		b.ReportMetric(rate, "writes/s")
		b.ReportMetric(float64(b.N)/float64(boltstore.Commits(s)-before), "writes/commit")
		if bestFloor > 0 {
			b.ReportMetric(rate/bestFloor, "x-floor")
			b.ReportMetric(rate/bestBatch, "x-batch")
		}
	}
	b.Run("store/nolinger", func(b *testing.B) {
		s := openWritable(b)
		boltstore.SetLinger(s, false)
		store(b, s)
	})
	b.Run("store", func(b *testing.B) { store(b, openWritable(b)) })
}

// commit16 is one durable commit of 16 new connections (rawPutConn).
func commit16(db *bolt.DB, val []byte) error {
	var puts [16]func(*bolt.Tx) error
	for i := range puts {
		puts[i] = rawPutConn(val)
	}
	return db.Update(func(tx *bolt.Tx) error {
		for _, put := range puts {
			if err := put(tx); err != nil {
				return err
			}
		}
		return nil
	})
}

// BenchmarkPut16Turns is BenchmarkPut16Writers with its rows taking turns:
// the disk's speed here drifts by half within minutes, so rows measured
// one after another compare spells as much as code. Each round gives every
// mode BENCH_PUT_SLICE (default 1 s) on the same fixture file, in turn:
// the ceiling (one goroutine committing 16 writes at a time, back to
// back), the raw group-commit floor, the raw DB.Batch floor with a 1 ms
// delay, and the store; -benchtime Nx runs N rounds. Reported: each mode's
// writes/s and the store's rate over the ceiling's and the floors'.
func BenchmarkPut16Turns(b *testing.B) {
	slice := time.Second
	if d, err := time.ParseDuration(os.Getenv("BENCH_PUT_SLICE")); err == nil && d > 0 {
		slice = d
	}
	s := openWritable(b)
	db := s.DB()
	val := bytes.Repeat([]byte{0x5a}, putRecordSize(b))
	group, _ := boltstore.GroupUpdate(db)
	ctx := context.Background()
	type mode struct {
		name string
		run  func(end time.Time) (int, error)
	}
	writers16 := func(op func() error) func(time.Time) (int, error) {
		return func(end time.Time) (int, error) {
			var n atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 16)
			for range 16 {
				wg.Go(func() {
					for time.Now().Before(end) {
						if err := op(); err != nil {
							errs <- err
							return
						}
						n.Add(1)
					}
				})
			}
			wg.Wait()
			close(errs)
			return int(n.Load()), <-errs
		}
	}
	modes := []mode{
		{"ceiling", func(end time.Time) (int, error) {
			n := 0
			for time.Now().Before(end) {
				if err := commit16(db, val); err != nil {
					return n, err
				}
				n += 16
			}
			return n, nil
		}},
		{"group", writers16(func() error { return group(rawPutConn(val)) })},
		{"batch1ms", writers16(func() error { return db.Batch(rawPutConn(val)) })},
		{"store", writers16(func() error {
			_, err := s.CreateConnection(ctx, newPutConn())
			return err
		})},
	}
	db.MaxBatchDelay = time.Millisecond
	writes := make([]int, len(modes))
	took := make([]time.Duration, len(modes))
	b.ResetTimer()
	for range b.N {
		for i, m := range modes {
			start := time.Now()
			n, err := m.run(start.Add(slice))
			if err != nil {
				b.Fatalf("%s: %v", m.name, err)
			}
			writes[i] += n
			took[i] += time.Since(start)
		}
	}
	rate := make([]float64, len(modes))
	for i, m := range modes {
		rate[i] = float64(writes[i]) / took[i].Seconds()
		b.ReportMetric(rate[i], m.name+"-writes/s")
	}
	store := rate[len(modes)-1]
	b.ReportMetric(store/rate[0], "store/ceiling")
	b.ReportMetric(store/rate[1], "store/group")
	b.ReportMetric(store/rate[2], "store/batch1ms")
}

// BenchmarkPutOpenLoop: what the group commit's wait for returning writers
// costs when writers do not come back. Writes arrive at random (Poisson,
// BENCH_PUT_RATE a second, default 1000) for 1 s per round, each from its
// own goroutine; rounds alternate the wait off and on so the disk's drift
// touches both alike. Reported per mode: p50 and p99 latency in ms, writes
// per commit, and the process's CPU per write (the wait yields the
// processor in a loop rather than sleeping, so a wait for no one costs
// CPU).
func BenchmarkPutOpenLoop(b *testing.B) {
	rate := 1000.0
	if r, err := strconv.ParseFloat(os.Getenv("BENCH_PUT_RATE"), 64); err == nil && r > 0 {
		rate = r
	}
	s := openWritable(b)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	lat := map[bool][]time.Duration{}
	writes, commits := map[bool]int{}, map[bool]int{}
	cpu := map[bool]time.Duration{}
	b.ResetTimer()
	for range b.N {
		for _, on := range []bool{false, true} {
			boltstore.SetLinger(s, on)
			var (
				mu   sync.Mutex
				wg   sync.WaitGroup
				took []time.Duration
			)
			c0 := processCPU()
			end := time.Now().Add(time.Second)
			for next := time.Now(); next.Before(end); next = next.Add(time.Duration(rng.ExpFloat64() / rate * 1e9)) {
				time.Sleep(time.Until(next))
				wg.Add(1)
				go func() {
					defer wg.Done()
					t0 := time.Now()
					if _, err := s.CreateConnection(ctx, newPutConn()); err != nil {
						b.Error(err)
					}
					d := time.Since(t0)
					mu.Lock()
					took = append(took, d)
					mu.Unlock()
				}()
			}
			wg.Wait()
			cpu[on] += processCPU() - c0
			lat[on] = append(lat[on], took...)
			writes[on] += len(took)
			commits[on] += boltstore.Commits(s)
		}
	}
	for _, on := range []bool{false, true} {
		name := map[bool]string{false: "nolinger", true: "linger"}[on]
		b.ReportMetric(percentile(lat[on], 0.5)/1e6, name+"-p50-ms")
		b.ReportMetric(percentile(lat[on], 0.99)/1e6, name+"-p99-ms")
		b.ReportMetric(float64(writes[on])/float64(commits[on]), name+"-writes/commit")
		b.ReportMetric(float64(cpu[on].Microseconds())/float64(writes[on]), name+"-cpu-us/write")
	}
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parallel16 runs op from 16 goroutines b.N times in all and returns the
// rate.
func parallel16(b *testing.B, op func() error) float64 {
	b.SetParallelism(max(1, 16/runtimeProcs()))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	return float64(b.N) / time.Since(start).Seconds()
}

// rawPutConn returns a raw bbolt write of a new connection: val under its
// id, and its principal index key, as Store.CreateConnection writes them
// but without codec or encryption; a taken id is an error.
func rawPutConn(val []byte) func(*bolt.Tx) error {
	c := newPutConn()
	id := []byte(c.ID)
	idx := binary.BigEndian.AppendUint32(nil, uint32(len(c.Principal.Issuer)))
	idx = append(idx, c.Principal.Issuer...)
	idx = binary.BigEndian.AppendUint32(idx, uint32(len(c.Principal.Subject)))
	idx = append(append(idx, c.Principal.Subject...), c.ID...)
	return func(tx *bolt.Tx) error {
		if tx.Bucket(bucketConns).Get(id) != nil {
			return errors.New("exists")
		}
		if err := tx.Bucket(bucketConns).Put(id, val); err != nil {
			return err
		}
		return tx.Bucket(bucketConnByPrinc).Put(idx, nil)
	}
}

// putRecordSize is the size of the record Store.CreateConnection writes
// for newPutConn.
func putRecordSize(b testing.TB) int {
	rec, err := record.EncodeConnection(benchKeyring(b), newPutConn())
	if err != nil {
		b.Fatal(err)
	}
	return len(rec)
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
