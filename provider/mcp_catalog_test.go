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
