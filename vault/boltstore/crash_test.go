package boltstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/internal/powercut"
	"credbroker/internal/testskip"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

// Environment of the crash child: the database path, its key line, and
// whether to open the store with NoSync (the control case).
const (
	crashDBEnv     = "CREDBROKER_CRASH_CHILD_DB"
	crashKeysEnv   = "CREDBROKER_CRASH_CHILD_KEYS"
	crashNoSyncEnv = "CREDBROKER_CRASH_CHILD_NOSYNC"
)

// crashChild is TestCrashSafety's child process (TestMain runs it when
// crashDBEnv is set): it writes connections from several goroutines
// forever and prints "ack <id>" after each write the store acknowledged.
func crashChild(path string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(3)
	}
	kr, err := vault.ParseKeys(os.Getenv(crashKeysEnv))
	if err != nil {
		fail(err)
	}
	noSync := os.Getenv(crashNoSyncEnv) == "1"
	s, err := boltstore.Open(path, kr, boltstore.Options{NoSync: noSync})
	if err != nil {
		fail(err)
	}
	if noSync {
		// Never sync at all: bbolt syncs when it grows the file unless
		// told not to, and such a sync can cover every write so far, so
		// the control case would pass or fail by when the last growth
		// came.
		s.DB().NoGrowSync = true
	}
	var mu sync.Mutex // guards out
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%d-%06d", w, i)
				p := vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("user%d", i%7)}
				if _, err := s.CreateConnection(context.Background(), vaulttest.Conn(id, p, "github", id)); err != nil {
					fail(fmt.Errorf("create: %w", err))
				}
				mu.Lock()
				fmt.Fprintln(out, "ack", id)
				out.Flush()
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestCrashSafety kills a process that is writing to a bbolt store and
// cuts the power: the store lives on a powercut file system, which drops
// every write not covered by an fsync, as losing the page cache does.
// After each cut every write the store acknowledged must be there and the
// file must pass bbolt's consistency check (Tx.Check).
//
// A kill at a moment of the stream mostly lands between two commits, with
// nothing unsynced to lose (five runs in six did). So the test also cuts
// the power in the middle of commits on purpose: powercut.CutAtWrite kills
// the child and cuts right after one of its page writes, before the sync
// that would cover it, at a different write each round; every such cut
// must report the dirty pages it threw away. The control case runs the
// child with NoSync, and the cut must lose acknowledged writes: otherwise
// the test could not tell a durable store from one that never syncs.
func TestCrashSafety(t *testing.T) {
	testskip.Short(t, "spawns a child process")
	t.Run("fsync on, killed mid-stream: every acknowledged write survives", func(t *testing.T) {
		s, acked, cut := crashAndRestart(t, false, crashCut{})
		checkSurvived(t, s, acked)
		t.Logf("%d acknowledged writes survived SIGKILL and a power cut; %d dirty pages lost", len(acked), cut.DirtyPages)
	})

	t.Run("fsync on, cut in the middle of a commit: every acknowledged write survives", func(t *testing.T) {
		// bbolt commits by writing the changed pages, syncing, writing a
		// meta page (page 0 or 1) and syncing again. The cut lands on the
		// nth write after the child has 300 acks, or on the nth meta page
		// write: written, not yet synced.
		pageSize := int64(os.Getpagesize()) // bbolt's default page size
		meta := func(off int64) bool { return off < 2*pageSize }
		for _, tc := range []struct {
			n    int
			meta bool
		}{{1, false}, {2, false}, {3, false}, {5, false}, {8, false}, {1, true}, {2, true}} {
			at, what := crashCut{n: tc.n}, fmt.Sprintf("write %d", tc.n)
			if tc.meta {
				at.at, what = meta, fmt.Sprintf("meta page write %d", tc.n)
			}
			s, acked, cut := crashAndRestart(t, false, at)
			if cut.DirtyPages == 0 {
				t.Fatalf("cut at %s: no dirty pages, so it did not land in the middle of a commit: %+v", what, cut)
			}
			checkSurvived(t, s, acked)
			t.Logf("cut at %s: %d acknowledged writes survived; the cut lost %d dirty pages (%d bytes)", what, len(acked), cut.DirtyPages, cut.BytesLost)
		}
	})

	t.Run("control: with NoSync the power cut loses acknowledged writes", func(t *testing.T) {
		s, acked, _ := crashAndRestart(t, true, crashCut{})
		lost := 0
		for _, id := range acked {
			_, err := s.GetConnection(t.Context(), id)
			switch {
			case errors.Is(err, vault.ErrNotFound):
				lost++
			case err != nil:
				t.Fatalf("read %s: %v", id, err)
			}
		}
		if lost == 0 {
			t.Fatalf("all %d acknowledged writes of a store that never syncs survived the power cut: the cut does not discard unsynced writes", len(acked))
		}
		t.Logf("the power cut lost %d of %d acknowledged writes made without fsync", lost, len(acked))
	})
}

