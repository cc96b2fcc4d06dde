// Package fulldisk gives tests a small file system they can fill to the
// last byte and empty again: a tmpfs of a given size mounted on a
// temporary directory, and a filler file that takes every free block
// (Fill) until it is removed (Free). What the broker does when its disk is
// full (a bbolt commit that cannot write) is tested on it.
//
// Mounting needs CAP_SYS_ADMIN (root); without it MountT fails the test,
// or skips it with CREDBROKER_ALLOW_SKIP=1 (internal/testskip).
//
// It is test support: only tests use it.
package fulldisk

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"credbroker/internal/testskip"
)

// Disk is a mounted tmpfs.
type Disk struct {
	// Dir is where it is mounted.
	Dir    string
	filler string
}

// MountT mounts a tmpfs of size bytes on a fresh temporary directory for
// the test and unmounts it when the test ends.
func MountT(t testing.TB, size int64) *Disk {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		testskip.Missing(t, "a tmpfs mount ("+err.Error()+")", "run the tests as root, or with CAP_SYS_ADMIN")
		return nil
	}
	// Registered after TempDir's own clean-up, so it runs first.
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("fulldisk: unmount %s: %v", dir, err)
		}
	})
	return &Disk{Dir: dir, filler: filepath.Join(dir, ".filler")}
}

// Fill writes the filler file until the file system has no free block
// left. A disk already full stays full.
func (d *Disk) Fill() error {
	f, err := os.OpenFile(d.filler, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			return nil
		}
		return err
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for len(buf) > 0 {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				return err
			}
			buf = buf[:len(buf)/2] // the last blocks, smaller writes
		}
	}
	return nil
}

// Free removes the filler file: the space it took is free again.
func (d *Disk) Free() error {
	err := os.Remove(d.filler)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
