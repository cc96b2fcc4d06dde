package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Exit statuses.
const (
	exitOK           = 0
	exitFailure      = 1
	exitUsage        = 2
	exitNeedsBrowser = 3
)

const usage = `usage: brokerctl [flags] <command> [args]

commands:
  connect PROVIDER [--scopes a,b]       connect an account (opens a browser step when needed)
  list                                  list your connections
  disconnect PROVIDER [--account LOGIN] revoke and delete a connection
  request PROVIDER METHOD PATH [--body JSON] [--query k=v ...]
                                        call the provider's API through the broker
  tools                                 list the tools of the MCP server at --url
  call TOOL [--args JSON]               call any tool of the MCP server at --url (a server
                                        on the broker's sidecar API, or a remote MCP server
                                        through the gateway, /mcp/u/PROVIDER), browser step included

flags:
`

// maxRounds bounds the retry loop, as the SDK's own MRTR loop does.
const maxRounds = 10

// protocolVersions are the MCP versions --protocol-version takes: the
// current one (requests carry their version; url elicitations come as
// input_required results) and the one before (a session opened with
// initialize; url elicitations come as -32042 errors).
var protocolVersions = []string{"2026-07-28", "2025-11-25"}

type cli struct {
	url            string
	token          string
	version        string // the protocol version asked for; "" the newest, falling back
	nonInteractive bool
	open           bool
	asJSON         bool

	in     *bufio.Reader
	out    io.Writer
	errOut io.Writer
	// openBrowser launches the system browser; replaced in tests.
	openBrowser func(string) error
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, getenv func(string) string) int {
	c := &cli{in: bufio.NewReader(stdin), out: stdout, errOut: stderr, openBrowser: func(u string) error { return systemOpenHook(u) }}
	fs := flag.NewFlagSet("brokerctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	defURL := getenv("BROKER_URL")
	if defURL == "" {
		defURL = "http://127.0.0.1:8080/mcp"
	}
	fs.StringVar(&c.url, "url", defURL, "the broker's MCP endpoint (env BROKER_URL)")
	fs.StringVar(&c.token, "token", "", "bearer token for the broker (prefer env BROKER_TOKEN: flags show in ps)")
	fs.BoolVar(&c.nonInteractive, "non-interactive", false, "never prompt: print the URL a person must open and exit with status 3")
	fs.BoolVar(&c.open, "open", false, "after you agree, open the URL in the system browser")
	fs.BoolVar(&c.asJSON, "json", false, "print structured results as JSON")
	fs.StringVar(&c.version, "protocol-version", "", "speak this MCP version: "+strings.Join(protocolVersions, " or ")+" (default: the newest the server speaks)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if c.version != "" && !slices.Contains(protocolVersions, c.version) {
		fmt.Fprintf(stderr, "brokerctl: --protocol-version %q: want %s\n", c.version, strings.Join(protocolVersions, " or "))
		return exitUsage
	}
	if c.token == "" {
		c.token = getenv("BROKER_TOKEN")
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitUsage
	}
	if c.token == "" {
		fmt.Fprintln(stderr, "brokerctl: no token: set BROKER_TOKEN or pass --token")
		return exitUsage
	}
	if _, err := url.ParseRequestURI(c.url); err != nil {
		fmt.Fprintf(stderr, "brokerctl: --url %q is not a URL\n", c.url)
		return exitUsage
	}
	tool, arguments, err := parseCommand(rest)
	if err != nil {
		fmt.Fprintln(stderr, "brokerctl:", err)
		return exitUsage
	}
	var code int
	if tool == listTools {
		code, err = c.tools(ctx)
	} else {
		code, err = c.call(ctx, tool, arguments)
	}
	if err != nil {
		fmt.Fprintln(stderr, "brokerctl:", err)
	}
	return code
}

// parseCommand maps a command line to a tool name and its arguments.
func parseCommand(args []string) (string, map[string]any, error) {
	cmd, args := args[0], args[1:]
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	scopes := fs.String("scopes", "", "comma-separated scopes")
	account := fs.String("account", "", "account login, when several are connected")
	body := fs.String("body", "", "request body")
	toolArgs := fs.String("args", "{}", "the tool's arguments, a JSON object")
	var query multiFlag
	fs.Var(&query, "query", "query parameter k=v (repeatable)")
	positional, err := parseInterleaved(fs, args)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %v", cmd, err)
	}
	need := func(n int, what string) error {
		if len(positional) != n {
			return fmt.Errorf("%s: want %s", cmd, what)
		}
		return nil
	}
	a := map[string]any{}
	switch cmd {
	case "connect":
		if err := need(1, "PROVIDER"); err != nil {
			return "", nil, err
		}
		a["provider"] = positional[0]
		if *scopes != "" {
			a["scopes"] = strings.Split(*scopes, ",")
		}
		return "connect_account", a, nil
	case "list":
		if err := need(0, "no arguments"); err != nil {
			return "", nil, err
		}
		return "list_connections", a, nil
	case "disconnect":
		if err := need(1, "PROVIDER"); err != nil {
			return "", nil, err
		}
		a["provider"] = positional[0]
		if *account != "" {
			a["account"] = *account
		}
		return "disconnect_account", a, nil
	case "request":
		if err := need(3, "PROVIDER METHOD PATH"); err != nil {
			return "", nil, err
		}
		a["provider"], a["method"], a["path"] = positional[0], strings.ToUpper(positional[1]), positional[2]
		if *account != "" {
			a["account"] = *account
		}
		if *body != "" {
			a["body"] = *body
		}
		if len(query) > 0 {
			q := map[string]string{}
			for _, kv := range query {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return "", nil, fmt.Errorf("request: --query %q: want k=v", kv)
				}
				q[k] = v
			}
			a["query"] = q
		}
		return "provider_request", a, nil
	case "tools":
		if err := need(0, "no arguments"); err != nil {
			return "", nil, err
		}
		return listTools, nil, nil
	case "call":
		if err := need(1, "TOOL"); err != nil {
			return "", nil, err
		}
		dec := json.NewDecoder(strings.NewReader(*toolArgs))
		dec.UseNumber()
		if err := dec.Decode(&a); err != nil || a == nil || dec.More() {
			return "", nil, fmt.Errorf("call: --args %q is not one JSON object", *toolArgs)
		}
		return positional[0], a, nil
	}
	return "", nil, fmt.Errorf("unknown command %q (want connect, list, disconnect, request, tools or call)", cmd)
}

