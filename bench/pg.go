package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"credbroker/vault/pgstore/pgtest"
)

// pgServer is the bench's PostgreSQL: a throwaway server started from the
// local binaries as the tests start theirs (package pgtest: initdb into a
// temporary directory, loopback TCP, fsync and synchronous_commit on), or
// the server named by CREDBROKER_TEST_POSTGRES. pg_stat_statements is
// loaded, so each measure can say which statements the broker sent.
type pgServer struct {
	srv     *pgtest.Server
	version string
	admin   *pgx.Conn // the bench's own queries of the statistics
	stmts   bool      // pg_stat_statements is available
	pm      int       // the postmaster's pid when the bench started it, else 0
}

func startPostgres() (*pgServer, error) {
	srv, err := pgtest.Start()
	if err != nil {
		return nil, err
	}
	p := &pgServer{srv: srv}
	if err := p.loadStatements(); err != nil {
		p.close()
		return nil, err
	}
	p.pm = postmaster()
	return p, nil
}

// loadStatements loads pg_stat_statements, which PostgreSQL loads only at
// start: on a server the bench started, it is named in
// shared_preload_libraries and the server restarted (pgtest restarts by a
// crash and recovery, on an empty database here); on an external server
// the extension is used if it is there.
func (p *pgServer) loadStatements() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, p.srv.URL)
	if err != nil {
		return err
	}
	var preload string
	if err := c.QueryRow(ctx, "SHOW shared_preload_libraries").Scan(&preload); err != nil {
		c.Close(ctx)
		return err
	}
	if os.Getenv(pgtest.EnvURL) == "" && !strings.Contains(preload, "pg_stat_statements") {
		if _, err := c.Exec(ctx, "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"); err != nil {
			c.Close(ctx)
			return err
		}
		c.Close(ctx)
		if err := p.srv.Kill(); err != nil {
			return err
		}
		if err := p.srv.Restart(); err != nil {
			return err
		}
		if c, err = pgx.Connect(ctx, p.srv.URL); err != nil {
			return err
		}
	}
	p.admin = c
	if err := c.QueryRow(ctx, "SHOW server_version").Scan(&p.version); err != nil {
		return err
	}
	_, err = c.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	p.stmts = err == nil
	if !p.stmts && os.Getenv(pgtest.EnvURL) == "" {
		return fmt.Errorf("pg_stat_statements: %w", err)
	}
	return nil
}

func (p *pgServer) close() {
	if p.admin != nil {
		p.admin.Close(context.Background())
	}
	p.srv.Close()
}

// freshSchema returns a URL whose connections use a new, empty schema.
func (p *pgServer) freshSchema() (string, error) {
	u, _, err := p.srv.NewSchema()
	return u, err
}

// statementCounts is pg_stat_statements' calls by statement (this
// server's statements other than the bench's own statistics queries).
type statementCounts map[string]int64

func (p *pgServer) statementCounts() (statementCounts, error) {
	if !p.stmts {
		return nil, errors.New("pg_stat_statements is not available")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := p.admin.Query(ctx, "SELECT query, calls FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())")
	if err != nil {
		return nil, err
	}
	out := statementCounts{}
	var q string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&q, &n}, func() error {
		if !strings.Contains(q, "pg_stat_statements") && !strings.Contains(q, "pg_database") {
			out[strings.Join(strings.Fields(q), " ")] += n
		}
		return nil
	})
	return out, err
}

// counted runs run and, on PostgreSQL with pg_stat_statements, gives its
// result the statements the server ran meanwhile.
func (st *stack) counted(run func() loadResult) loadResult {
	var before statementCounts
	if st.kind == storePostgres && st.pg.stmts {
		before, _ = st.pg.statementCounts()
	}
	r := run()
	if before != nil {
		if after, err := st.pg.statementCounts(); err == nil {
			r.stmts = after.sub(before)
		}
	}
	return r
}

// sub returns the calls made between snapshot o and c.
func (c statementCounts) sub(o statementCounts) statementCounts {
	d := statementCounts{}
	for q, n := range c {
		if n -= o[q]; n != 0 {
			d[q] = n
		}
	}
	return d
}

func (c statementCounts) add(o statementCounts) {
	for q, n := range o {
		c[q] += n
	}
}

// heartbeat is the statement each replica's change feeds send five times
// a second whatever the load (pgstore's watch), not a call's.
const heartbeat = "SELECT pg_notify($1, $2)"

// work is total without the feeds' heartbeats.
func (c statementCounts) work() int64 { return c.total() - c[heartbeat] }

func (c statementCounts) total() int64 {
	var t int64
	for _, n := range c {
		t += n
	}
	return t
}

