package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/sidecar"
	"credbroker/vault"
)

// sidecarConfig is the sidecar API listener (off unless Addr or Socket is set).
type sidecarConfig struct {
	Addr      string
	Socket    string
	Secret    vault.Secret // BROKER_SIDECAR_SECRET
	Audiences []string     // accepted user-token audiences (default: the MCP resource)
}

func (c sidecarConfig) enabled() bool { return c.Addr != "" || c.Socket != "" }

// validate reports every problem with the sidecar settings.
func (c sidecarConfig) validate() []error {
	var errs []error
	if !c.enabled() {
		return nil
	}
	if c.Addr != "" && c.Socket != "" {
		errs = append(errs, errors.New("--sidecar-addr and --sidecar-socket: give one"))
	}
	if c.Addr != "" {
		host, _, err := net.SplitHostPort(c.Addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("--sidecar-addr %q: %v", c.Addr, err))
		} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			errs = append(errs, fmt.Errorf("--sidecar-addr %q: the sidecar API listens on loopback only (or use --sidecar-socket)", c.Addr))
		}
	}
	if len(c.Secret.Reveal()) < 16 {
		errs = append(errs, errors.New("the sidecar API needs BROKER_SIDECAR_SECRET (at least 16 characters)"))
	}
	return errs
}

// newSidecarConfig builds the sidecar settings from flag values and the
// environment (BROKER_SIDECAR_SECRET).
func newSidecarConfig(addr, socket, audiences string) sidecarConfig {
	c := sidecarConfig{Addr: addr, Socket: socket, Secret: vault.Secret(os.Getenv("BROKER_SIDECAR_SECRET"))}
	for a := range strings.SplitSeq(audiences, ",") {
		if a = strings.TrimSpace(a); a != "" {
			c.Audiences = append(c.Audiences, a)
		}
	}
	return c
}

// startSidecar serves the sidecar API until ctx ends. The listener is
// opened before returning, so a bad address fails the start.
func startSidecar(ctx context.Context, d brokerDeps, conns *connections.Service) error {
	c := d.Sidecar
	if !c.enabled() {
		return nil
	}
	auds := c.Audiences
	if len(auds) == 0 {
		auds = []string{d.Resource}
	}
	verify, err := bearer.NewJWTVerifier(d.Issuer, auds, d.HTTPClient, nil)
	if err != nil {
		return fmt.Errorf("sidecar: %w", err)
	}
	log := d.Logger.With("component", "sidecar")
	h, err := sidecar.New(sidecar.Options{
		Secret: c.Secret, Verify: bearer.Cached(verify, 10000, nil), Connections: conns,
		StateKeys: d.Keys.Derive("requestState"), StateTTL: d.StateTTL,
		Logger: log, RequiredScope: d.RequiredScope,
	})
	if err != nil {
		return err
	}
	var ln net.Listener
	if c.Socket != "" {
		ln, err = listenUnixPrivate(c.Socket)
	} else {
		ln, err = net.Listen("tcp", c.Addr)
	}
	if err != nil {
		return fmt.Errorf("sidecar listener: %w", err)
	}
	srv := newHTTPServer(h, log)
	go func() {
		if err := serveUntilDone(ctx, srv, ln, log); err != nil {
			log.Error("sidecar API stopped", "err", err)
		}
	}()
	log.Info("sidecar API serving", "addr", ln.Addr().String())
	return nil
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
