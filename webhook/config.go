package webhook

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/loopback"
	"credbroker/vault"
)

// Event types. Endpoints choose among them; app.* are sent once the
// broker's authorization server reports them (Publisher.Publish).
const (
	ConnectionCreated        = "connection.created"
	ConnectionReconnected    = "connection.reconnected"
	ConnectionNeedsReconnect = "connection.needs_reconnect"
	ConnectionDeleted        = "connection.deleted"
	ConnectionRefreshFailed  = "connection.refresh_failed"
	AppAuthorized            = "app.authorized"
	AppRemoved               = "app.removed"
)

// Types lists every event type.
func Types() []string {
	return []string{ConnectionCreated, ConnectionReconnected, ConnectionNeedsReconnect, ConnectionDeleted,
		ConnectionRefreshFailed, AppAuthorized, AppRemoved}
}

// Endpoint is one configured receiver.
type Endpoint struct {
	// Name identifies the endpoint in the outbox, logs and metrics.
	Name string
	// URL receives POST requests (https; http only on loopback).
	URL string
	// Keys are the HMAC-SHA256 keys (whsec_ secrets decoded); each signs
	// every message, so a receiver can move to a new secret without a
	// gap (the Standard Webhooks rotation).
	Keys []vault.Secret
	// Events are the types sent to this endpoint; empty: all of them.
	Events []string
}

// Wants reports whether the endpoint receives events of type typ.
func (e Endpoint) Wants(typ string) bool {
	return len(e.Events) == 0 || slices.Contains(e.Events, typ)
}

// Config is the validated set of endpoints.
type Config struct {
	Endpoints []Endpoint
}

// Names returns the endpoint names.
func (c *Config) Names() []string {
	if c == nil {
		return nil
	}
	var out []string
	for _, e := range c.Endpoints {
		out = append(out, e.Name)
	}
	return out
}

// Empty reports whether no endpoint is configured.
func (c *Config) Empty() bool { return c == nil || len(c.Endpoints) == 0 }

// fileSpec is the document shape of a webhooks file:
//
//	endpoints:
//	  ops:
//	    url: https://ops.example.com/hooks/credbroker
//	    secret: ${CREDBROKER_WEBHOOK_SECRET}     # or secret_file: /run/secrets/…
//	    events: [connection.deleted, connection.needs_reconnect]   # default: all
type fileSpec struct {
	Endpoints map[string]endpointSpec `yaml:"endpoints"`
}

type endpointSpec struct {
	URL        string   `yaml:"url"`
	Secret     string   `yaml:"secret"`
	SecretFile string   `yaml:"secret_file"`
	Events     []string `yaml:"events"`
}

var (
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	envRefRE = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$`)
)

// LoadConfig reads and validates a webhooks file; secrets come from the
// environment (${NAME}) or from secret_file. Every problem is reported at
// once.
func LoadConfig(path string, getenv func(string) string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	return ParseConfig(path, data, getenv)
}

// ParseConfig validates a webhooks document; name is used in messages.
func ParseConfig(name string, data []byte, getenv func(string) string) (*Config, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var f fileSpec
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("webhooks: %s: %v", name, err)
	}
	if len(f.Endpoints) == 0 {
		return nil, fmt.Errorf("webhooks: %s: no endpoints: want a top-level \"endpoints:\" map with at least one entry", name)
	}
	var errs []error
	cfg := &Config{}
	names := make([]string, 0, len(f.Endpoints))
	for n := range f.Endpoints {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		s := f.Endpoints[n]
		secret, err := resolveSecret(s, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: endpoint %s: %w", name, n, err))
			continue
		}
		e, err := NewEndpoint(n, s.URL, secret, s.Events)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
			continue
		}
		cfg.Endpoints = append(cfg.Endpoints, e)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("webhooks: %w", errors.Join(errs...))
	}
	return cfg, nil
}

func resolveSecret(s endpointSpec, getenv func(string) string) (string, error) {
	switch {
	case s.Secret != "" && s.SecretFile != "":
		return "", errors.New("give secret or secret_file, not both")
	case s.Secret != "":
		m := envRefRE.FindStringSubmatch(s.Secret)
		if m == nil {
			return "", errors.New("secret must be a reference ${NAME} to an environment variable (or use secret_file); secrets are never written in this file")
		}
		v := getenv(m[1])
		if v == "" {
			return "", fmt.Errorf("secret: environment variable %s is not set", m[1])
		}
		return v, nil
	case s.SecretFile != "":
		b, err := os.ReadFile(s.SecretFile)
		if err != nil {
			return "", fmt.Errorf("secret_file: cannot read %s", s.SecretFile)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return "", errors.New("secret or secret_file is required (a whsec_ secret)")
}

// NewEndpoint validates one endpoint: name, URL, secret (one or more
// whsec_ values separated by spaces, each 24 to 64 random bytes in
// base64) and event types.
func NewEndpoint(name, rawURL, secret string, events []string) (Endpoint, error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("endpoint %s: "+format, append([]any{name}, args...)...))
	}
	if !nameRE.MatchString(name) {
		bad("name: use 1-32 lowercase letters, digits, '-' or '_', starting with a letter")
	}
	if err := checkURL(rawURL); err != nil {
		bad("url: %v", err)
	}
	var keys []vault.Secret
	for _, s := range strings.Fields(secret) {
		k, err := ParseSecret(s)
		if err != nil {
			bad("secret: %v", err)
			continue
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 && len(errs) == 0 {
		bad("secret: empty")
	}
	var evs []string
	for _, ev := range events {
		if !slices.Contains(Types(), ev) {
			bad("events: unknown type %q (known: %s)", ev, strings.Join(Types(), ", "))
			continue
		}
		if !slices.Contains(evs, ev) {
			evs = append(evs, ev)
		}
	}
	if len(errs) > 0 {
		return Endpoint{}, errors.Join(errs...)
	}
	return Endpoint{Name: name, URL: rawURL, Keys: keys, Events: evs}, nil
}

// ParseSecret decodes a Standard Webhooks symmetric secret: "whsec_"
// followed by the base64 of 24 to 64 random bytes.
func ParseSecret(s string) (vault.Secret, error) {
	rest, ok := strings.CutPrefix(s, "whsec_")
	if !ok {
		return "", errors.New(`want a "whsec_" secret (whsec_ followed by base64)`)
	}
	k, err := base64.StdEncoding.DecodeString(rest)
	if err != nil {
		return "", errors.New("the part after whsec_ is not base64")
	}
	if len(k) < 24 || len(k) > 64 {
		return "", fmt.Errorf("the key is %d bytes; want 24 to 64", len(k))
	}
	return vault.Secret(k), nil
}

// checkURL accepts absolute https URLs without user info or fragment;
// http only on loopback.
func checkURL(raw string) error { return loopback.CheckURL(raw) }