// listTools is the command "tools" (tools/list, not a tool call).
const listTools = "\x00tools/list"

// parseInterleaved lets flags follow positional arguments.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// bearer adds the Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// session connects to the server at c.url.
func (c *cli) session(ctx context.Context) (*mcp.ClientSession, error) {
	client := mcp.NewClient(&mcp.Implementation{Name: "brokerctl", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{
			Elicitation: &mcp.ElicitationCapabilities{URL: &mcp.URLElicitationCapabilities{}},
		},
		// The retry loop is ours: the user decides when to retry.
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})
	transport := &mcp.StreamableClientTransport{
		Endpoint:             c.url,
		HTTPClient:           &http.Client{Transport: bearer{token: c.token, next: http.DefaultTransport}},
		DisableStandaloneSSE: true,
		MaxRetries:           -1,
	}
	var opts *mcp.ClientSessionOptions
	if c.version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: c.version}
	}
	session, err := client.Connect(ctx, transport, opts)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", c.url, err)
	}
	return session, nil
}

// tools prints the server's tools: name and the first line of the
// description (all of it with --json).
func (c *cli) tools(ctx context.Context) (int, error) {
	session, err := c.session(ctx)
	if err != nil {
		return exitFailure, err
	}
	defer session.Close()
	var all []*mcp.Tool
	for t, err := range session.Tools(ctx, nil) {
		if err != nil {
			return exitFailure, err
		}
		all = append(all, t)
	}
	if c.asJSON {
		return exitOK, json.NewEncoder(c.out).Encode(all)
	}
	for _, t := range all {
		desc, _, _ := strings.Cut(t.Description, "\n")
		fmt.Fprintf(c.out, "%-24s %s\n", sanitize(t.Name), sanitize(desc))
	}
	return exitOK, nil
}

