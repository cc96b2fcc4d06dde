package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"credbroker/internal/buildinfo"
	"credbroker/internal/egress"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/memstore"
)

// upstreamConfig is how the broker reaches the remote MCP servers of
// type: mcp entries (the gateway).
type upstreamConfig struct {
	// AllowPrivate lets upstream requests reach loopback, private and
	// other special-use addresses (and plain http on loopback).
	AllowPrivate bool
	// AllowUnauthenticated permits entries with auth: none.
	AllowUnauthenticated bool
	// ClientMetadataURL is the broker's Client ID Metadata Document
	// (default <public-url>/oauth/client-metadata.json).
	ClientMetadataURL string
	// MaxCallTimeout caps every entry's call_timeout.
	MaxCallTimeout time.Duration
	// AllowedHosts, when set, are the only hosts the gateway reaches
	// (broker dev: its own listener).
	AllowedHosts []string
}

func (c *upstreamConfig) flags(fs *flag.FlagSet) {
	fs.BoolVar(&c.AllowPrivate, "upstream-allow-private", false, "let the gateway reach upstream MCP servers and their authorization servers on loopback, private and other special-use addresses (and plain http on loopback)")
	fs.BoolVar(&c.AllowUnauthenticated, "upstream-allow-unauthenticated", false, "allow type: mcp entries with auth: none (servers that take no token: every signed-in person may use them)")
	fs.StringVar(&c.ClientMetadataURL, "client-metadata-url", os.Getenv("BROKER_CLIENT_METADATA_URL"), "the broker's Client ID Metadata Document, its client_id at upstream authorization servers that support them; must be https (default <public-url>/oauth/client-metadata.json)")
	fs.DurationVar(&c.MaxCallTimeout, "upstream-max-call-timeout", provider.MaxCallTimeout, "the longest mcp.call_timeout a type: mcp entry may set, from 1s to 10m")
}

// validate reports the flags' problems.
func (c *upstreamConfig) validate() []error {
	var errs []error
	if !c.maxCallTimeoutValid() {
		errs = append(errs, fmt.Errorf("--upstream-max-call-timeout %s: must be between 1s and %s", c.MaxCallTimeout, provider.MaxCallTimeout))
	}
	if c.ClientMetadataURL != "" {
		if err := checkBaseURL(c.ClientMetadataURL); err != nil {
			errs = append(errs, fmt.Errorf("--client-metadata-url: %v", err))
		}
	}
	return errs
}

// maxCallTimeoutValid reports whether --upstream-max-call-timeout is in
// its range, 1s to provider.MaxCallTimeout.
func (c *upstreamConfig) maxCallTimeoutValid() bool {
	return c.MaxCallTimeout >= time.Second && c.MaxCallTimeout <= provider.MaxCallTimeout
}

// metadataURL is the Client ID Metadata Document URL for publicURL.
func (c *upstreamConfig) metadataURL(publicURL string) string {
	if c.ClientMetadataURL != "" {
		return c.ClientMetadataURL
	}
	return strings.TrimSuffix(publicURL, "/") + "/oauth/client-metadata.json"
}

// checkProviders reports the type: mcp entries the flags do not allow,
// publicURL being the broker's (--public-url): what `broker serve`, `broker
// dev` and `broker upstreams check` refuse to start with.
func (c *upstreamConfig) checkProviders(reg *provider.Registry, publicURL string) []error {
	var errs []error
	for _, name := range reg.Names() {
		errs = append(errs, c.checkProvider(reg, name, publicURL)...)
	}
	return errs
}

