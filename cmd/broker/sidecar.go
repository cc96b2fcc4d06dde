package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/sidecar"
	"credbroker/vault"
	"credbroker/web"
)

// sidecarConfig is the sidecar API listener (off unless Addr or Socket is set).
type sidecarConfig struct {
	Addr   string
	Socket string
	// Listener, when set, is the already open listener (broker dev opens
	// it first to learn whether its default address is free).
	Listener net.Listener
	// Secret is BROKER_SIDECAR_SECRET: the unnamed co-located server.
	Secret vault.Secret
	// SecretsFile holds one "name:secret [providers=a,b]" line per named
	// co-located server (--sidecar-secrets-file).
	SecretsFile string
	// Callers, when set, are used instead of Secret and SecretsFile
	// (broker dev's own server).
	Callers []sidecar.Caller
	// Audiences is --sidecar-audiences: AUDIENCE[=SCOPE],… (default: the
	// MCP resource URI with --required-scope).
	Audiences string
}

func (c sidecarConfig) enabled() bool { return c.Addr != "" || c.Socket != "" || c.Listener != nil }

// validate reports every problem with the sidecar settings.
func (c sidecarConfig) validate() []error {
	var errs []error
	if !c.enabled() {
		if c.SecretsFile != "" {
			errs = append(errs, errors.New("--sidecar-secrets-file is set but the sidecar API is off: give --sidecar-addr or --sidecar-socket"))
		}
		return errs
	}
	if c.Addr != "" && c.Socket != "" {
		errs = append(errs, errors.New("--sidecar-addr and --sidecar-socket: give one"))
	}
	if c.Addr != "" {
		if err := checkSidecarAddr(c.Addr); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := c.callers(); err != nil {
		errs = append(errs, err)
	}
	if _, err := c.audiences("", ""); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkSidecarAddr accepts loopback host:port addresses only.
func checkSidecarAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--sidecar-addr %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--sidecar-addr %q: the sidecar API listens on loopback only (or use --sidecar-socket)", addr)
	}
	return nil
}

// callers are the co-located servers allowed in: the unnamed one of
// BROKER_SIDECAR_SECRET and the named ones of the secrets file.
func (c sidecarConfig) callers() ([]sidecar.Caller, error) {
	if len(c.Callers) > 0 {
		return c.Callers, nil
	}
	var out []sidecar.Caller
	var errs []error
	if s := c.Secret.Reveal(); s != "" {
		if len(s) < 16 {
			errs = append(errs, errors.New("BROKER_SIDECAR_SECRET must be at least 16 characters"))
		}
		out = append(out, sidecar.Caller{Name: vault.UnnamedServer, Secret: c.Secret})
	}
	if c.SecretsFile != "" {
		named, err := readSidecarSecrets(c.SecretsFile)
		if err != nil {
			errs = append(errs, err)
		}
		for _, n := range named {
			for _, o := range out {
				if n.Secret.Reveal() == o.Secret.Reveal() {
					errs = append(errs, fmt.Errorf("--sidecar-secrets-file: %s has the secret of BROKER_SIDECAR_SECRET: each server needs its own", n.Name))
				}
			}
		}
		out = append(out, named...)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("the sidecar API needs a secret: BROKER_SIDECAR_SECRET (one unnamed server) or --sidecar-secrets-file (name:secret lines)"))
	}
	return out, errors.Join(errs...)
}

