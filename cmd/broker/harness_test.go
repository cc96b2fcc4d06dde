package main

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"credbroker/internal/logbuf"
	"credbroker/internal/loopback"
)

// Binaries built once per test run, with -race when the tests have it.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

func binaries(t *testing.T) (broker, brokerctl string) {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "credbroker-bin-")
		if buildErr != nil {
			return
		}
		for _, pkg := range []string{"cmd/broker", "cmd/brokerctl", "examples/demorepos"} {
			args := []string{"build", "-o", filepath.Join(binDir, filepath.Base(pkg))}
			if raceEnabled {
				// The subprocesses run under the race detector when the
				// tests do (their reports fail the tests: see raceReport).
				args = append(args, "-race")
			}
			out, err := exec.Command("go", append(args, "credbroker/"+pkg)...).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "broker"), filepath.Join(binDir, "brokerctl")
}

// demoreposBinary is examples/demorepos, built with the others.
func demoreposBinary(t *testing.T) string {
	binaries(t)
	return filepath.Join(binDir, "demorepos")
}

func TestMain(m *testing.M) {
	if control := os.Getenv(gatewayHelperEnv); control != "" {
		// This binary is the conformance suite's --command
		// (TestGatewayConformanceClient).
		os.Exit(gatewayHelperMain(control, os.Args[1:]))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// devBroker is a `broker dev` subprocess.
type devBroker struct {
	t       *testing.T
	cmd     *exec.Cmd
	BaseURL string
	Data    string
	Addr    string

	mu     sync.Mutex // guards stdout
	stdout strings.Builder
	stderr logbuf.Buffer // line by line, so a test can wait for a log line
	exited chan struct{}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// startDev runs `broker dev` on addr with data dir (and extra flags),
// waits for its banner. The sidecar API is off unless extra gives
// --sidecar-addr: tests never take the default port a developer's own
// `make run` wants.
func startDev(t *testing.T, addr, data string, extra ...string) *devBroker {
	t.Helper()
	if !slices.Contains(extra, "--sidecar-addr") {
		extra = append(extra, "--sidecar-addr", "off")
	}
	return startDevArgs(t, addr, data, extra)
}

// startDevArgs is startDev with exactly the extra flags given.
func startDevArgs(t *testing.T, addr, data string, extra []string) *devBroker {
	t.Helper()
	broker, _ := binaries(t)
	d := &devBroker{t: t, Data: data, Addr: addr, exited: make(chan struct{})}
	d.cmd = exec.Command(broker, append([]string{"dev", "--addr", addr, "--data", data}, extra...)...)
	d.cmd.Env = append(os.Environ(), "NO_COLOR=1")
	outR, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errR, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The banner names the MCP endpoint and ends with "Ready." once
	// everything is mounted; the reader says so on ready.
	ready := make(chan string, 1)
	// Both pipes are read to EOF before Wait, which closes them: calling
	// Wait while a read is pending can lose the last output.
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(outR)
		base := ""
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.stdout.WriteString(line + "\n")
			d.mu.Unlock()
			if f := strings.Fields(line); len(f) == 3 && f[0] == "MCP" && f[1] == "endpoint" {
				base = strings.TrimSuffix(f[2], "/mcp")
			}
			if strings.TrimSpace(line) == "Ready." && base != "" {
				ready <- base
			}
		}
		io.Copy(io.Discard, outR)
	})
	readers.Go(func() {
		// Line by line, so a failing test can show the log so far.
		sc := bufio.NewScanner(errR)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.stderr.Write([]byte(sc.Text() + "\n"))
		}
		io.Copy(io.Discard, errR)
	})
	go func() { readers.Wait(); d.cmd.Wait(); close(d.exited) }()
	t.Cleanup(d.Stop)
	select {
	case base := <-ready:
		d.BaseURL = base
	case <-d.exited:
		t.Fatalf("broker dev exited early:\nstdout:\n%s\nstderr:\n%s", d.Stdout(), d.Stderr())
	case <-time.After(60 * time.Second):
		t.Fatalf("broker dev did not start in time:\n%s\n%s", d.Stdout(), d.Stderr())
	}
	return d
}

func (d *devBroker) Stdout() string { d.mu.Lock(); defer d.mu.Unlock(); return d.stdout.String() }
func (d *devBroker) Stderr() string { return d.stderr.String() }

// WaitStderr waits up to timeout for a line containing text in the
// broker's log, and reports whether it came.
func (d *devBroker) WaitStderr(text string, timeout time.Duration) bool {
	return d.stderr.WaitFor(text, d.exited, timeout)
}

// logsWhen waits (at most 30 s, woken by every write) until cond holds for
// buf, the captured output of a child process, and returns buf's text then,
// for the caller's own checks. The child writes a line before it sends the
// answer the test sees, but the test copies the child's pipe into buf on a
// goroutine of its own: right after the answer the line can still be on its
// way. gone is closed once the child has exited (its output all copied).
// On a timeout the text is returned as it is, for the caller's check to
// fail on and show.
func logsWhen(buf *logbuf.Buffer, gone <-chan struct{}, cond func(text string) bool) string {
	buf.WaitUntil(cond, gone, 30*time.Second)
	return buf.String()
}

// Stop sends SIGTERM and waits for a graceful exit.
func (d *devBroker) Stop() {
	select {
	case <-d.exited:
	default:
		d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(30 * time.Second):
			d.cmd.Process.Kill()
			<-d.exited
			d.t.Errorf("broker dev did not stop on SIGTERM within 30s")
		}
	}
	raceReport(d.t, "broker dev", d.Stderr())
}

// raceReport fails t when a subprocess built with -race reported a data
// race in its log (it also exits 66 then, which not every caller checks).
func raceReport(t *testing.T, name, log string) {
	t.Helper()
	if i := strings.Index(log, "WARNING: DATA RACE"); i >= 0 {
		t.Errorf("%s reported a data race:\n%s", name, log[i:])
	}
}

// Token mints a bearer token for a development user through /dev/token.
func (d *devBroker) Token(user string) string {
	d.t.Helper()
	return d.TokenFor(user, "")
}

// TokenFor mints user's bearer token for resource (a gateway endpoint;
// "" the broker's /mcp) through /dev/token.
func (d *devBroker) TokenFor(user, resource string) string {
	d.t.Helper()
	form := url.Values{"user": {user}}
	if resource != "" {
		form.Set("resource", resource)
	}
	req, _ := http.NewRequest("POST", d.BaseURL+"/dev/token", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		d.t.Fatalf("/dev/token: %d %s", resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestBinariesMatchRace: the broker, brokerctl and examples/demorepos that
// tests start are built with -race exactly when the tests are.
func TestBinariesMatchRace(t *testing.T) {
	broker, ctl := binaries(t)
	for _, bin := range []string{broker, ctl, demoreposBinary(t)} {
		info, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		race := false
		for _, s := range info.Settings {
			if s.Key == "-race" && s.Value == "true" {
				race = true
			}
		}
		if race != raceEnabled {
			t.Errorf("%s built with -race=%v, the tests run with -race=%v", filepath.Base(bin), race, raceEnabled)
		}
	}
}
