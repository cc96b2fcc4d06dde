package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/logbuf"
	"credbroker/internal/testskip"
	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
)

// readyWriter keeps what is written and closes ready at "Ready.".
type readyWriter struct {
	logbuf.Buffer
	once  sync.Once
	ready chan struct{}
}

func (w *readyWriter) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if strings.Contains(w.Buffer.String(), "\nReady.\n") {
		w.once.Do(func() { close(w.ready) })
	}
	return n, err
}

// inProcessDev runs broker dev in this process with defaultSidecar as its
// default sidecar address until the test ends; it returns the banner once
// ready, or the error the start ended with.
func inProcessDev(t *testing.T, data, defaultSidecar string, args ...string) (banner string, err error) {
	t.Helper()
	banner, _, err = startInProcessDev(t, data, defaultSidecar, args...)
	return banner, err
}

// startInProcessDev is inProcessDev that also returns stop, which ends the
// broker and waits for it.
func startInProcessDev(t *testing.T, data, defaultSidecar string, args ...string) (banner string, stop func(), err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &readyWriter{ready: make(chan struct{})}
	logs := &logbuf.Buffer{}
	done := make(chan error, 1)
	go func() {
		done <- runDevWith(ctx, append([]string{"--addr", "127.0.0.1:0", "--data", data}, args...), out, logs, defaultSidecar)
	}()
	select {
	case <-out.ready:
	case err := <-done:
		cancel()
		return out.String(), func() {}, err
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("broker dev did not start:\n%s\n%s", out.String(), logs.String())
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("broker dev stopped with %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return out.String(), stop, nil
}

// bannerValue returns the rest of the banner line that starts with label.
func bannerValue(banner, label string) string {
	for _, l := range strings.Split(banner, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), label); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestDevSidecar: broker dev serves the sidecar API with a development
// secret next to its keys; a default address in use turns it off with a
// note in the banner; an address given on the command line must work.
func TestDevSidecar(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	t.Run("default address in use", func(t *testing.T) {
		banner, err := inProcessDev(t, t.TempDir(), taken.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		want := "off: " + taken.Addr().String() + " is in use (another broker dev?); pass --sidecar-addr 127.0.0.1:PORT to choose another"
		if got := bannerValue(banner, "sidecar API"); got != want {
			t.Errorf("banner says sidecar API %q, want %q:\n%s", got, want, banner)
		}
		if strings.Contains(banner, "examples/demorepos") {
			t.Errorf("the banner offers the example without a sidecar API:\n%s", banner)
		}
		// The rest of the broker runs.
		mcp := bannerValue(banner, "MCP endpoint")
		resp, err := http.Post(mcp, "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s: HTTP %d, want 401 (the broker serves)", mcp, resp.StatusCode)
		}
	})

	t.Run("given address in use", func(t *testing.T) {
		_, err := inProcessDev(t, t.TempDir(), "127.0.0.1:1", "--sidecar-addr", taken.Addr().String())
		if err == nil || !strings.Contains(err.Error(), "listen on --sidecar-addr "+taken.Addr().String()) {
			t.Fatalf("start with a taken --sidecar-addr: %v, want an error naming it", err)
		}
	})

	t.Run("off", func(t *testing.T) {
		data := t.TempDir()
		banner, err := inProcessDev(t, data, taken.Addr().String(), "--sidecar-addr", "off")
		if err != nil {
			t.Fatal(err)
		}
		if got := bannerValue(banner, "sidecar API"); got != "off (--sidecar-addr off)" {
			t.Errorf("banner says sidecar API %q", got)
		}
		if _, err := os.Stat(filepath.Join(data, "sidecar.secret")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a secret was written for a sidecar that is off: %v", err)
		}
	})

	t.Run("not loopback", func(t *testing.T) {
		_, err := inProcessDev(t, t.TempDir(), "127.0.0.1:1", "--sidecar-addr", "0.0.0.0:8081")
		if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "loopback only") {
			t.Fatalf("--sidecar-addr 0.0.0.0:8081: %v, want a usage error", err)
		}
	})

	t.Run("serves, secret kept across restarts", func(t *testing.T) {
		data := t.TempDir()
		free := freeAddr(t)
		banner, stop, err := startInProcessDev(t, data, free)
		if err != nil {
			t.Fatal(err)
		}
		secretPath := filepath.Join(data, "sidecar.secret")
		if got, want := bannerValue(banner, "sidecar API"), "http://"+free+" (secret: "+secretPath+")"; got != want {
			t.Fatalf("banner says sidecar API %q, want %q", got, want)
		}
		wantCmd := "go run ./examples/demorepos -addr 127.0.0.1:8090 -sidecar-url http://" + free + " -secret-file " + secretPath
		if !strings.Contains(banner, "\n  "+wantCmd+"\n") {
			t.Errorf("banner lacks the example's command %q:\n%s", wantCmd, banner)
		}
		fi, err := os.Stat(secretPath)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("secret file: %v %v; want mode 0600", fi, err)
		}
		secret, _ := os.ReadFile(secretPath)
		checked := sidecartest.NewContract(t).Proxy("http://" + free)
		sc, err := client.New(checked, strings.TrimSpace(string(secret)), nil)
		if err != nil {
			t.Fatal(err)
		}
		// The secret gets in; the user token is checked next.
		if _, err := sc.Require(context.Background(), "not-a-token", client.RequireRequest{Provider: "demo"}); !isSidecarCode(err, "unauthorized") {
			t.Fatalf("require with the dev secret and a bad user token: %v", err)
		}
		wrong, _ := client.New(checked, "not-the-dev-secret-0123456789", nil)
		if _, err := wrong.Require(context.Background(), "x", client.RequireRequest{Provider: "demo"}); !isSidecarCode(err, "unauthorized") {
			t.Fatalf("wrong secret: %v", err)
		}
		// A second start with the same data keeps the secret.
		stop()
		if _, err := inProcessDev(t, data, freeAddr(t)); err != nil {
			t.Fatal(err)
		}
		again, _ := os.ReadFile(secretPath)
		if string(again) != string(secret) {
			t.Error("the development secret changed on restart")
		}
	})
}

func isSidecarCode(err error, code string) bool {
	var e *client.Error
	return errors.As(err, &e) && e.Code == code
}

// TestDevBrokersSideBySide starts two development brokers as a developer
// (or a test run) would, both with the default sidecar address: whichever
// gets it serves the sidecar API; the other says in its banner that the
// address is in use and runs without it. (Should something else hold the
// default port, both say so.)
func TestDevBrokersSideBySide(t *testing.T) {
	testskip.Short(t, "starts two broker processes")
	inUse := "off: " + devSidecarAddr + " is in use (another broker dev?); pass --sidecar-addr 127.0.0.1:PORT to choose another"
	first := startDevArgs(t, freeAddr(t), t.TempDir(), nil)
	second := startDevArgs(t, freeAddr(t), t.TempDir(), nil)
	got := bannerValue(first.Stdout(), "sidecar API")
	if !strings.HasPrefix(got, "http://"+devSidecarAddr+" (secret: ") && got != inUse {
		t.Errorf("first broker: sidecar API %q", got)
	}
	// The first one is still running: the default port is taken.
	if got := bannerValue(second.Stdout(), "sidecar API"); got != inUse {
		t.Errorf("second broker: sidecar API %q, want %q", got, inUse)
	}
	for _, d := range []*devBroker{first, second} {
		if tok := d.Token("alice"); tok == "" {
			t.Errorf("broker %s does not serve", d.BaseURL)
		}
	}
}
