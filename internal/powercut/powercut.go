// Package powercut is a FUSE file system for crash tests that must tell a
// synced write from an unsynced one, after LazyFS
// (github.com/dsrhaslab/lazyfs): it keeps every file's contents in memory
// twice, as the programs using it see them (the "page cache") and as they
// were at the file's last fsync or fdatasync (the "disk"). Cut simulates a
// power cut: every file goes back to its disk contents, and whatever was
// written since the last sync is gone.
//
// A SIGKILL alone cannot show this: the kernel's page cache survives the
// process, so a program that never syncs passes a kill -9 test. Through
// powercut, it loses its writes.
//
// The process serving the file system must not mmap its files (bbolt
// does): a page fault served by its own goroutines can deadlock with the Go
// runtime's stop-the-world phases. Tests therefore let a child process use
// the mount and read the result with Contents.
//
// Scope: one flat directory of regular files (what a bbolt database needs).
// File names are durable as soon as they are created or removed, as on a
// journaling file system that committed the metadata; only contents are
// volatile. Reads and writes go to the file system on every call (no
// writeback cache), so a write() that returned is in powercut's memory.
//
// CutAtWrite cuts the power at an exact point instead: right after a given
// write, with the writer killed at that instant, so a crash test can land
// in the middle of a commit (pages written, not yet synced) every time
// rather than when a timed kill happens to.
//
// Mounting needs /dev/fuse and either root (powercut mounts with mount(2)
// itself) or the fusermount3 helper (Debian package fuse3). MountT mounts
// one for a test, which fails (or skips, see internal/testskip) without.
//
// It is test support: only tests use it.
package powercut

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"credbroker/internal/testskip"
)

// pageSize is the unit in which unsynced writes are tracked.
const pageSize = 4096

// FS is a mounted powercut file system.
type FS struct {
	// Dir is the mount point.
	Dir string

	server *fuse.Server

	mu     sync.Mutex // guards the fields below and every file's contents
	files  map[*file]bool
	fsyncs int
	// armed: a cut waits for the nth write (CutAtWrite); off: the power
	// is cut and every change fails.
	armed *armedCut
	off   bool
	// failing: the disk fails (Fail) and every change fails, until it
	// works again.
	failing bool
}

// armedCut is a power cut waiting for a write (CutAtWrite).
type armedCut struct {
	writes int                  // matching writes left before the cut
	at     func(off int64) bool // which writes count; nil: all
	kill   func()
	report chan CutReport
}

// Stats counts what a file system saw.
type Stats struct {
	Fsyncs int // fsync and fdatasync calls
}

// CutReport says what a power cut discarded.
type CutReport struct {
	Files        int // files whose contents changed
	DirtyPages   int // pages written since their file's last sync
	BytesLost    int // bytes whose value differs after the cut
	SizeRollback int // files whose size went back
}

// Mount mounts an empty powercut file system on dir, an existing empty
// directory. Call Unmount when done.
func Mount(dir string) (*FS, error) {
	p := &FS{Dir: dir, files: map[*file]bool{}}
	root := &rootDir{fs: p}
	zero := time.Duration(0)
	srv, err := fs.Mount(dir, root, &fs.Options{
		// No kernel caching of names or attributes: after a cut, sizes
		// change under the kernel's feet.
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		MountOptions: fuse.MountOptions{
			FsName:        "powercut",
			Name:          "powercut",
			DirectMount:   true, // as root: mount(2), no fusermount needed
			DisableXAttrs: true,
		},
	})
	if err != nil {
		return nil, fmt.Errorf("powercut: mount on %s: %w", dir, err)
	}
	p.server = srv
	return p, nil
}

// MountT mounts a powercut file system on a fresh directory for tb and
// unmounts it when tb ends (after tb's later cleanups, such as closing a
// database on it). Without FUSE, tb fails (or skips: see internal/testskip).
func MountT(tb testing.TB) *FS {
	tb.Helper()
	dir := tb.TempDir()
	p, err := Mount(dir)
	if err != nil {
		testskip.Missing(tb, "fuse", fmt.Sprintf("%v; FUSE needs /dev/fuse and root, or the fusermount3 helper: apt-get install -y fuse3", err))
		return nil
	}
	tb.Cleanup(func() {
		if err := p.Unmount(); err != nil {
			tb.Errorf("%v", err)
		}
	})
	return p
}

// Unmount unmounts the file system. Every file on it must be closed.
func (p *FS) Unmount() error {
	if err := p.server.Unmount(); err != nil {
		return fmt.Errorf("powercut: unmount %s: %w", p.Dir, err)
	}
	p.server.Wait()
	return nil
}

// Stats returns the counters so far.
func (p *FS) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Fsyncs: p.fsyncs}
}

