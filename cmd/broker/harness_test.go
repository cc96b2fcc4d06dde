package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
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
)

// Binaries built once per test run.
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
			out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, filepath.Base(pkg)), "credbroker/"+pkg).CombinedOutput()
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

	mu     sync.Mutex
	stdout strings.Builder
	stderr strings.Builder
	exited chan struct{}
}

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
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
	ready := make(chan string, 1)
	// Both pipes are read to EOF before Wait, which closes them: calling
	// Wait while a read is pending can lose the last output.
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			line := sc.Text()
			d.mu.Lock()
			d.stdout.WriteString(line + "\n")
			d.mu.Unlock()
			if f := strings.Fields(line); len(f) == 3 && f[0] == "MCP" && f[1] == "endpoint" {
				ready <- strings.TrimSuffix(f[2], "/mcp")
			}
		}
		io.Copy(io.Discard, outR)
	})
	readers.Go(func() {
		// Line by line, so a failing test can show the log so far.
		sc := bufio.NewScanner(errR)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			d.mu.Lock()
			d.stderr.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
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
	// The banner is printed once everything is mounted; wait for "Ready.".
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.Stdout(), "Ready.") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	return d
}

func (d *devBroker) Stdout() string { d.mu.Lock(); defer d.mu.Unlock(); return d.stdout.String() }
func (d *devBroker) Stderr() string { d.mu.Lock(); defer d.mu.Unlock(); return d.stderr.String() }

// Stop sends SIGTERM and waits for a graceful exit.
func (d *devBroker) Stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(30 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		d.t.Errorf("broker dev did not stop on SIGTERM within 30s")
	}
}

// Token mints a bearer token for a development user through /dev/token.
func (d *devBroker) Token(user string) string {
	d.t.Helper()
	req, _ := http.NewRequest("POST", d.BaseURL+"/dev/token", strings.NewReader(url.Values{"user": {user}}.Encode()))
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
