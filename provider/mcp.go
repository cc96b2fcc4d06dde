package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"go.yaml.in/yaml/v3"
	"golang.org/x/oauth2"

	"credbroker/internal/egress"
	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

// The mcp kind: a remote MCP server the broker relays to (the gateway at
// /mcp/u/{provider}), as the OAuth client of its authorization server.
// The broker discovers the server's protected-resource metadata (RFC 9728)
// and its authorization server's metadata (RFC 8414, the issuer compared
// exactly), refuses an authorization server without PKCE S256, registers
// itself in the specification's order (a pre-registered client, a Client
// ID Metadata Document, dynamic registration), and sends the server's
// canonical URL as `resource` (RFC 8707) on the authorization request, the
// code exchange and every refresh: mcp.url, or the server's origin when the
// server's metadata is at the root well-known URI and names its origin
// (RFC 9728 §3.3: the identifier the well-known URI was built from). With
// auth: none the server needs no connection at all. With auth: enterprise
// the broker first asks the organisation's IdP for an ID-JAG for the
// server and redeems it there (idjag.go), with no browser step; the code
// flow stays the fallback.

// TypeMCP is the mcp kind's type.
const TypeMCP = "mcp"

// Limits of an mcp entry.
const (
	// MaxCallTimeout is the longest call_timeout an entry may set (the
	// broker's --upstream-max-call-timeout may lower it).
	MaxCallTimeout        = 10 * time.Minute
	defaultCallTimeout    = 120 * time.Second
	defaultMaxResultBytes = 4 << 20
	maxResultBytesCap     = 64 << 20
	// upstreamMetadataTTL is how long discovered metadata is reused.
	upstreamMetadataTTL = time.Hour
	// registrationBackoff spaces registration attempts at one issuer.
	registrationBackoff = time.Minute
)

// Upstream describes an mcp entry's server and the relay's limits: what
// the gateway needs, whatever the entry's authorization.
type Upstream struct {
	// URL is the server's MCP endpoint, its canonical resource URI.
	URL string
	// Open: auth none; calls carry no token and need no connection.
	Open bool
	// CallTimeout bounds one relayed call; MaxResultBytes its answer.
	// CallTimeoutSet: the entry sets call_timeout (else CallTimeout is
	// the default, which Registry.LimitCallTimeouts may lower).
	CallTimeout    time.Duration
	CallTimeoutSet bool
	MaxResultBytes int64
	// Tools filters the server's tools by name.
	Tools ToolFilter
	// InputRequests are the kinds of input the server may ask the host
	// for through the broker: "elicitation", "sampling", "roots".
	InputRequests []string
	// RelayInstructions: the server's instructions reach the host
	// (sanitised and capped); else they are dropped.
	RelayInstructions bool
}

// LimitCallTimeouts lowers to max the call timeout of every mcp entry that
// sets none (the default, 120 s, may be over an operator's maximum, which
// such an entry does not ask to exceed). An entry that sets one over max
// is the caller's to refuse. It is called once, before r is shared.
func (r *Registry) LimitCallTimeouts(max time.Duration) {
	for _, p := range r.byName {
		var up *Upstream
		switch k := p.Kind.(type) {
		case *MCP:
			up = &k.up
		case *OpenMCP:
			up = &k.up
		}
		if up != nil && !up.CallTimeoutSet && up.CallTimeout > max {
			up.CallTimeout = max
		}
	}
}

// Gateway is a kind whose provider is an MCP server the broker relays to
// rather than an HTTP API the broker calls.
type Gateway interface {
	Kind
	Upstream() Upstream
}

// ToolFilter allows tool names matching Allow ("*" globs, path.Match
// syntax; empty: all) and not matching Deny.
type ToolFilter struct {
	Allow, Deny []string
}

// Allowed reports whether the filter passes tool name.
func (f ToolFilter) Allowed(name string) bool {
	match := func(pats []string) bool {
		return slices.ContainsFunc(pats, func(p string) bool { ok, _ := path.Match(p, name); return ok })
	}
	return (len(f.Allow) == 0 || match(f.Allow)) && !match(f.Deny)
}

// mcpUpstream is what both mcp kinds hold.
type mcpUpstream struct{ up Upstream }

func (m *mcpUpstream) Type() string       { return TypeMCP }
func (m *mcpUpstream) Upstream() Upstream { return m.up }

// OpenMCP is an mcp entry with auth: none: a server that takes no token.
type OpenMCP struct{ mcpUpstream }

var _ Gateway = (*OpenMCP)(nil)

// MCP is an mcp entry with auth: oauth or enterprise.
type MCP struct {
	mcpUpstream
	// Enterprise: auth: enterprise (enterprise-managed authorization):
	// connect with an ID-JAG from the organisation's IdP when the
	// server's authorization server takes the JWT bearer grant, the code
	// flow otherwise (AssertionStep).
	Enterprise bool
	// Registration is auto, static, cimd or dcr.
	Registration string
	// AllowedHosts are hosts the authorization server may be on besides
	// the server's own.
	AllowedHosts []string
	// OfflineAccess is auto (asked for when the server offers it), always
	// or never.
	OfflineAccess string
	// ResourceOnRefresh sends resource on refresh requests too (false for
	// authorization servers that refuse it).
	ResourceOnRefresh bool
	// ClientID and ClientSecret are a pre-registered client (static).
	ClientID     string
	ClientSecret vault.Secret
	// AccountURL etc. name the account when the server's token answer has
	// no ID token (as an oauth2 entry's account).
	AccountURL, AccountIDField, AccountLoginField string
}

var (
	_ RedirectStep  = (*MCP)(nil)
	_ AccountLookup = (*MCP)(nil)
	_ Refresher     = (*MCP)(nil)
	_ Revoker       = (*MCP)(nil)
	_ Gateway       = (*MCP)(nil)
	_ AssertionStep = (*MCP)(nil)
)

// ConsentPage is the consent page of an upstream MCP server.
func (m *MCP) ConsentPage() string { return "consent" }

// mcpSpec is an mcp entry as written in providers.yaml.
type mcpSpec struct {
	entrySpec        `yaml:",inline"`
	scopeSpec        `yaml:",inline"`
	MCP              *mcpSection  `yaml:"mcp"`
	ClientID         string       `yaml:"client_id"`
	ClientSecret     string       `yaml:"client_secret"`
	ClientSecretFile string       `yaml:"client_secret_file"`
	Account          *accountSpec `yaml:"account"`
	KeepAlive        string       `yaml:"keep_alive"`
	KeepAliveRefresh string       `yaml:"keep_alive_refresh"`
}

type mcpSection struct {
	URL               string   `yaml:"url"`
	Auth              string   `yaml:"auth"`
	Registration      string   `yaml:"registration"`
	AllowedHosts      []string `yaml:"allowed_hosts"`
	OfflineAccess     string   `yaml:"offline_access"`
	ResourceOnRefresh *bool    `yaml:"resource_on_refresh"`
	CallTimeout       string   `yaml:"call_timeout"`
	MaxResultBytes    string   `yaml:"max_result_bytes"`
	Tools             *struct {
		Allow []string `yaml:"allow"`
		Deny  []string `yaml:"deny"`
	} `yaml:"tools"`
	InputRequests []string `yaml:"input_requests"`
	Instructions  string   `yaml:"instructions"`
}

var mcpKind = defineKind(TypeMCP, func(key, _ string) string {
	return fmt.Sprintf("%s is not used by type %q (the broker relays MCP requests to mcp.url)", key, TypeMCP)
}, buildMCP)