// Contents returns a copy of the named file's contents as its readers see
// them (after Cut: what survived), read from memory rather than through
// the kernel. ok is false when there is no such file.
func (p *FS) Contents(name string) (b []byte, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for f := range p.files {
		if f.name == name {
			return append([]byte(nil), f.data...), true
		}
	}
	return nil, false
}

// Cut simulates a power cut: every file loses what was written to it since
// its last fsync or fdatasync (a file never synced comes back empty), and
// the kernel's caches of the files are dropped so that readers see what is
// left. Processes still using the files see their contents change under
// them, as after a reboot; crash tests kill them first.
func (p *FS) Cut() CutReport {
	p.mu.Lock()
	rep, changed := p.cutLocked()
	p.mu.Unlock()
	for _, f := range changed {
		// Drop the kernel's cached pages and attributes; ENOENT just
		// means the kernel holds nothing for this file.
		_ = f.NotifyContent(0, 0)
	}
	return rep
}

// CutAtWrite arms a power cut for the nth write (n >= 1) from now on
// whose offset at accepts (nil accepts every write, to any file), to land
// in the middle of whatever the writer is doing: that write reaches the
// page cache, and then, before it returns and before anything else reaches
// the file system, kill is called (it must stop the writing processes, as
// a power cut does: SIGKILL them) and the power is cut as by Cut. The report arrives on the returned channel. From then on
// the file system is off: every write, truncate and sync fails with EIO
// and changes nothing, as on a machine without power; the killed
// processes' requests still in flight come to nothing. Read what survived
// with Contents (the kernel's caches of the files are not dropped).
//
// The cut is exact: no sync can slip in between the write and the cut, so
// the report always counts that write's dirty page.
func (p *FS) CutAtWrite(n int, at func(off int64) bool, kill func()) <-chan CutReport {
	if n < 1 {
		panic("powercut: CutAtWrite needs n >= 1")
	}
	c := &armedCut{writes: n, at: at, kill: kill, report: make(chan CutReport, 1)}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = c
	return c.report
}

// Fail makes the disk fail (on) or work again (off), as a disk with an
// I/O fault does: while it fails, every write, truncate, sync, create and
// unlink fails with EIO and changes nothing, and reads go on. Nothing is
// lost: what was written before is still there, synced or not, and once
// it works again the same open files take writes. (The power stays on:
// unlike a cut, the writers live on and see the errors.)
func (p *FS) Fail(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failing = on
}

// refusesLocked reports whether a change must fail with EIO: the power is
// cut or the disk fails. The caller holds p.mu.
func (p *FS) refusesLocked() bool { return p.off || p.failing }

// cutLocked discards every file's unsynced contents; the caller holds
// p.mu. It returns the report and the files whose contents changed.
func (p *FS) cutLocked() (CutReport, []*file) {
	var rep CutReport
	var changed []*file
	for f := range p.files {
		rep.DirtyPages += len(f.dirty)
		lost := 0
		for i := range max(len(f.data), len(f.synced)) {
			if i >= len(f.data) || i >= len(f.synced) || f.data[i] != f.synced[i] {
				lost++
			}
		}
		if len(f.synced) < len(f.data) {
			rep.SizeRollback++
		}
		if lost > 0 || len(f.dirty) > 0 {
			rep.Files++
			rep.BytesLost += lost
			changed = append(changed, f)
		}
		f.data = append([]byte(nil), f.synced...)
		clear(f.dirty)
	}
	return rep, changed
}

// afterWriteLocked fires an armed cut whose write this was (at offset
// off); the caller holds p.mu.
func (p *FS) afterWriteLocked(off int64) {
	c := p.armed
	if c == nil || c.at != nil && !c.at(off) {
		return
	}
	if c.writes--; c.writes > 0 {
		return
	}
	p.armed = nil
	c.kill()
	rep, _ := p.cutLocked()
	p.off = true
	c.report <- rep
}

// rootDir is the file system's only directory.
type rootDir struct {
	fs.Inode
	fs *FS
}

var (
	_ fs.NodeCreater   = (*rootDir)(nil)
	_ fs.NodeUnlinker  = (*rootDir)(nil)
	_ fs.NodeGetattrer = (*rootDir)(nil)
)

func (d *rootDir) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = fuse.S_IFDIR | 0o755
	return fs.OK
}

func (d *rootDir) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	d.fs.mu.Lock()
	refuses := d.fs.refusesLocked()
	d.fs.mu.Unlock()
	if refuses {
		return nil, nil, 0, syscall.EIO
	}
	f := &file{fs: d.fs, name: name, mode: mode & 0o7777, dirty: map[int]struct{}{}}
	if c, ok := fuse.FromContext(ctx); ok {
		f.uid, f.gid = c.Uid, c.Gid
	}
	d.fs.mu.Lock()
	d.fs.files[f] = true
	d.fs.mu.Unlock()
	ch := d.NewPersistentInode(ctx, f, fs.StableAttr{Mode: fuse.S_IFREG})
	f.fillAttr(&out.Attr)
	return ch, nil, 0, fs.OK
}

