package deploy_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/loopback"
	"credbroker/internal/testskip"
	"credbroker/vault"
)

// What the image promises (Dockerfile, docs/DEPLOY.md).
const (
	imageUser       = "65532:65532"
	imageUID        = 65532
	imagePort       = "8080"
	imageEntrypoint = "/broker serve"
)

// TestDockerfile reads the Dockerfile's runtime stage (the last one): an
// empty base, no RUN or ADD, a numeric non-root user, `broker serve` as an
// exec-form entrypoint, the exposed port the broker listens on, and the
// /data volume holding the default bbolt store. It needs no container
// runtime, so it holds everywhere; TestImage checks the built image itself.
func TestDockerfile(t *testing.T) {
	src, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(string(src))
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage Dockerfile, found %d stage(s)", len(stages))
	}
	build, rt := stages[0], stages[len(stages)-1]
	if f := strings.Fields(build.from); len(f) != 3 || !strings.EqualFold(f[1], "AS") || f[2] != "build" {
		t.Errorf("first stage: FROM %s; want `FROM <go image> AS build` (make image replaces the stage named build)", build.from)
	}
	if base := strings.Fields(rt.from)[0]; base != "scratch" && !strings.HasPrefix(base, "gcr.io/distroless/static") {
		t.Errorf("runtime stage is FROM %s; want scratch or distroless/static", base)
	}
	env := map[string]string{}
	var user, entrypoint string
	var exposed, volumes []string
	for _, in := range rt.instrs {
		switch in.cmd {
		case "RUN", "ADD", "CMD", "SHELL", "HEALTHCHECK":
			t.Errorf("runtime stage has %s %s: the image has no shell to run it", in.cmd, in.args)
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(in.args), &argv); err != nil {
				t.Errorf("ENTRYPOINT %s is not in exec form (a JSON array): it would need a shell", in.args)
			}
			entrypoint = strings.Join(argv, " ")
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "VOLUME":
			var vs []string
			if json.Unmarshal([]byte(in.args), &vs) != nil {
				vs = strings.Fields(in.args)
			}
			volumes = append(volumes, vs...)
		case "ENV":
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
			}
		case "COPY":
			if !strings.Contains(in.args, "--from=build ") {
				t.Errorf("runtime stage copies from somewhere other than the build stage: COPY %s", in.args)
			}
		}
	}
	if user != imageUser {
		t.Errorf("USER %q, want %q (numeric, so a runtime can check runAsNonRoot)", user, imageUser)
	}
	if entrypoint != imageEntrypoint {
		t.Errorf("ENTRYPOINT %q, want %q", entrypoint, imageEntrypoint)
	}
	if !slices.Contains(exposed, imagePort) && !slices.Contains(exposed, imagePort+"/tcp") {
		t.Errorf("EXPOSE %v, want %s", exposed, imagePort)
	}
	if _, port, err := net.SplitHostPort(env["BROKER_ADDR"]); err != nil || port != imagePort {
		t.Errorf("ENV BROKER_ADDR=%q: want the broker to listen on all interfaces on the exposed port %s", env["BROKER_ADDR"], imagePort)
	}
	if !slices.Contains(volumes, "/data") {
		t.Errorf("VOLUME %v, want /data", volumes)
	}
	if !strings.HasPrefix(env["BROKER_STORE"], "bolt:/data/") {
		t.Errorf("ENV BROKER_STORE=%q, want the default bbolt store on the /data volume", env["BROKER_STORE"])
	}
	if env["BROKER_PROVIDERS"] == "" {
		t.Errorf("ENV BROKER_PROVIDERS is not set: the default providers.yaml path is relative to a working directory the image does not have")
	}
}

