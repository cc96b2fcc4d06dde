package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"credbroker/authserver"
	"credbroker/internal/buildinfo"
	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
	"credbroker/webhook"
)

// usageError is a command-line mistake: exit status 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// parseFlags parses a subcommand's args into fs, whose flags are defined,
// writing its errors and usage to stderr, and allows at most maxArgs
// arguments besides the flags, before, between or after them (up to a
// "--", after which everything is an argument): it returns them. What is
// wrong is a usageError naming the subcommand.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, maxArgs int) ([]string, error) {
	fs.SetOutput(stderr)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{err.Error()}
		}
		rest := fs.Args()
		if consumed := args[:len(args)-len(rest)]; len(consumed) > 0 && consumed[len(consumed)-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if len(positional) > maxArgs {
		return nil, usageError{fmt.Sprintf("%s: unexpected argument %q", fs.Name(), positional[maxArgs])}
	}
	return positional, nil
}

func exitCode(err error) int {
	var u usageError
	if errors.As(err, &u) {
		return 2
	}
	return 1
}

const usage = `usage: broker <command> [flags]

commands:
  serve          run the broker (needs keys, an IdP and providers.yaml)
  dev            run the development stack on 127.0.0.1 (make run)
  keys generate  print a new random key line for BROKER_KEYS or --keys-file
  keys rotate    add a new primary key to --keys-file and re-encrypt every record
  keys status    how many records each key seals (when an old key can be removed)
  migrate        copy every record of a bolt store into PostgreSQL, or back (--from STORE --to STORE)
  admin          connections | offboard | provider disable (docs/OPERATIONS.md)
  upstreams      check [PROVIDER]: discovery and registration of type: mcp entries, storing nothing;
                 forget PROVIDER: delete the stored dynamic registration at its authorization server
  version        print the version, commit and build date
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "", usage, map[string]command{
		"serve": runServe, "keys": runKeys, "migrate": runMigrate, "dev": runDev, "admin": runAdmin,
		"upstreams": runUpstreams, "version": runVersion, "--version": runVersion,
	}, args, stdout, stderr)
}

// command is one subcommand: its arguments after its name.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// dispatch runs the command of cmds that args[0] names with the rest of
// args. No command or an unknown one prints usage to stderr and is a
// usage error (its message begins with prefix); help prints usage to
// stdout.
func dispatch(ctx context.Context, prefix, usage string, cmds map[string]command, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageError{prefix + "no command given"}
	}
	if c, ok := cmds[args[0]]; ok {
		return c(ctx, args[1:], stdout, stderr)
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return usageError{fmt.Sprintf("%sunknown command %q", prefix, args[0])}
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg serveConfig
	cfg.flags(fs)
	if _, err := parseFlags(fs, args, stderr, 0); err != nil {
		return err
	}
	cfg.KeysEnv = os.Getenv("BROKER_KEYS")
	cfg.ClientSecret = os.Getenv("BROKER_CLIENT_SECRET")

	// Everything that can be checked without side effects is checked
	// together, so an operator sees every problem at once.
	var problems []error
	if err := cfg.validate(); err != nil {
		problems = append(problems, err)
	}
	secret := cfg.ClientSecret
	if secret == "" && cfg.SecretFile != "" {
		b, err := os.ReadFile(cfg.SecretFile)
		if err != nil {
			problems = append(problems, fmt.Errorf("--client-secret-file: %w", err))
		}
		secret = strings.TrimSpace(string(b))
	}
	var keys *vault.Keyring
	if cfg.KeysEnv != "" || cfg.KeysFile != "" {
		kr, err := loadKeyring(cfg.KeysEnv, cfg.KeysFile)
		if err != nil {
			problems = append(problems, err)
		}
		keys = kr
	}
	providers, err := provider.LoadProviders(cfg.ProvidersFile, os.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	if providers != nil {
		problems = append(problems, cfg.Upstreams.checkProviders(providers, cfg.PublicURL)...)
	}
	sc := cfg.sidecar()
	var sidecarNames []string
	if callers, err := sc.callers(); sc.enabled() && err == nil {
		for _, c := range callers {
			sidecarNames = append(sidecarNames, c.Name)
			for _, p := range c.Providers {
				if providers == nil {
					break
				}
				if _, ok := providers.Lookup(p); !ok {
					problems = append(problems, fmt.Errorf("--sidecar-secrets-file: %s may use provider %q, which is not in %s", c.Name, p, cfg.ProvidersFile))
				}
			}
		}
	}
	hooks, err := cfg.Ops.Webhooks.load(os.Getenv)
	if err != nil {
		problems = append(problems, err)
	}
	if _, err := tracing.ConfigFromEnv(os.Getenv); err != nil {
		problems = append(problems, fmt.Errorf("tracing: %w", err))
	}
	if len(problems) > 0 {
		return fmt.Errorf("configuration has problems:\n%w", errors.Join(problems...))
	}
	// Entries that set no call_timeout get at most the operator's maximum.
	providers.LimitCallTimeouts(cfg.Upstreams.MaxCallTimeout)
	if cfg.CheckConfig {
		fmt.Fprintf(stdout, "configuration OK: %d provider(s): %s\n", len(providers.Names()), strings.Join(providers.Names(), ", "))
		return nil
	}

	level := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}[cfg.LogLevel]
	log := newLogger(stderr, cfg.LogFormat, level)
	tp, stopTracing, err := startTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	events := webhook.NewPublisher(hooks, nil)
	store, err := openStoreHooked(cfg.Store, keys, events)
	if err != nil {
		return err
	}
	defer store.Close()

	publicURL := strings.TrimSuffix(cfg.PublicURL, "/")
	resource := cfg.Resource
	if resource == "" {
		resource = publicURL + "/mcp"
	}
	rec := telemetry.New(telemetry.Options{Providers: providers.Names(), Audit: log, ProcessMetrics: true, SidecarServers: sidecarNames,
		WebhookEndpoints: hooks.Names()})
	mux := http.NewServeMux()
	var authCfg *authServerConfig
	if cfg.MCPAuth == "broker" {
		authCfg = &authServerConfig{
			Registration: cfg.Registration == "open", AllowPrivateMetadata: cfg.ClientMetadataAllowPrivate,
			AccessTokenTTL: cfg.AccessTokenTTL, RefreshTokenTTL: cfg.RefreshTokenTTL, RefreshIdleTTL: cfg.RefreshTokenIdle,
			IDJAGIssuers: splitList(cfg.IDJAGIssuers),
		}
		authCfg.IDJAG, _ = authserver.ParseIDJAGPolicy(cfg.IDJAG) // validated
	}
	m, err := mount(ctx, mux, brokerDeps{
		PublicURL: publicURL, Resource: resource, Issuer: cfg.Issuer,
		ClientID: cfg.ClientID, ClientSecret: vault.Secret(secret), RequiredScope: cfg.RequiredScope,
		GrantTTL: cfg.GrantTTL, StateTTL: cfg.StateTTL,
		Store: store, Keys: keys, Providers: providers, Logger: log, HTTPClient: outboundClient(),
		Telemetry: rec, MetricsOnMain: cfg.MetricsAddr == "", Tracing: tp,
		RefreshMargin: cfg.RefreshMargin,
		Sidecar:       sc,
		AuthServer:    authCfg,
		Events:        events,
		ClientAddr:    cfg.trusted().Addr,
		Upstreams:     cfg.Upstreams,
	})
	if err != nil {
		return err
	}
	if err := startOps(ctx, opsDeps{Config: cfg.Ops, Webhooks: hooks, Store: m.Store, Mounted: m, Providers: providers,
		Issuer: cfg.Issuer, PublicURL: publicURL, HTTP: outboundClient(), Telemetry: rec, Tracing: tp, Logger: log}); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("listen on --metrics-addr %s: %w", cfg.MetricsAddr, err)
		}
		mmux := http.NewServeMux()
		mmux.Handle("GET /metrics", rec.Handler())
		go serveUntilDone(ctx, newHTTPServer(web.APIPolicy(mmux), log), mln, log)
		log.Info("metrics serving", "addr", mln.Addr().String())
	}
	go collectGrants(ctx, m.Grants, log)
	// A finished rotation is a key_rotation audit event.
	startBackgroundRekey(ctx, m.Store, store, keys, log, rec)
	if t := cfg.trusted(); !t.Empty() {
		log.Info("client addresses from X-Forwarded-For", "trusted_proxies", t.String())
	}
	bi := buildinfo.Get()
	log.Info("credbroker serving", "addr", ln.Addr().String(), "public_url", publicURL, "mcp_auth", cfg.MCPAuth,
		"providers", strings.Join(providers.Names(), ","),
		"version", bi.Version, "commit", bi.Commit)
	srv := newHTTPServer(mux, log)
	srv.RegisterOnShutdown(m.MCP.EndStreams)
	err = serveUntilDone(ctx, srv, ln, log)
	// In-flight requests are done: end the upstream sessions (a
	// 2025-11-25 server is told).
	m.Upstreams.Close()
	return err
}
