package boltstore_test

import (
	"bufio"
	"context"
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

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

// Environment of the crash child: the database path and its key line.
const (
	crashDBEnv   = "CREDBROKER_CRASH_CHILD_DB"
	crashKeysEnv = "CREDBROKER_CRASH_CHILD_KEYS"
)

// TestCrashChild is the child process of TestCrashSafety: it writes
// connections from several goroutines forever and prints "ack <id>" after
// each write the store acknowledged. It does nothing in a normal test run.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashDBEnv)
	if path == "" {
		t.Skip("child process of TestCrashSafety only")
	}
	kr, err := vault.ParseKeys(os.Getenv(crashKeysEnv))
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // guards stdout
	out := bufio.NewWriter(os.Stdout)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("w%d-%06d", w, i)
				p := vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("user%d", i%7)}
				if _, err := s.CreateConnection(context.Background(), vaulttest.Conn(id, p, "github", id)); err != nil {
					fmt.Fprintln(os.Stderr, "create:", err)
					os.Exit(3)
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

func TestCrashSafety(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a child process")
	}
	path := filepath.Join(t.TempDir(), "crash.db")
	keyLine := vault.GenerateKey()
	kr, err := vault.ParseKeys(keyLine)
	if err != nil {
		t.Fatal(err)
	}
	const acksWanted = 300
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDBEnv+"="+path, crashKeysEnv+"="+keyLine)
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
	// Kill mid-stream: writers are still committing.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
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

	s, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatalf("reopen after kill -9: %v", err)
	}
	defer s.Close()
	for _, id := range acked {
		c, err := s.GetConnection(t.Context(), id)
		if err != nil {
			t.Fatalf("acknowledged write %s: %v", id, err)
		}
		if c.Token.AccessToken.Reveal() != "at-"+id+"-secret" {
			t.Fatalf("acknowledged write %s: wrong token after reopen", id)
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
	err = s.DB().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			problems = append(problems, err)
		}
		return nil
	})
	if err != nil || len(problems) > 0 {
		t.Fatalf("bbolt consistency check: %v %v", err, problems)
	}
	t.Logf("%d acknowledged writes survived SIGKILL; %d records listed", len(acked), listed)
}