// buildMCP validates an mcp entry. Every value is checked whatever
// mcp.auth says (so that changing auth never reveals a problem that was
// there all along); with auth: none, each key that only concerns the
// server's authorization is a problem of its own (openMCPProblems).
func buildMCP(c *entryCheck, s *mcpSpec) *Provider {
	if s.MCP == nil {
		c.failAt(nil, "mcp (url, auth, …) is required for type %q", TypeMCP)
		return c.newProvider(s.entrySpec, &OpenMCP{})
	}
	up := c.upstream(s.MCP)
	m := &MCP{mcpUpstream: mcpUpstream{up}, Registration: s.MCP.Registration, AllowedHosts: s.MCP.AllowedHosts,
		OfflineAccess: s.MCP.OfflineAccess, ResourceOnRefresh: true, Enterprise: s.MCP.Auth == "enterprise"}
	if s.MCP.ResourceOnRefresh != nil {
		m.ResourceOnRefresh = *s.MCP.ResourceOnRefresh
	}
	switch m.Registration {
	case "":
		m.Registration = "auto"
	case "auto", "static", "cimd", "dcr":
	default:
		c.failAt(at("mcp", "registration"), "mcp.registration %q: want auto, static, cimd or dcr", m.Registration)
	}
	switch m.OfflineAccess {
	case "":
		m.OfflineAccess = "auto"
	case "auto", "always", "never":
	default:
		c.failAt(at("mcp", "offline_access"), "mcp.offline_access %q: want auto, always or never", m.OfflineAccess)
	}
	for i, h := range m.AllowedHosts {
		if why, bad := allowedHostProblem(h); bad {
			c.failAt(at("mcp", "allowed_hosts", i), "mcp.allowed_hosts[%d] %q: want a lowercase host name%s", i, h, why)
		}
	}
	if s.ClientID != "" {
		m.ClientID, _ = c.secretRef("client_id", s.ClientID, true)
	}
	secret, secretGiven := c.clientSecret(s.ClientSecret, s.ClientSecretFile)
	m.ClientSecret = secret
	if a := s.Account; a != nil {
		m.AccountURL = c.url("account", a.URL, true)
		m.AccountIDField, m.AccountLoginField = a.IDField, a.LoginField
		if a.IDField == "" {
			c.fail("account", "account.id_field is required")
		}
		if a.LoginField == "" {
			m.AccountLoginField = a.IDField
		}
	}
	if s.MCP.Auth == "none" {
		// The scopes and keep-alive are checked on a provider of no use.
		c.scopes(&Provider{}, s.scopeSpec)
		c.keepAlive(&Provider{}, s.KeepAlive, s.KeepAliveRefresh)
		c.openMCPProblems()
		up.Open = true
		return c.newProvider(s.entrySpec, &OpenMCP{mcpUpstream{up}})
	}
	p := c.newProvider(s.entrySpec, m)
	switch m.Registration {
	case "dcr", "cimd":
		if m.Registration == "dcr" && m.Enterprise {
			// The IdP names the broker's client at the server in the
			// ID-JAG (client_id): it can know a pre-registered id or a
			// metadata document URL, never one registered on the fly.
			c.failAt(at("mcp", "registration"), "mcp.registration dcr cannot be used with mcp.auth enterprise: the IdP must name the broker's client id at the server in each ID-JAG, and a dynamically registered id is known to the broker only; use static (client_id) or cimd")
		}
		// The broker's client there is the one it registers, or its
		// metadata document: a configured client would be ignored.
		how := "the broker registers itself dynamically"
		if m.Registration == "cimd" {
			how = "the broker is known by its metadata document's URL (--client-metadata-url)"
		}
		for _, k := range []string{"client_id", "client_secret", "client_secret_file"} {
			if keyLine(c.node, k) > 0 {
				c.fail(k, "%s is only for a pre-registered client (mcp.registration static, or auto): with mcp.registration %s %s and never uses it; remove %s or set mcp.registration static",
					k, m.Registration, how, k)
			}
		}
	default:
		if secretGiven && s.ClientID == "" {
			c.fail("client_secret", "a client secret needs client_id (a pre-registered client)")
		}
		if m.Registration == "static" && s.ClientID == "" {
			c.failAt(at("mcp", "registration"), "mcp.registration static needs client_id (the client registered at the server's authorization server)")
		}
	}
	c.scopes(p, s.scopeSpec)
	c.keepAlive(p, s.KeepAlive, s.KeepAliveRefresh)
	return p
}

// Keys an entry with mcp.auth: none may set: those of the relay. Every
// other key of an mcp entry concerns the server's authorization (the
// broker's client, scopes, the account, tokens), which such a server does
// not have.
var (
	openEntryKeys = []string{"type", "display_name", "mcp"}
	openMCPKeys   = []string{"url", "auth", "call_timeout", "max_result_bytes", "tools", "input_requests", "instructions"}
)

// openMCPProblems reports each key of an mcp.auth: none entry that only an
// authorized server's entry uses, at its line: set, it would be silently
// ignored. Keys of another kind and unknown keys were reported already.
func (c *entryCheck) openMCPProblems() {
	own := yamlKeys(reflect.TypeFor[mcpSpec]())
	for _, key := range entryKeys(c.node) {
		if !slices.Contains(openEntryKeys, key.Value) && slices.Contains(own, key.Value) {
			c.bad = true
			c.addf(key.Line, "%s: %s means nothing with mcp.auth: none (the server takes no token)", c.name, key.Value)
		}
	}
	sec := mapValue(c.node, "mcp")
	if sec != nil && sec.Kind == yaml.AliasNode {
		sec = sec.Alias
	}
	if sec == nil || sec.Kind != yaml.MappingNode {
		return
	}
	for _, key := range entryKeys(sec) {
		if _, known := fieldOf(reflect.TypeFor[mcpSection](), key.Value); !known || slices.Contains(openMCPKeys, key.Value) {
			continue
		}
		why := "the server takes no token"
		if key.Value == "allowed_hosts" {
			why = "the server takes no token, so the broker asks no authorization server; calls go to mcp.url's host only"
		}
		c.bad = true
		c.addf(key.Line, "%s: mcp.%s means nothing with mcp.auth: none (%s)", c.name, key.Value, why)
	}
}

// allowedHostProblem says why h is not a plain lower-case host name, as
// mcp.allowed_hosts wants (compared exactly with the host of each URL the
// authorization server's metadata names, whatever its port): bad, and the
// rest of the problem (with the name to write, when there is one).
func allowedHostProblem(h string) (why string, bad bool) {
	if plainHost(h) {
		return "", false
	}
	write := ""
	if s := hostOf(h); s != h && plainHost(s) {
		write = ": write " + strconv.Quote(s)
	}
	_, port, portErr := net.SplitHostPort(h)
	switch {
	case h == "":
		return "", true
	case strings.Contains(h, "*"):
		return ": a wildcard never matches (hosts are compared exactly); list each host the authorization server uses", true
	case strings.Contains(h, "://"):
		return ", not a URL" + write, true
	case strings.Contains(h, "@"):
		return ", without userinfo" + write, true
	case strings.ContainsAny(h, "/?#"):
		return ", without a path" + write, true
	case portErr == nil || port != "":
		return ", without a port (any port of the host is allowed)" + write, true
	case write != "":
		return write, true
	}
	return " (letters, digits, '-' and '.', or an IP address)", true
}

// hostOf is the host name h names, as best it can be told: without a
// scheme, userinfo, path or port, in lower case.
func hostOf(h string) string {
	if _, rest, ok := strings.Cut(h, "://"); ok {
		h = rest
	}
	if i := strings.IndexAny(h, "/?#"); i >= 0 {
		h = h[:i]
	}
	if i := strings.LastIndex(h, "@"); i >= 0 {
		h = h[i+1:]
	}
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	return strings.ToLower(h)
}