// print lists the statements, most called first, per unit (calls / n).
func (c statementCounts) print(n int, unit string) {
	qs := make([]string, 0, len(c))
	for q := range c {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, func(a, b string) int {
		if c[a] != c[b] {
			return int(c[b] - c[a])
		}
		return strings.Compare(a, b)
	})
	fmt.Printf("\n| per %s | statement |\n|---|---|\n", unit)
	for _, q := range qs {
		text := q
		if len(text) > 110 {
			text = text[:107] + "..."
		}
		fmt.Printf("| %.2f | `%s` |\n", float64(c[q])/float64(n), strings.ReplaceAll(text, "|", `\|`))
	}
}

// postmaster returns the pid of the PostgreSQL server this process
// started (its child named postgres), or 0.
func postmaster() int {
	me := os.Getpid()
	for _, pid := range pids() {
		if comm, ppid, _ := procStat(pid); comm == "postgres" && ppid == me {
			return pid
		}
	}
	return 0
}

func pids() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// procStat reads a process's name, parent and CPU clock ticks (user and
// system, its own and, with children, those of its reaped children).
func procStat(pid int) (comm string, ppid int, ticks [2]int64) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return "", 0, ticks
	}
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "", 0, ticks
	}
	comm = string(b[i+1 : j])
	f := strings.Fields(string(b[j+1:]))
	// f[0] is the state; ppid is field 4 of stat, utime..cstime 14..17.
	if len(f) < 15 {
		return comm, 0, ticks
	}
	ppid, _ = strconv.Atoi(f[1])
	at := func(k int) int64 { v, _ := strconv.ParseInt(f[k-3], 10, 64); return v }
	ticks[0] = at(14) + at(15)
	ticks[1] = at(16) + at(17)
	return comm, ppid, ticks
}

// cpu is the CPU time the server's processes have used so far: the
// postmaster, its exited children and its running ones (backends, WAL
// writer, checkpointer, …), at the kernel's 10 ms resolution per process.
// It is negative for a server the bench did not start.
func (p *pgServer) cpu() time.Duration {
	if p == nil || p.pm == 0 {
		return -1
	}
	_, _, t := procStat(p.pm)
	total := t[0] + t[1]
	for _, pid := range pids() {
		if _, ppid, ct := procStat(pid); ppid == p.pm {
			total += ct[0]
		}
	}
	return time.Duration(total) * time.Second / 100 // USER_HZ
}

// startSQLFloor serves the PostgreSQL floor: the JSON floor plus one SQL
// round trip on the broker's server and database, the primary-key read of
// the connection the broker answers about (the raw record, not decoded),
// through a pool as large as the store's.
func (st *stack) startSQLFloor(dbURL string, fixed []byte) (string, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return "", err
	}
	cfg.MaxConns = 16
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	st.closers = append(st.closers, pool.Close)
	read := func(ctx context.Context) error {
		var rec []byte
		return pool.QueryRow(ctx, "SELECT record FROM connections WHERE id = $1", "conn_bench_alice_github").Scan(&rec)
	}
	if err := read(ctx); err != nil {
		return "", fmt.Errorf("SQL floor: %w", err)
	}
	ln, u, err := listen()
	if err != nil {
		return "", err
	}
	serve(st, ln, jsonFloor(fixed, read))
	return u, nil
}

// pgCommitFloor is the two durable commits an MRTR round trip needs, done
// bare on the broker's PostgreSQL database over one connection: insert a
// grant-sized value, then, in one transaction, overwrite it and insert a
// second one (the callback's grant and connection).
type pgCommitFloor struct {
	conn *pgx.Conn
	val  []byte
}

func newPGCommitFloor(dbURL string) (*pgCommitFloor, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	if _, err := c.Exec(ctx, "CREATE TABLE bench_floor (k text PRIMARY KEY, v bytea NOT NULL)"); err != nil {
		c.Close(ctx)
		return nil, err
	}
	return &pgCommitFloor{conn: c, val: bytes.Repeat([]byte{0x5a}, floorValue)}, nil
}

func (f *pgCommitFloor) round(i int) error {
	ctx := context.Background()
	g, c := fmt.Sprintf("g%08d", i), fmt.Sprintf("c%08d", i)
	if _, err := f.conn.Exec(ctx, "INSERT INTO bench_floor (k, v) VALUES ($1, $2)", g, f.val); err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, f.conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "UPDATE bench_floor SET v = $2 WHERE k = $1", g, f.val); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO bench_floor (k, v) VALUES ($1, $2)", c, f.val)
		return err
	})
}

func (f *pgCommitFloor) drop() error {
	ctx := context.Background()
	defer f.conn.Close(ctx)
	_, err := f.conn.Exec(ctx, "DROP TABLE bench_floor")
	return err
}

// describe says what the floor is, for the MRTR section.
func (f *pgCommitFloor) describe() string {
	return fmt.Sprintf("two bare durable PostgreSQL commits on the same server and database over one connection (a %d-byte insert, then a transaction of its update and a second insert; no codec, no encryption, no HTTP)", floorValue)
}