func (c *cli) call(ctx context.Context, tool string, arguments map[string]any) (int, error) {
	session, err := c.session(ctx)
	if err != nil {
		return exitFailure, err
	}
	defer session.Close()

	params := &mcp.CallToolParams{Name: tool, Arguments: arguments}
	for round := 0; ; round++ {
		res, err := session.CallTool(ctx, params)
		links, isLinks := urlElicitations(err)
		if err != nil && !isLinks {
			return exitFailure, err
		}
		if err == nil && !res.NeedsInput() {
			return c.printResult(res)
		}
		if round >= maxRounds {
			return exitFailure, fmt.Errorf("gave up after %d rounds", maxRounds)
		}
		if isLinks {
			// 2025-11-25: the server refused the call until the user has
			// opened its links; the retry is the same call again.
			if code, err := c.openLinks(links); err != nil || code != exitOK {
				return code, err
			}
			params = &mcp.CallToolParams{Name: tool, Arguments: arguments}
			continue
		}
		responses, code, err := c.answer(ctx, res.InputRequests)
		if err != nil || code != exitOK {
			return code, err
		}
		// The retry: same tool and arguments, the requestState echoed byte
		// for byte; the SDK gives it a new JSON-RPC id.
		params = &mcp.CallToolParams{Name: tool, Arguments: arguments, InputResponses: responses, RequestState: res.RequestState}
	}
}

// urlElicitations returns the links of a 2025-11-25 URLElicitationRequired
// error (-32042), and whether err is one.
func urlElicitations(err error) ([]*mcp.ElicitParams, bool) {
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != mcp.CodeURLElicitationRequired {
		return nil, false
	}
	var data struct {
		Elicitations []*mcp.ElicitParams `json:"elicitations"`
	}
	if json.Unmarshal(we.Data, &data) != nil || len(data.Elicitations) == 0 {
		return nil, false
	}
	return data.Elicitations, true
}

// openLinks asks the user to open each link of a -32042 error; it answers
// exitOK only when they did all of them (the call is then retried).
func (c *cli) openLinks(links []*mcp.ElicitParams) (int, error) {
	for _, ep := range links {
		if ep == nil || ep.Mode != "url" {
			return exitFailure, errors.New("the server asked for input other than a link, which this client does not support")
		}
		action, err := c.askURL(ep)
		switch {
		case err != nil:
			return exitFailure, err
		case action == "":
			return exitNeedsBrowser, nil
		case action != "accept":
			return exitFailure, fmt.Errorf("not retried: you answered %s to the server's link", action)
		}
	}
	return exitOK, nil
}

// answer handles each input request: only url-mode elicitations are
// supported (this client declares nothing else).
func (c *cli) answer(ctx context.Context, reqs mcp.InputRequestMap) (mcp.InputResponseMap, int, error) {
	responses := mcp.InputResponseMap{}
	for key, r := range reqs {
		ep, ok := r.(*mcp.ElicitParams)
		if !ok || ep.Mode != "url" {
			responses[key] = &mcp.ElicitResult{Action: "decline"}
			continue
		}
		action, err := c.askURL(ep)
		if err != nil {
			return nil, exitFailure, err
		}
		if action == "" {
			return nil, exitNeedsBrowser, nil
		}
		responses[key] = &mcp.ElicitResult{Action: action}
	}
	return responses, exitOK, nil
}