// plainHost reports whether h is a lower-case DNS name (labels of a-z,
// 0-9 and '-', not at either end) or an IP address as Go writes it: what
// url.URL.Hostname of an https URL can be equal to.
func plainHost(h string) bool {
	if a, err := netip.ParseAddr(h); err == nil {
		return a.Zone() == "" && a.String() == h
	}
	if h == "" || len(h) > 253 {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// upstream checks the mcp section's relay settings.
func (c *entryCheck) upstream(s *mcpSection) Upstream {
	up := Upstream{CallTimeout: defaultCallTimeout, MaxResultBytes: defaultMaxResultBytes,
		InputRequests: []string{"elicitation", "sampling"}, RelayInstructions: true}
	switch err := checkEndpoint(s.URL); {
	case s.URL == "":
		c.failAt(at("mcp", "url"), "mcp.url is required")
	case err != nil:
		c.failAt(at("mcp", "url"), "mcp.url: %v", err)
	default:
		if u, _ := url.Parse(s.URL); u.RawQuery != "" || strings.HasSuffix(u.Path, "/") && u.Path != "/" {
			c.failAt(at("mcp", "url"), "mcp.url %q: the server's canonical URL has no query and no trailing slash", s.URL)
		} else {
			up.URL = s.URL
		}
	}
	switch s.Auth {
	case "", "oauth", "enterprise", "none":
	default:
		c.failAt(at("mcp", "auth"), "mcp.auth %q: want oauth, enterprise or none", s.Auth)
	}
	if s.CallTimeout != "" {
		d, err := ParseDuration(s.CallTimeout)
		switch {
		case err != nil || d <= 0:
			c.failAt(at("mcp", "call_timeout"), "mcp.call_timeout %q: want a duration such as 120s", s.CallTimeout)
		case d > MaxCallTimeout:
			c.failAt(at("mcp", "call_timeout"), "mcp.call_timeout %s is over the maximum %s", s.CallTimeout, MaxCallTimeout)
		default:
			up.CallTimeout, up.CallTimeoutSet = d, true
		}
	}
	if s.MaxResultBytes != "" {
		n, err := ParseSize(s.MaxResultBytes)
		if err != nil || n <= 0 || n > maxResultBytesCap {
			c.failAt(at("mcp", "max_result_bytes"), "mcp.max_result_bytes %q: want a size such as 4MiB, at most 64MiB", s.MaxResultBytes)
		} else {
			up.MaxResultBytes = n
		}
	}
	if t := s.Tools; t != nil {
		for key, pats := range map[string][]string{"allow": t.Allow, "deny": t.Deny} {
			for i, p := range pats {
				if !toolPattern(p) {
					c.failAt(at("mcp", "tools", key, i), "mcp.tools.%s[%d] %q: not a name pattern (letters, digits, _ . - and * ? [...] globs)", key, i, p)
				}
			}
		}
		up.Tools = ToolFilter{Allow: slices.Clone(t.Allow), Deny: slices.Clone(t.Deny)}
	}
	if s.InputRequests != nil {
		up.InputRequests = nil
		for i, k := range s.InputRequests {
			switch k {
			case "elicitation", "sampling", "roots":
				up.InputRequests = append(up.InputRequests, k)
			default:
				c.failAt(at("mcp", "input_requests", i), "mcp.input_requests[%d] %q: want elicitation, sampling or roots", i, k)
			}
		}
	}
	switch s.Instructions {
	case "", "relay":
	case "drop":
		up.RelayInstructions = false
	default:
		c.failAt(at("mcp", "instructions"), "mcp.instructions %q: want relay or drop", s.Instructions)
	}
	return up
}

// toolPattern reports whether p is a pattern of tool names (path.Match
// syntax): tool names' characters (letters, digits, _ . -), * and ?, and
// [...] classes of those characters, ranges and a leading ^. Anything else
// (a space, a slash, an escape) could never match a tool the gateway
// lists, whose names are [A-Za-z0-9_.-]{1,128}.
func toolPattern(p string) bool {
	if _, err := path.Match(p, ""); err != nil || p == "" {
		return false
	}
	class := false // within [...]
	for i := 0; i < len(p); i++ {
		switch b := p[i]; {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '_', b == '.', b == '-':
		case !class && (b == '*' || b == '?'):
		case !class && b == '[':
			class = true
		case class && b == '^' && p[i-1] == '[':
		case class && b == ']':
			class = false
		default:
			return false
		}
	}
	return !class
}

// ParseSize reads a byte size: a number with an optional unit (B, KiB,
// MiB, GiB; KB, MB, GB as powers of 10).
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}}
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range units {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(n), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return n * mult, nil
}

// UpstreamError says why the broker cannot use an upstream MCP server's
// authorization: discovery or registration failed. Its message names the
// server and the fix (for the operator and the person); nothing secret.
type UpstreamError struct {
	Provider string
	// Kind is what went wrong, one of the Upstream* kinds (an audit
	// event's outcome); Reason says it in words, with the fix.
	Kind   string
	Reason string
	Err    error
}

// Kinds of UpstreamError.
const (
	UpstreamNoMetadata          = "no_metadata"          // no protected-resource or authorization-server metadata, or unreadable
	UpstreamResourceMismatch    = "resource_mismatch"    // the protected-resource metadata names another resource than mcp.url
	UpstreamHostNotAllowed      = "host_not_allowed"     // the authorization server or an endpoint is on a host not allowed, or not https
	UpstreamIssuerMismatch      = "issuer_mismatch"      // the authorization server's metadata names another issuer
	UpstreamMetadataRefused     = "metadata_refused"     // the go-sdk refused the authorization server's metadata (another issuer, no PKCE, a bad URL)
	UpstreamNoS256              = "no_s256"              // no PKCE with S256
	UpstreamPrivateAddress      = "private_address"      // a special-use address, without --upstream-allow-private
	UpstreamRedirect            = "redirect"             // a metadata request answered with a redirect
	UpstreamRefused             = "refused"              // the egress policy refused a request otherwise
	UpstreamNoRegistration      = "no_registration"      // no registration method fits the entry and the authorization server
	UpstreamRegistrationFailed  = "registration_failed"  // dynamic registration failed
	UpstreamRegistrationBackoff = "registration_backoff" // dynamic registration failed less than a minute ago; not tried
	UpstreamBadEndpoint         = "bad_endpoint"         // the authorization endpoint is not a URL
	UpstreamClientRefused       = "client_refused"       // the token endpoint answered invalid_client for a pre-registered client or the metadata document: an operator's to fix
)

func (e *UpstreamError) Error() string { return e.Provider + ": " + e.Reason }
func (e *UpstreamError) Unwrap() error { return ErrProviderUnavailable }

// upstreamAuth is what discovery found about an upstream server's
// authorization.
type upstreamAuth struct {
	issuer string
	meta   *oauthex.AuthServerMeta
	// resource is what the broker sends as resource: the server's
	// identifier as its metadata names it.
	resource string
	// challenged are the scopes the server's 401 challenge names; scopes
	// its scopes_supported (PRM). A connect request that names none asks
	// for the challenged ones, else those.
	challenged, scopes []string
	at                 time.Time
}

// defaultScopes are the scopes a connect request that names none asks
// for: the 401 challenge's, else the metadata's scopes_supported (else
// none: the scope parameter is left out).
func (ua *upstreamAuth) defaultScopes() []string {
	if len(ua.challenged) > 0 {
		return ua.challenged
	}
	return ua.scopes
}

// upstreamState is a Client's memory of one mcp entry.
type upstreamState struct {
	mu   sync.Mutex // guards the fields below
	auth *upstreamAuth
}

// registrationState is a Client's memory of its dynamic registrations at
// one authorization server (issuer), whichever entries use it: one at a
// time, and none within registrationBackoff of one that failed.
type registrationState struct {
	mu     sync.Mutex // held while registering; guards failed
	failed time.Time
	users  int // callers holding the state; guarded by Client.mu
}

// registration returns issuer's state, held by the caller until done.
// Only issuers in use or within registrationBackoff of a failure are
// kept: the others are forgotten whenever a new issuer is added, so the
// map does not grow with every issuer servers have named.
func (k *Client) registration(issuer string) (st *registrationState, done func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	st = k.registrations[issuer]
	if st == nil {
		now := k.opts.Now()
		for other, o := range k.registrations {
			// users 0: nobody holds o.mu, and the last holder's
			// write of failed happened before its done (k.mu).
			if o.users == 0 && now.Sub(o.failed) >= registrationBackoff {
				delete(k.registrations, other)
			}
		}
		st = &registrationState{}
		k.registrations[issuer] = st
	}
	st.users++
	return st, func() {
		k.mu.Lock()
		st.users--
		k.mu.Unlock()
	}
}

func (k *Client) upstream(name string) *upstreamState {
	k.mu.Lock()
	defer k.mu.Unlock()
	st := k.upstreams[name]
	if st == nil {
		st = &upstreamState{}
		k.upstreams[name] = st
	}
	return st
}

