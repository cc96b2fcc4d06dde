package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"credbroker/authserver"
	"credbroker/internal/clientaddr"
	"credbroker/internal/loopback"
)

// serveConfig is everything `broker serve` needs, as data. validate reports
// every problem at once and has no side effects.
type serveConfig struct {
	Addr          string
	PublicURL     string
	Resource      string
	Issuer        string
	ClientID      string
	ClientSecret  string // resolved from BROKER_CLIENT_SECRET or --client-secret-file
	SecretFile    string
	ProvidersFile string
	Store         string
	KeysFile      string
	KeysEnv       string // value of BROKER_KEYS
	RequiredScope string
	GrantTTL      time.Duration
	StateTTL      time.Duration
	LogFormat     string
	LogLevel      string
	CheckConfig   bool
	// Sidecar API (off unless an address or socket is given) and refresh.
	SidecarAddr        string
	SidecarSocket      string
	SidecarAudiences   string
	SidecarSecretsFile string
	RefreshMargin      time.Duration
	MetricsAddr        string // separate listener for /metrics; empty: on the main listener
	// TrustedProxies lists the proxies (addresses, CIDR prefixes) whose
	// X-Forwarded-For names the client; empty: none.
	TrustedProxies string
	// Who issues the MCP bearer tokens: "broker" (the built-in
	// authorization server) or "issuer" (the IdP's JWTs).
	MCPAuth                    string
	Registration               string // open or off
	ClientMetadataAllowPrivate bool
	AccessTokenTTL             time.Duration
	RefreshTokenTTL            time.Duration
	RefreshTokenIdle           time.Duration
	// IDJAG is the JWT bearer grant's policy (off, any, or an allow-list)
	// and IDJAGIssuers the ID-JAG issuers trusted besides --issuer.
	IDJAG        string
	IDJAGIssuers string
	// Ops: webhooks, the admin API, keep-alive (ops.go).
	Ops opsConfig
	// Upstreams: how the gateway reaches remote MCP servers (upstreams.go).
	Upstreams upstreamConfig
}