// TestImage builds the image with `make image` and checks the image config
// (user, entrypoint, exposed port, volume), its files (a static broker, no
// shell, /data owned by the user), and a container started from it
// (read-only root file system, every capability dropped, keys and client
// secret mounted as files, `broker serve` against the development IdP
// running in this test on the host's loopback, --network host) answering
// 200 on /readyz.
//
// Without podman, or when podman builds but cannot start containers here,
// the test fails naming what is missing, or with CREDBROKER_ALLOW_SKIP=1
// skips the rest (see internal/testskip): config and files are still
// checked when podman can build.
func TestImage(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		testskip.Missing(t, "podman", "podman is not installed, so no image is built: apt-get install -y podman runc (.ci/deps does this)")
		return
	}
	rt := newContainerRuntime(t, podman)

	tag := "localhost/credbroker:test-" + randomHex(t, 6)
	stamp := map[string]string{"VERSION": "v0.0.0-imagetest", "COMMIT": "0123456789abcdef0123456789abcdef01234567", "BUILD_DATE": "2026-12-01T10:11:12Z"}
	start := time.Now()
	// --layers=false: no intermediate images are left behind per run.
	mk := exec.Command("make", "image", "IMAGE="+tag, "IMAGE_DIR="+t.TempDir(), "IMAGE_BUILD_FLAGS=--layers=false",
		"VERSION="+stamp["VERSION"], "COMMIT="+stamp["COMMIT"], "BUILD_DATE="+stamp["BUILD_DATE"])
	mk.Dir = ".."
	mk.Env = rt.env
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { rt.podman(t, "rmi", "--force", tag) })
	t.Logf("make image built %s in %s", tag, time.Since(start).Round(100*time.Millisecond))

	t.Run("config", func(t *testing.T) { checkImageConfig(t, rt, tag, stamp) })
	t.Run("files", func(t *testing.T) { checkImageFiles(t, rt, tag) })

	// Can this machine start a container? The probe runs `broker version`
	// in the image, which also shows the stamp made it into the binary.
	out, err := rt.podmanErr("run", "--rm", "--network", "host", "--entrypoint", "/broker", tag, "version")
	if err != nil {
		testskip.Missing(t, "a container runtime", fmt.Sprintf("podman built the image but cannot start a container (config and files were checked): %v: %s", err, out))
		return
	}
	if !strings.Contains(out, "credbroker "+stamp["VERSION"]+"\n") || !strings.Contains(out, "commit  "+stamp["COMMIT"]) {
		t.Errorf("broker version in the image:\n%s\nwant version %s and commit %s", out, stamp["VERSION"], stamp["COMMIT"])
	}
	t.Run("run", func(t *testing.T) { runImage(t, rt, tag, stamp) })
}

// containerRuntime runs podman with the adjustments some machines need:
// a containers.conf without default ulimits (setting RLIMIT_NOFILE is not
// permitted in some sandboxes) and runc when installed (crun fails on
// hybrid cgroups there). Both are harmless elsewhere.
type containerRuntime struct {
	podmanPath string
	env        []string
	global     []string // flags before the podman subcommand
}