// hostAllowed reports whether URL raw is on the server's host or one of
// the allowed hosts.
func (m *MCP) hostAllowed(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && m.hostAllowedName(u.Hostname())
}

func (m *MCP) hostAllowedName(host string) bool {
	own, _ := url.Parse(m.up.URL)
	h := strings.ToLower(host)
	return h == strings.ToLower(own.Hostname()) || slices.Contains(m.AllowedHosts, h)
}

// HostNotAllowedError: a request for an mcp entry to a host the entry
// does not allow, refused before it was sent.
type HostNotAllowedError struct{ Host string }

func (e *HostNotAllowedError) Error() string {
	return "provider: " + e.Host + " is neither mcp.url's host nor in mcp.allowed_hosts"
}

// hostGate sends an mcp entry's requests only to the hosts it allows:
// mcp.url's, mcp.allowed_hosts and its account.url's (the operator's
// own). Every request made for the entry's authorization (metadata,
// keys, registration, tokens, revocation, each redirect followed) goes
// through it, whatever URLs a server's metadata or challenge names.
type hostGate struct {
	m       *MCP
	account string // account.url's host, "" when none
	next    http.RoundTripper
}

func (g hostGate) RoundTrip(r *http.Request) (*http.Response, error) {
	if h := r.URL.Hostname(); !g.m.hostAllowedName(h) && (g.account == "" || !strings.EqualFold(h, g.account)) {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, &HostNotAllowedError{Host: h}
	}
	return g.next.RoundTrip(r)
}

// gated is a copy of c whose requests pass m's hostGate.
func (m *MCP) gated(c *http.Client) *http.Client {
	g := hostGate{m: m, next: c.Transport}
	if g.next == nil {
		g.next = http.DefaultTransport
	}
	if u, err := url.Parse(m.AccountURL); err == nil && m.AccountURL != "" {
		g.account = u.Hostname()
	}
	cc := *c
	cc.Transport = g
	return &cc
}

// discover finds the server's authorization server, cached for an hour.
func (m *MCP) discover(ctx context.Context, k *Client, p *Provider) (*upstreamAuth, error) {
	st := k.upstream(p.Name)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.auth != nil && k.opts.Now().Sub(st.auth.at) < upstreamMetadataTTL {
		return st.auth, nil
	}
	// Recorded as one upstream request (method "discovery"), timed from
	// the first request to the verdict.
	start := time.Now()
	fail := func(kind, reason string, err error) (*upstreamAuth, error) {
		k.opts.Telemetry.Upstream(p.Name, "discovery", "", telemetry.UpstreamFailed, time.Since(start))
		return nil, &UpstreamError{Provider: p.DisplayName, Kind: kind, Reason: reason, Err: err}
	}
	client := NoRedirectClient(k.httpFor(p))
	var prm *oauthex.ProtectedResourceMetadata
	var other, refused, refusedKind string
	places, challenged := prmURLs(ctx, client, m.up.URL)
	// The documents are read here rather than by the go-sdk's
	// oauthex.GetProtectedResourceMetadata, which refuses in text only:
	// the operator's answer names the resource a document gave and the
	// host that redirected, and a document at the root may name mcp.url
	// as well as the origin (where the go-sdk takes the origin only). Its
	// other checks hold here too: the document's URL is https (loopback
	// http when allowed), and the authorization server must be on an
	// allowed host and serve RFC 8414 metadata over https.
	for _, u := range places {
		got, err := fetchJSON[oauthex.ProtectedResourceMetadata](ctx, client, u.url)
		switch {
		case err != nil:
			if refused == "" {
				refusedKind, refused = refusalReason(err)
			}
			continue
		case !slices.Contains(u.resources, got.Resource):
			// RFC 9728 §3.3: the document is for another resource.
			other = got.Resource
			continue
		}
		prm = got
		break
	}
	switch {
	case prm == nil && other != "":
		return fail(UpstreamResourceMismatch, "its protected-resource metadata names the resource "+untrusted.Quote(other)+", not mcp.url "+untrusted.Quote(m.up.URL)+"; set mcp.url to the server's canonical URL", nil)
	case prm == nil && refused != "":
		return fail(refusedKind, "its protected-resource metadata "+refused, nil)
	case prm == nil:
		return fail(UpstreamNoMetadata, "no protected-resource metadata (RFC 9728) was found for "+m.up.URL, nil)
	case len(prm.AuthorizationServers) == 0:
		return fail(UpstreamNoMetadata, "its protected-resource metadata names no authorization server", nil)
	}
	issuer := prm.AuthorizationServers[0]
	if !m.hostAllowed(issuer) {
		return fail(UpstreamHostNotAllowed, "its authorization server "+untrusted.Quote(issuer)+" is on another host; list that host in mcp.allowed_hosts to trust it", nil)
	}
	asm, err := auth.GetAuthServerMetadata(ctx, issuer, client)
	switch {
	case err != nil:
		kind, refused := refusalReason(err)
		if refused == "" {
			kind, refused = UpstreamMetadataRefused, "could not be read ("+untrusted.Clip(err.Error(), 200)+")"
		}
		return fail(kind, "its authorization server's metadata "+refused, err)
	case asm == nil:
		return fail(UpstreamNoMetadata, "its authorization server "+untrusted.Quote(issuer)+" publishes no metadata (RFC 8414)", nil)
	case asm.Issuer != issuer:
		// RFC 8414 §3.3: identical, no normalisation (the go-sdk forgives
		// a trailing slash).
		return fail(UpstreamIssuerMismatch, "its authorization server's metadata names issuer "+untrusted.Quote(asm.Issuer)+", not "+untrusted.Quote(issuer)+
			" (RFC 8414 wants them identical); the server's operator must make them equal", nil)
	case !slices.Contains(asm.CodeChallengeMethodsSupported, "S256"):
		return fail(UpstreamNoS256, "its authorization server does not support PKCE with S256, which the broker requires; the server's operator must enable it", nil)
	}
	for _, e := range []string{asm.AuthorizationEndpoint, asm.TokenEndpoint, asm.RegistrationEndpoint, asm.RevocationEndpoint} {
		if e != "" && (!m.hostAllowed(e) || checkEndpoint(e) != nil) {
			return fail(UpstreamHostNotAllowed, "its authorization server's endpoint "+untrusted.Quote(e)+" is on a host that is not allowed (list it in mcp.allowed_hosts) or not https", nil)
		}
	}
	st.auth = &upstreamAuth{issuer: issuer, meta: asm, resource: prm.Resource, challenged: challenged, scopes: prm.ScopesSupported, at: k.opts.Now()}
	k.opts.Telemetry.Upstream(p.Name, "discovery", "", telemetry.UpstreamOK, time.Since(start))
	return st.auth, nil
}

// forget drops what discovery found about entry name, so that the next
// request discovers again: after the server refused a connection's token
// for good, its metadata may have changed (another authorization server).
func (k *Client) forget(name string) {
	st := k.upstream(name)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.auth = nil
}

// forgetFor is forget for connection id's entry.
func (k *Client) forgetFor(ctx context.Context, id string) {
	if c, err := k.opts.Store.GetConnection(ctx, id); err == nil {
		k.forget(c.Provider)
	}
}

// prmPlace is where protected-resource metadata may be, and the resource
// identifiers a document found there may name (RFC 9728 §3.3).
type prmPlace struct {
	url       string
	resources []string
}

// prmURLs are the places protected-resource metadata may be, in the
// specification's order: the resource_metadata of the server's 401
// challenge first, then the well-known URIs (path-inserted, then root);
// and the scopes the challenge names. A document found through the
// challenge or at the path-inserted URI must name mcp.url; one at the root
// URI may also name the server's origin, the identifier that URI is built
// from.
func prmURLs(ctx context.Context, client *http.Client, resource string) ([]prmPlace, []string) {
	var out []prmPlace
	metadata, scopes := challenge(ctx, client, resource)
	if metadata != "" {
		out = append(out, prmPlace{metadata, []string{resource}})
	}
	ru, err := url.Parse(resource)
	if err != nil {
		return out, scopes
	}
	w := *ru
	w.Path = "/.well-known/oauth-protected-resource/" + strings.TrimLeft(ru.Path, "/")
	w.RawPath = ""
	out = append(out, prmPlace{w.String(), []string{resource}})
	w.Path = "/.well-known/oauth-protected-resource"
	origin := url.URL{Scheme: ru.Scheme, Host: ru.Host}
	return append(out, prmPlace{w.String(), []string{resource, origin.String()}}), scopes
}

