package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"credbroker/internal/testskip"
)

// demoMCPTools are the demo MCP server's own tools (internal/demomcp),
// which a connected person's host lists at /mcp/u/demo-mcp by the same
// names.
var demoMCPTools = []string{"add_note", "echo", "list_notes"}

// TestGatewayHosts: three real MCP hosts use the gateway endpoint of
// `broker dev`'s demo MCP server, /mcp/u/demo-mcp, in both protocol
// eras (alice speaks 2026-07-28, bob 2025-11-25), the connect step done in
// headless Chromium (the dev IdP's sign-in, the broker's consent, the demo
// authorization server's consent). In each era, for each host: before the
// person is connected it lists only the placeholder connect_account; a
// call asks for the connect link (a url elicitation, or -32042 in
// 2025-11-25); once the person connected in the browser, the retried call
// answers, the host lists the demo server's tools by their own names, and
// a call of echo reaches the server as the person's demo account.
//
//   - The MCP Inspector 2.12.0 (testdata/inspector). Its CLI
//     (mcp-inspector --cli) declares no elicitation capability at all (it
//     builds its client with elicit: false, whatever the configuration
//     says), so it cannot take a connect link: it lists the placeholder,
//     gets the broker's refusal naming elicitation.url for a call (the
//     -32021 error in 2026-07-28, a tool error pointing at the
//     connections page in 2025-11-25), and after the connect lists and
//     calls the server's tools. The connect link itself is taken by
//     mcpdo, the connection CLI of the same package, which declares url
//     elicitation (connect --elicit url), parks the call, and completes it
//     on `elicitation/respond --done`.
//   - brokerctl, with --protocol-version for the era: tools, then call
//     echo, whose link it shows and follows with the call again.
//   - The official TypeScript client 2.4.0 (testdata/mcpclient/host.mjs),
//     which first gets its own token from the broker's authorization
//     server (dynamic registration, resource = the endpoint), then lists,
//     calls connect_account through the link, lists and calls.
//
// Between hosts the person disconnects (brokerctl disconnect demo-mcp on
// /mcp), so each host starts unconnected.
func TestGatewayHosts(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	mcpClientDir(t) // skip early when a host is not installed
	insp := inspectorHost(t)
	d := startDev(t, freeAddr(t), t.TempDir())
	bctx := newBrowser(t)
	endpoint := d.BaseURL + "/mcp/u/demo-mcp"
	_, ctl := binaries(t)

	for _, era := range []struct {
		version, user string
	}{{"2026-07-28", "alice"}, {"2025-11-25", "bob"}} {
		t.Run(era.version, func(t *testing.T) {
			ctx := testContext(t, 4*time.Minute)
			user, account, legacy := era.user, era.user+"-demo", era.version == "2025-11-25"
			person := personBrowser(t, bctx)
			connect := func(link string) error {
				if !strings.HasPrefix(link, d.BaseURL+"/connect/") {
					return fmt.Errorf("the link %q is not a broker connect link", link)
				}
				return connectSignedIn(person, link, user, account)
			}
			token := d.TokenFor(user, endpoint)
			disconnect := func(t *testing.T) {
				t.Helper()
				cmd := exec.CommandContext(ctx, ctl, "--url", d.BaseURL+"/mcp", "disconnect", "demo-mcp")
				cmd.Env = append(os.Environ(), "BROKER_TOKEN="+d.Token(user))
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("brokerctl disconnect demo-mcp: %v\n%s", err, out)
				}
			}

			t.Run("MCP Inspector", func(t *testing.T) {
				cli := insp.cli(endpoint, token, era.version)
				if got := cli.tools(t, ctx); !slices.Equal(got, []string{placeholderName}) {
					t.Fatalf("before connecting the Inspector lists %v, want only %s", got, placeholderName)
				}
				// The CLI declares no elicitation: the broker says which
				// capability a connect link needs.
				out := cli.run(t, ctx, "--method", "tools/call", "--tool-name", placeholderName)
				want := `"Connecting Demo MCP server needs the client capability elicitation.url`
				if legacy {
					want = `this client cannot open connect links (it did not declare the elicitation.url capability)`
				}
				if !strings.Contains(out, want) {
					t.Fatalf("the Inspector CLI's call before connecting printed %s; want %s", out, want)
				}
				// mcpdo takes the link.
				do := insp.mcpdo(t, endpoint, token, era.version)
				link, id := do.pending(t, ctx, placeholderName)
				if err := connect(link); err != nil {
					t.Fatal(err)
				}
				if res := do.run(t, ctx, "elicitation/respond", id, "--done"); !strings.Contains(res, connectedText) {
					t.Fatalf("mcpdo's call after connecting answered %s", res)
				}
				do.stop(t)
				if got := cli.tools(t, ctx); !slices.Equal(got, demoMCPTools) {
					t.Fatalf("once connected the Inspector lists %v, want the demo server's %v", got, demoMCPTools)
				}
				echoed := cli.run(t, ctx, "--method", "tools/call", "--tool-name", "echo", "--tool-args-json", `{"text":"from the Inspector"}`)
				checkEcho(t, echoed, "from the Inspector", account)
			})
			if t.Failed() {
				return
			}
			disconnect(t)

			t.Run("brokerctl", func(t *testing.T) {
				run := func(args ...string) string {
					t.Helper()
					cmd := exec.CommandContext(ctx, ctl, append([]string{"--url", endpoint, "--protocol-version", era.version}, args...)...)
					cmd.Env = append(os.Environ(), "BROKER_TOKEN="+token)
					out, err := converse(cmd, connect)
					if err != nil {
						t.Fatalf("brokerctl %s: %v\n%s\nbroker log:\n%s", strings.Join(args, " "), err, out, d.Stderr())
					}
					return out
				}
				if out := run("tools"); toolNames(out) == nil || !slices.Equal(toolNames(out), []string{placeholderName}) {
					t.Fatalf("before connecting brokerctl tools printed:\n%s", out)
				}
				out := run("call", "echo", "--args", `{"text":"from brokerctl"}`)
				if !strings.Contains(out, "URL:    "+d.BaseURL+"/connect/") {
					t.Fatalf("brokerctl showed no connect link:\n%s", out)
				}
				checkEcho(t, out, "from brokerctl", account)
				if out := run("tools"); !slices.Equal(toolNames(out), demoMCPTools) {
					t.Fatalf("once connected brokerctl tools printed:\n%s", out)
				}
			})
			if t.Failed() {
				return
			}
			disconnect(t)

			t.Run("TypeScript client", func(t *testing.T) {
				h := startTSGatewayHost(t, ctx, endpoint, era.version)
				h.signIn(t, person, user, endpoint)
				if got := h.tools(t); !slices.Equal(got, []string{placeholderName}) {
					t.Fatalf("before connecting the TypeScript host lists %v", got)
				}
				h.send(t, map[string]any{"call": placeholderName})
				ev := h.next(t, "elicit")
				if ev.Legacy != legacy {
					t.Errorf("the link came as a -32042 error: %v; want %v", ev.Legacy, legacy)
				}
				if err := connect(ev.URL); err != nil {
					t.Fatal(err)
				}
				h.say(t, "continue")
				if res := h.next(t, "result"); !strings.Contains(string(res.Result), connectedText) {
					t.Fatalf("connect_account answered %s", res.Result)
				}
				if got := h.tools(t); !slices.Equal(got, demoMCPTools) {
					t.Fatalf("once connected the TypeScript host lists %v", got)
				}
				h.send(t, map[string]any{"call": "echo", "arguments": map[string]any{"text": "from TypeScript"}})
				checkEcho(t, string(h.next(t, "result").Result), "from TypeScript", account)
			})
		})
	}
}