// checkSurvived requires every acknowledged write to read back whole from
// s, the index to list them, and bbolt's consistency check to pass.
func checkSurvived(t *testing.T, s *boltstore.Store, acked []string) {
	t.Helper()
	for _, id := range acked {
		c, err := s.GetConnection(t.Context(), id)
		if err != nil {
			t.Fatalf("acknowledged write %s: %v", id, err)
		}
		if c.Token.AccessToken.Reveal() != "at-"+id+"-secret" {
			t.Fatalf("acknowledged write %s: wrong token after the restart", id)
		}
	}
	listed := 0
	for u := range 7 {
		list, err := s.ListConnections(t.Context(), vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("user%d", u)})
		if err != nil {
			t.Fatal(err)
		}
		listed += len(list)
	}
	if listed < len(acked) {
		t.Fatalf("index lists %d connections, %d were acknowledged", listed, len(acked))
	}
	var problems []error
	err := s.DB().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			problems = append(problems, err)
		}
		return nil
	})
	if err != nil || len(problems) > 0 {
		t.Fatalf("bbolt consistency check: %v %v", err, problems)
	}
}

// crashCut says where crashAndRestart cuts the power: n 0 kills the child
// mid-stream and cuts afterwards; n > 0 kills it and cuts at its nth
// write (among those at accepts; nil: any) from then on.
type crashCut struct {
	n  int
	at func(off int64) bool
}

// crashAndRestart runs the crash child on a fresh powercut file system
// until it has acknowledged at least 300 writes, then stops it as cut
// says: a SIGKILL mid-stream and then the power cut, or the kill and the
// cut together at a write (powercut.CutAtWrite), in the middle of a
// commit. It opens the store again and returns it (closed when t ends),
// the ids whose writes were acknowledged and what the cut discarded.
func crashAndRestart(t *testing.T, noSync bool, cut crashCut) (*boltstore.Store, []string, powercut.CutReport) {
	t.Helper()
	pfs := powercut.MountT(t)
	path := filepath.Join(pfs.Dir, "crash.db")
	keyLine := vault.GenerateKey()
	kr, err := vault.ParseKeys(keyLine)
	if err != nil {
		t.Fatal(err)
	}
	const acksWanted = 300
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), crashDBEnv+"="+path, crashKeysEnv+"="+keyLine)
	if noSync {
		cmd.Env = append(cmd.Env, crashNoSyncEnv+"=1")
	}
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var acked []string
	sc := bufio.NewScanner(stdout)
	for len(acked) < acksWanted && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
			acked = append(acked, id)
		}
	}
	var armed <-chan powercut.CutReport
	if cut.n > 0 {
		// Writers are still committing; the kill comes from the file
		// system, at the write, with no sync in between.
		armed = pfs.CutAtWrite(cut.n, cut.at, func() { cmd.Process.Signal(syscall.SIGKILL) })
	} else if err := cmd.Process.Signal(syscall.SIGKILL); err != nil { // kill mid-stream
		t.Fatal(err)
	}
	for sc.Scan() { // acks already in the pipe were acknowledged too
		if id, ok := strings.CutPrefix(sc.Text(), "ack "); ok {
			acked = append(acked, id)
		}
	}
	err = cmd.Wait()
	if len(acked) < acksWanted {
		t.Fatalf("child acknowledged only %d writes before exiting: %v", len(acked), err)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed by SIGKILL: %v", err)
	}
	st := pfs.Stats()
	var rep powercut.CutReport
	if armed != nil {
		select {
		case rep = <-armed:
		default:
			t.Fatalf("the child died before the write the cut was armed for (its exit: %v)", err)
		}
	} else {
		rep = pfs.Cut()
	}
	t.Logf("child: %d writes acknowledged, %d fsyncs; power cut: %+v", len(acked), st.Fsyncs, rep)

	// What survived, on an ordinary file: this process serves the mount,
	// so it must not mmap files on it (see internal/powercut).
	survived, ok := pfs.Contents("crash.db")
	if !ok {
		t.Fatal("crash.db is gone after the power cut")
	}
	restarted := filepath.Join(t.TempDir(), "crash.db")
	if err := os.WriteFile(restarted, survived, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(restarted, kr, boltstore.Options{})
	if err != nil {
		t.Fatalf("reopen after kill -9 and a power cut: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s, acked, rep
}