// readSidecarSecrets parses a secrets file: blank lines and # comments
// aside, one server per line,
//
//	name:secret
//	name:secret providers=github,google
//
// Every problem is reported with its line number; secrets never appear in
// an error.
func readSidecarSecrets(path string) ([]sidecar.Caller, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--sidecar-secrets-file: %w", err)
	}
	var out []sidecar.Caller
	var errs []error
	names, secrets := map[string]int{}, map[string]int{}
	bad := func(n int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s line %d: %s", path, n, fmt.Sprintf(format, args...)))
	}
	for i, line := range strings.Split(string(b), "\n") {
		n := i + 1
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		name, secret, ok := strings.Cut(fields[0], ":")
		if !ok || name == "" || secret == "" {
			bad(n, "want name:secret (then optionally providers=a,b)")
			continue
		}
		c := sidecar.Caller{Name: name, Secret: vault.Secret(secret)}
		switch {
		case name == vault.UnnamedServer:
			bad(n, "the name %q is reserved for BROKER_SIDECAR_SECRET", name)
		case !sidecar.ValidCallerName(name):
			bad(n, "the name %q: use lowercase letters, digits, '.', '_' and '-' (at most 64)", name)
		case names[name] != 0:
			bad(n, "the name %q is already on line %d", name, names[name])
		}
		names[name] = n
		if len(secret) < 16 {
			bad(n, "the secret of %s must be at least 16 characters", name)
		} else if secrets[secret] != 0 {
			bad(n, "%s has the same secret as line %d: each server needs its own", name, secrets[secret])
		}
		secrets[secret] = n
		for _, opt := range fields[1:] {
			k, v, _ := strings.Cut(opt, "=")
			if k != "providers" || v == "" {
				bad(n, "unknown option %q (the one option is providers=a,b)", k)
				continue
			}
			for p := range strings.SplitSeq(v, ",") {
				if p = strings.TrimSpace(p); p != "" {
					c.Providers = append(c.Providers, p)
				}
			}
		}
		out = append(out, c)
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s: no server in the file", path))
	}
	return out, errors.Join(errs...)
}

// audiences parses --sidecar-audiences: comma-separated AUDIENCE or
// AUDIENCE=SCOPE entries. Empty: the MCP resource URI with the MCP
// endpoint's required scope. An entry naming the MCP resource URI
// without a scope of its own keeps the MCP endpoint's required scope (the
// same tokens must not get in here with less); every other entry requires
// only its own scope, if any.
func (c sidecarConfig) audiences(resource, requiredScope string) ([]sidecar.Audience, error) {
	if strings.TrimSpace(c.Audiences) == "" {
		return []sidecar.Audience{{URI: resource, RequiredScope: requiredScope}}, nil
	}
	var out []sidecar.Audience
	var errs []error
	seen := map[string]bool{}
	for e := range strings.SplitSeq(c.Audiences, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		uri, scope, hasScope := strings.Cut(e, "=")
		uri, scope = strings.TrimSpace(uri), strings.TrimSpace(scope)
		switch {
		case uri == "" || strings.ContainsAny(uri, " \t"):
			errs = append(errs, fmt.Errorf("--sidecar-audiences entry %q: want AUDIENCE or AUDIENCE=SCOPE", e))
			continue
		case hasScope && (scope == "" || strings.ContainsAny(scope, " \t")):
			errs = append(errs, fmt.Errorf("--sidecar-audiences entry %q: the scope after = is one scope", e))
			continue
		case seen[uri]:
			errs = append(errs, fmt.Errorf("--sidecar-audiences: %q is listed twice", uri))
			continue
		}
		seen[uri] = true
		if !hasScope && uri == resource {
			scope = requiredScope
		}
		out = append(out, sidecar.Audience{URI: uri, RequiredScope: scope})
	}
	if len(out) == 0 && len(errs) == 0 {
		errs = append(errs, errors.New("--sidecar-audiences lists no audience"))
	}
	return out, errors.Join(errs...)
}

// newSidecarConfig builds the sidecar settings from flag values and the
// environment (BROKER_SIDECAR_SECRET).
func newSidecarConfig(addr, socket, secretsFile, audiences string) sidecarConfig {
	return sidecarConfig{Addr: addr, Socket: socket, SecretsFile: secretsFile, Audiences: audiences,
		Secret: vault.Secret(os.Getenv("BROKER_SIDECAR_SECRET"))}
}