// checkProvider reports entry name's problems with the flags (none for an
// entry of another type).
func (c *upstreamConfig) checkProvider(reg *provider.Registry, name, publicURL string) []error {
	p, ok := reg.Lookup(name)
	if !ok {
		return nil
	}
	g, ok := p.Kind.(provider.Gateway)
	if !ok {
		return nil
	}
	var errs []error
	up := g.Upstream()
	if up.Open && !c.AllowUnauthenticated {
		errs = append(errs, fmt.Errorf("provider %s: auth: none relays every signed-in person's calls to %s with no account of theirs; start the broker with --upstream-allow-unauthenticated to allow it", name, up.URL))
	}
	if c.maxCallTimeoutValid() && up.CallTimeout > c.MaxCallTimeout && up.CallTimeoutSet {
		// An entry that sets none has the default, which the maximum
		// lowers rather than refuses (Registry.LimitCallTimeouts, once
		// the checks pass). A maximum out of its range is a problem of
		// the flag's, reported as such.
		errs = append(errs, fmt.Errorf("%s: %s: mcp.call_timeout %s is over --upstream-max-call-timeout %s; lower mcp.call_timeout or raise --upstream-max-call-timeout",
			reg.At(name, "mcp", "call_timeout"), name, up.CallTimeout, c.MaxCallTimeout))
	}
	if err := c.checkRegistration(reg, name, publicURL); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkRegistration reports entry name's mcp.registration when the flags
// make it impossible, so the broker refuses to start rather than fail each
// connect at discovery: cimd needs the broker's Client ID Metadata
// Document at an https URL (the provider package uses it at no other),
// and --client-metadata-url, or <public-url>/oauth/client-metadata.json
// without it, may be http. auto is never refused: it passes over the
// document when its URL is not https.
func (c *upstreamConfig) checkRegistration(reg *provider.Registry, name, publicURL string) error {
	p, _ := reg.Lookup(name)
	m, ok := p.Kind.(*provider.MCP)
	if !ok || m.Registration != "cimd" {
		return nil
	}
	doc := c.metadataURL(publicURL)
	if strings.HasPrefix(doc, "https://") || checkBaseURL(doc) != nil {
		// No URL at all is a problem of --public-url's or
		// --client-metadata-url's, reported as such.
		return nil
	}
	from := ""
	if c.ClientMetadataURL == "" {
		from = ", from --public-url"
	}
	return fmt.Errorf("%s: %s: registration cimd needs an https client metadata URL (--client-metadata-url is %s%s); give the broker an https --public-url or --client-metadata-url, or another mcp.registration (auto skips the document when it is not https)",
		reg.At(name, "mcp", "registration"), name, doc, from)
}

// httpClients are the egress clients: auth for authorization servers
// (discovery, registration, tokens, revocation: 30 seconds each), mcp for
// the MCP sessions (each call bounded by its entry's call_timeout).
func (c *upstreamConfig) httpClients() (auth, mcp *http.Client, err error) {
	base := egress.Options{AllowPrivate: c.AllowPrivate, AllowLoopbackHTTP: c.AllowPrivate, AllowedHosts: c.AllowedHosts,
		DialTimeout: 5 * time.Second, TLSHandshakeTimeout: 5 * time.Second}
	a := base
	a.ResponseHeaderTimeout = 15 * time.Second
	a.MaxResponseBytes = 1 << 20
	if auth, err = egress.New(a); err != nil {
		return nil, nil, err
	}
	m := base
	m.Timeout = -1
	if mcp, err = egress.New(m); err != nil {
		return nil, nil, err
	}
	return auth, mcp, nil
}

const upstreamsUsage = `usage: broker upstreams check [PROVIDER] [--providers FILE] [--public-url URL] [--upstream-allow-private]
                                [--upstream-allow-unauthenticated] [--client-metadata-url URL] [--upstream-max-call-timeout D]
       broker upstreams forget PROVIDER [--store STORE] [--keys-file F] [--upstream-issuer URL] [--providers FILE] [--public-url URL] [--upstream-allow-private]
                                [--upstream-allow-unauthenticated] [--client-metadata-url URL] [--upstream-max-call-timeout D]

PROVIDER may come before, between or after the flags.

check: checks each type: mcp entry (or only PROVIDER): its protected-resource
and authorization-server metadata, how the broker would register there, the
scopes a connect asks for, and the protocol era the server speaks. It
registers nothing and stores nothing. It refuses, as serve does, entries
the flags do not allow (give it serve's flags), and exits 1 when any
entry's check found a problem, once every entry is printed.

forget: deletes the broker's dynamic registration (RFC 7591) at PROVIDER's
authorization server from the store, so the next connect registers anew;
it prints the client id and issuer it deleted, never a secret. The issuer
is discovered from the server's metadata unless --upstream-issuer names it.
A bolt store must not be in use by a running broker.
`

// runUpstreams is `broker upstreams check` and `broker upstreams forget`.
func runUpstreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) > 0 && args[0] == "check":
		return runUpstreamsCheck(ctx, args[1:], stdout, stderr)
	case len(args) > 0 && args[0] == "forget":
		return runUpstreamsForget(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, upstreamsUsage)
	return usageError{"want: broker upstreams check [PROVIDER] or broker upstreams forget PROVIDER"}
}

