// Package pgtest gives tests a PostgreSQL database: a throwaway server
// started on 127.0.0.1 from the local PostgreSQL binaries (initdb into a
// temporary directory, unix socket inside it, trust authentication on
// loopback only), or the server named by CREDBROKER_TEST_POSTGRES (a URL).
//
// When no server can be started the tests that need one fail, saying why
// (or skip when CREDBROKER_ALLOW_SKIP=1; see internal/testskip).
//
// As root, the server runs as the "postgres" user (PostgreSQL refuses to run
// as root) with its directory chowned to it. The server process gets
// SIGINT (fast shutdown) if the test binary dies, so none outlives a run.
package pgtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"

	"credbroker/internal/loopback"
	"credbroker/internal/testskip"
)

// Environment variables read by this package.
const (
	// EnvURL names an existing server to use instead of starting one. The
	// role must be allowed to create schemas in its database.
	EnvURL = "CREDBROKER_TEST_POSTGRES"
	// EnvBin is an optional directory holding initdb and postgres.
	EnvBin = "CREDBROKER_PG_BIN"
)

// Server is a PostgreSQL server for tests.
type Server struct {
	// URL connects to the server's default database as a superuser (or as
	// the role named by CREDBROKER_TEST_POSTGRES).
	URL string

	dir  string // everything below lives here
	data string
	logf string
	bin  string
	port int
	cred *syscall.Credential

	mu     sync.Mutex // guards the fields below
	cmd    *exec.Cmd  // the running postmaster
	exited chan struct{}
	closed bool
}