func (d *rootDir) Unlink(ctx context.Context, name string) syscall.Errno {
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	if f, ok := ch.Operations().(*file); ok {
		d.fs.mu.Lock()
		defer d.fs.mu.Unlock()
		if d.fs.refusesLocked() {
			return syscall.EIO
		}
		delete(d.fs.files, f)
	}
	return fs.OK
}

// file is a regular file: data is what readers see, synced what a power
// cut leaves, dirty the pages of data written since the last sync.
type file struct {
	fs.Inode
	fs   *FS
	name string // the directory is flat and has no rename

	// Guarded by fs.mu:
	data, synced []byte
	dirty        map[int]struct{}
	mode         uint32
	uid, gid     uint32
}

var (
	_ fs.NodeOpener    = (*file)(nil)
	_ fs.NodeReader    = (*file)(nil)
	_ fs.NodeWriter    = (*file)(nil)
	_ fs.NodeGetattrer = (*file)(nil)
	_ fs.NodeSetattrer = (*file)(nil)
	_ fs.NodeFsyncer   = (*file)(nil)
	_ fs.NodeFlusher   = (*file)(nil)
)

// fillAttr sets a's size and mode; the caller holds fs.mu or owns f.
func (f *file) fillAttr(a *fuse.Attr) {
	a.Mode = fuse.S_IFREG | f.mode
	a.Size = uint64(len(f.data))
	a.Blocks = (a.Size + 511) / 512
	a.Owner = fuse.Owner{Uid: f.uid, Gid: f.gid}
}

func (f *file) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	// No FOPEN_KEEP_CACHE: every open drops the kernel's cached pages.
	return nil, 0, fs.OK
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	f.fillAttr(&out.Attr)
	return fs.OK
}

func (f *file) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.refusesLocked() {
		return syscall.EIO
	}
	if size, ok := in.GetSize(); ok {
		f.resize(int(size))
	}
	if mode, ok := in.GetMode(); ok {
		f.mode = mode & 0o7777
	}
	if uid, ok := in.GetUID(); ok {
		f.uid = uid
	}
	if gid, ok := in.GetGID(); ok {
		f.gid = gid
	}
	f.fillAttr(&out.Attr)
	return fs.OK
}

func (f *file) Read(ctx context.Context, fh fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if off >= int64(len(f.data)) {
		return fuse.ReadResultData(nil), fs.OK
	}
	n := copy(dest, f.data[off:])
	return fuse.ReadResultData(dest[:n]), fs.OK
}

func (f *file) Write(ctx context.Context, fh fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.refusesLocked() {
		return 0, syscall.EIO
	}
	end := int(off) + len(data)
	if end > len(f.data) {
		f.resize(end)
	}
	copy(f.data[off:], data)
	f.markDirty(int(off), end)
	f.fs.afterWriteLocked(off)
	if f.fs.off {
		// This write's page is what the cut lost; its writer is dead.
		return 0, syscall.EIO
	}
	return uint32(len(data)), fs.OK
}

// Fsync makes the file's current contents (and size) what a power cut
// leaves; fsync and fdatasync are the same here.
func (f *file) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.fs.refusesLocked() {
		return syscall.EIO
	}
	f.fs.fsyncs++
	f.synced = resized(f.synced, len(f.data))
	for pg := range f.dirty {
		lo := pg * pageSize
		if lo >= len(f.data) {
			continue
		}
		hi := min(lo+pageSize, len(f.data))
		copy(f.synced[lo:hi], f.data[lo:hi])
	}
	clear(f.dirty)
	return fs.OK
}

// Flush is close(2); it syncs nothing, as on a real file system.
func (f *file) Flush(ctx context.Context, fh fs.FileHandle) syscall.Errno { return fs.OK }

// resize changes the size of data, zero-filling growth, and marks the
// pages between the old and the new end dirty. The caller holds fs.mu.
func (f *file) resize(n int) {
	old := len(f.data)
	if old == n {
		return
	}
	f.data = resized(f.data, n)
	f.markDirty(min(old, n), max(old, n))
}

// markDirty marks the pages overlapping [lo, hi) dirty. The caller holds fs.mu.
func (f *file) markDirty(lo, hi int) {
	if hi <= lo {
		return
	}
	for pg := lo / pageSize; pg <= (hi-1)/pageSize; pg++ {
		f.dirty[pg] = struct{}{}
	}
}

// resized returns b with length n: bytes beyond n are zeroed so that later
// growth reads zeros, and growth is zero-filled.
func resized(b []byte, n int) []byte {
	switch {
	case n <= len(b):
		clear(b[n:])
		return b[:n]
	case n <= cap(b):
		old := len(b)
		b = b[:n]
		clear(b[old:])
		return b
	default:
		nb := make([]byte, n, n+n/4)
		copy(nb, b)
		return nb
	}
}