// upstreamFlags are the flags of both upstreams commands: the egress
// policy, the catalogue, the public URL.
type upstreamFlags struct {
	uc              upstreamConfig
	file, publicURL string
}

func (f *upstreamFlags) register(fs *flag.FlagSet) {
	f.uc.flags(fs)
	fs.StringVar(&f.file, "providers", envOr("BROKER_PROVIDERS", "providers.yaml"), "provider catalogue")
	fs.StringVar(&f.publicURL, "public-url", envOr("BROKER_PUBLIC_URL", "http://127.0.0.1:8080"), "the broker's external base URL (names its redirect URI and metadata document)")
}

// load checks the flags and loads the catalogue.
func (f *upstreamFlags) load() (*provider.Registry, error) {
	if errs := f.uc.validate(); len(errs) > 0 {
		return nil, usageError{errors.Join(errs...).Error()}
	}
	return provider.LoadProviders(f.file, os.Getenv)
}

// client is a provider client of reg for the upstreams commands on store,
// its audit events to audit (nil: none).
func (f *upstreamFlags) client(reg *provider.Registry, store vault.Store, audit io.Writer) (*provider.Client, error) {
	authHTTP, _, err := f.uc.httpClients()
	if err != nil {
		return nil, err
	}
	opts := provider.Options{Store: store, Providers: reg, HTTPClient: outboundClient(), UpstreamHTTPClient: authHTTP,
		UpstreamClients: store.UpstreamClients(), BrokerURL: f.publicURL, ClientMetadataURL: f.uc.metadataURL(f.publicURL),
		Logger: slog.New(slog.DiscardHandler)}
	if audit != nil {
		opts.Telemetry = telemetry.New(telemetry.Options{Providers: reg.Names(), Audit: newLogger(audit, "text", slog.LevelInfo)})
	}
	return provider.New(opts)
}

// runUpstreamsCheck is `broker upstreams check`.
func runUpstreamsCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("upstreams check", flag.ContinueOnError)
	var f upstreamFlags
	f.register(fs)
	only, err := parseFlags(fs, args, stderr, 1)
	if err != nil {
		return err
	}
	reg, err := f.load()
	if err != nil {
		return err
	}
	var names []string
	var problems []error
	for _, n := range reg.Names() {
		p, _ := reg.Lookup(n)
		if _, ok := p.Kind.(provider.Gateway); ok && (len(only) == 0 || only[0] == n) {
			names = append(names, n)
			// What serve refuses to start with, this refuses to check.
			problems = append(problems, f.uc.checkProvider(reg, n, f.publicURL)...)
		}
	}
	if len(names) == 0 {
		if len(only) == 1 {
			return fmt.Errorf("%s has no type: mcp provider %q", f.file, only[0])
		}
		return fmt.Errorf("%s has no type: mcp providers", f.file)
	}
	if len(problems) > 0 {
		// serve would refuse to start: nothing to check.
		return fmt.Errorf("configuration has problems:\n%w", errors.Join(problems...))
	}
	_, mcpHTTP, err := f.uc.httpClients()
	if err != nil {
		return err
	}
	// An empty in-memory store: the check reads no connection and keeps
	// nothing.
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		return err
	}
	client, err := f.client(reg, memstore.New(kr), nil)
	if err != nil {
		return err
	}
	pool := mcpup.New(mcpup.Options{HTTPClient: mcpHTTP, Version: buildinfo.Get().Version})
	defer pool.Close() // the probes' sessions end before the command does
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROVIDER\tURL\tISSUER\tREGISTRATION\tSCOPES\tERA")
	failed := 0
	for _, n := range names {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c, err := client.CheckUpstream(cctx, n)
		era, eraErr := upstreamEra(cctx, pool, n, c)
		cancel()
		if err != nil || eraErr != nil {
			// Every entry is checked and printed; any problem fails the
			// command.
			failed++
		}
		if err != nil {
			fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t%s\n", n, c.URL, "error: "+err.Error(), era)
			continue
		}
		issuer, reg, scopes := c.Issuer, c.Registration, strings.Join(c.Scopes, " ")
		if c.Open {
			issuer, reg, scopes = "(auth: none)", "-", "-"
		}
		if scopes == "" {
			scopes = "(none)"
		}
		if c.IDJAG != "" {
			reg += " (" + c.IDJAG + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n, c.URL, issuer, reg, scopes, era)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d upstream(s) failed the check", failed, len(names))
	}
	return nil
}