const placeholderName = "connect_account"

// connectedText begins the placeholder's answer once the person is
// connected. The broker names the account itself: the demo server's
// authorization server issues no ID token, and the entry has no
// account.url.
const connectedText = "Connected to Demo MCP server as Demo MCP server account "

// checkEcho fails t unless out (a host's print of echo's answer) shows
// the text sent and the person's demo account.
func checkEcho(t *testing.T, out, text, account string) {
	t.Helper()
	for _, want := range []string{text, account} {
		if !strings.Contains(out, want) {
			t.Fatalf("echo answered %s; want %q in it", out, want)
		}
	}
	if strings.Contains(out, `"isError":true`) {
		t.Fatalf("echo answered a tool error: %s", out)
	}
}

// toolNames reads the tool names brokerctl tools printed (the first word
// of each line), sorted.
func toolNames(out string) []string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	slices.Sort(names)
	return names
}

// inspector is the installed MCP Inspector (make inspector-deps): its
// launcher (mcp-inspector) and mcpdo, run by the pinned Node 22.
type inspector struct {
	node, launcher, mcpdoBin string
}

func inspectorHost(t *testing.T) inspector {
	t.Helper()
	node, dir := gwPeer(t, "inspector", "@modelcontextprotocol/inspector")
	pkg := filepath.Join(dir, "node_modules", "@modelcontextprotocol", "inspector")
	return inspector{node: node, launcher: filepath.Join(pkg, "clients", "launcher", "build", "index.js"),
		mcpdoBin: filepath.Join(pkg, "clients", "mcpdo", "build", "mcp-bin.js")}
}

