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
}

func (c *serveConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "addr", envOr("BROKER_ADDR", "127.0.0.1:8080"), "listen address (env BROKER_ADDR)")
	fs.StringVar(&c.PublicURL, "public-url", os.Getenv("BROKER_PUBLIC_URL"), "external base URL of the broker, e.g. https://broker.example.com (env BROKER_PUBLIC_URL)")
	fs.StringVar(&c.Resource, "resource", os.Getenv("BROKER_RESOURCE"), "MCP resource URI, the audience bearer tokens must carry (default <public-url>/mcp)")
	fs.StringVar(&c.Issuer, "issuer", os.Getenv("BROKER_ISSUER"), "the organisation's OIDC issuer URL (env BROKER_ISSUER)")
	fs.StringVar(&c.ClientID, "client-id", os.Getenv("BROKER_CLIENT_ID"), "the broker's OIDC client id at the issuer (env BROKER_CLIENT_ID)")
	fs.StringVar(&c.SecretFile, "client-secret-file", os.Getenv("BROKER_CLIENT_SECRET_FILE"), "file holding the broker's OIDC client secret (or env BROKER_CLIENT_SECRET)")
	fs.StringVar(&c.ProvidersFile, "providers", envOr("BROKER_PROVIDERS", "providers.yaml"), "provider catalogue")
	fs.StringVar(&c.Store, "store", envOr("BROKER_STORE", "bolt:./data/broker.db"), "store: bolt:PATH (or a plain path)")
	fs.StringVar(&c.KeysFile, "keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	fs.StringVar(&c.RequiredScope, "required-scope", os.Getenv("BROKER_REQUIRED_SCOPE"), "scope every MCP bearer token must carry (optional)")
	fs.DurationVar(&c.GrantTTL, "grant-ttl", 10*time.Minute, "how long a connect link stays usable")
	fs.DurationVar(&c.StateTTL, "state-ttl", 10*time.Minute, "how long a sealed requestState stays valid")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&c.CheckConfig, "check-config", false, "validate the configuration and providers, then exit")
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
	if _, err := storePath(c.Store); err != nil {
		bad("--store: %v", err)
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("--addr %q: %v", c.Addr, err)
	}
	if c.GrantTTL < time.Minute || c.GrantTTL > time.Hour {
		bad("--grant-ttl %s: must be between 1m and 1h", c.GrantTTL)
	}
	if c.StateTTL < time.Minute || c.StateTTL > time.Hour {
		bad("--state-ttl %s: must be between 1m and 1h", c.StateTTL)
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

// storePath turns a --store value into a bolt file path.
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
	case strings.Contains(s, "://"):
		return "", fmt.Errorf("%q: unsupported store (this build supports bolt:PATH)", s)
	}
	return s, nil
}
