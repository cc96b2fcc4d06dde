package provider

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// goodMCP is a valid mcp entry with every key set.
const goodMCP = `providers:
  linear:
    type: mcp
    display_name: Linear
    mcp:
      url: https://mcp.linear.app/mcp
      auth: oauth
      registration: auto
      allowed_hosts: [linear.app]
      offline_access: auto
      resource_on_refresh: true
      call_timeout: 90s
      max_result_bytes: 2MiB
      tools: {allow: ["*"], deny: [delete_*]}
      input_requests: [elicitation, sampling, roots]
      instructions: drop
    client_id: ${LINEAR_ID}
    client_secret: ${LINEAR_SECRET}
    default_scopes: [read]
  local:
    type: mcp
    mcp: {url: "http://127.0.0.1:9/mcp", auth: none}
`

// TestMCPCatalog: a valid mcp entry reads as written, an open one as
// open, and the defaults are the documented ones.
func TestMCPCatalog(t *testing.T) {
	reg, err := ParseProviders("p.yaml", []byte(goodMCP+`  bare:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp"}
`), env(map[string]string{"LINEAR_ID": "lin-id", "LINEAR_SECRET": "lin-secret"}))
	if err != nil {
		t.Fatal(err)
	}
	lp, _ := reg.Lookup("linear")
	m, ok := lp.Kind.(*MCP)
	if !ok {
		t.Fatalf("linear is a %T", lp.Kind)
	}
	up := m.Upstream()
	if up.URL != "https://mcp.linear.app/mcp" || up.Open || up.CallTimeout != 90*time.Second || up.MaxResultBytes != 2<<20 ||
		up.RelayInstructions || strings.Join(up.InputRequests, ",") != "elicitation,sampling,roots" ||
		!up.Tools.Allowed("list_issues") || up.Tools.Allowed("delete_issue") {
		t.Errorf("linear upstream = %+v", up)
	}
	if m.Registration != "auto" || strings.Join(m.AllowedHosts, ",") != "linear.app" || m.OfflineAccess != "auto" || !m.ResourceOnRefresh ||
		m.ClientID != "lin-id" || m.ClientSecret.Reveal() != "lin-secret" || strings.Join(lp.DefaultScopes, ",") != "read" {
		t.Errorf("linear = %+v", m)
	}
	local, _ := reg.Lookup("local")
	if o, ok := local.Kind.(*OpenMCP); !ok || !o.Upstream().Open || o.Upstream().URL != "http://127.0.0.1:9/mcp" {
		t.Errorf("local = %T %+v", local.Kind, local.Kind)
	}
	bp, _ := reg.Lookup("bare")
	b := bp.Kind.(*MCP)
	bu := b.Upstream()
	if b.Registration != "auto" || b.OfflineAccess != "auto" || !b.ResourceOnRefresh || bu.CallTimeout != 120*time.Second ||
		bu.MaxResultBytes != 4<<20 || !bu.RelayInstructions || strings.Join(bu.InputRequests, ",") != "elicitation,sampling" ||
		!bu.Tools.Allowed("anything") || bp.DisplayName != "bare" {
		t.Errorf("bare = %+v %+v", b, bu)
	}
}

