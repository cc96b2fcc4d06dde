//go:build unix

package main

import (
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestSidecarSocketNeverWiderThan0600 watches the socket path while the
// listener is created under a permissive umask: no moment may show the
// socket with group or other permissions.
func TestSidecarSocketNeverWiderThan0600(t *testing.T) {
	old := syscall.Umask(0)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := t.TempDir()
	path := filepath.Join(dir, "sidecar.sock")
	for i := range 100 {
		var widest atomic.Uint32
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if fi, err := os.Lstat(path); err == nil {
					if m := uint32(fi.Mode().Perm()); m&^0o600 != 0 {
						widest.Store(m)
					}
				}
			}
		})
		ln, err := listenUnixPrivate(path)
		close(stop)
		wg.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if m := widest.Load(); m != 0 {
			t.Fatalf("round %d: the socket was visible with mode %#o", i, m)
		}
		fi, err := os.Lstat(path)
		if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("round %d: %v %v; want a 0600 socket", i, fi.Mode(), err)
		}
		if i == 0 {
			if ln.Addr().String() != path {
				t.Errorf("Addr() = %s, want %s", ln.Addr(), path)
			}
			go func() {
				if c, err := ln.Accept(); err == nil {
					c.Close()
				}
			}()
			c, err := net.Dial("unix", path)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			c.Close()
		}
		if err := ln.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Fatalf("round %d: socket left after Close: %v", i, err)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left behind in the socket directory: %v", ents)
	}
}

func TestSidecarSocketExistingFiles(t *testing.T) {
	dir := t.TempDir()
	t.Run("stale socket is replaced", func(t *testing.T) {
		path := filepath.Join(dir, "stale.sock")
		stale, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		stale.(*net.UnixListener).SetUnlinkOnClose(false)
		stale.Close()
		ln, err := listenUnixPrivate(path)
		if err != nil {
			t.Fatalf("over a stale socket: %v", err)
		}
		ln.Close()
	})
	t.Run("other file is kept", func(t *testing.T) {
		path := filepath.Join(dir, "notes.txt")
		if err := os.WriteFile(path, []byte("keep me"), 0o644); err != nil {
			t.Fatal(err)
		}
		if ln, err := listenUnixPrivate(path); err == nil {
			ln.Close()
			t.Fatal("listening over a regular file succeeded")
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != "keep me" {
			t.Fatalf("the file was changed: %q %v", b, err)
		}
	})
}