// redirectError is a redirect answered to a discovery request, which the
// broker does not follow.
type redirectError struct {
	status int
	host   string
}

func (e *redirectError) Error() string {
	return fmt.Sprintf("%s answered with a redirect (HTTP %d)", e.host, e.status)
}

// refusalReason says why a discovery request was refused by the egress
// policy or answered with a redirect (its kind, and "" when it failed
// otherwise), with what to do about it.
func refusalReason(err error) (kind, reason string) {
	var rd *redirectError
	var re *egress.RefusedError
	var hn *HostNotAllowedError
	switch {
	case errors.As(err, &rd):
		return UpstreamRedirect, "at " + untrusted.Quote(rd.host) + " answered with a redirect (HTTP " + strconv.Itoa(rd.status) +
			"), which the broker does not follow; set mcp.url to the server's canonical URL"
	case errors.As(err, &hn):
		return UpstreamHostNotAllowed, "is on " + untrusted.Quote(hn.Host) + ", a host the entry does not allow: list it in mcp.allowed_hosts to trust it"
	case errors.As(err, &re) && errors.Is(re, egress.ErrSpecialAddress):
		return UpstreamPrivateAddress, "could not be fetched: " + re.Addr.String() + " is " + re.Range +
			": start the broker with --upstream-allow-private to reach servers on private addresses"
	case errors.As(err, &re):
		return UpstreamRefused, "could not be fetched: " + untrusted.Clip(re.Error(), 200)
	}
	return "", ""
}

// maxMetadataBytes caps a metadata document.
const maxMetadataBytes = 64 << 10

// fetchJSON GETs a JSON document (200 only, capped).
func fetchJSON[T any](ctx context.Context, client *http.Client, u string) (*T, error) {
	if err := checkEndpoint(u); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return nil, &redirectError{status: resp.StatusCode, host: req.URL.Host}
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	b, err := egress.ReadAll(resp.Body, maxMetadataBytes)
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := json.Unmarshal(b, v); err != nil {
		return nil, errors.New("not a JSON document")
	}
	return v, nil
}