// TestMCPCatalogProblems: every problem of mcp entries is reported at
// once, each at the line it concerns.
func TestMCPCatalogProblems(t *testing.T) {
	doc := `providers:
  nourl:
    type: mcp
    mcp: {auth: oauth}
  plain:
    type: mcp
    mcp:
      url: http://mcp.example.com/mcp
      registration: static
  slash:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp/?x=1
      auth: basic
      registration: magic
      allowed_hosts: [Linear.App, "a/b"]
      offline_access: sometimes
      call_timeout: 11m
      max_result_bytes: 65MiB
      tools: {allow: ["[a-", ""], deny: [ok], except: [x]}
      input_requests: [elicitation, telepathy]
      instructions: shout
      urll: x
    mcpp: 1
  keys:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      call_timeout: soon
      max_result_bytes: lots
    api: {base_url: https://api.example.com}
    fields: [{name: k, label: K, secret: true}]
    inject: {header: "X-Key: {k}"}
    verify: {path: /me, account_id: /id}
    client_secret: ${S}
  open:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", auth: none, max_result_bytes: "0"}
    client_id: x
    default_scopes: [a]
  nosection:
    type: mcp
`
	_, err := ParseProviders("p.yaml", []byte(doc), env(map[string]string{"S": "s"}))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	want := []string{
		`p.yaml:4: nourl: mcp.url is required`,
		`p.yaml:8: plain: mcp.url: "http://mcp.example.com/mcp" must use https (http is allowed on loopback only)`,
		`p.yaml:9: plain: mcp.registration static needs client_id`,
		`p.yaml:13: slash: mcp.url "https://mcp.example.com/mcp/?x=1": the server's canonical URL has no query and no trailing slash`,
		`p.yaml:14: slash: mcp.auth "basic": want oauth, enterprise or none`,
		`p.yaml:15: slash: mcp.registration "magic": want auto, static, cimd or dcr`,
		`p.yaml:16: slash: mcp.allowed_hosts[0] "Linear.App": want a lowercase host name`,
		`p.yaml:16: slash: mcp.allowed_hosts[1] "a/b": want a lowercase host name`,
		`p.yaml:17: slash: mcp.offline_access "sometimes": want auto, always or never`,
		`p.yaml:18: slash: mcp.call_timeout 11m is over the maximum 10m0s`,
		`p.yaml:19: slash: mcp.max_result_bytes "65MiB": want a size such as 4MiB, at most 64MiB`,
		`p.yaml:20: unknown key "except"`,
		`p.yaml:20: slash: mcp.tools.allow[0] "[a-": not a name pattern`,
		`p.yaml:20: slash: mcp.tools.allow[1] "": not a name pattern`,
		`p.yaml:21: slash: mcp.input_requests[1] "telepathy": want elicitation, sampling or roots`,
		`p.yaml:22: slash: mcp.instructions "shout": want relay or drop`,
		`p.yaml:23: unknown key "urll"`,
		`p.yaml:24: unknown key "mcpp"`,
		`p.yaml:29: keys: mcp.call_timeout "soon": want a duration such as 120s`,
		`p.yaml:30: keys: mcp.max_result_bytes "lots": want a size such as 4MiB, at most 64MiB`,
		`p.yaml:31: keys: api is not used by type "mcp"`,
		`p.yaml:32: keys: fields is not used by type "mcp"`,
		`p.yaml:33: keys: inject is not used by type "mcp"`,
		`p.yaml:34: keys: verify is not used by type "mcp"`,
		`p.yaml:35: keys: a client secret needs client_id (a pre-registered client)`,
		`p.yaml:38: open: mcp.max_result_bytes "0": want a size such as 4MiB, at most 64MiB`,
		`p.yaml:39: open: client_id means nothing with mcp.auth: none`,
		`p.yaml:40: open: default_scopes means nothing with mcp.auth: none`,
		`p.yaml:41: nosection: mcp (url, auth, …) is required for type "mcp"`,
	}
	wantProblems(t, ce, want)
}

// parseProblems parses doc and returns its *ConfigError, failing the test
// when there is none.
func parseProblems(t *testing.T, doc string) *ConfigError {
	t.Helper()
	_, err := ParseProviders("p.yaml", []byte(doc), env(map[string]string{"S": "s", "ID": "i"}))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	return ce
}

// TestMCPCatalogOpenProblems: an entry with mcp.auth: none has its values
// checked as any other (a bad value is reported whatever auth says), and
// each key that concerns only a server's authorization (the broker's
// client, scopes, the account, keep-alive, the mcp keys of registration,
// offline access, refresh and the authorization server's hosts) is a
// problem at its line rather than silently ignored; the relay's keys are
// fine.
func TestMCPCatalogOpenProblems(t *testing.T) {
	doc := `providers:
  open:
    type: mcp
    display_name: Open
    mcp:
      url: https://mcp.example.com/mcp
      auth: none
      registration: bogus
      offline_access: sometimes
      allowed_hosts: ["BAD/HOST"]
      resource_on_refresh: false
      call_timeout: 30s
      max_result_bytes: 1MiB
      tools: {allow: ["*"], deny: [x]}
      input_requests: [elicitation]
      instructions: drop
    client_id: ${ID}
    client_secret_file: /nonexistent/secret
    default_scopes: ["bad scope"]
    allowed_scopes: [read]
    scope_descriptions: {read: Read}
    scope_aliases: {read: [r]}
    scope_implies: {read: [list]}
    account: {url: "http://example.com/me", id_field: id}
    keep_alive: 30d
    keep_alive_refresh: never
  plain:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", auth: none, tools: {allow: ["list_*"]}, input_requests: [], instructions: relay}
`
	wantProblems(t, parseProblems(t, doc), []string{
		`p.yaml:8: open: mcp.registration "bogus": want auto, static, cimd or dcr`,
		`p.yaml:8: open: mcp.registration means nothing with mcp.auth: none (the server takes no token)`,
		`p.yaml:9: open: mcp.offline_access "sometimes": want auto, always or never`,
		`p.yaml:9: open: mcp.offline_access means nothing with mcp.auth: none (the server takes no token)`,
		`p.yaml:10: open: mcp.allowed_hosts[0] "BAD/HOST": want a lowercase host name, without a path: write "bad"`,
		`p.yaml:10: open: mcp.allowed_hosts means nothing with mcp.auth: none (the server takes no token, so the broker asks no authorization server; calls go to mcp.url's host only)`,
		`p.yaml:11: open: mcp.resource_on_refresh means nothing with mcp.auth: none (the server takes no token)`,
		`p.yaml:17: open: client_id means nothing with mcp.auth: none (the server takes no token)`,
		`p.yaml:18: open: client_secret_file: cannot read /nonexistent/secret`,
		`p.yaml:18: open: client_secret_file means nothing with mcp.auth: none`,
		`p.yaml:19: open: default scope "bad scope" is not a valid scope token`,
		`p.yaml:19: open: default_scopes means nothing with mcp.auth: none`,
		`p.yaml:20: open: allowed_scopes means nothing with mcp.auth: none`,
		`p.yaml:21: open: scope_descriptions means nothing with mcp.auth: none`,
		`p.yaml:22: open: scope_aliases means nothing with mcp.auth: none`,
		`p.yaml:23: open: scope_implies means nothing with mcp.auth: none`,
		`p.yaml:24: open: account: "http://example.com/me" must use https`,
		`p.yaml:24: open: account means nothing with mcp.auth: none`,
		`p.yaml:25: open: keep_alive means nothing with mcp.auth: none`,
		`p.yaml:26: open: keep_alive_refresh "never": want a positive duration such as 1d or 6h`,
		`p.yaml:26: open: keep_alive_refresh means nothing with mcp.auth: none`,
	})
}

