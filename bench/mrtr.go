package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"credbroker/internal/buffered"
	"credbroker/provider"
	"credbroker/vault"

	bolt "go.etcd.io/bbolt"
)

// usage is the process's CPU time and its system (kernel) part, from one
// getrusage call; with bbolt the kernel part is mostly each commit's pwrite
// and fdatasync. One call per snapshot: the call itself costs several
// microseconds here, and a second call would be charged to what is timed.
func usage() (cpu, sys time.Duration) {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), time.Duration(ru.Stime.Nano())
}

// floorValue is the size of the value each floor commit puts: about a
// sealed grant or connection record.
const floorValue = 512

// mrtrPeople is how many people the MRTR round trips take turns for. At
// the default limit of 30 connect requests a person an hour, they carry
// up to 30 × mrtrPeople round trips a run, warm-up and allocation pass
// included.
const mrtrPeople = 400

func mrtrName(i int) string { return fmt.Sprintf("mrtr-%04d", i) }

type mrtrPerson struct {
	p    vault.Principal
	auth map[string][]string // the Authorization header's value, by mode
}

// mrtrBlock is how many MRTR round trips run before the other mode's and
// then the floor's take their turn; the connections a block created are
// deleted after it, outside every count (no one has a second turn within
// a block: mrtrBlock < mrtrPeople).
const mrtrBlock = 100

// commitFloor is the two durable commits an MRTR round trip needs, done
// bare on the store's own file or database.
type commitFloor interface {
	round(i int) error
	drop() error
	describe() string
}

// mrtrTally is what the timed blocks of one kind of round add up to.
type mrtrTally struct {
	n                   int
	cpu, sys, wall, srv time.Duration // srv: PostgreSQL's CPU; negative: not measured
	commits             int64
	stmts               statementCounts
}

func (t *mrtrTally) perCPU() float64 { return float64(t.cpu.Microseconds()) / float64(t.n) }
func (t *mrtrTally) perSrv() float64 {
	if t.srv < 0 {
		return -1
	}
	return float64(t.srv.Microseconds()) / float64(t.n)
}