func newContainerRuntime(t *testing.T, podman string) *containerRuntime {
	conf := filepath.Join(t.TempDir(), "containers.conf")
	if err := os.WriteFile(conf, []byte("[containers]\ndefault_ulimits = []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := &containerRuntime{podmanPath: podman, env: append(os.Environ(), "CONTAINERS_CONF="+conf)}
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc"} {
		if _, err := os.Stat(p); err == nil {
			rt.global = []string{"--runtime", p}
			break
		}
	}
	return rt
}

func (rt *containerRuntime) command(args ...string) *exec.Cmd {
	cmd := exec.Command(rt.podmanPath, append(slices.Clone(rt.global), args...)...)
	cmd.Env = rt.env
	return cmd
}

// podmanErr runs podman and returns its standard output (with standard
// error on failure).
func (rt *containerRuntime) podmanErr(args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := rt.command(args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func (rt *containerRuntime) podman(t *testing.T, args ...string) string {
	t.Helper()
	out, err := rt.podmanErr(args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// checkImageConfig reads the built image's configuration.
func checkImageConfig(t *testing.T, rt *containerRuntime, tag string, stamp map[string]string) {
	var images []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			ExposedPorts map[string]struct{}
			Volumes      map[string]struct{}
			Env          []string
			Labels       map[string]string
		}
		Size int64
	}
	if err := json.Unmarshal([]byte(rt.podman(t, "image", "inspect", tag)), &images); err != nil || len(images) != 1 {
		t.Fatalf("podman image inspect: %v (%d images)", err, len(images))
	}
	c := images[0].Config
	t.Logf("image %s: %.1f MB", tag, float64(images[0].Size)/1e6)
	if c.User != imageUser {
		t.Errorf("user %q, want %q", c.User, imageUser)
	}
	if got := strings.Join(c.Entrypoint, " "); got != imageEntrypoint || len(c.Cmd) != 0 {
		t.Errorf("entrypoint %q cmd %q, want %q and no cmd", c.Entrypoint, c.Cmd, imageEntrypoint)
	}
	if _, ok := c.ExposedPorts[imagePort+"/tcp"]; !ok || len(c.ExposedPorts) != 1 {
		t.Errorf("exposed ports %v, want %s/tcp", c.ExposedPorts, imagePort)
	}
	if _, ok := c.Volumes["/data"]; !ok {
		t.Errorf("volumes %v, want /data", c.Volumes)
	}
	if !slices.Contains(c.Env, "BROKER_ADDR=:"+imagePort) || !slices.Contains(c.Env, "BROKER_STORE=bolt:/data/broker.db") {
		t.Errorf("env %v lacks BROKER_ADDR=:%s or BROKER_STORE=bolt:/data/broker.db", c.Env, imagePort)
	}
	if c.Labels["org.opencontainers.image.revision"] != stamp["COMMIT"] || c.Labels["org.opencontainers.image.version"] != stamp["VERSION"] {
		t.Errorf("labels %v do not carry the version and commit", c.Labels)
	}
}

// checkImageFiles exports the image's file system and checks it file by
// file: nothing but the broker, CA certificates, time zones, passwd/group,
// the provider catalogue and /data; no shell; a static broker.
func checkImageFiles(t *testing.T, rt *containerRuntime, tag string) {
	id := strings.TrimSpace(rt.podman(t, "create", tag))
	defer rt.podman(t, "rm", "--volumes", id)
	cmd := rt.command("export", id)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	files := map[string]*tar.Header{}
	var broker, caBundle []byte
	tr := tar.NewReader(stdout)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("podman export: %v", err)
		}
		name := strings.TrimSuffix(path.Clean("/"+h.Name), "/")
		files[name] = h
		switch name {
		case "/broker":
			broker, err = io.ReadAll(tr)
		case "/etc/ssl/certs/ca-certificates.crt":
			caBundle, err = io.ReadAll(tr)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("podman export: %v\n%s", err, stderr.String())
	}

	allowed := []string{"/broker", "/data", "/etc", "/etc/passwd", "/etc/group", "/etc/ssl", "/etc/ssl/certs",
		"/etc/ssl/certs/ca-certificates.crt", "/etc/credbroker", "/etc/credbroker/providers.yaml", "/usr", "/usr/share"}
	// Runtimes add mount points for what they inject at run time.
	injected := []string{"/dev", "/proc", "/sys", "/run", "/etc/hosts", "/etc/resolv.conf", "/etc/hostname", "/run/.containerenv"}
	zones := 0
	for name, h := range files {
		base := path.Base(name)
		if slices.Contains([]string{"sh", "bash", "dash", "ash", "busybox", "su", "sudo"}, base) {
			t.Errorf("the image contains %s", name)
		}
		switch {
		case strings.HasPrefix(name, "/usr/share/zoneinfo"):
			zones++
		case slices.Contains(allowed, name), slices.Contains(injected, name), strings.HasPrefix(name, "/dev/"), strings.HasPrefix(name, "/run/"):
		default:
			t.Errorf("unexpected file in the image: %s", name)
		}
		if h.Typeflag == tar.TypeReg && h.Mode&0o022 != 0 {
			t.Errorf("%s is writable by group or others (mode %o)", name, h.Mode)
		}
	}
	for _, want := range []string{"/broker", "/etc/ssl/certs/ca-certificates.crt", "/usr/share/zoneinfo/UTC", "/usr/share/zoneinfo/Europe/Berlin", "/etc/passwd", "/etc/credbroker/providers.yaml", "/data"} {
		if files[want] == nil {
			t.Errorf("the image lacks %s", want)
		}
	}
	t.Logf("image files: %d, of which %d time zone entries", len(files), zones)
	if h := files["/broker"]; h != nil && (h.Uid != 0 || h.Mode&0o111 == 0) {
		t.Errorf("/broker: uid %d mode %o; want owned by root and executable", h.Uid, h.Mode)
	}
	if h := files["/data"]; h != nil && (h.Typeflag != tar.TypeDir || h.Uid != imageUID || h.Gid != imageUID) {
		t.Errorf("/data: uid %d gid %d; want a directory owned by %d:%d so a fresh volume is writable", h.Uid, h.Gid, imageUID, imageUID)
	}
	checkCABundle(t, caBundle)
	ef, err := elf.NewFile(bytes.NewReader(broker))
	if err != nil {
		t.Fatalf("/broker is not an ELF executable: %v", err)
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/broker is dynamically linked (it has an ELF interpreter); the image has no libc: build with CGO_ENABLED=0")
		}
	}
}

// checkCABundle: the image trusts the distribution's CA set, not the CAs
// added locally on the machine that built it (a corporate or sandbox
// TLS-inspecting proxy's CA in /usr/local/share/ca-certificates).
func checkCABundle(t *testing.T, bundle []byte) {
	t.Helper()
	inImage := map[string]bool{}
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		inImage[string(b.Bytes)] = true
	}
	if len(inImage) < 100 {
		t.Errorf("the image's CA bundle holds %d certificates; want the distribution's full set", len(inImage))
	}
	local, _ := filepath.Glob("/usr/local/share/ca-certificates/*.crt")
	for _, f := range local {
		pemBytes, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for rest := pemBytes; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if inImage[string(b.Bytes)] {
				t.Errorf("the image trusts %s, a CA added locally on the build machine", f)
			}
		}
	}
	t.Logf("CA bundle: %d certificates; %d local CA file(s) on this machine, none in the image", len(inImage), len(local))
}

