package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"credbroker/internal/testskip"
	"credbroker/vault"
)

// tsExample is the TypeScript SDK's example server, relative to the
// installed packages.
const tsExample = "node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js"

const tsProvidersYAML = `providers:
  ts:
    display_name: TypeScript example
    type: mcp
    mcp:
      url: http://localhost:{{PORT}}/mcp
  ts-by-address:
    display_name: TypeScript example by address
    type: mcp
    mcp:
      url: http://127.0.0.1:{{PORT}}/mcp
`

var (
	tsSessionRE = regexp.MustCompile(`Session initialized with ID: (\S+)`)
	tsTokenRE   = regexp.MustCompile(`token: '([^']+)'`)
)

// TestGatewayTypeScriptUpstream runs the gateway against the TypeScript
// SDK's example server (pinned in testdata/tsupstream), started as
// `simpleStreamableHttp.js --oauth --oauth-strict` on loopback: a
// 2025-11-25 server with sessions whose demo authorization server
// registers clients dynamically, issues access tokens without refresh
// tokens and (strict) only for the server's own URL. Through `broker
// serve`: the broker registers itself and connects with resource set to
// the server's URL; an entry naming the server by another URL is refused
// at discovery; calls share one upstream session; after the server
// restarts, the session it forgot is opened again and the call goes
// through; the server's form elicitation pushed on the session gets an
// answer and the host a clean result; an access token past its expiry,
// with nothing to refresh it with, asks the person to connect again.
func TestGatewayTypeScriptUpstream(t *testing.T) {
	testskip.Short(t, "end-to-end test")
	t.Parallel()
	node, dir := gwPeer(t, "tsupstream", "@modelcontextprotocol/sdk", "loopback.mjs")
	ctx := testContext(t, 3*time.Minute)
	_, mcpPort, _ := net.SplitHostPort(freeAddr(t))
	_, authPort, _ := net.SplitHostPort(freeAddr(t))
	state := filepath.Join(t.TempDir(), "as-state.json")
	upstream := func() *nodeProc {
		p := startNode(t, node, dir, []string{"MCP_PORT=" + mcpPort, "MCP_AUTH_PORT=" + authPort, "TS_UPSTREAM_STATE=" + state},
			"--import", "./loopback.mjs", tsExample, "--oauth", "--oauth-strict")
		p.wait("OAuth Authorization Server listening")
		p.wait("MCP Streamable HTTP Server listening")
		return p
	}
	up := upstream()
	ups := []*nodeProc{up}
	mcpURL := "http://localhost:" + mcpPort + "/mcp"

	s := newGWStack(t)
	s.start(strings.ReplaceAll(tsProvidersYAML, "{{PORT}}", mcpPort))
	br := s.browser()
	connect := func(ctx context.Context, link string) error {
		_, err := br.connect(ctx, link, "alice")
		return err
	}
	h := s.host(t, ctx, "alice", "ts", connect)
	fail := func(t *testing.T, format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nupstream:\n%s\n%s\nbroker log:\n%s", append(args, up.stdout.String(), up.stderr.String(), s.proc.logs.String())...)
	}

	t.Run("dynamic registration; tokens for the server's URL", func(t *testing.T) {
		if got := h.tools(t, ctx); !slices.Equal(got, []string{"connect_account"}) {
			t.Fatalf("tools before connecting: %v", got)
		}
		if text := h.call(t, ctx, "greet", map[string]any{"name": "Alice"}); text != "Hello, Alice!" || h.asked() != 1 {
			fail(t, "greet answered %q after %d elicitations, want one", text, h.asked())
		}
		var auths []*url.URL
		for _, u := range br.visited("/authorize") {
			if u.Host == "localhost:"+authPort {
				auths = append(auths, u)
			}
		}
		if len(auths) != 1 {
			fail(t, "the browser went to the upstream's authorization endpoint %d times, want once", len(auths))
		}
		q := auths[0].Query()
		if q.Get("client_id") == "" || q.Get("resource") != mcpURL ||
			q.Get("code_challenge_method") != "S256" || q.Get("redirect_uri") != s.public()+"/oauth/ts/callback" {
			fail(t, "authorization request %s", auths[0])
		}
		// The example's authorization server knows no client but the
		// ones registered with it: the broker registered itself. Its code
		// exchange refuses any resource but the server's (--oauth-strict),
		// and its MCP server any token issued for another.
		tools := h.tools(t, ctx)
		for _, want := range []string{"greet", "multi-greet", "collect-user-info"} {
			if !slices.Contains(tools, want) {
				t.Errorf("tools once connected lack %s: %v", want, tools)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("an mcp.url other than the server's own is refused", func(t *testing.T) {
		other := s.host(t, ctx, "alice", "ts-by-address", connect)
		res, err := other.cs.CallTool(ctx, &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "Alice"}})
		if err != nil {
			t.Fatal(err)
		}
		text := resultText(res)
		if !res.IsError || !strings.Contains(text, `names the resource "`+mcpURL+`"`) || !strings.Contains(text, "set mcp.url to the server's canonical URL") {
			fail(t, "a call through ts-by-address answered %+v %q", res.IsError, text)
		}
	})

	t.Run("one upstream session for many calls", func(t *testing.T) {
		for i := range 4 {
			if text := h.call(t, ctx, "greet", map[string]any{"name": fmt.Sprint("call ", i)}); text != fmt.Sprintf("Hello, call %d!", i) {
				t.Fatalf("call %d answered %q", i, text)
			}
		}
		log := logsWhen(&up.stdout, up.exited, tsSessionRE.MatchString)
		if n := len(tsSessionRE.FindAllString(log, -1)); n != 1 {
			fail(t, "the upstream initialized %d sessions, want 1", n)
		}
	})

	t.Run("after the upstream restarts its session is opened again", func(t *testing.T) {
		up.stop(syscall.SIGINT) // and its output is all copied
		old := tsSessionRE.FindStringSubmatch(up.stdout.String())
		up = upstream()
		ups = append(ups, up)
		asked := h.asked()
		if text := h.call(t, ctx, "greet", map[string]any{"name": "again"}); text != "Hello, again!" || h.asked() != asked {
			fail(t, "after the restart greet answered %q with %d more elicitations", text, h.asked()-asked)
		}
		log := logsWhen(&up.stdout, up.exited, func(log string) bool {
			return old == nil || strings.Contains(log, "Received MCP request for session: "+old[1]) && tsSessionRE.MatchString(log)
		})
		if old == nil || !strings.Contains(log, "Received MCP request for session: "+old[1]) {
			fail(t, "the restarted upstream never saw the old session %v", old)
		}
		if n := len(tsSessionRE.FindAllString(log, -1)); n != 1 {
			fail(t, "the restarted upstream initialized %d sessions, want 1", n)
		}
	})

	t.Run("a form elicitation pushed on the session: a clean result", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		res, err := h.cs.CallTool(cctx, &mcp.CallToolParams{Name: "collect-user-info", Arguments: map[string]any{"infoType": "contact"}})
		if err != nil {
			fail(t, "collect-user-info: %v", err)
		}
		// The broker declared url elicitation only and relays no push: a
		// form elicitation is answered -32601, which the example's tool
		// reports in its result.
		if text := resultText(res); res.IsError || !strings.HasPrefix(text, "Error collecting contact information:") || !strings.Contains(text, "-32601") {
			fail(t, "collect-user-info answered isError=%v %q", res.IsError, text)
		}
	})

	// An expired access token without a refresh token: the person is asked
	// to connect again. The stored expiry is set in the past while the
	// broker is stopped (at the test's level: the restarted broker serves
	// to the end).
	s.restart(func() {
		st, err := openStore("bolt:"+s.storePath(), s.keys)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		list, err := st.ListConnections(ctx, vault.Principal{Issuer: s.idp.Issuer(), Subject: "alice"})
		if err != nil || len(list) != 1 {
			t.Fatalf("alice's connections: %v %v", list, err)
		}
		c, err := st.UpdateConnection(ctx, list[0].ID, func(c vault.Connection) (vault.Connection, error) {
			c.Token.Expiry = time.Now().Add(-time.Minute)
			return c, nil
		})
		if err != nil || c.Token.RefreshToken != "" {
			t.Fatalf("the connection: %v; refresh token present: %v", err, c.Token.RefreshToken != "")
		}
	})
	h2 := s.host(t, ctx, "alice", "ts", connect)
	if text := h2.call(t, ctx, "greet", map[string]any{"name": "Alice"}); text != "Hello, Alice!" || h2.asked() != 1 {
		fail(t, "after the expiry greet answered %q after %d elicitations, want one", text, h2.asked())
	}
	reconnects := func(logs string) bool { return len(auditLines(logs, "needs_reconnect")) >= 1 }
	lines := auditLines(logsWhen(s.proc.logs, s.proc.exited, reconnects), "needs_reconnect")
	if len(lines) != 1 || field(lines[0], "provider") != "ts" || !strings.Contains(field(lines[0], "outcome"), "no refresh token") {
		fail(t, "needs_reconnect audit events: %v", lines)
	}

	// The example logs each token it accepts.
	var tokens []string
	for _, p := range ups {
		for _, m := range tsTokenRE.FindAllStringSubmatch(p.stdout.String(), -1) {
			tokens = append(tokens, m[1])
		}
	}
	s.noLeak(t, tokens)
}