// TestMCPCatalogClientNeedsStatic: client_id, client_secret and
// client_secret_file name a pre-registered client, which registration
// dcr and cimd never use: each is a problem at its line with either, not
// silently ignored; with auto or static they are that client.
func TestMCPCatalogClientNeedsStatic(t *testing.T) {
	doc := `providers:
  dcr:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", registration: dcr}
    client_id: ${ID}
    client_secret: ${S}
  cimd:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", registration: cimd}
    client_secret_file: /nonexistent/secret
  fine:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp", registration: static}
    client_id: ${ID}
    client_secret: ${S}
  auto:
    type: mcp
    mcp: {url: "https://mcp.example.com/mcp"}
    client_id: ${ID}
`
	wantProblems(t, parseProblems(t, doc), []string{
		`p.yaml:5: dcr: client_id is only for a pre-registered client (mcp.registration static, or auto): with mcp.registration dcr the broker registers itself dynamically and never uses it; remove client_id or set mcp.registration static`,
		`p.yaml:6: dcr: client_secret is only for a pre-registered client (mcp.registration static, or auto): with mcp.registration dcr the broker registers itself dynamically and never uses it; remove client_secret or set mcp.registration static`,
		`p.yaml:10: cimd: client_secret_file: cannot read /nonexistent/secret`,
		`p.yaml:10: cimd: client_secret_file is only for a pre-registered client (mcp.registration static, or auto): with mcp.registration cimd the broker is known by its metadata document's URL (--client-metadata-url) and never uses it; remove client_secret_file or set mcp.registration static`,
	})
}

// TestMCPCatalogToolPatterns: mcp.tools patterns are what the problem
// says they are: tool names' characters (letters, digits, _ . -) and
// globs (* ? [...]); anything else could never match a tool's name and is
// a problem at its line.
func TestMCPCatalogToolPatterns(t *testing.T) {
	good := []string{"*", "list_*", "get-issue.v2", "a?c", "[a-z]*", "[^x]_*", "[_.]x"}
	reg, err := ParseProviders("p.yaml", []byte(`providers:
  ok:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      tools: {allow: ["`+strings.Join(good, `", "`)+`"]}
`), nil)
	if err != nil {
		t.Errorf("good patterns refused: %v", err)
	} else if p, _ := reg.Lookup("ok"); !p.Kind.(*MCP).Upstream().Tools.Allowed("list_issues") || !p.Kind.(*MCP).Upstream().Tools.Allowed("get-issue.v2") {
		t.Errorf("filter = %+v", p.Kind.(*MCP).Upstream().Tools)
	}
	bad := `providers:
  bad:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      tools:
        allow: ["a b", "/x", "list/*", "a\\*", "x^y", "é"]
        deny:
          - "tool!"
`
	wantProblems(t, parseProblems(t, bad), []string{
		`p.yaml:7: bad: mcp.tools.allow[0] "a b": not a name pattern (letters, digits, _ . - and * ? [...] globs)`,
		`p.yaml:7: bad: mcp.tools.allow[1] "/x": not a name pattern`,
		`p.yaml:7: bad: mcp.tools.allow[2] "list/*": not a name pattern`,
		`p.yaml:7: bad: mcp.tools.allow[3] "a\\*": not a name pattern`,
		`p.yaml:7: bad: mcp.tools.allow[4] "x^y": not a name pattern`,
		`p.yaml:7: bad: mcp.tools.allow[5] "é": not a name pattern`,
		`p.yaml:9: bad: mcp.tools.deny[0] "tool!": not a name pattern`,
	})
}

