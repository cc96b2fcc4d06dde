package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"credbroker/internal/browsertest"
	"credbroker/internal/testskip"
	"credbroker/sidecar/sidecartest"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// newBrowser starts headless Chromium (see internal/browsertest).
func newBrowser(t *testing.T) context.Context { return browsertest.Start(t) }

// personBrowser returns a fresh browser context (its own cookies, like a
// separate browser profile) in the running Chromium of bctx.
func personBrowser(t *testing.T, bctx context.Context) context.Context {
	return browsertest.NewPerson(t, bctx)
}

// waitForText polls the page until its text contains want, riding out
// navigations in progress.
func waitForText(ctx context.Context, want string) error {
	js := fmt.Sprintf("!!document.body && document.body.innerText.includes(%s)", strconv.Quote(want))
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](js))
		if err == nil && ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("page never showed %q: %w", want, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// completeInBrowser does what a person does with a connect link in
// development mode: sign in at the dev IdP, approve on the broker, pick the
// demo account and approve at the demo provider, and land on "Connected".
// It returns the text of the broker's consent page.
func completeInBrowser(t *testing.T, bctx context.Context, link, user, demoAccount string) string {
	t.Helper()
	consent, err := browseConsent(bctx, link, user, demoAccount)
	if err != nil {
		t.Fatal(err)
	}
	return consent
}

// press clicks the first element matching the CSS selector from inside
// the page (HTMLElement.click: the form submits with the button's
// name=value, as a person's click does). A mouse event at computed
// coordinates can miss a button while the page is still laying out on a
// loaded machine, leaving the test on the old page until its deadline.
func press(sel string) chromedp.Action[chromedp.Void] {
	click := chromedp.Evaluate[bool](fmt.Sprintf(
		`(() => { const b = document.querySelector(%s); if (!b) return false; b.click(); return true })()`, strconv.Quote(sel)))
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		ok, err := click(ctx, t)
		if err == nil && !ok {
			err = fmt.Errorf("no %s on the page", sel)
		}
		return chromedp.Void{}, err
	}
}

// pickAccountJS selects the option whose visible text is %s (a JS string).
const pickAccountJS = `(() => { const s = document.querySelector('select[name=account]');
	for (const o of s.options) { if (o.text.trim() === %s) { s.value = o.value; return true } }
	return false })()`

// browseConnect is completeInBrowser returning an error, for callers that
// run inside an MCP client's elicitation handler.
func browseConnect(bctx context.Context, link, user, demoAccount string) error {
	_, err := browseConsent(bctx, link, user, demoAccount)
	return err
}