// mrtr times round trips through the handler, in-process, in both modes:
// first call → input_required → the consent form's check
// (binding.Authorize, as oauthflow's loadGrant; it writes nothing) → the
// callback's connections.Save, which stores the new connection and
// approves and completes the grant in one transaction → retry → complete.
// The connections are deleted after each block so each person's next
// round starts unconnected.
func (st *stack) mrtr(cfg config) error {
	ctx := context.Background()
	n := cfg.mrtrN
	demo, ok := st.conns.Providers().Lookup("demo")
	if !ok {
		return fmt.Errorf("no demo provider")
	}
	pg := st.kind == storePostgres
	allocN := min(n, 500)
	if total := len(modes)*len(st.people) + len(modes)*n + allocN; total > 30*len(st.people) {
		return fmt.Errorf("-mrtr %d: %d round trips for %d people would pass the limit of 30 connect requests a person an hour", n, total, len(st.people))
	}
	var ms runtime.MemStats
	mallocs := func() uint64 { runtime.ReadMemStats(&ms); return ms.Mallocs }
	do := func(mode string, who mrtrPerson, body []byte) ([]byte, error) {
		rr := buffered.NewResponse()
		req := st.newRequest(st.endpoint(mode), who.auth[mode], body)
		st.srv[mode].ServeHTTP(rr, req)
		if rr.Status != 200 {
			return nil, fmt.Errorf("HTTP %d: %s", rr.Status, rr.Body.Bytes())
		}
		return rr.Body.Bytes(), nil
	}
	turn := 0 // people take turns: no one has more than one round trip more than another
	round := func(mode string, i int) (string, error) {
		who := st.people[turn%len(st.people)]
		turn++
		b, err := do(mode, who, callBody(2*i, "demo", ""))
		if err != nil {
			return "", err
		}
		var first struct {
			Result struct {
				ResultType    string `json:"resultType"`
				RequestState  string `json:"requestState"`
				InputRequests map[string]struct {
					Params struct{ URL string } `json:"params"`
				} `json:"inputRequests"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &first); err != nil || first.Result.ResultType != "input_required" {
			return "", fmt.Errorf("first call: %s", b)
		}
		u := first.Result.InputRequests["connect_demo"].Params.URL
		grant := u[strings.LastIndex(u, "/")+1:]
		// The browser: the consent form checks the grant (and writes
		// nothing), then the callback stores what the code exchange
		// produced (connections.Save, as oauthflow calls it).
		g, err := st.grants.Authorize(ctx, grant, who.p)
		if err != nil {
			return "", err
		}
		conn, err := st.conns.Save(ctx, who.p, g, demo, provider.Exchanged{
			Account: provider.Account{ID: "42", Login: "demo-user"}, Scopes: []string{"profile"},
			Token: vault.TokenSet{AccessToken: "demo-access-0123456789", TokenType: "bearer", Expiry: time.Now().Add(time.Hour)},
		})
		if err != nil {
			return "", err
		}
		b, err = do(mode, who, callBody(2*i+1, "demo", `,"requestState":"`+first.Result.RequestState+`","inputResponses":{"connect_demo":{"action":"accept"}}`))
		if err != nil {
			return "", err
		}
		if !bytes.Contains(b, []byte(`"status":"connected"`)) {
			return "", fmt.Errorf("retry: %s", b)
		}
		return conn.ID, nil
	}
	// cleanup deletes a block's connections on the plain store (its
	// deletes announced to the listing cache on bolt: st.writes): not
	// through the commit counter, outside every timed or counted span.
	cleanup := func(ids []string) error {
		for _, id := range ids {
			if err := st.writes.DeleteConnection(ctx, id); err != nil {
				return err
			}
		}
		return nil
	}
	// block runs m round trips of mode (or floor rounds when mode is "")
	// and adds what they took to t (when not nil).
	var floor commitFloor
	block := func(mode string, from, m int, t *mrtrTally) error {
		var s0 statementCounts
		if t != nil && pg && st.pg.stmts {
			s0, _ = st.pg.statementCounts()
		}
		srv0 := st.pg.cpu()
		c0 := st.counter.commits.Load()
		u0, k0 := usage()
		w0 := time.Now()
		ids := make([]string, 0, m)
		for i := from; i < from+m; i++ {
			if mode == "" {
				if err := floor.round(i); err != nil {
					return err
				}
				continue
			}
			id, err := round(mode, i)
			if err != nil {
				return fmt.Errorf("%s: %w", modeLabel(mode), err)
			}
			ids = append(ids, id)
		}
		wall := time.Since(w0)
		u1, k1 := usage()
		srv1 := st.pg.cpu()
		if t != nil {
			t.n += m
			t.cpu += u1 - u0
			t.sys += k1 - k0
			t.wall += wall
			t.commits += st.counter.commits.Load() - c0
			if srv0 >= 0 && srv1 >= 0 && t.srv >= 0 {
				t.srv += srv1 - srv0
			} else {
				t.srv = -1
			}
			if s0 != nil {
				if s1, err := st.pg.statementCounts(); err == nil {
					if t.stmts == nil {
						t.stmts = statementCounts{}
					}
					t.stmts.add(s1.sub(s0))
				}
			}
		}
		return cleanup(ids)
	}

	var err error
	switch st.kind {
	case storeBolt:
		floor, err = newBoltCommitFloor(st.bolt.DB())
	case storePostgres:
		floor, err = newPGCommitFloor(st.dbURL)
	}
	if err != nil {
		return err
	}
	// Warm-up: a round trip for every person in each mode, so each one's
	// bearer tokens are verified (and cached) before the timed rounds, as
	// a client's would be after its first call.
	for _, m := range modes {
		for b := 0; b < len(st.people); b += mrtrBlock {
			if err := block(m, b, min(mrtrBlock, len(st.people)-b), nil); err != nil {
				return err
			}
		}
	}
	if err := block("", 0, 50, nil); err != nil {
		return err
	}
	runtime.GC()
	stopProfile, err := cfg.cpuProfile("." + st.kind + ".mrtr")
	if err != nil {
		return err
	}
	// Each mode's round trips and the floor's bare commits take turns in
	// blocks, so all meet the same spells of the disk (its speed drifts
	// within minutes here).
	tally := map[string]*mrtrTally{}
	for _, m := range append(modes[:len(modes):len(modes)], "") {
		tally[m] = &mrtrTally{}
	}
	for b := 0; b < n; b += mrtrBlock {
		m := min(mrtrBlock, n-b)
		for _, mode := range modes {
			if err := block(mode, 1000+b, m, tally[mode]); err != nil {
				return err
			}
		}
		if err := block("", 100+b, m, tally[""]); err != nil {
			return err
		}
	}
	if err := stopProfile(); err != nil {
		return err
	}
	if err := floor.drop(); err != nil {
		return err
	}
	// A shorter pass, not timed, counts heap allocations per round trip
	// of the default mode.
	if cfg.memprofile != "" {
		runtime.MemProfileRate = 1
	}
	var allocs uint64
	for b := 0; b < allocN; b += mrtrBlock {
		m := min(mrtrBlock, allocN-b)
		ids := make([]string, 0, m)
		a0 := mallocs()
		for i := b; i < b+m; i++ {
			id, err := round(modeBroker, 1000+n+i)
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		allocs += mallocs() - a0
		if err := cleanup(ids); err != nil {
			return err
		}
	}
	if cfg.memprofile != "" {
		runtime.GC()
		f, err := os.Create(cfg.memprofile + "." + st.kind + ".mrtr")
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
		runtime.MemProfileRate = 512 * 1024
	}

	fl := tally[""]
	fmt.Printf("\n## MRTR round trip (%s; in-process handler, %d round trips per mode for %d people in turns, blocks of %d alternating with the floor's)\n\n",
		storeTitle(st.kind), n, len(st.people), mrtrBlock)
	fmt.Printf("First call, the consent form's check, the callback's connections.Save (approve and complete with the connection), retry; the cleanup deletes after each block are left out. Floor: %s.\n\n", floor.describe())
	head, sep := "| round trip | CPU µs | of it kernel |", "|---|---|---|"
	if pg {
		head += " PostgreSQL CPU µs | broker + PostgreSQL µs |"
		sep += "---|---|"
	}
	head += " wall ms, one at a time | durable commits |"
	sep += "---|---|"
	if pg {
		head += " SQL statements |"
		sep += "---|"
	}
	fmt.Println(head)
	fmt.Println(sep)
	row := func(name string, t *mrtrTally, commits string) {
		line := fmt.Sprintf("| %s | %.0f | %.0f |", name, t.perCPU(), float64(t.sys.Microseconds())/float64(t.n))
		if pg {
			if s := t.perSrv(); s >= 0 {
				line += fmt.Sprintf(" %.0f | %.0f |", s, t.perCPU()+s)
			} else {
				line += " n/a | n/a |"
			}
		}
		line += fmt.Sprintf(" %.2f | %s |", float64(t.wall.Microseconds())/1000/float64(t.n), commits)
		if pg {
			if t.stmts != nil {
				line += fmt.Sprintf(" %.2f |", float64(t.stmts.total())/float64(t.n))
			} else {
				line += " n/a |"
			}
		}
		fmt.Println(line)
	}
	for _, m := range modes {
		t := tally[m]
		row(modeLabel(m), t, fmt.Sprintf("%.2f", float64(t.commits)/float64(t.n)))
	}
	row("floor: two bare commits", fl, "2")
	cpuOf := func(t *mrtrTally) float64 {
		if s := t.perSrv(); pg && s >= 0 {
			return t.perCPU() + s
		}
		return t.perCPU()
	}
	fmt.Printf("\nThe default path adds %.0f µs of CPU to its two commits (the issuer mode %.0f µs). %.0f heap allocations per round trip of the default path (counted over %d more round trips, cleanup left out).\n",
		cpuOf(tally[modeBroker])-cpuOf(fl), cpuOf(tally[modeIssuer])-cpuOf(fl), float64(allocs)/float64(allocN), allocN)
	if pg && tally[modeBroker].stmts != nil {
		fmt.Printf("\nStatements of a default-path round trip:\n")
		tally[modeBroker].stmts.print(tally[modeBroker].n, "round trip")
	}
	for _, m := range modes {
		t := tally[m]
		commits := float64(t.commits) / float64(t.n)
		what := fmt.Sprintf("%s, MRTR round trip, %s", storeTitle(st.kind), pathName(m))
		st.sum.add(what+": durable commits", fmt.Sprintf("%.2f", commits), "≤ 3", commits <= 3)
		if pg {
			// Compared with bbolt's at the end of the run (summary.compareMRTR).
			if t.perSrv() >= 0 {
				st.sum.setMRTR(st.kind, m, mrtrFigure{cpu: cpuOf(t), floor: cpuOf(fl)})
			}
			continue
		}
		st.sum.setMRTR(st.kind, m, mrtrFigure{cpu: cpuOf(t), floor: cpuOf(fl)})
		cpu := t.perCPU() / 1000
		got := fmt.Sprintf("%.3f (user %.3f; floor's 2 bare commits %.3f)", cpu, (t.perCPU()-float64(t.sys.Microseconds())/float64(t.n))/1000, fl.perCPU()/1000)
		st.sum.add(what+": CPU ms", got, "≤ 1", cpu <= 1)
	}
	if pg && tally[modeBroker].perSrv() < 0 {
		fmt.Printf("\n(The server's CPU cannot be read for a server the bench did not start, so its CPU is not compared with bbolt's.)\n")
	}
	return nil
}

// boltCommitFloor is the two durable commits an MRTR round trip needs,
// done bare on the broker's own bolt file (same fsync, same disk): put a
// grant-sized value, then overwrite it and put a second one (the
// callback's grant and connection). Its bucket is dropped afterwards,
// outside any count.
type boltCommitFloor struct {
	db     *bolt.DB
	bucket []byte
	val    []byte
}

func newBoltCommitFloor(db *bolt.DB) (*boltCommitFloor, error) {
	f := &boltCommitFloor{db: db, bucket: []byte("bench-floor"), val: bytes.Repeat([]byte{0x5a}, floorValue)}
	return f, f.db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(f.bucket)
		return err
	})
}

func (f *boltCommitFloor) put(keys ...string) error {
	return f.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(f.bucket)
		for _, k := range keys {
			if err := b.Put([]byte(k), f.val); err != nil {
				return err
			}
		}
		return nil
	})
}

func (f *boltCommitFloor) round(i int) error {
	g, c := fmt.Sprintf("g%08d", i), fmt.Sprintf("c%08d", i)
	if err := f.put(g); err != nil {
		return err
	}
	return f.put(c, g)
}

func (f *boltCommitFloor) drop() error {
	return f.db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(f.bucket) })
}

func (f *boltCommitFloor) describe() string {
	return fmt.Sprintf("two bare durable bbolt commits in the same file (a %d-byte put, then two; no codec, no encryption, no HTTP)", floorValue)
}