// TestMCPCatalogAllowedHosts: mcp.allowed_hosts are plain lower-case
// host names (or IP addresses), compared exactly with the host of each
// URL the authorization server's metadata names: a URL, userinfo, a path,
// a port or a wildcard could never match and is a problem at its line,
// saying what to write instead where that can be told.
func TestMCPCatalogAllowedHosts(t *testing.T) {
	reg, err := ParseProviders("p.yaml", []byte(`providers:
  ok:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      allowed_hosts: [linear.app, auth-1.linear.app, 127.0.0.1, "::1", localhost]
`), nil)
	if err != nil {
		t.Errorf("good hosts refused: %v", err)
	} else if p, _ := reg.Lookup("ok"); !p.Kind.(*MCP).hostAllowed("https://auth-1.linear.app:8443/token") || !p.Kind.(*MCP).hostAllowed("http://[::1]:9/x") {
		t.Errorf("hosts %v do not allow their own URLs", p.Kind.(*MCP).AllowedHosts)
	}
	doc := `providers:
  bad:
    type: mcp
    mcp:
      url: https://mcp.example.com/mcp
      allowed_hosts:
        - "*.linear.app"
        - https://linear.app
        - user@linear.app
        - linear.app/oauth
        - linear.app:443
        - Linear.App
        - linear_app
        - linear.app.
        - ""
        - "[::1]"
        - "-linear.app"
`
	wantProblems(t, parseProblems(t, doc), []string{
		`p.yaml:7: bad: mcp.allowed_hosts[0] "*.linear.app": want a lowercase host name: a wildcard never matches (hosts are compared exactly); list each host the authorization server uses`,
		`p.yaml:8: bad: mcp.allowed_hosts[1] "https://linear.app": want a lowercase host name, not a URL: write "linear.app"`,
		`p.yaml:9: bad: mcp.allowed_hosts[2] "user@linear.app": want a lowercase host name, without userinfo: write "linear.app"`,
		`p.yaml:10: bad: mcp.allowed_hosts[3] "linear.app/oauth": want a lowercase host name, without a path: write "linear.app"`,
		`p.yaml:11: bad: mcp.allowed_hosts[4] "linear.app:443": want a lowercase host name, without a port (any port of the host is allowed): write "linear.app"`,
		`p.yaml:12: bad: mcp.allowed_hosts[5] "Linear.App": want a lowercase host name: write "linear.app"`,
		`p.yaml:13: bad: mcp.allowed_hosts[6] "linear_app": want a lowercase host name (letters, digits, '-' and '.', or an IP address)`,
		`p.yaml:14: bad: mcp.allowed_hosts[7] "linear.app.": want a lowercase host name (letters, digits, '-' and '.', or an IP address)`,
		`p.yaml:15: bad: mcp.allowed_hosts[8] "": want a lowercase host name`,
		`p.yaml:16: bad: mcp.allowed_hosts[9] "[::1]": want a lowercase host name (letters`,
		`p.yaml:17: bad: mcp.allowed_hosts[10] "-linear.app": want a lowercase host name (letters`,
	})
}

// TestLimitCallTimeouts: an operator's maximum lowers the call timeout of
// the mcp entries that set none (the default, 120 s), whatever their
// auth, and leaves an entry's own timeout as it is (the broker refuses
// one over the maximum at start-up) and other kinds alone.
func TestLimitCallTimeouts(t *testing.T) {
	reg, err := ParseProviders("providers.yaml", []byte(`providers:
  open:
    type: mcp
    mcp: {url: https://open.example.com/mcp, auth: none}
  oauth:
    type: mcp
    mcp: {url: https://oauth.example.com/mcp}
  own:
    type: mcp
    mcp: {url: https://own.example.com/mcp, call_timeout: 5m}
  short:
    type: mcp
    mcp: {url: https://short.example.com/mcp, call_timeout: 10s}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	timeout := func(name string) (time.Duration, bool) {
		p, _ := reg.Lookup(name)
		up := p.Kind.(Gateway).Upstream()
		return up.CallTimeout, up.CallTimeoutSet
	}
	if d, set := timeout("open"); d != 120*time.Second || set {
		t.Fatalf("an entry with no call_timeout: %v (set %v), want the default 2m0s, not set", d, set)
	}
	reg.LimitCallTimeouts(time.Minute)
	for name, want := range map[string]time.Duration{"open": time.Minute, "oauth": time.Minute, "own": 5 * time.Minute, "short": 10 * time.Second} {
		if d, _ := timeout(name); d != want {
			t.Errorf("%s: call timeout %v under a maximum of 1m0s, want %v", name, d, want)
		}
	}
}