// browseConsent is browseConnect that also returns the text of the
// broker's consent page.
func browseConsent(bctx context.Context, link, user, demoAccount string) (string, error) {
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	const approveSel = `button[name=decision][value=approve]`
	approve := chromedp.CSS(approveSel)
	var consent string
	err := chromedp.Do(ctx,
		chromedp.Navigate(link),
		chromedp.WaitVisible(chromedp.CSS(`input[name=username]`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=username]`), user),
		chromedp.SendKeys(chromedp.CSS(`input[name=password]`), user),
		press(`form [type=submit]`),
		chromedp.WaitVisible(approve),
	)
	if err == nil {
		consent, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	}
	if err == nil {
		err = chromedp.Do(ctx,
			press(approveSel),
			chromedp.WaitVisible(chromedp.CSS(`select[name=account]`)),
		)
	}
	if err == nil {
		// Pick the demo account by its visible login.
		var picked bool
		picked, err = chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(pickAccountJS, strconv.Quote(demoAccount))))
		if err == nil && !picked {
			err = fmt.Errorf("demo account %q is not offered", demoAccount)
		}
	}
	if err == nil {
		err = chromedp.Do(ctx, press(approveSel))
	}
	if err == nil {
		err = waitForText(ctx, "Connected")
	}
	if err != nil {
		page, _ := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`body`)))
		return "", fmt.Errorf("browser step: %v\npage now: %s", err, page)
	}
	return consent, nil
}

func mcpSession(t *testing.T, ctx context.Context, endpoint, token string, handler func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities:       &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}}},
		ElicitationHandler: handler,
	})
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:             endpoint,
		HTTPClient:           &http.Client{Transport: bearerTransport{token, http.DefaultTransport}},
		DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type bearerTransport struct {
	token string
	next  http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structuredContent %s: %v", b, err)
	}
	return m
}

// TestDevEndToEnd is issue 5's walkthrough: broker dev as a subprocess, the
// go-sdk client's MRTR loop with the browser part in headless Chromium,
// brokerctl --non-interactive, and a restart that keeps the connection.
func TestDevEndToEnd(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	addr, data := freeAddr(t), t.TempDir()
	d := startDev(t, addr, data)
	bctx := newBrowser(t)
	ctx := testContext(t, 3*time.Minute)

	t.Run("go-sdk client, alice", func(t *testing.T) {
		var links []string
		cs := mcpSession(t, ctx, d.BaseURL+"/mcp", d.Token("alice"), func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			if req.Params.Mode != "url" {
				return &mcp.ElicitResult{Action: "decline"}, nil
			}
			links = append(links, req.Params.URL)
			if len(links) == 1 {
				if err := browseConnect(bctx, req.Params.URL, "alice", "alice-demo"); err != nil {
					return nil, err
				}
			}
			return &mcp.ElicitResult{Action: "accept"}, nil
		})
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "connect_account", Arguments: map[string]any{"provider": "demo"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("tool error: %+v", res.Content)
		}
		if len(links) != 1 || !regexp.MustCompile(`^`+regexp.QuoteMeta(d.BaseURL)+`/connect/[A-Za-z0-9_-]{22}$`).MatchString(links[0]) {
			t.Fatalf("elicitation links %v: want one broker connect URL with only an opaque id", links)
		}
		if got := fmt.Sprint(structured(t, res)); !strings.Contains(got, "alice-demo") {
			t.Fatalf("result %s does not name alice-demo", got)
		}
	})

	t.Run("provider_request and brokerctl request, alice", func(t *testing.T) {
		cs := mcpSession(t, ctx, d.BaseURL+"/mcp", d.Token("alice"), nil)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "provider_request", Arguments: map[string]any{"provider": "demo", "method": "GET", "path": "/user"}})
		if err != nil || res.IsError {
			t.Fatalf("provider_request: %v %+v", err, res)
		}
		got := structured(t, res)
		if got["status"] != float64(200) || !strings.Contains(fmt.Sprint(got["body"]), `"login":"alice-demo"`) {
			t.Fatalf("provider_request answered %v", got)
		}
		_, ctl := binaries(t)
		cmd := exec.CommandContext(ctx, ctl, "--url", d.BaseURL+"/mcp", "request", "demo", "GET", "/user")
		cmd.Env = append(os.Environ(), "BROKER_TOKEN="+d.Token("alice"))
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "alice-demo") {
			t.Fatalf("brokerctl request: %v\n%s", err, out)
		}
	})

	t.Run("brokerctl non-interactive, bob", func(t *testing.T) {
		_, ctl := binaries(t)
		token := d.Token("bob")
		run := func() (string, int) {
			cmd := exec.CommandContext(ctx, ctl, "--url", d.BaseURL+"/mcp", "--non-interactive", "connect", "demo")
			cmd.Env = append(os.Environ(), "BROKER_TOKEN="+token)
			out, err := cmd.Output()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			return string(out), code
		}
		out, code := run()
		if code != 3 {
			t.Fatalf("first run: exit %d (want 3), output %q", code, out)
		}
		completeInBrowser(t, personBrowser(t, bctx), strings.TrimSpace(out), "bob", "bob-demo")
		out, code = run()
		if code != 0 || !strings.Contains(out, "bob-demo") {
			t.Fatalf("second run: exit %d, output %q", code, out)
		}
	})

	var d2 *devBroker
	top := t // the restarted broker outlives this subtest
	t.Run("restart keeps the connection", func(t *testing.T) {
		d.Stop()
		d2 = startDev(top, addr, data)
		cs := mcpSession(t, ctx, d2.BaseURL+"/mcp", d2.Token("alice"), nil)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "list_connections", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("list: %v %+v", err, res)
		}
		if got := fmt.Sprint(structured(t, res)); !strings.Contains(got, "alice-demo") || strings.Contains(got, "bob-demo") {
			t.Fatalf("after restart alice's connections are %s", got)
		}
	})

	t.Run("disconnect revokes at the provider", func(t *testing.T) {
		if d2 == nil {
			t.Fatal("the restart subtest failed, so there is no broker to disconnect on")
		}
		cs := mcpSession(t, ctx, d2.BaseURL+"/mcp", d2.Token("alice"), nil)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "disconnect_account", Arguments: map[string]any{"provider": "demo"}})
		if err != nil || res.IsError {
			t.Fatalf("disconnect: %v %+v", err, res)
		}
		if got := structured(t, res); got["revocation"] != "revoked" || got["deleted"] != true {
			t.Fatalf("disconnect answered %v, want revoked and deleted", got)
		}
		// Now alice is not connected: the call asks for the browser again.
		asked := 0
		cs = mcpSession(t, ctx, d2.BaseURL+"/mcp", d2.Token("alice"), func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			asked++
			return &mcp.ElicitResult{Action: "cancel"}, nil
		})
		res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "provider_request", Arguments: map[string]any{"provider": "demo", "method": "GET", "path": "/user"}})
		if err != nil || asked != 1 || strings.Contains(fmt.Sprint(res.StructuredContent), "alice-demo") {
			t.Fatalf("after disconnect: err %v, asked %d, result %+v", err, asked, res)
		}
	})
}

// TestReadmeWalkthrough runs the README's walkthrough blocks command by
// command against a dev broker, so the documentation cannot drift: every
// `$ ` line is executed by bash from the repository root with the
// broker's addresses substituted for 127.0.0.1:8080 (broker), :8081
// (sidecar API) and :8090 (examples/demorepos), and the data directory
// for data/; brokerctl's prompts are answered, and the browser step is
// done in headless Chromium. examples/demorepos keeps running in the
// background, as in its own terminal.
func TestReadmeWalkthrough(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("curl is needed by the README walkthrough (apt-get install -y curl): %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)<!-- walkthrough -->\\s*```sh\\n(.*?)```").FindAllSubmatch(readme, -1)
	if len(blocks) < 3 {
		t.Fatalf("README.md has %d <!-- walkthrough --> sh blocks, want the broker's, the sidecar's and the gateway's", len(blocks))
	}
	sideAddr, demoAddr := freeAddr(t), freeAddr(t)
	d := startDev(t, freeAddr(t), t.TempDir(), "--sidecar-addr", sideAddr)
	contract := sidecartest.NewContract(t)
	bctx := newBrowser(t)
	ctx := testContext(t, 4*time.Minute)
	_, ctl := binaries(t)
	env := os.Environ()
	ran, consents, gatewayConnected := 0, []string{}, false
	var lines []string
	for _, b := range blocks {
		lines = append(lines, strings.Split(string(b[1]), "\n")...)
	}
	for _, line := range lines {
		line = strings.TrimSpace(line)
		// The broker's and the sidecar's addresses and the data directory
		// are this test's; the banner must print the same commands.
		line = strings.NewReplacer("127.0.0.1:8080", d.Addr, "127.0.0.1:8081", sideAddr, " data/", " "+d.Data+"/").Replace(line)
		if strings.HasPrefix(line, "$ go run ./examples/demorepos ") && !strings.Contains(d.Stdout(), "\n  "+strings.TrimPrefix(line, "$ ")+"\n") {
			t.Errorf("banner and README disagree on the command that starts examples/demorepos (%s):\n%s", line, d.Stdout())
		}
		if strings.Contains(line, "call list_demo_repos") && !strings.Contains(d.Stdout(), "\n  "+strings.TrimPrefix(line, "$ ")+"\n") {
			t.Errorf("banner and README disagree on calling the example's tool (%s):\n%s", line, d.Stdout())
		}
		line = strings.ReplaceAll(line, "127.0.0.1:8090", demoAddr)
		switch {
		case line == "$ make run":
			continue // the broker is already running
		case strings.HasPrefix(line, "$ export "):
			// export NAME=$(command): evaluate and keep in the environment.
			kv := strings.TrimPrefix(line, "$ export ")
			name, expr, _ := strings.Cut(kv, "=")
			out, err := exec.CommandContext(ctx, "bash", "-c", "printf %s "+expr).Output()
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			env = append(env, name+"="+string(out))
		case strings.HasPrefix(line, "$ go run ./examples/demorepos "):
			// Its own terminal: it keeps running until the test ends. It
			// reaches the sidecar API through a proxy that checks every
			// exchange against docs/sidecar.openapi.yaml.
			cmdline := strings.Replace(strings.TrimPrefix(line, "$ "), "go run ./examples/demorepos", demoreposBinary(t), 1)
			cmdline = strings.Replace(cmdline, "http://"+sideAddr, contract.Proxy("http://"+sideAddr), 1)
			startServer(t, ctx, root, env, cmdline)
		case strings.HasPrefix(line, "$ "):
			cmdline := strings.Replace(strings.TrimPrefix(line, "$ "), "go run ./cmd/brokerctl", ctl, 1)
			cmd := exec.CommandContext(ctx, "bash", "-c", cmdline)
			cmd.Dir, cmd.Env = root, env
			// A person's browser, signed in to nothing yet, for each link.
			out, err := converse(cmd, func(link string) error {
				if strings.Contains(cmdline, "demo-keys") {
					// The API-key service: the key is read at the demo
					// provider's key page and entered on the broker's.
					_, err := (&keyBrowser{}).enterKey(personBrowser(t, bctx), link, "alice", "alice-demo", "", "Connected")
					return err
				}
				consent, err := browseConsent(personBrowser(t, bctx), link, "alice", "alice-demo")
				consents = append(consents, consent)
				gatewayConnected = gatewayConnected || strings.Contains(cmdline, "/mcp/u/")
				return err
			})
			if err != nil {
				t.Fatalf("%s: %v\n%s", cmdline, err, out)
			}
			var transcript strings.Builder
			transcript.WriteString(out)
			// What each command prints: the connection's account, except
			// the gateway's tool lists (the placeholder until alice is
			// connected, then the demo MCP server's own tools).
			want := "alice-demo"
			switch {
			case strings.HasSuffix(cmdline, " tools") && !gatewayConnected:
				want = "connect_account"
			case strings.HasSuffix(cmdline, " tools"):
				want = "list_notes"
			}
			if !strings.Contains(transcript.String(), want) {
				t.Fatalf("%s: output does not name %s:\n%s", cmdline, want, transcript.String())
			}
			ran++
		}
	}
	if ran < 8 {
		t.Fatalf("walkthrough ran %d brokerctl commands, want at least connect, list, the demo-keys connect and request, the example's tool, and the gateway's tools, call and tools", ran)
	}
	// The banner shows the same token command as the README.
	if !strings.Contains(d.Stdout(), "curl -s -H 'Accept: text/plain' -d user=alice "+d.BaseURL+"/dev/token") {
		t.Errorf("banner and README disagree on the token command:\n%s", d.Stdout())
	}
	// Two browser steps: brokerctl's own connect, then the example's,
	// which the consent page attributes to the configured server and,
	// apart and unverified, to the host.
	if len(consents) != 3 {
		t.Fatalf("%d browser steps, want 3", len(consents))
	}
	if !strings.Contains(consents[2], d.BaseURL+"/dev/mcp-upstream") {
		t.Errorf("the gateway's consent page does not name the relayed server:\n%s", consents[2])
	}
	if seen := contract.Checked(); seen["POST /v1/require 200"] < 2 || seen["GET /v1/proxy/{provider}/{path} 200"] < 1 {
		t.Errorf("the example's exchanges checked against the document: %v; want its connect, retry and list", seen)
	}
	for _, want := range []string{"Requested by dev-sidecar, a server your administrator configured.", "brokerctl (name as reported by the app; not verified)"} {
		if !strings.Contains(strings.Join(strings.Fields(consents[1]), " "), want) {
			t.Errorf("the example's consent page lacks %q:\n%s", want, consents[1])
		}
	}
}

// startServer starts cmdline (a server that runs until the test ends) and
// waits for it to say where it listens.
func startServer(t *testing.T, ctx context.Context, dir string, env []string, cmdline string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+cmdline)
	cmd.Dir, cmd.Env = dir, env
	out, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = cmd.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	listening := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		said := false
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if !said && strings.Contains(sc.Text(), "MCP endpoint on http://") {
				said = true
				listening <- true
			}
		}
		if !said {
			listening <- false
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	select {
	case ok := <-listening:
		if !ok {
			t.Fatalf("%s exited before listening", cmdline)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not say where it listens", cmdline)
	}
}

// converse runs cmd (brokerctl, interactive) to its end, answering as a
// person does: yes to a link, then the browser step (link), then Enter.
// It returns everything cmd printed.
func converse(cmd *exec.Cmd, link func(url string) error) (string, error) {
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return "", err
	}
	var transcript strings.Builder
	var failed error
	sc := bufio.NewScanner(stdout)
	sc.Split(scanPrompts)
	for sc.Scan() {
		chunk := sc.Text()
		transcript.WriteString(chunk)
		switch {
		case failed != nil:
		case strings.Contains(chunk, "? [y]es"):
			io.WriteString(stdin, "y\n")
		case strings.Contains(chunk, "Press Enter"):
			links := urlLineRE.FindAllStringSubmatch(transcript.String(), -1)
			if links == nil {
				failed = fmt.Errorf("no URL shown before the prompt")
			} else {
				failed = link(links[len(links)-1][1])
			}
			if failed != nil {
				io.WriteString(stdin, "c\n")
				continue
			}
			io.WriteString(stdin, "\n")
		}
	}
	err := cmd.Wait()
	if failed != nil {
		err = failed
	}
	return transcript.String(), err
}

// urlLineRE finds the link brokerctl shows ("URL:    …").
var urlLineRE = regexp.MustCompile(`URL:\s+(\S+)`)

// scanPrompts splits output at newlines and after prompts that end in ": "
// (which wait for input without a newline).
func scanPrompts(data []byte, atEOF bool) (int, []byte, error) {
	for i := 0; i < len(data); i++ {
		if data[i] == '\n' {
			return i + 1, data[:i+1], nil
		}
		if data[i] == ':' && i+1 < len(data) && data[i+1] == ' ' && i+2 == len(data) {
			return i + 2, data[:i+2], nil
		}
	}
	if atEOF && len(data) > 0 {
		return len(data), data, nil
	}
	return 0, nil, nil
}
