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
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
	logf   string
	mu     sync.Mutex
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
	s := &Server{dir: dir, exited: make(chan struct{}), logf: filepath.Join(dir, "server.log")}
	fail := func(err error) (*Server, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(err)
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	port, err := freePort()
	if err != nil {
		return fail(err)
	}
	logFile, err := os.Create(s.logf)
	if err != nil {
		return fail(err)
	}
	s.cmd = exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(port),
		"-c", "unix_socket_directories="+dir,
		"-c", "max_connections=300",
		"-c", "shared_buffers=64MB",
		"-c", "log_min_messages=warning",
	)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = logFile, logFile
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGINT, Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		logFile.Close()
		return fail(fmt.Errorf("start postgres: %w", err))
	}
	go func() { s.cmd.Wait(); logFile.Close(); close(s.exited) }()
	s.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := ping(s.URL, 2*time.Second)
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.logf)
			return fail(fmt.Errorf("postgres exited at start: %s", strings.TrimSpace(string(log))))
		default:
		}
		if time.Now().After(deadline) {
			s.Close()
			return nil, fmt.Errorf("postgres did not accept connections within 30s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
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
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	// The server's last children may still be exiting: retry briefly.
	var err error
	for range 50 {
		if err = os.RemoveAll(s.dir); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
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