// inspectorEnv keeps the Inspector's files (catalog, stored secrets,
// mcpdo's daemon) in a directory of the test's own, its secrets in memory.
func inspectorEnv(t *testing.T) []string {
	home := t.TempDir()
	return append(os.Environ(), "HOME="+home, "MCP_INSPECTOR_SECRET_STORE=memory", "NO_COLOR=1")
}

// inspectorEra is the Inspector's name for a protocol version.
func inspectorEra(version string) string {
	if version == "2025-11-25" {
		return "legacy"
	}
	return "modern"
}

// inspectorCLI is mcp-inspector --cli at one endpoint, with one bearer,
// in one era: each call is one process.
type inspectorCLI struct {
	in   inspector
	args []string
	env  []string
}

func (in inspector) cli(endpoint, token, version string) inspectorCLI {
	return inspectorCLI{in: in, args: []string{in.launcher, "--cli", endpoint, "--transport", "http", "--header", "Authorization: Bearer " + token,
		"--protocol-era", inspectorEra(version), "--format", "json"}}
}

// run runs the CLI with args and returns its stdout (one JSON object:
// {"result":…} or {"error":…}).
func (c inspectorCLI) run(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	if c.env == nil {
		c.env = inspectorEnv(t)
	}
	cmd := exec.CommandContext(ctx, c.in.node, append(slices.Clone(c.args), args...)...)
	cmd.Env = c.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if _, exited := err.(*exec.ExitError); err != nil && !exited {
		t.Fatalf("mcp-inspector --cli %s: %v", strings.Join(args, " "), err)
	}
	if err != nil && !json.Valid(out) {
		// A failure's envelope is printed on stderr.
		out = []byte(strings.TrimSpace(stderr.String()))
	}
	if !json.Valid(out) {
		t.Fatalf("mcp-inspector --cli %s printed no JSON (%v):\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// tools lists the endpoint's tool names, sorted.
func (c inspectorCLI) tools(t *testing.T, ctx context.Context) []string {
	t.Helper()
	out := c.run(t, ctx, "--method", "tools/list")
	var res struct {
		Result struct{ Tools []struct{ Name string } }
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Result.Tools == nil {
		t.Fatalf("mcp-inspector --cli tools/list printed %s (%v)", out, err)
	}
	var names []string
	for _, tool := range res.Result.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	return names
}

// mcpdoConn is an mcpdo connection to one endpoint, held by a private
// daemon of the test's own (its directory, its token).
type mcpdoConn struct {
	in        inspector
	endpoint  string
	env       []string
	daemonDir string
}

func (in inspector) mcpdo(t *testing.T, endpoint, token, version string) *mcpdoConn {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcpdo-") // short: the daemon's socket lives here
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	secret := make([]byte, 24)
	rand.Read(secret)
	c := &mcpdoConn{in: in, endpoint: endpoint, daemonDir: dir,
		env: append(inspectorEnv(t), "MCP_INSPECTOR_DAEMON_DIR="+dir, "MCP_INSPECTOR_DAEMON_TOKEN="+hex.EncodeToString(secret))}
	t.Cleanup(func() { c.stop(t) })
	ctx := testContext(t, time.Minute)
	c.exec(t, ctx, "connect", endpoint, "--transport", "http", "--header", "Authorization: Bearer "+token,
		"--elicit", "url", "--era", inspectorEra(version))
	return c
}

// exec runs mcpdo with args (on the test's daemon) and returns its stdout.
func (c *mcpdoConn) exec(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, c.in.node, append([]string{c.in.mcpdoBin, "--format", "json"}, args...)...)
	cmd.Env = c.env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("mcpdo %s: %v\n%s\nstderr:\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// run runs an MCP command on the connection.
func (c *mcpdoConn) run(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	return c.exec(t, ctx, append([]string{"--connection", c.endpoint}, args...)...)
}

// pending calls tool, which must stop at a url elicitation: it returns
// the link and the elicitation's id (mcpdo's own) to answer it with.
func (c *mcpdoConn) pending(t *testing.T, ctx context.Context, tool string) (link, id string) {
	t.Helper()
	out := c.run(t, ctx, "tools/call", tool)
	var res struct {
		ElicitationPending struct {
			ElicitationID, Mode, URL string
		}
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.ElicitationPending.Mode != "url" || res.ElicitationPending.ElicitationID == "" {
		t.Fatalf("mcpdo tools/call %s printed %s; want a pending url elicitation", tool, out)
	}
	return res.ElicitationPending.URL, res.ElicitationPending.ElicitationID
}

// stop stops the test's daemon: mcpdo daemon stop, then (should it still
// run) SIGKILL to the pid in its lock file.
func (c *mcpdoConn) stop(t *testing.T) {
	lock := filepath.Join(c.daemonDir, "mcpdod.lock")
	b, err := os.ReadFile(lock)
	if err != nil {
		return // no daemon (stopped already, or never started)
	}
	cmd := exec.Command(c.in.node, c.in.mcpdoBin, "daemon", "stop")
	cmd.Env = c.env
	cmd.Run()
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Errorf("mcpdo's lock file holds %q, not a pid", b)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil; {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("mcpdo's daemon (pid %d) did not stop on `mcpdo daemon stop`", pid)
			return
		}
		time.Sleep(50 * time.Millisecond) // polling a process we cannot wait for
	}
	os.Remove(lock)
}

// tsGatewayHost is host.mjs (the TypeScript client) in command mode at a
// gateway endpoint.
type tsGatewayHost struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan hostEvent
	stderr *strings.Builder
}

func startTSGatewayHost(t *testing.T, ctx context.Context, endpoint, version string) *tsGatewayHost {
	t.Helper()
	node, script := mcpClientDir(t)
	h := &tsGatewayHost{events: make(chan hostEvent, 16), stderr: &strings.Builder{}}
	h.cmd = exec.CommandContext(ctx, node, script, endpoint, "dcr")
	h.cmd.Env = append(os.Environ(), "HOST_COMMANDS=1", "HOST_ERA="+version)
	h.stdin, _ = h.cmd.StdinPipe()
	stdout, _ := h.cmd.StdoutPipe()
	h.cmd.Stderr = h.stderr
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(h.events)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var ev hostEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil && ev.Event != "" {
				h.events <- ev
			}
		}
	}()
	t.Cleanup(func() {
		h.stdin.Close() // an empty line or the end of input ends command mode
		h.cmd.Wait()
	})
	return h
}

// next waits for the host's next event, which must be want.
func (h *tsGatewayHost) next(t *testing.T, want string) hostEvent {
	t.Helper()
	select {
	case ev, ok := <-h.events:
		if !ok {
			t.Fatalf("the TypeScript host ended before %s:\n%s", want, h.stderr.String())
		}
		if ev.Event != want {
			t.Fatalf("the TypeScript host said %s (%s %s); want %s\nstderr:\n%s", ev.Event, ev.Message, ev.Result, want, h.stderr.String())
		}
		return ev
	case <-time.After(2 * time.Minute):
		t.Fatalf("the TypeScript host did not say %s within 2 minutes:\n%s", want, h.stderr.String())
		return hostEvent{}
	}
}

func (h *tsGatewayHost) say(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(h.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (h *tsGatewayHost) send(t *testing.T, cmd map[string]any) {
	t.Helper()
	b, _ := json.Marshal(cmd)
	h.say(t, string(b))
}

// signIn is the host's own OAuth at the broker: the authorization request
// names the endpoint as the resource, and the person allows the app.
func (h *tsGatewayHost) signIn(t *testing.T, person context.Context, user, endpoint string) {
	t.Helper()
	ev := h.next(t, "authorize")
	if q := mustQuery(t, ev.URL); q.Get("resource") != endpoint || q.Get("code_challenge_method") != "S256" {
		t.Fatalf("the host's authorization request %s; want resource %s and S256", ev.URL, endpoint)
	}
	if err := signInAndAllow(person, ev.URL, user, "Signed in: return to the test host."); err != nil {
		t.Fatal(err)
	}
	if ev := h.next(t, "authorized"); !ev.Refresh {
		t.Fatalf("the host got no refresh token")
	}
	h.next(t, "ready")
}

// tools lists the endpoint's tool names, sorted.
func (h *tsGatewayHost) tools(t *testing.T) []string {
	t.Helper()
	h.send(t, map[string]any{"list": true})
	names := slices.Clone(h.next(t, "tools").Names)
	slices.Sort(names)
	return names
}