// askURL shows an elicitation URL and returns the user's action: accept,
// decline or cancel; "" in non-interactive mode.
func (c *cli) askURL(ep *mcp.ElicitParams) (string, error) {
	u, err := url.Parse(ep.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		fmt.Fprintf(c.errOut, "The server sent an unusable link (%q); declining.\n", ep.URL)
		return "decline", nil
	}
	warnings := hostWarnings(u, c.url)
	if c.nonInteractive {
		fmt.Fprintln(c.errOut, sanitize(ep.Message))
		for _, w := range warnings {
			fmt.Fprintln(c.errOut, "WARNING:", w)
		}
		fmt.Fprintln(c.errOut, "Open this URL in a browser, finish there, then run the command again:")
		fmt.Fprintln(c.out, ep.URL)
		return "", nil
	}
	fmt.Fprintf(c.out, "\nThe broker asks you to continue in your browser:\n  %s\n\n", sanitize(ep.Message))
	fmt.Fprintf(c.out, "  URL:    %s\n  Domain: >>> %s <<<\n", ep.URL, u.Host)
	for _, w := range warnings {
		fmt.Fprintf(c.out, "  WARNING: %s\n", w)
	}
	verb := "Will you open this link yourself"
	if c.open {
		verb = "Open this link in your browser"
	}
	switch c.prompt(fmt.Sprintf("\n%s? [y]es / [n]o, decline / [c]ancel: ", verb)) {
	case "y", "yes":
	case "n", "no":
		return "decline", nil
	default:
		return "cancel", nil
	}
	if c.open {
		if err := c.openBrowser(ep.URL); err != nil {
			fmt.Fprintf(c.out, "Could not start a browser (%v); open the URL yourself.\n", err)
		}
	}
	if c.prompt("Press Enter when you are done in the browser (or c then Enter to cancel): ") == "c" {
		return "cancel", nil
	}
	return "accept", nil
}

func (c *cli) prompt(q string) string {
	fmt.Fprint(c.out, q)
	line, err := c.in.ReadString('\n')
	if err != nil && line == "" {
		return "c" // end of input: no decision
	}
	return strings.ToLower(strings.TrimSpace(line))
}

// hostWarnings flags links a careful person should look at twice.
func hostWarnings(u *url.URL, brokerURL string) []string {
	var w []string
	host := u.Hostname()
	for _, label := range strings.Split(host, ".") {
		if strings.HasPrefix(strings.ToLower(label), "xn--") {
			w = append(w, "the domain is punycode (internationalised): it may imitate another domain")
			break
		}
	}
	for _, r := range host {
		if r > unicode.MaxASCII {
			w = append(w, "the domain contains non-ASCII characters: it may imitate another domain")
			break
		}
	}
	if b, err := url.Parse(brokerURL); err == nil && !strings.EqualFold(b.Host, u.Host) {
		w = append(w, fmt.Sprintf("the link's host %q is not the host you called (%q); expected only when that server relays the broker's link", u.Host, b.Host))
	}
	if u.Scheme == "http" && !isLoopback(host) {
		w = append(w, "the link is not HTTPS")
	}
	return w
}

func isLoopback(h string) bool {
	return h == "localhost" || h == "::1" || strings.HasPrefix(h, "127.")
}

// sanitize drops control characters from server-supplied text before it
// reaches a terminal.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) && r != '\n' {
			return -1
		}
		return r
	}, s)
}

func (c *cli) printResult(res *mcp.CallToolResult) (int, error) {
	var text []string
	for _, ct := range res.Content {
		if tc, ok := ct.(*mcp.TextContent); ok {
			text = append(text, sanitize(tc.Text))
		}
	}
	if res.IsError {
		return exitFailure, errors.New(strings.Join(text, "\n"))
	}
	if c.asJSON && res.StructuredContent != nil {
		b, err := json.MarshalIndent(res.StructuredContent, "", "  ")
		if err != nil {
			return exitFailure, err
		}
		fmt.Fprintln(c.out, string(b))
		return exitOK, nil
	}
	fmt.Fprintln(c.out, strings.Join(text, "\n"))
	return exitOK, nil
}

// systemOpenHook starts the system browser; tests replace it.
var systemOpenHook = systemOpen

func systemOpen(u string) error {
	name := "xdg-open"
	if runtime.GOOS == "darwin" {
		name = "open"
	}
	return exec.Command(name, u).Start()
}