// startSidecar serves the sidecar API until ctx ends. The listener is
// opened before returning, so a bad address fails the start. It returns
// the address served ("" when off). brokerTokens is the built-in
// authorization server's verifier (nil in issuer mode): then the sidecar
// accepts the broker's tokens (audience: the MCP resource, with its
// required scope), and the IdP's JWTs only for audiences given explicitly
// with --sidecar-audiences.
func startSidecar(ctx context.Context, d brokerDeps, conns *connections.Service, brokerTokens bearer.Verifier) (string, error) {
	c := d.Sidecar
	if !c.enabled() {
		return "", nil
	}
	callers, err := c.callers()
	if err != nil {
		return "", fmt.Errorf("sidecar: %w", err)
	}
	auds, err := c.audiences(d.Resource, d.RequiredScope)
	if err != nil {
		return "", fmt.Errorf("sidecar: %w", err)
	}
	verify := brokerTokens
	if brokerTokens == nil || strings.TrimSpace(c.Audiences) != "" {
		uris := make([]string, len(auds))
		for i, a := range auds {
			uris[i] = a.URI
		}
		idp, err := bearer.NewJWTVerifier(d.Issuer, uris, d.HTTPClient, nil)
		if err != nil {
			return "", fmt.Errorf("sidecar: %w", err)
		}
		verify = bearer.Cached(idp, 10000, nil)
		if brokerTokens != nil {
			verify = bearer.ByIssuer(map[string]bearer.Verifier{d.PublicURL: brokerTokens}, verify)
		}
	}
	if brokerTokens != nil && !slices.ContainsFunc(auds, func(a sidecar.Audience) bool { return a.URI == d.Resource }) {
		auds = append(auds, sidecar.Audience{URI: d.Resource, RequiredScope: d.RequiredScope})
	}
	log := d.Logger.With("component", "sidecar")
	h, err := sidecar.New(sidecar.Options{
		Callers: callers, Verify: verify, Audiences: auds, Connections: conns,
		StateKeys: d.Keys.Derive("requestState"), StateTTL: d.StateTTL,
		Logger: log, Telemetry: d.Telemetry, Tracing: d.Tracing,
	})
	if err != nil {
		return "", err
	}
	ln := c.Listener
	switch {
	case ln != nil:
	case c.Socket != "":
		ln, err = listenUnixPrivate(c.Socket)
	default:
		ln, err = net.Listen("tcp", c.Addr)
	}
	if err != nil {
		return "", fmt.Errorf("sidecar listener: %w", err)
	}
	// An API of its own listener: the same policy as the main listener's
	// API side (no cookie reaches it).
	srv := newHTTPServer(web.APIPolicy(h), log)
	go func() {
		if err := serveUntilDone(ctx, srv, ln, log); err != nil {
			log.Error("sidecar API stopped", "err", err)
		}
	}()
	names := make([]string, len(callers))
	for i, c := range callers {
		names[i] = c.Name
	}
	log.Info("sidecar API serving", "addr", ln.Addr().String(), "servers", strings.Join(names, ","))
	return ln.Addr().String(), nil
}

// listenUnixPrivate listens on a Unix socket at path that is never more
// open than 0600, whatever the umask: the socket is created inside a fresh
// 0700 directory next to path, set to 0600 there, and only then linked
// into place (link, unlike rename, never replaces an existing file). A
// stale socket at path from an earlier run is removed first; any other
// file there is an error. Closing the listener removes path.
func listenUnixPrivate(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		os.Remove(path) // a stale socket of an earlier run
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".sidecar-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // tmp goes with dir; path is removed by Close
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Link(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	return &unixListener{UnixListener: ln, path: path}, nil
}

// unixListener reports the socket's final path and removes it on Close.
type unixListener struct {
	*net.UnixListener
	path string
	once sync.Once
}

func (l *unixListener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

func (l *unixListener) Close() error {
	err := l.UnixListener.Close()
	l.once.Do(func() { os.Remove(l.path) })
	return err
}