// upstreamEra probes the protocol version of provider n's server without
// a token: an OAuth-protected server usually refuses that, which is
// reported as such. It returns the ERA column, and the probe's error when
// that is a problem (the column then says it).
func upstreamEra(ctx context.Context, pool *mcpup.Pool, n string, c provider.UpstreamCheck) (string, error) {
	era, err := pool.Probe(ctx, mcpup.Target{Provider: n, URL: c.URL})
	switch {
	case errors.Is(err, mcpup.ErrTokenRequired) && !c.Open:
		return "(needs a connection to tell)", nil
	case err != nil:
		return "error: " + err.Error(), err
	}
	return era, nil
}

// runUpstreamsForget is `broker upstreams forget PROVIDER`: it deletes
// the stored dynamic registration at the provider's authorization server
// (the server forgot it, or it must be made anew), printing what it
// deleted and never a secret.
func runUpstreamsForget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("upstreams forget", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f upstreamFlags
	f.register(fs)
	var k keyFlags
	fs.StringVar(&k.keysFile, "keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	fs.StringVar(&k.store, "store", envOr("BROKER_STORE", "bolt:./data/broker.db"), "store: bolt:PATH (or a plain path) or a postgres:// URL")
	issuer := fs.String("upstream-issuer", "", "the authorization server's issuer, exactly as broker upstreams check prints it (default: discovered from the server's metadata)")
	// PROVIDER may come before the flags or after them.
	positional, err := parseFlags(fs, args, stderr, 1)
	if err != nil {
		return err
	}
	if len(positional) == 0 {
		return usageError{"upstreams forget: name the provider whose registration to delete"}
	}
	name := positional[0]
	reg, err := f.load()
	if err != nil {
		return err
	}
	if _, ok := reg.Lookup(name); !ok {
		return fmt.Errorf("%s has no provider %q (its providers: %s)", f.file, name, strings.Join(reg.Names(), ", "))
	}
	kr, err := loadKeys(k.keysFile)
	if err != nil {
		return err
	}
	store, err := openExistingStore(k.store, kr)
	if errors.Is(err, boltstore.ErrLocked) {
		return fmt.Errorf("%w\nA running broker holds this bolt file (a bolt store belongs to one process): stop it, run the command, and start it again", err)
	}
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := f.client(reg, store, stderr)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := client.ForgetUpstreamClient(cctx, name, *issuer)
	var ue *provider.UpstreamError
	switch {
	case errors.Is(err, vault.ErrNotFound):
		at, redirect, _ := strings.Cut(c.Key, " ")
		return fmt.Errorf("no registration of the broker is stored for %s: none at issuer %s for redirect URI %s; nothing was deleted", name, at, redirect)
	case errors.As(err, &ue):
		return fmt.Errorf("%w; name the issuer with --upstream-issuer to delete its registration without discovery", err)
	case err != nil:
		return err
	}
	at, redirect, _ := strings.Cut(c.Key, " ")
	fmt.Fprintf(stdout, "deleted the registration of %s: client_id %s at issuer %s (redirect URI %s, registered %s); the next connect registers anew\n",
		name, c.ClientID, at, redirect, c.Created.UTC().Format(time.RFC3339))
	return nil
}