// challenge asks the server without a token and reads the
// resource_metadata and the scope of its Bearer challenge ("" and nil
// when there is none).
func challenge(ctx context.Context, client *http.Client, resource string) (metadata string, scopes []string) {
	body := `{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, resource, strings.NewReader(body))
	if err != nil {
		return "", nil
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "server/discover")
	resp, err := client.Do(req)
	if err != nil {
		return "", nil
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		return "", nil
	}
	cs, err := oauthex.ParseWWWAuthenticate(resp.Header.Values("WWW-Authenticate"))
	if err != nil {
		return "", nil
	}
	for _, c := range cs {
		if c.Scheme == "bearer" {
			return c.Params["resource_metadata"], strings.Fields(c.Params["scope"])
		}
	}
	return "", nil
}

// client returns the broker's client at the server's authorization
// server: pre-registered, a Client ID Metadata Document, or registered
// dynamically (once, shared by replicas through the store).
func (m *MCP) client(ctx context.Context, k *Client, p *Provider, ua *upstreamAuth, redirectURL string) (UpstreamClient, error) {
	method, err := m.registration(k, p, ua)
	switch {
	case err != nil:
		return UpstreamClient{}, err
	case method == "static":
		// A confidential client authenticates as the server takes it:
		// HTTP Basic, RFC 8414's default, unless it lists only the form.
		auth, methods := "client_secret_basic", ua.meta.TokenEndpointAuthMethodsSupported
		switch {
		case m.ClientSecret == "":
			auth = "none"
		case len(methods) > 0 && !slices.Contains(methods, auth) && slices.Contains(methods, "client_secret_post"):
			auth = "client_secret_post"
		}
		return UpstreamClient{ClientID: m.ClientID, ClientSecret: m.ClientSecret, AuthMethod: auth}, nil
	case method == "cimd":
		return UpstreamClient{ClientID: k.opts.ClientMetadataURL, AuthMethod: "none"}, nil
	}
	return m.register(ctx, k, p, ua, redirectURL)
}

// registration picks how the broker is a client there, in the
// specification's order: static (a client_id is configured), cimd (the
// authorization server supports Client ID Metadata Documents and the
// broker's document is https), dcr (it has a registration endpoint).
func (m *MCP) registration(k *Client, p *Provider, ua *upstreamAuth) (string, error) {
	canCIMD := ua.meta.ClientIDMetadataDocumentSupported && strings.HasPrefix(k.opts.ClientMetadataURL, "https://")
	switch {
	case m.ClientID != "" && (m.Registration == "auto" || m.Registration == "static"):
		return "static", nil
	case m.Registration == "static":
		return "", &UpstreamError{Provider: p.DisplayName, Kind: UpstreamNoRegistration, Reason: "mcp.registration static needs client_id"}
	case canCIMD && (m.Registration == "auto" || m.Registration == "cimd"):
		return "cimd", nil
	case m.Registration == "cimd":
		return "", &UpstreamError{Provider: p.DisplayName, Kind: UpstreamNoRegistration,
			Reason: "registration cimd needs an authorization server that supports Client ID Metadata Documents and an https --client-metadata-url"}
	case ua.meta.RegistrationEndpoint == "":
		return "", &UpstreamError{Provider: p.DisplayName, Kind: UpstreamNoRegistration,
			Reason: "its authorization server offers no way to register (no pre-registered client_id, no Client ID Metadata Documents, no dynamic registration): register the broker there and set client_id"}
	}
	return "dcr", nil
}

// UpstreamCheck is what `broker upstreams check` reports of an mcp entry.
type UpstreamCheck struct {
	URL string
	// Open: auth none (nothing below is set).
	Open bool
	// Issuer is the authorization server; Registration how the broker
	// is (or would become) its client: static, cimd or dcr.
	Issuer       string
	Registration string
	// Scopes are those a connect request asks for by default.
	Scopes []string
	// IDJAG, for an mcp.auth: enterprise entry, says whether its
	// authorization server takes ID-JAGs (the JWT bearer grant):
	// "id-jag", or "no id-jag: code flow only"; "" for other entries.
	IDJAG string
}

// CheckUpstream runs mcp entry name's discovery and picks its
// registration method, registering nothing and storing nothing.
func (k *Client) CheckUpstream(ctx context.Context, name string) (UpstreamCheck, error) {
	p, ok := k.opts.Providers.Lookup(name)
	if !ok {
		return UpstreamCheck{}, fmt.Errorf("%w: %s", ErrUnknownProvider, name)
	}
	g, ok := p.Kind.(Gateway)
	if !ok {
		return UpstreamCheck{}, fmt.Errorf("provider %s is of type %s, not mcp", name, p.Kind.Type())
	}
	out := UpstreamCheck{URL: g.Upstream().URL, Open: g.Upstream().Open}
	m, ok := g.(*MCP)
	if !ok {
		return out, nil
	}
	ua, err := m.discover(ctx, k, p)
	if err != nil {
		return out, err
	}
	out.Issuer = ua.issuer
	if m.Enterprise {
		out.IDJAG = "no id-jag: code flow only"
		if slices.Contains(ua.meta.GrantTypesSupported, grantJWTBearer) {
			out.IDJAG = "id-jag"
		}
	}
	out.Scopes = p.DefaultScopes
	if len(out.Scopes) == 0 {
		out.Scopes = ua.defaultScopes()
	}
	out.Registration, err = m.registration(k, p, ua)
	return out, err
}

// ForgetUpstreamClient deletes the broker's dynamic registration at mcp
// entry name's authorization server (broker upstreams forget), and
// returns what it deleted, its secret cleared. The issuer is discovered
// unless given (the server may be unreachable, or have moved to another
// authorization server). Errors: ErrUnknownProvider; a *NotMCPError for
// another kind or an entry that takes no token; discovery's
// *UpstreamError; vault.ErrNotFound when nothing is stored.
func (k *Client) ForgetUpstreamClient(ctx context.Context, name, issuer string) (UpstreamClient, error) {
	p, ok := k.opts.Providers.Lookup(name)
	if !ok {
		return UpstreamClient{}, fmt.Errorf("%w: %s", ErrUnknownProvider, name)
	}
	m, ok := p.Kind.(*MCP)
	if !ok {
		e := &NotMCPError{Name: name, Type: p.Kind.Type()}
		if _, open := p.Kind.(*OpenMCP); open {
			e.Type = "mcp with auth: none"
		}
		return UpstreamClient{}, e
	}
	if issuer == "" {
		ua, err := m.discover(ctx, k, p)
		if err != nil {
			return UpstreamClient{}, err
		}
		issuer = ua.issuer
	}
	key := UpstreamClientKey(issuer, k.opts.RedirectURL(name))
	c, err := k.opts.UpstreamClients.GetUpstreamClient(ctx, key)
	if err != nil {
		return UpstreamClient{Key: key}, err
	}
	if err := k.opts.UpstreamClients.DeleteUpstreamClient(ctx, key, c.ClientID); err != nil {
		return UpstreamClient{Key: key}, err
	}
	c.ClientSecret = ""
	k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventUpstreamRegistrationDropped, Provider: name, Client: c.ClientID,
		Via: "cli", Outcome: "forgotten"})
	return c, nil
}

// NotMCPError: the entry is not one the broker registers for: another
// type, or type mcp with auth: none (Type "mcp (auth: none)").
type NotMCPError struct{ Name, Type string }

func (e *NotMCPError) Error() string {
	return fmt.Sprintf("provider %s is of type %s: the broker keeps no registration for it (only for type: mcp with auth: oauth)", e.Name, e.Type)
}

// PrepareUpstream readies mcp entry name for a connect request: its
// discovery (cached), and the broker's client at its authorization server,
// registered dynamically when that is the method (once per issuer and
// redirect URI; after a failure, not again within a minute). Refusals are
// *UpstreamError. An entry that takes no token needs nothing.
func (k *Client) PrepareUpstream(ctx context.Context, name string) error {
	p, ok := k.opts.Providers.Lookup(name)
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownProvider, name)
	}
	m, ok := p.Kind.(*MCP)
	if !ok {
		return nil
	}
	_, _, err := m.config(ctx, k, p, "")
	return err
}

// register registers the broker dynamically (RFC 7591), once per
// issuer and redirect URI, one registration at a time per issuer; after
// an attempt at an issuer failed, none is made there within a minute,
// for any entry. Each attempt is recorded as an upstream request (method
// "registration"), ok or failed.
func (m *MCP) register(ctx context.Context, k *Client, p *Provider, ua *upstreamAuth, redirectURL string) (UpstreamClient, error) {
	key := UpstreamClientKey(ua.issuer, redirectURL)
	if c, err := k.opts.UpstreamClients.GetUpstreamClient(ctx, key); err == nil {
		return c, nil
	} else if !errors.Is(err, vault.ErrNotFound) {
		return UpstreamClient{}, fmt.Errorf("%w: upstream client %s: %v", ErrProviderUnavailable, p.Name, err)
	}
	st, done := k.registration(ua.issuer)
	defer done()
	st.mu.Lock()
	defer st.mu.Unlock()
	if c, err := k.opts.UpstreamClients.GetUpstreamClient(ctx, key); err == nil {
		return c, nil // registered by another caller meanwhile
	}
	now := k.opts.Now()
	if now.Sub(st.failed) < registrationBackoff {
		return UpstreamClient{}, &UpstreamError{Provider: p.DisplayName, Kind: UpstreamRegistrationBackoff, Reason: "dynamic registration failed a moment ago; try again in a minute"}
	}
	// A confidential client when the server takes one (Basic, RFC 8414's
	// default when it lists nothing; else the form when it takes no
	// public client), else a public one.
	method, ms := "none", ua.meta.TokenEndpointAuthMethodsSupported
	switch {
	case len(ms) == 0 || slices.Contains(ms, "client_secret_basic"):
		method = "client_secret_basic"
	case len(ms) > 0 && !slices.Contains(ms, "none") && slices.Contains(ms, "client_secret_post"):
		method = "client_secret_post"
	}
	meta := &oauthex.ClientRegistrationMetadata{RedirectURIs: []string{redirectURL}, TokenEndpointAuthMethod: method,
		GrantTypes: []string{"authorization_code", "refresh_token"}, ResponseTypes: []string{"code"},
		ClientName: "credbroker", ClientURI: k.opts.BrokerURL, SoftwareID: "credbroker", ApplicationType: "web"}
	start := time.Now()
	resp, err := oauthex.RegisterClient(ctx, ua.meta.RegistrationEndpoint, meta, NoRedirectClient(k.httpFor(p)))
	if err != nil {
		st.failed = now
		k.opts.Telemetry.Upstream(p.Name, "registration", "", telemetry.UpstreamFailed, time.Since(start))
		return UpstreamClient{}, &UpstreamError{Provider: p.DisplayName, Kind: UpstreamRegistrationFailed,
			Reason: "dynamic registration at its authorization server failed (" + untrusted.Clip(err.Error(), 200) + "); the broker tries again after a minute", Err: err}
	}
	k.opts.Telemetry.Upstream(p.Name, "registration", "", telemetry.UpstreamOK, time.Since(start))
	got := UpstreamClient{Key: key, ClientID: resp.ClientID, ClientSecret: vault.Secret(resp.ClientSecret), AuthMethod: method, Created: k.opts.Now()}
	if got.ClientSecret == "" {
		got.AuthMethod = "none"
	}
	stored, err := k.opts.UpstreamClients.PutUpstreamClient(ctx, got)
	if err != nil {
		return UpstreamClient{}, fmt.Errorf("%w: store upstream client %s: %v", ErrProviderUnavailable, p.Name, err)
	}
	return stored, nil
}

// config is the x/oauth2 configuration of the broker's client there.
func (m *MCP) config(ctx context.Context, k *Client, p *Provider, redirectURL string) (*oauth2.Config, *upstreamAuth, error) {
	ua, err := m.discover(ctx, k, p)
	if err != nil {
		return nil, nil, err
	}
	if redirectURL == "" {
		redirectURL = k.opts.RedirectURL(p.Name)
	}
	cl, err := m.client(ctx, k, p, ua, redirectURL)
	if err != nil {
		return nil, nil, err
	}
	style := oauth2.AuthStyleInHeader
	switch cl.AuthMethod {
	case "client_secret_post":
		style = oauth2.AuthStyleInParams
	case "none":
		style = oauth2.AuthStyleInParams
	}
	return &oauth2.Config{ClientID: cl.ClientID, ClientSecret: cl.ClientSecret.Reveal(), RedirectURL: redirectURL,
		Endpoint: oauth2.Endpoint{AuthURL: ua.meta.AuthorizationEndpoint, TokenURL: ua.meta.TokenEndpoint, AuthStyle: style}}, ua, nil
}

// requestScopes asks for offline access as the entry says: always adds
// it, never takes it out (whoever named it).
func (m *MCP) requestScopes(scopes []string) []string {
	scopes = slices.Clone(scopes)
	switch {
	case m.OfflineAccess == "always" && !slices.Contains(scopes, oidc.ScopeOfflineAccess):
		scopes = append(scopes, oidc.ScopeOfflineAccess)
	case m.OfflineAccess == "never":
		scopes = slices.DeleteFunc(scopes, func(s string) bool { return s == oidc.ScopeOfflineAccess })
	}
	return scopes
}

func (m *MCP) authRequest(ctx context.Context, k *Client, p *Provider, scopes []string, redirectURL string) (AuthRequest, error) {
	conf, ua, err := m.config(ctx, k, p, redirectURL)
	if err != nil {
		return AuthRequest{}, err
	}
	if len(scopes) == 0 {
		scopes = slices.Clone(ua.defaultScopes())
	}
	if m.OfflineAccess == "auto" && slices.Contains(ua.meta.ScopesSupported, oidc.ScopeOfflineAccess) && !slices.Contains(scopes, oidc.ScopeOfflineAccess) {
		scopes = append(slices.Clone(scopes), oidc.ScopeOfflineAccess)
	}
	// The server's own suggestions (its challenge, scopes_supported) are
	// held to the entry's choice too.
	scopes = m.requestScopes(scopes)
	endpoint, err := url.Parse(conf.Endpoint.AuthURL)
	if err != nil {
		return AuthRequest{}, &UpstreamError{Provider: p.DisplayName, Kind: UpstreamBadEndpoint, Reason: "its authorization endpoint is not a URL"}
	}
	a := AuthRequest{Endpoint: endpoint, State: randomToken(), Verifier: oauth2.GenerateVerifier(), Scopes: slices.Clone(scopes)}
	conf.Scopes = a.Scopes
	opts := []oauth2.AuthCodeOption{oauth2.S256ChallengeOption(a.Verifier), oauth2.SetAuthURLParam("resource", ua.resource)}
	if slices.Contains(scopes, oidc.ScopeOpenID) {
		a.Nonce = randomToken()
		opts = append(opts, oauth2.SetAuthURLParam("nonce", a.Nonce))
	}
	if slices.Contains(scopes, oidc.ScopeOfflineAccess) {
		// OpenID Connect Core §11: offline access is asked with
		// prompt=consent, else OpenID providers (oidc-provider) drop the
		// scope and issue no refresh token.
		opts = append(opts, oauth2.SetAuthURLParam("prompt", "consent"))
	}
	a.URL = conf.AuthCodeURL(a.State, opts...)
	return a, nil
}

func (m *MCP) redeem(ctx context.Context, k *Client, p *Provider, redirectURL, code string, a AuthRequest) (*oauth2.Token, error) {
	conf, ua, err := m.config(ctx, k, p, redirectURL)
	if err != nil {
		return nil, err
	}
	conf.Scopes = a.Scopes
	tok, err := conf.Exchange(k.TokenContext(ctx, p), code, oauth2.VerifierOption(a.Verifier), oauth2.SetAuthURLParam("resource", ua.resource))
	if err != nil {
		if cerr := m.clientRefused(ctx, k, p, ua, conf, "browser", err); cerr != nil {
			return nil, cerr
		}
		var re *oauth2.RetrieveError
		if errors.As(err, &re) && re.ErrorCode == "invalid_grant" {
			return nil, fmt.Errorf("%w: %s", ErrCodeRejected, DescribeTokenError(err))
		}
		return nil, fmt.Errorf("%w: %s", ErrProviderUnavailable, DescribeTokenError(err))
	}
	return tok, nil
}

func (m *MCP) responseIssuer(ctx context.Context, k *Client, p *Provider) (string, bool, error) {
	ua, err := m.discover(ctx, k, p)
	if err != nil {
		return "", false, err
	}
	return ua.issuer, ua.meta.AuthorizationResponseIssParameterSupported, nil
}

func (m *MCP) refreshToken(ctx context.Context, k *Client, p *Provider, refreshToken string) (*oauth2.Token, error) {
	conf, ua, err := m.config(ctx, k, p, "")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProviderUnavailable, err)
	}
	if m.ResourceOnRefresh {
		// x/oauth2 sends no extra parameters on a refresh: the token
		// request's transport adds resource.
		base, _ := ctx.Value(oauth2.HTTPClient).(*http.Client)
		if base == nil {
			base = NoRedirectClient(k.httpFor(p))
		}
		cl := *base
		next := cl.Transport
		if next == nil {
			next = http.DefaultTransport
		}
		cl.Transport = formParam{next: next, key: "resource", value: ua.resource}
		ctx = context.WithValue(ctx, oauth2.HTTPClient, &cl)
	}
	tok, err := conf.TokenSource(ctx, &oauth2.Token{RefreshToken: refreshToken}).Token()
	if cerr := m.clientRefused(ctx, k, p, ua, conf, "background", err); cerr != nil {
		return nil, cerr
	}
	return tok, err
}

// clientRefused answers a token request's err that is the token
// endpoint's invalid_client (RFC 6749 §5.2: the authorization server does
// not know, or does not accept, the broker's client conf names) with the
// error to return instead; nil for any other err.
//
// A dynamic registration the server no longer knows is deleted from the
// store, compare-and-delete (only that client: one another replica
// registered since stays); the answer is ErrRegistrationDropped (a
// *registrationDropped, which Exchange and the refresh audit naming the
// person), and the next connect registers anew (single
// flight; after a failed registration, none within a minute). A
// pre-registered client or the broker's metadata document is never
// dropped: that is an operator's to fix, which the answer (a
// *UpstreamError) and the log say. via is what asked: "browser" (a code
// exchange) or "background" (a refresh).
func (m *MCP) clientRefused(ctx context.Context, k *Client, p *Provider, ua *upstreamAuth, conf *oauth2.Config, via string, err error) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) || re.ErrorCode != "invalid_client" {
		return nil
	}
	log := k.log.With("provider", p.Name, "issuer", ua.issuer, "client_id", conf.ClientID, "via", via)
	method, merr := m.registration(k, p, ua)
	if merr != nil {
		return nil
	}
	if method != "dcr" {
		reason := "its authorization server refused the broker's pre-registered client " + untrusted.Quote(conf.ClientID) +
			" (invalid_client): the entry's client_id or client secret is wrong or no longer registered there; an operator must fix providers.yaml (the broker never registers anew in place of a configured client)"
		if method == "cimd" {
			reason = "its authorization server refused the broker's Client ID Metadata Document " + untrusted.Quote(conf.ClientID) +
				" (invalid_client): an operator must check that the server can fetch it and that it lists " + untrusted.Quote(conf.RedirectURL)
		}
		log.Error("provider: the upstream's authorization server refused the broker's client; an operator must fix it", "registration", method, "err", DescribeTokenError(err))
		ue := &UpstreamError{Provider: p.DisplayName, Kind: UpstreamClientRefused, Reason: reason, Err: err}
		k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventUpstreamError, Provider: p.Name, Client: conf.ClientID, Via: via,
			Outcome: UpstreamClientRefused, Err: ue})
		return ue
	}
	derr := k.opts.UpstreamClients.DeleteUpstreamClient(context.WithoutCancel(ctx), UpstreamClientKey(ua.issuer, conf.RedirectURL), conf.ClientID)
	switch {
	case derr == nil:
		log.Warn("provider: the upstream's authorization server no longer knows the broker's registration (invalid_client); dropped, the next connect registers anew")
		return &registrationDropped{provider: p.Name, client: conf.ClientID, via: via, dropped: true}
	case errors.Is(derr, vault.ErrNotFound), errors.Is(derr, vault.ErrConflict):
		log.Info("provider: the upstream's authorization server no longer knows a registration already dropped or replaced")
	default:
		log.Error("provider: dropping the registration the upstream's authorization server no longer knows failed", "err", derr)
		return fmt.Errorf("%w: drop the registration at %s: %v", ErrProviderUnavailable, p.Name, derr)
	}
	return &registrationDropped{provider: p.Name, client: conf.ClientID, via: via}
}

// registrationDropped is ErrRegistrationDropped with what its audit event
// names. clientRefused, which met it, does not know whose exchange or
// refresh it was; the Client's caller that does records the event
// (auditDropped), once, and only when this process deleted the
// registration (dropped).
type registrationDropped struct {
	provider, client, via string
	dropped               bool
}

func (e *registrationDropped) Error() string {
	return ErrRegistrationDropped.Error() + ": " + e.provider
}

func (e *registrationDropped) Unwrap() error { return ErrRegistrationDropped }

// auditDropped records upstream_registration_dropped for err when it is a
// registration this process dropped: the person pr whose code exchange or
// refresh (of connection, when there is one) met the server's
// invalid_client, the provider and the forgotten client.
func (k *Client) auditDropped(ctx context.Context, err error, pr vault.Principal, connection string) {
	var d *registrationDropped
	if !errors.As(err, &d) || !d.dropped {
		return
	}
	k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventUpstreamRegistrationDropped, Principal: pr, Provider: d.provider,
		Connection: connection, Client: d.client, Via: d.via, Outcome: "invalid_client"})
}

func (m *MCP) expectsRefreshToken(scopes []string) bool {
	return m.OfflineAccess == "always" || slices.Contains(scopes, oidc.ScopeOfflineAccess)
}

// formParam adds one parameter to form-encoded POST bodies.
type formParam struct {
	next       http.RoundTripper
	key, value string
}

func (f formParam) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method != http.MethodPost || r.Body == nil || !strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		return f.next.RoundTrip(r)
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	form, err := url.ParseQuery(string(b))
	if err != nil {
		return nil, err
	}
	if !form.Has(f.key) {
		form.Set(f.key, f.value)
	}
	enc := form.Encode()
	r2 := r.Clone(r.Context())
	r2.Body = io.NopCloser(strings.NewReader(enc))
	r2.ContentLength = int64(len(enc))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(enc)), nil }
	return f.next.RoundTrip(r2)
}

// lookupAccount names the account: a verified ID token's subject, else
// the entry's account endpoint, else a hash of the provider and the person (so that
// two people never share an account id, and revoking one person's
// connection never counts as shared).
func (m *MCP) lookupAccount(ctx context.Context, k *Client, p *Provider, pr vault.Principal, tok *oauth2.Token, nonce string) (Account, error) {
	if raw, _ := tok.Extra("id_token").(string); raw != "" {
		ua, err := m.discover(ctx, k, p)
		if err != nil {
			return Account{}, err
		}
		if ua.meta.JWKSURI == "" {
			return Account{}, errors.New("an id_token, but no jwks_uri to check it with")
		}
		conf, _, err := m.config(ctx, k, p, "")
		if err != nil {
			return Account{}, err
		}
		v := oidc.NewVerifier(ua.issuer, oidc.NewRemoteKeySet(k.HTTPContext(ctx, p), ua.meta.JWKSURI),
			&oidc.Config{ClientID: conf.ClientID, Now: k.opts.Now, SupportedSigningAlgs: idTokenAlgs})
		a, _, err := verifyIDToken(ctx, v, raw, nonce)
		return a, err
	}
	if m.AccountURL != "" {
		return (&OAuth{AccountURL: m.AccountURL, AccountIDField: m.AccountIDField, AccountLoginField: m.AccountLoginField}).
			lookupAccount(ctx, k, p, pr, tok, "")
	}
	// Not keyed with the broker's keys: the id must survive a key
	// rotation (a new id would make a reconnect a second account).
	sum := sha256.Sum256([]byte("credbroker/upstream-account/v1\x00" + p.Name + "\x00" + pr.Issuer + "\x00" + pr.Subject))
	id := hex.EncodeToString(sum[:16])
	return Account{ID: id, Login: p.DisplayName + " account " + id[:8]}, nil
}

// idTokenAlgs are the signatures an upstream's ID token may have: every
// asymmetric one go-oidc knows, checked with the keys of the server's own
// jwks_uri (RFC 8414 metadata does not list them, and go-oidc's default
// is RS256 alone, which refused an ES256 authorization server's tokens).
var idTokenAlgs = []string{oidc.RS256, oidc.RS384, oidc.RS512, oidc.ES256, oidc.ES384, oidc.ES512,
	oidc.PS256, oidc.PS384, oidc.PS512, oidc.EdDSA}

// revoke revokes at the authorization server's RFC 7009 endpoint, when it
// has one.
func (m *MCP) revoke(ctx context.Context, k *Client, p *Provider, c vault.Connection, shared bool) (Revocation, error) {
	conf, ua, err := m.config(ctx, k, p, "")
	if err != nil {
		return NotConfirmed, err
	}
	if ua.meta.RevocationEndpoint == "" {
		return NotSupported, nil
	}
	o := &OAuth{ClientID: conf.ClientID, ClientSecret: vault.Secret(conf.ClientSecret), TokenAuthInParams: conf.Endpoint.AuthStyle == oauth2.AuthStyleInParams}
	return o.revokeRFC7009(ctx, k, p, c, ua.meta.RevocationEndpoint, shared)
}

// UpstreamClient is a client the broker has at an upstream MCP server's
// authorization server: pre-registered, its Client ID Metadata Document,
// or registered dynamically (then kept by Options.UpstreamClients, its
// secret sealed at rest by the vault).
type UpstreamClient = vault.UpstreamClient

// UpstreamClientKey names a dynamic registration (UpstreamClient.Key):
// the authorization server's issuer and the broker's redirect URI there.
func UpstreamClientKey(issuer, redirectURL string) string { return issuer + " " + redirectURL }

// UpstreamClients keeps the clients the broker registered dynamically,
// shared by every replica: a store's vault.UpstreamClientStore is one.
type UpstreamClients interface {
	// GetUpstreamClient returns the registration under key
	// (vault.ErrNotFound when there is none).
	GetUpstreamClient(ctx context.Context, key string) (UpstreamClient, error)
	// PutUpstreamClient stores c unless a registration under its key
	// exists; the stored one is returned either way.
	PutUpstreamClient(ctx context.Context, c UpstreamClient) (UpstreamClient, error)
	// DeleteUpstreamClient deletes the registration under key if it is
	// client clientID (any, when empty): vault.ErrNotFound when there is
	// none, vault.ErrConflict when it is another client.
	DeleteUpstreamClient(ctx context.Context, key, clientID string) error
}

var _ UpstreamClients = vault.UpstreamClientStore(nil)

// UpstreamTokens gives the gateway's upstream client (mcpup) the tokens
// of connections to upstream MCP servers, refreshed as Token refreshes
// them; the client puts the access token on its requests only, and
// redacts both from every answer of the upstream.
func (k *Client) UpstreamTokens() mcpup.Tokens { return upstreamTokens{k} }

type upstreamTokens struct{ k *Client }

func (u upstreamTokens) AccessToken(ctx context.Context, id string) (mcpup.Token, error) {
	return u.k.upstreamToken(u.k.Token(ctx, id))
}

// ForceRefresh is asked for because the server refused the token: when
// no new one can be had, the connection must be made again, and the
// server's metadata is discovered again first (it may have moved to
// another authorization server).
func (u upstreamTokens) ForceRefresh(ctx context.Context, id, stale string) (mcpup.Token, error) {
	tok, err := u.k.upstreamToken(u.k.ForceRefresh(ctx, id, vault.Secret(stale)))
	if errors.Is(err, mcpup.ErrNoToken) {
		u.k.forgetFor(ctx, id)
	}
	return tok, err
}

// upstreamToken is c's tokens (the access token for the upstream's
// requests, both for redacting its answers), with the record version they
// were read at and until when the access token is usable without a
// refresh (fresh's rule: the pool's session uses it again until then, as
// long as the connection's listing shows that version); an error that
// means the connection must be made again is also mcpup.ErrNoToken (any
// other, such as an authorization server that is down, is not: the grant
// may be fine).
func (k *Client) upstreamToken(c vault.Connection, err error) (mcpup.Token, error) {
	switch {
	case errors.Is(err, ErrNeedsReconnect), errors.Is(err, vault.ErrNotFound):
		return mcpup.Token{}, fmt.Errorf("%w: %w", mcpup.ErrNoToken, err)
	case err != nil:
		return mcpup.Token{}, err
	}
	return mcpup.Token{Access: c.Token.AccessToken.Reveal(), Refresh: c.Token.RefreshToken.Reveal(), Version: c.Version, Until: k.usableUntil(c)}, nil
}

// Unauthorized marks connection id needs_reconnect because its server
// refused the access token again right after a refresh (the upstream's
// second 401), and returns ErrNeedsReconnect.
func (k *Client) Unauthorized(ctx context.Context, id string) error {
	c, err := k.opts.Store.GetConnection(ctx, id)
	if err != nil {
		return fmt.Errorf("provider: connection %s: %w", id, err)
	}
	// The server may have moved to another authorization server: the
	// reconnect discovers again.
	k.forget(c.Provider)
	return k.refused(ctx, c, k.log.With("provider", c.Provider, "connection", id), "the upstream server refused the access token again right after a refresh")
}
