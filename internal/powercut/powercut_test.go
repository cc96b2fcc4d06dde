package powercut_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
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

// TestCutAtWrite: the armed cut fires on the nth write after arming,
// calls kill once, at that write, loses that write and everything else
// unsynced, and leaves the file system off.
func TestCutAtWrite(t *testing.T) {
	p := powercut.MountT(t)
	a, b := bytes.Repeat([]byte("A"), 4096), bytes.Repeat([]byte("B"), 4096)
	path := filepath.Join(p.Dir, "db")
	f := create(t, path)
	write(t, f, 0, a)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	var kills atomic.Int32
	// The second write at offset 0 or 8192: the write at 4096 does not
	// count.
	report := p.CutAtWrite(2, func(off int64) bool { return off != 4096 }, func() { kills.Add(1) })
	write(t, f, 8192, b)
	write(t, f, 4096, b)
	if kills.Load() != 0 {
		t.Fatal("the cut fired early; armed for the second write not at 4096")
	}
	if _, err := f.WriteAt(b, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("the write the cut landed on: %v, want EIO", err)
	}
	var rep powercut.CutReport
	select {
	case rep = <-report:
	default:
		t.Fatal("no report after the armed write")
	}
	if n := kills.Load(); n != 1 {
		t.Fatalf("kill called %d times, want once", n)
	}
	if rep.DirtyPages != 3 || rep.SizeRollback != 1 || rep.BytesLost != 3*4096 {
		t.Fatalf("cut report %+v: want the 3 pages written since the sync, 12288 bytes and the size lost", rep)
	}
	if got, _ := p.Contents("db"); !bytes.Equal(got, a) {
		t.Fatalf("after the cut: %d bytes, want the synced 4096 bytes of A", len(got))
	}
	// Off: nothing changes any more.
	if _, err := f.WriteAt(b, 0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a write after the cut: %v, want EIO", err)
	}
	if err := f.Sync(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a sync after the cut: %v, want EIO", err)
	}
	if err := f.Truncate(0); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a truncate after the cut: %v, want EIO", err)
	}
	if _, err := os.Create(filepath.Join(p.Dir, "new")); !errors.Is(err, syscall.EIO) {
		t.Fatalf("a create after the cut: %v, want EIO", err)
	}
	if got, _ := p.Contents("db"); !bytes.Equal(got, a) {
		t.Fatal("the file changed after the cut")
	}
}

// TestFail: while the disk fails, every change fails with EIO and changes
// nothing, reads go on; once it works again the same open file takes
// writes, and nothing written before (synced or not) was lost.
func TestFail(t *testing.T) {
	p := powercut.MountT(t)
	path := filepath.Join(p.Dir, "db")
	f := create(t, path)
	a := bytes.Repeat([]byte("A"), 5000)
	write(t, f, 0, a)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	write(t, f, 5000, []byte("unsynced"))
	before := contents(t, path)

	p.Fail(true)
	for name, change := range map[string]func() error{
		"write":    func() error { _, err := f.WriteAt([]byte("B"), 0); return err },
		"append":   func() error { _, err := f.WriteAt([]byte("B"), 9000); return err },
		"sync":     f.Sync,
		"truncate": func() error { return f.Truncate(100) },
		"create":   func() error { _, err := os.Create(filepath.Join(p.Dir, "other")); return err },
		"remove":   func() error { return os.Remove(path) },
	} {
		if err := change(); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s on a failing disk: %v, want EIO", name, err)
		}
	}
	if got := contents(t, path); !bytes.Equal(got, before) {
		t.Fatalf("the failing disk changed the file: %d bytes, want the %d before", len(got), len(before))
	}
	if got, _ := p.Contents("db"); !bytes.Equal(got, before) {
		t.Fatal("the file system's own copy changed")
	}

	p.Fail(false)
	write(t, f, 0, []byte("B"))
	if err := f.Sync(); err != nil {
		t.Fatalf("sync once the disk works again: %v", err)
	}
	want := append([]byte("B"), before[1:]...)
	if got := contents(t, path); !bytes.Equal(got, want) {
		t.Fatal("after the disk works again the file is not what was written")
	}
	if _, err := os.Stat(filepath.Join(p.Dir, "other")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a file created on the failing disk exists: %v", err)
	}
}
