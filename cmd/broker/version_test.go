package main

import (
	"bufio"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"credbroker/internal/buildinfo"
)

// TestVersionStamped builds the broker as the Makefile does, with the
// version, commit and date stamped by -ldflags -X, and checks that
// `broker version` and /healthz of a running broker report them.
func TestVersionStamped(t *testing.T) {
	t.Parallel()
	want := buildinfo.Info{Version: "v9.8.7-test", Commit: "0123456789abcdef0123456789abcdef01234567", Date: "2026-12-01T10:11:12Z"}
	bin := filepath.Join(t.TempDir(), "broker")
	ldflags := "-X credbroker/internal/buildinfo.version=" + want.Version +
		" -X credbroker/internal/buildinfo.commit=" + want.Commit +
		" -X credbroker/internal/buildinfo.date=" + want.Date
	goBuild(t, moduleRoot(t), "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", bin, "./cmd/broker")
	checkBuildInfo(t, bin, want)
}

// TestVersionFromVCS builds the broker without -ldflags inside a fresh git
// repository holding a copy of this tree, committed at a known date, and
// checks that `broker version` and /healthz fall back to what the Go
// toolchain recorded (debug.ReadBuildInfo: vcs.revision, vcs.time and the
// pseudo-version).
func TestVersionFromVCS(t *testing.T) {
	t.Parallel()
	const commitDate = "2026-11-30T02:22:10Z"
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("this test needs git (the toolchain's VCS stamp comes from it): ", err)
	}
	repo := filepath.Join(t.TempDir(), "src")
	// The repository is created empty first and every git call names it
	// explicitly, with GIT_* variables from the environment dropped (a git
	// hook running the tests sets GIT_DIR): nothing here may ever reach the
	// repository the tests run in.
	env := []string{"GIT_DIR=" + filepath.Join(repo, ".git"), "GIT_WORK_TREE=" + repo,
		"GIT_CEILING_DIRECTORIES=" + filepath.Dir(repo),
		"GIT_AUTHOR_DATE=" + commitDate, "GIT_COMMITTER_DATE=" + commitDate}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			env = append(env, kv)
		}
	}
	runGit := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(git, append([]string{"-c", "user.name=test", "-c", "user.email=test@example.com",
			"-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Dir = repo
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if err := os.Mkdir(repo, 0o755); err != nil {
		t.Fatal(err)
	}
	runGit("init", "-q")
	copyTree(t, moduleRoot(t), repo)
	runGit("add", "-A")
	runGit("commit", "-q", "-m", "snapshot")
	rev := runGit("rev-parse", "HEAD")

	bin := filepath.Join(t.TempDir(), "broker")
	// -buildvcs=true overrides a GOFLAGS=-buildvcs=false in the environment.
	goBuild(t, repo, "-trimpath", "-buildvcs=true", "-o", bin, "./cmd/broker")
	checkBuildInfo(t, bin, buildinfo.Info{
		Version: "v0.0.0-20261130022210-" + rev[:12],
		Commit:  rev,
		Date:    commitDate,
	})
}

// checkBuildInfo runs `bin version`, `bin version --json` and `bin dev`,
// and compares version, commit and date with want.
func checkBuildInfo(t *testing.T, bin string, want buildinfo.Info) {
	t.Helper()
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("broker version: %v\n%s", err, out)
	}
	for _, line := range []string{"credbroker " + want.Version, "commit  " + want.Commit, "date    " + want.Date} {
		if !strings.Contains(string(out), line+"\n") {
			t.Errorf("broker version: no line %q in\n%s", line, out)
		}
	}
	out, err = exec.Command(bin, "version", "--json").Output()
	if err != nil {
		t.Fatalf("broker version --json: %v", err)
	}
	var got buildinfo.Info
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("broker version --json: %v: %s", err, out)
	}
	if got.Version != want.Version || got.Commit != want.Commit || got.Date != want.Date || got.GoVersion == "" {
		t.Errorf("broker version --json = %+v, want %+v", got, want)
	}

	base, stop := startDevBinary(t, bin)
	defer stop()
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("/healthz: HTTP %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var h struct {
		Status string `json:"status"`
		buildinfo.Info
	}
	if err := json.Unmarshal(body, &h); err != nil {
		t.Fatalf("/healthz: %v: %s", err, body)
	}
	if h.Status != "ok" || h.Version != want.Version || h.Commit != want.Commit || h.Date != want.Date {
		t.Errorf("/healthz = %s, want status ok and %+v", body, want)
	}
}

// startDevBinary runs `bin dev` on a free loopback port and returns its
// base URL once the banner says it is ready.
func startDevBinary(t *testing.T, bin string) (base string, stop func()) {
	t.Helper()
	cmd := exec.Command(bin, "dev", "--addr", "127.0.0.1:0", "--data", t.TempDir())
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "MCP" && f[1] == "endpoint" {
				base = strings.TrimSuffix(f[2], "/mcp")
			}
			if sc.Text() == "Ready." {
				ready <- base
			}
		}
		io.Copy(io.Discard, stdout)
	}()
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		cmd.Wait()
	}
	select {
	case b := <-ready:
		return b, stop
	case <-done:
		cmd.Wait()
		t.Fatalf("broker dev exited before it was ready:\n%s", stderr.String())
	case <-time.After(60 * time.Second):
		stop()
		t.Fatalf("broker dev did not get ready in 60s:\n%s", stderr.String())
	}
	return "", nil
}

// moduleRoot is the directory holding go.mod.
func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" {
		t.Fatalf("go env GOMOD: %v %s", err, out)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func goBuild(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build"}, args...)...)
	cmd.Dir = dir
	// GIT_* variables (set when a git hook runs the tests) would point the
	// toolchain's VCS stamp at another repository.
	cmd.Env = []string{"CGO_ENABLED=0"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// copyTree copies the source tree at src into dst, leaving out every
// dot-file and dot-directory (.git above all: in a linked worktree it is a
// file pointing at the real repository), caches and build output.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	skip := map[string]bool{"bin": true, "data": true, "node_modules": true, "test-output": true}
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if rel != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			if skip[d.Name()] {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}
