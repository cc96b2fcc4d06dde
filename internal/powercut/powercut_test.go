package powercut_test

import (
	"bytes"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"credbroker/internal/powercut"
)

func write(t *testing.T, f *os.File, off int64, b []byte) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func contents(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func create(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestCut(t *testing.T) {
	p := powercut.MountT(t)
	a, b := bytes.Repeat([]byte("A"), 3*4096), bytes.Repeat([]byte("B"), 5000)

	t.Run("never synced: the file comes back empty", func(t *testing.T) {
		path := filepath.Join(p.Dir, "unsynced")
		f := create(t, path)
		write(t, f, 0, a)
		if got := contents(t, path); !bytes.Equal(got, a) {
			t.Fatalf("before the cut, read %d bytes, want the %d written", len(got), len(a))
		}
		rep := p.Cut()
		if got := contents(t, path); len(got) != 0 {
			t.Fatalf("after the cut the file has %d bytes, want 0", len(got))
		}
		if rep.DirtyPages < 3 || rep.BytesLost != len(a) || rep.SizeRollback != 1 {
			t.Fatalf("cut report %+v: want >= 3 dirty pages, %d bytes lost, one size rollback", rep, len(a))
		}
	})

	t.Run("fsync keeps what it covers, not what follows", func(t *testing.T) {
		path := filepath.Join(p.Dir, "synced")
		f := create(t, path)
		write(t, f, 0, a)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		write(t, f, 2000, b) // over pages 0 and 1, not synced
		write(t, f, int64(len(a)), b)
		if got := contents(t, path); len(got) != len(a)+len(b) {
			t.Fatalf("before the cut the file has %d bytes", len(got))
		}
		p.Cut()
		if got := contents(t, path); !bytes.Equal(got, a) {
			t.Fatalf("after the cut: %d bytes, %q…; want the synced %d bytes of A", len(got), got[:min(len(got), 16)], len(a))
		}
	})

	t.Run("fdatasync counts as a sync", func(t *testing.T) {
		path := filepath.Join(p.Dir, "datasynced")
		f := create(t, path)
		write(t, f, 0, b)
		before := p.Stats().Fsyncs
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			t.Fatal(err)
		}
		if p.Stats().Fsyncs != before+1 {
			t.Fatalf("fdatasync did not reach the file system")
		}
		p.Cut()
		if got := contents(t, path); !bytes.Equal(got, b) {
			t.Fatalf("after the cut: %d bytes, want the %d datasynced", len(got), len(b))
		}
	})

	t.Run("an unsynced truncate is undone", func(t *testing.T) {
		path := filepath.Join(p.Dir, "truncated")
		f := create(t, path)
		write(t, f, 0, a)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(100); err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(int64(len(a))); err != nil { // grows back with zeros
			t.Fatal(err)
		}
		if got := contents(t, path); got[100] != 0 || got[len(a)-1] != 0 {
			t.Fatal("growth after a truncate did not read zeros")
		}
		p.Cut()
		if got := contents(t, path); !bytes.Equal(got, a) {
			t.Fatal("after the cut the truncated file did not come back whole")
		}
	})

	t.Run("syncing one file does not sync another", func(t *testing.T) {
		one, two := filepath.Join(p.Dir, "one"), filepath.Join(p.Dir, "two")
		f1, f2 := create(t, one), create(t, two)
		write(t, f1, 0, b)
		write(t, f2, 0, b)
		if err := f1.Sync(); err != nil {
			t.Fatal(err)
		}
		p.Cut()
		if got := contents(t, one); !bytes.Equal(got, b) {
			t.Fatal("the synced file lost its contents")
		}
		if got := contents(t, two); len(got) != 0 {
			t.Fatalf("the unsynced file kept %d bytes", len(got))
		}
	})

	t.Run("names are durable, removal too", func(t *testing.T) {
		path := filepath.Join(p.Dir, "removed")
		create(t, path).Close()
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		p.Cut()
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("a removed file is back after the cut: %v", err)
		}
	})
}