func (c *serveConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", envOr("BROKER_ADDR", "127.0.0.1:8080"), "listen address (env BROKER_ADDR)")
	fs.StringVar(&c.PublicURL, "public-url", os.Getenv("BROKER_PUBLIC_URL"), "external base URL of the broker, e.g. https://broker.example.com (env BROKER_PUBLIC_URL)")
	fs.StringVar(&c.Resource, "resource", os.Getenv("BROKER_RESOURCE"), "MCP resource URI, the audience bearer tokens must carry (default <public-url>/mcp)")
	fs.StringVar(&c.Issuer, "issuer", os.Getenv("BROKER_ISSUER"), "the organisation's OIDC issuer URL (env BROKER_ISSUER)")
	fs.StringVar(&c.ClientID, "client-id", os.Getenv("BROKER_CLIENT_ID"), "the broker's OIDC client id at the issuer (env BROKER_CLIENT_ID)")
	fs.StringVar(&c.SecretFile, "client-secret-file", os.Getenv("BROKER_CLIENT_SECRET_FILE"), "file holding the broker's OIDC client secret (or env BROKER_CLIENT_SECRET)")
	fs.StringVar(&c.ProvidersFile, "providers", envOr("BROKER_PROVIDERS", "providers.yaml"), "provider catalogue")
	fs.StringVar(&c.Store, "store", envOr("BROKER_STORE", "bolt:./data/broker.db"), "store: bolt:PATH (or a plain path), or postgres://… (or postgres:KEY=VALUE…) for replicas sharing one database")
	fs.StringVar(&c.KeysFile, "keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	fs.StringVar(&c.RequiredScope, "required-scope", os.Getenv("BROKER_REQUIRED_SCOPE"), "scope every MCP bearer token must carry (optional)")
	fs.DurationVar(&c.GrantTTL, "grant-ttl", 10*time.Minute, "how long a connect link stays usable")
	fs.DurationVar(&c.StateTTL, "state-ttl", 10*time.Minute, "how long a sealed requestState stays valid")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "validate the configuration and providers, then exit")
	fs.StringVar(&c.SidecarAddr, "sidecar-addr", os.Getenv("BROKER_SIDECAR_ADDR"), "serve the sidecar API for co-located MCP servers on this loopback address, e.g. 127.0.0.1:8081 (needs BROKER_SIDECAR_SECRET or --sidecar-secrets-file; off by default)")
	fs.StringVar(&c.SidecarSocket, "sidecar-socket", os.Getenv("BROKER_SIDECAR_SOCKET"), "serve the sidecar API on this Unix socket instead (mode 0600)")
	fs.StringVar(&c.SidecarSecretsFile, "sidecar-secrets-file", os.Getenv("BROKER_SIDECAR_SECRETS_FILE"), "file of name:secret lines, one per co-located server (optionally followed by providers=a,b); BROKER_SIDECAR_SECRET is the unnamed one")
	fs.StringVar(&c.SidecarAudiences, "sidecar-audiences", os.Getenv("BROKER_SIDECAR_AUDIENCES"), "comma-separated AUDIENCE or AUDIENCE=SCOPE accepted in user tokens on the sidecar API, each with the scope its tokens must carry (default: the MCP resource URI with --required-scope)")
	fs.DurationVar(&c.RefreshMargin, "refresh-margin", 5*time.Minute, "refresh provider access tokens this long before they expire")
	fs.StringVar(&c.MCPAuth, "mcp-auth", envOr("BROKER_MCP_AUTH", "broker"), "who issues MCP bearer tokens: broker (the built-in authorization server; the IdP only signs people in) or issuer (the IdP's JWTs whose aud is the resource) (env BROKER_MCP_AUTH)")
	fs.StringVar(&c.Registration, "registration", envOr("BROKER_REGISTRATION", "open"), "dynamic client registration at the built-in authorization server: open or off (env BROKER_REGISTRATION)")
	fs.BoolVar(&c.ClientMetadataAllowPrivate, "client-metadata-allow-private", false, "let Client ID Metadata Documents be fetched from loopback, private and other special-use addresses (tests, private networks)")
	fs.DurationVar(&c.AccessTokenTTL, "access-token-ttl", time.Hour, "lifetime of the access tokens the broker issues")
	fs.DurationVar(&c.RefreshTokenTTL, "refresh-token-ttl", 30*24*time.Hour, "absolute lifetime of a sign-in's refresh tokens")
	fs.DurationVar(&c.RefreshTokenIdle, "refresh-token-idle", 7*24*time.Hour, "a refresh token unused this long expires")
	fs.StringVar(&c.IDJAG, "idjag", envOr("BROKER_IDJAG", "off"), "enterprise-managed authorization: which clients may redeem ID-JAGs from the organisation's IdP at the built-in authorization server (JWT bearer grant, no consent page): off, any (any confidential client), or a comma-separated allow-list of client ids and metadata-document URLs (env BROKER_IDJAG)")
	fs.StringVar(&c.IDJAGIssuers, "idjag-issuers", os.Getenv("BROKER_IDJAG_ISSUERS"), "comma-separated issuers whose ID-JAGs are trusted besides --issuer, each found by OIDC discovery (env BROKER_IDJAG_ISSUERS)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", os.Getenv("BROKER_METRICS_ADDR"), "serve /metrics on this separate address instead of the main listener (env BROKER_METRICS_ADDR)")
	fs.StringVar(&c.TrustedProxies, "trusted-proxies", os.Getenv("BROKER_TRUSTED_PROXIES"), "comma-separated addresses or CIDR prefixes of the load balancers or proxies in front of the broker: from them, the client address (registration limit, security-event logs) is read from X-Forwarded-For (env BROKER_TRUSTED_PROXIES; default: none)")
	c.Ops.flags(fs)
	c.Upstreams.flags(fs)
}

// trusted is the parsed --trusted-proxies (validate has checked it).
func (c *serveConfig) trusted() clientaddr.Trusted {
	t, _ := clientaddr.Parse(c.TrustedProxies)
	return t
}