// Start starts a throwaway server (or returns the external one named by
// CREDBROKER_TEST_POSTGRES). Close stops it and removes its files.
func Start() (*Server, error) {
	if u := os.Getenv(EnvURL); u != "" {
		if err := ping(u, 10*time.Second); err != nil {
			return nil, fmt.Errorf("%s=%s: %w", EnvURL, redactURL(u), err)
		}
		return &Server{URL: u}, nil
	}
	bin, err := findBin()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // the free port may be taken between probe and bind
		s, err := startLocal(bin)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// findBin locates the directory holding initdb and postgres.
func findBin() (string, error) {
	if d := os.Getenv(EnvBin); d != "" {
		return d, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", errors.New("no PostgreSQL binaries: initdb is not on PATH nor under /usr/lib/postgresql/*/bin (apt-get install postgresql, or set " + EnvURL + ")")
	}
	slices.SortFunc(matches, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	return filepath.Dir(matches[0]), nil
}

func pgMajor(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// runAs returns the credentials the server runs with: the postgres user
// when the test runs as root, else nil (the current user).
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("running as root and there is no postgres user to run the server as")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func startLocal(bin string) (*Server, error) {
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "credbroker-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, data: filepath.Join(dir, "data"), logf: filepath.Join(dir, "server.log"), bin: bin, cred: cred}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	if s.port, err = freePort(); err != nil {
		return fail(err)
	}
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	s.mu.Lock()
	err = s.start()
	s.mu.Unlock()
	if err != nil {
		return fail(err)
	}
	return s, nil
}

// readyLine is what the server logs once it accepts connections (after
// crash recovery, on a restart).
const readyLine = "database system is ready to accept connections"

// start runs the postmaster on s.data and waits until it logs readyLine.
// The caller holds s.mu.
func (s *Server) start() error {
	logFile, err := os.OpenFile(s.logf, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	out := &readyWatch{w: logFile, ready: make(chan struct{})}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"), "-D", s.data,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.port),
		"-c", "unix_socket_directories="+s.dir,
		"-c", "max_connections=300",
		"-c", "shared_buffers=64MB",
		"-c", "log_min_messages=warning", // LOG lines, readyLine among them, still appear
		// Durable commits, the default, stated because tests rely on it.
		"-c", "fsync=on",
		"-c", "synchronous_commit=on",
	)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so Kill reaches every backend at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGINT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); logFile.Close(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	select {
	case <-out.ready:
	case <-exited:
		log, _ := os.ReadFile(s.logf)
		return fmt.Errorf("postgres exited at start: %s", strings.TrimSpace(string(log)))
	case <-time.After(60 * time.Second):
		s.stop()
		return errors.New("postgres did not log that it accepts connections within 60s")
	}
	return ping(s.URL, 10*time.Second)
}

// readyWatch passes the server's output to its log file and closes ready
// at the first line that contains readyLine.
type readyWatch struct {
	w     io.Writer
	ready chan struct{}
	line  []byte // the unfinished last line
	seen  bool
}

func (r *readyWatch) Write(p []byte) (int, error) {
	n, err := r.w.Write(p)
	r.line = append(r.line, p...)
	for {
		i := bytes.IndexByte(r.line, '\n')
		if i < 0 {
			break
		}
		if !r.seen && bytes.Contains(r.line[:i], []byte(readyLine)) {
			r.seen = true
			close(r.ready)
		}
		r.line = r.line[i+1:]
	}
	return n, err
}

// stop asks the postmaster for a fast shutdown and waits for it to exit.
// The caller holds s.mu.
func (s *Server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// Kill crashes the server: SIGKILL to the postmaster and all its
// processes (each backend is in a session of its own, so one signal to a
// process group would miss them), as a crash of the machine's processes
// would, and returns once every one of them has exited. Nothing is shut
// down cleanly; Restart then starts the server again on the same data and
// port, and PostgreSQL recovers from its write-ahead log (fsync is on, so
// every committed transaction must come back).
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.closed {
		return errors.New("pgtest: Kill needs a running server started by this package")
	}
	pid := s.cmd.Process.Pid
	// Stopped, the postmaster starts no new process while its children die.
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgtest: stop postmaster %d: %w", pid, err)
	}
	kids, err := openChildren(pid)
	if err != nil {
		return err
	}
	defer kids.close()
	for _, k := range kids {
		_ = syscall.Kill(k.pid, syscall.SIGKILL)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgtest: kill postmaster %d: %w", pid, err)
	}
	<-s.exited
	// The next start refuses to run while a killed backend still holds the
	// shared memory.
	return kids.wait(30 * time.Second)
}

// Restart starts a server stopped by Kill again, on the same data
// directory and port (so URLs handed out stay valid), and waits until it
// accepts connections again.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.closed {
		return errors.New("pgtest: Restart needs a server started by this package")
	}
	select {
	case <-s.exited:
	default:
		return errors.New("pgtest: Restart: the server is still running")
	}
	return s.start()
}

// process is a process with a pidfd, which the kernel makes readable
// when the process exits.
type process struct{ pid, fd int }

type processes []process

// openChildren opens pidfds for the children of pid (from /proc).
func openChildren(pid int) (processes, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var ps processes
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(b[i+1:])); len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue
		}
		fd, err := unix.PidfdOpen(child, 0)
		if err != nil {
			continue // exited meanwhile
		}
		ps = append(ps, process{child, fd})
	}
	return ps, nil
}

// wait waits until every process has exited.
func (ps processes) wait(timeout time.Duration) error {
	fds := make([]unix.PollFd, len(ps))
	for i, p := range ps {
		fds[i] = unix.PollFd{Fd: int32(p.fd), Events: unix.POLLIN}
	}
	deadline := time.Now().Add(timeout)
	for left := len(fds); left > 0; {
		wait := time.Until(deadline)
		if wait <= 0 {
			return fmt.Errorf("pgtest: %d server processes still running after %v", left, timeout)
		}
		if _, err := unix.Poll(fds, int(wait.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("pgtest: poll pidfds: %w", err)
		}
		for i := range fds {
			if fds[i].Revents != 0 {
				fds[i] = unix.PollFd{Fd: -1} // poll skips negative fds
				left--
			}
		}
	}
	return nil
}

func (ps processes) close() {
	for _, p := range ps {
		unix.Close(p.fd)
	}
}

func freePort() (int, error) {
	addr, err := loopback.FreeAddr()
	if err != nil {
		return 0, err
	}
	_, port, _ := net.SplitHostPort(addr)
	return strconv.Atoi(port)
}

func ping(u string, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer c.Close(ctx)
	return c.Ping(ctx)
}

// Close stops a server this package started (fast shutdown) and removes
// its directory. It does nothing for an external server.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.cmd == nil {
		s.closed = true
		return nil
	}
	s.closed = true
	select {
	case <-s.exited: // killed and not restarted
	default:
		// The postmaster may exit before its last children have.
		kids, err := openChildren(s.cmd.Process.Pid)
		if err != nil {
			return err
		}
		defer kids.close()
		s.stop()
		if err := kids.wait(20 * time.Second); err != nil {
			return err
		}
	}
	return os.RemoveAll(s.dir)
}

// Log returns the server's log (empty for an external server).
func (s *Server) Log() string {
	if s.logf == "" {
		return ""
	}
	b, _ := os.ReadFile(s.logf)
	return string(b)
}

// Schema creates a fresh, empty schema and returns a URL whose connections
// use it as their search_path, so every caller gets its own tables on one
// server. The schema is dropped when t ends.
func (s *Server) Schema(t testing.TB) string {
	t.Helper()
	u, name, err := s.NewSchema()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if c, err := pgx.Connect(ctx, s.URL); err == nil {
			_, _ = c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE")
			c.Close(ctx)
		}
	})
	return u
}

// NewSchema is Schema for fixtures that outlive one test: the schema stays
// until the server is closed (or forever on an external server).
func (s *Server) NewSchema() (url, name string, err error) {
	var b [6]byte
	rand.Read(b[:])
	name = "t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return "", "", fmt.Errorf("connect: %w", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		return "", "", fmt.Errorf("create schema: %w", err)
	}
	return withParam(s.URL, "search_path", name), name, nil
}

func withParam(raw, k, v string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set(k, v)
	u.RawQuery = q.Encode()
	return u.String()
}

func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Unavailable stops t because no server could be started (err says why):
// it fails, or skips when CREDBROKER_ALLOW_SKIP=1 (see internal/testskip).
func Unavailable(t testing.TB, err error) {
	t.Helper()
	testskip.Missing(t, "postgresql", fmt.Sprintf("no PostgreSQL server could be started (%v); install the server binaries with: apt-get install -y postgresql (.ci/deps does this), or set %s to a server URL", err, EnvURL))
}

// StartT starts a server for one test and stops it when t ends; it fails
// (or skips, see Unavailable) when no server can be started.
func StartT(t testing.TB) *Server {
	t.Helper()
	s, err := Start()
	if err != nil {
		Unavailable(t, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

var (
	shared    *Server
	sharedErr error
	sharedMu  sync.Mutex
	sharedOK  bool
)

// Shared returns one server for the whole test binary, started on first
// use; it fails (or skips, see Unavailable) t when none can be started. Call Main from
// TestMain so the server is stopped when the tests end.
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedMu.Lock()
	if !sharedOK {
		shared, sharedErr = Start()
		sharedOK = true
	}
	s, err := shared, sharedErr
	sharedMu.Unlock()
	if err != nil {
		Unavailable(t, err)
	}
	return s
}

// Main runs the tests and then stops the shared server, if one started.
func Main(m *testing.M) {
	code := m.Run()
	sharedMu.Lock()
	if shared != nil {
		_ = shared.Close()
	}
	sharedMu.Unlock()
	os.Exit(code)
}