// runImage starts the image as a deployment would run it, against the
// development IdP served by this test on the host's loopback, and checks
// /readyz, /healthz, /mcp and a graceful stop.
func runImage(t *testing.T, rt *containerRuntime, tag string, stamp map[string]string) {
	const publicURL = "https://credbroker.test" // TLS ends at the ingress; the broker speaks HTTP
	clientSecret := randomHex(t, 16)
	idp := devidptest.Start(t, nil, []devidp.Client{{ID: "credbroker", Secret: clientSecret, RedirectURIs: []string{publicURL + "/auth/callback"}}})

	// Keys and the client secret as mounted files, readable only by the
	// image's user, as a Kubernetes Secret volume with fsGroup or a Compose
	// secret would give them.
	dir := t.TempDir()
	keysFile, secretFile := filepath.Join(dir, "keys"), filepath.Join(dir, "client-secret")
	writeSecret(t, keysFile, vault.GenerateKey()+"\n")
	writeSecret(t, secretFile, clientSecret+"\n")

	addr := freeLoopbackAddr(t)
	name := "credbroker-test-" + randomHex(t, 6)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := rt.command("run", "--rm", "--name", name,
		"--network", "host", "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"-v", keysFile+":/run/secrets/broker-keys:ro",
		"-v", secretFile+":/run/secrets/oidc-client-secret:ro",
		// The image's default catalogue takes its provider credentials from the environment.
		"-e", "GITHUB_CLIENT_ID=imagetest", "-e", "GITHUB_CLIENT_SECRET=imagetest-github",
		"-e", "GOOGLE_CLIENT_ID=imagetest", "-e", "GOOGLE_CLIENT_SECRET=imagetest-google",
		tag,
		"--addr", addr, "--public-url", publicURL, "--issuer", idp.Issuer(), "--client-id", "credbroker",
		"--client-secret-file", "/run/secrets/oidc-client-secret", "--keys-file", "/run/secrets/broker-keys",
		"--log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer rt.podmanErr("rm", "--force", "--volumes", name) // after a failure; a no-op after --rm

	// The broker logs "credbroker serving" once it listens; the log goes to
	// a channel so a failing test can show it.
	var logBuf strings.Builder
	serving := make(chan struct{})
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			logBuf.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), `"msg":"credbroker serving"`) {
				once = true
				close(serving)
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { <-logDone; exited <- cmd.Wait() }()
	select {
	case <-serving:
	case err := <-exited:
		t.Fatalf("the container exited before serving: %v\n%s%s", err, stdout.String(), logBuf.String())
	case <-ctx.Done():
		t.Fatalf("the container did not start serving in time")
	}

	base := "http://" + addr
	get := func(p string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+p, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	code, body := get("/readyz")
	var ready struct {
		Ready  bool
		Checks map[string]string
	}
	json.Unmarshal(body, &ready)
	if code != http.StatusOK || !ready.Ready || ready.Checks["store"] != "ok" || ready.Checks["idp"] != "ok" || ready.Checks["keys"] != "ok" {
		t.Errorf("/readyz: HTTP %d %s", code, body)
	}
	code, body = get("/healthz")
	var health map[string]any
	json.Unmarshal(body, &health)
	if code != http.StatusOK || health["version"] != stamp["VERSION"] || health["commit"] != stamp["COMMIT"] || health["date"] != stamp["BUILD_DATE"] {
		t.Errorf("/healthz: HTTP %d %s; want version, commit and date %v", code, body, stamp)
	}
	// An MCP call without a token is challenged with the public URL's
	// protected-resource metadata: the flags reached the broker.
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if wa := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(wa, publicURL+"/.well-known/oauth-protected-resource") {
		t.Errorf("POST /mcp without a token: HTTP %d, WWW-Authenticate %q", resp.StatusCode, wa)
	}

	// `podman stop` sends SIGTERM to the broker (PID 1): it must shut down
	// cleanly, well before podman's kill after 30 s (a kill exits 137,
	// which the exit status below catches too). podman's own stop takes
	// seconds on a busy machine, hence the room.
	stopStart := time.Now()
	if out, err := rt.podmanErr("stop", "--time", "30", name); err != nil {
		t.Errorf("podman stop: %v %s", err, out)
	}
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Errorf("the broker exited with status %d after SIGTERM:\n%s", ee.ExitCode(), logBuf.String())
		} else if err != nil {
			t.Error(err)
		}
	case <-ctx.Done():
		t.Fatal("the container did not exit after podman stop")
	}
	if d := time.Since(stopStart); d > 25*time.Second {
		t.Errorf("stopping took %s: SIGTERM did not reach the broker", d)
	}
	if !strings.Contains(logBuf.String(), "shutting down") {
		t.Errorf("no graceful shutdown in the log:\n%s", logBuf.String())
	}
	if t.Failed() {
		t.Logf("container log:\n%s", logBuf.String())
	}
}

// writeSecret writes a 0400 file owned by the image's user when this test
// runs as root (as rootful podman does); otherwise 0444.
func writeSecret(t *testing.T, name, content string) {
	t.Helper()
	mode := os.FileMode(0o444)
	if os.Geteuid() == 0 {
		mode = 0o400
	}
	if err := os.WriteFile(name, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(name, imageUID, imageUID); err != nil {
			t.Fatal(err)
		}
	}
}

func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	addr, err := loopback.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// A Dockerfile stage: its FROM arguments and instructions.
type dockerStage struct {
	from   string
	instrs []dockerInstr
}

type dockerInstr struct{ cmd, args string }

// parseDockerfile splits a Dockerfile into stages: comments and blank lines
// dropped, continuation lines joined. Enough for this repository's file.
func parseDockerfile(src string) []dockerStage {
	var stages []dockerStage
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	for _, l := range logical {
		cmd, args, _ := strings.Cut(l, " ")
		cmd = strings.ToUpper(cmd)
		args = strings.TrimSpace(args)
		if cmd == "FROM" {
			stages = append(stages, dockerStage{from: args})
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, dockerInstr{cmd, args})
		}
	}
	return stages
}