func (c *serveConfig) sidecar() sidecarConfig {
	return newSidecarConfig(c.SidecarAddr, c.SidecarSocket, c.SidecarSecretsFile, c.SidecarAudiences)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// validate reports every problem with c at once.
func (c *serveConfig) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.PublicURL == "" {
		bad("--public-url is required (the broker's external base URL)")
	} else if err := checkBaseURL(c.PublicURL); err != nil {
		bad("--public-url: %v", err)
	}
	if c.Resource != "" {
		if err := checkBaseURL(c.Resource); err != nil {
			bad("--resource: %v", err)
		}
	}
	if c.Issuer == "" {
		bad("--issuer is required (the organisation's OIDC issuer)")
	} else if err := checkBaseURL(c.Issuer); err != nil {
		bad("--issuer: %v", err)
	}
	if c.ClientID == "" {
		bad("--client-id is required (the broker's OIDC client at the issuer)")
	}
	if c.ClientSecret == "" && c.SecretFile == "" {
		bad("the broker's OIDC client secret is missing: set BROKER_CLIENT_SECRET or --client-secret-file")
	}
	if c.KeysEnv == "" && c.KeysFile == "" {
		bad("no encryption keys: set BROKER_KEYS or pass --keys-file (generate one with `broker keys generate`)")
	}
	if c.KeysEnv != "" && c.KeysFile != "" {
		bad("keys given both in BROKER_KEYS and --keys-file; use one")
	}
	if _, err := parseStore(c.Store); err != nil {
		bad("--store: %v", err)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("--addr %q: %v", c.Addr, err)
	}
	if _, err := clientaddr.Parse(c.TrustedProxies); err != nil {
		bad("--trusted-proxies: %v", err)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			bad("--metrics-addr %q: %v", c.MetricsAddr, err)
		} else if c.MetricsAddr == c.Addr {
			bad("--metrics-addr %q is the same as --addr; leave it empty to serve /metrics on the main listener", c.MetricsAddr)
		}
	}
	errs = append(errs, c.sidecar().validate()...)
	errs = append(errs, c.Ops.validate()...)
	errs = append(errs, c.Upstreams.validate()...)
	if c.Ops.AdminClaim != "" && c.Ops.AdminAddr == c.Addr {
		bad("--admin-addr %q is the same as --addr; the admin API needs its own listener", c.Ops.AdminAddr)
	}
	if c.RefreshMargin < 0 || c.RefreshMargin > time.Hour {
		bad("--refresh-margin %s: must be between 0 and 1h", c.RefreshMargin)
	}
	if c.GrantTTL < time.Minute || c.GrantTTL > time.Hour {
		bad("--grant-ttl %s: must be between 1m and 1h", c.GrantTTL)
	}
	if c.StateTTL < time.Minute || c.StateTTL > time.Hour {
		bad("--state-ttl %s: must be between 1m and 1h", c.StateTTL)
	}
	switch c.MCPAuth {
	case "broker", "issuer":
	default:
		bad("--mcp-auth %q: want broker or issuer", c.MCPAuth)
	}
	if c.Registration != "open" && c.Registration != "off" {
		bad("--registration %q: want open or off", c.Registration)
	}
	if _, err := authserver.ParseIDJAGPolicy(c.IDJAG); err != nil {
		bad("--idjag: %v", err)
	} else if c.IDJAG != "off" && c.MCPAuth != "broker" {
		bad("--idjag %s needs --mcp-auth broker (the built-in authorization server redeems ID-JAGs)", c.IDJAG)
	}
	for _, iss := range splitList(c.IDJAGIssuers) {
		if u, err := url.Parse(iss); err != nil || u.Host == "" || u.Scheme != "https" && !(u.Scheme == "http" && loopback.Host(u.Hostname())) {
			bad("--idjag-issuers: %q must be an https URL (http only on loopback)", iss)
		}
	}
	if c.AccessTokenTTL < time.Minute || c.AccessTokenTTL > 24*time.Hour {
		bad("--access-token-ttl %s: must be between 1m and 24h", c.AccessTokenTTL)
	}
	if c.RefreshTokenTTL < c.AccessTokenTTL || c.RefreshTokenTTL > 365*24*time.Hour {
		bad("--refresh-token-ttl %s: must be between --access-token-ttl and 8760h", c.RefreshTokenTTL)
	}
	if c.RefreshTokenIdle < time.Hour || c.RefreshTokenIdle > c.RefreshTokenTTL {
		bad("--refresh-token-idle %s: must be between 1h and --refresh-token-ttl", c.RefreshTokenIdle)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("--log-format %q: want text or json", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("--log-level %q: want debug, info, warn or error", c.LogLevel)
	}
	return errors.Join(errs...)
}

// checkBaseURL accepts absolute http(s) URLs without query or fragment;
// plain http only on loopback hosts.
func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q is not a URL", raw)
	}
	if u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("%q must be an absolute https URL", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q must not carry a query, fragment or user info", raw)
	}
	if u.Scheme == "http" && !isLoopbackHost(u.Hostname()) {
		return fmt.Errorf("%q must use https (plain http is only allowed on loopback)", raw)
	}
	return nil
}

func isLoopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// storePath turns a --store value into a bolt file path (see parseStore
// for every kind of store).
func storePath(s string) (string, error) {
	switch {
	case s == "":
		return "", errors.New("empty store")
	case strings.HasPrefix(s, "bolt:"):
		p := strings.TrimPrefix(s, "bolt:")
		if p == "" {
			return "", errors.New("bolt: needs a file path")
		}
		return p, nil
	case isPostgresStore(s):
		return "", errors.New("unsupported store for this command: it works on a bolt file (bolt:PATH), and the store given is PostgreSQL")
	case strings.Contains(s, "://"):
		return "", fmt.Errorf("%q: unsupported store (want bolt:PATH, a path, or postgres://…)", redactStore(s))
	}
	return s, nil
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
