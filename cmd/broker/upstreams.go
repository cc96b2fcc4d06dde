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
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
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
	fs.DurationVar(&c.MaxCallTimeout, "upstream-max-call-timeout", provider.MaxCallTimeout, "the longest call_timeout a type: mcp entry may set")
}

// validate reports the flags' problems.
func (c *upstreamConfig) validate() []error {
	var errs []error
	if c.MaxCallTimeout < time.Second || c.MaxCallTimeout > provider.MaxCallTimeout {
		errs = append(errs, fmt.Errorf("--upstream-max-call-timeout %s: must be between 1s and %s", c.MaxCallTimeout, provider.MaxCallTimeout))
	}
	if c.ClientMetadataURL != "" {
		if err := checkBaseURL(c.ClientMetadataURL); err != nil {
			errs = append(errs, fmt.Errorf("--client-metadata-url: %v", err))
		}
	}
	return errs
}

// metadataURL is the Client ID Metadata Document URL for publicURL.
func (c *upstreamConfig) metadataURL(publicURL string) string {
	if c.ClientMetadataURL != "" {
		return c.ClientMetadataURL
	}
	return strings.TrimSuffix(publicURL, "/") + "/oauth/client-metadata.json"
}

// checkProviders reports the type: mcp entries the flags do not allow.
func (c *upstreamConfig) checkProviders(reg *provider.Registry) []error {
	var errs []error
	for _, name := range reg.Names() {
		p, _ := reg.Lookup(name)
		g, ok := p.Kind.(provider.Gateway)
		if !ok {
			continue
		}
		up := g.Upstream()
		if up.Open && !c.AllowUnauthenticated {
			errs = append(errs, fmt.Errorf("provider %s: auth: none relays every signed-in person's calls to %s with no account of theirs; start the broker with --upstream-allow-unauthenticated to allow it", name, up.URL))
		}
		if up.CallTimeout > c.MaxCallTimeout {
			errs = append(errs, fmt.Errorf("provider %s: mcp.call_timeout %s is over --upstream-max-call-timeout %s", name, up.CallTimeout, c.MaxCallTimeout))
		}
	}
	return errs
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

Checks each type: mcp entry (or only PROVIDER): its protected-resource and
authorization-server metadata, how the broker would register there, the
scopes a connect asks for, and the protocol era the server speaks. It
registers nothing and stores nothing.
`

// runUpstreams is `broker upstreams check`.
func runUpstreams(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "check" {
		fmt.Fprint(stderr, upstreamsUsage)
		return usageError{"want: broker upstreams check [PROVIDER]"}
	}
	fs := flag.NewFlagSet("upstreams check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var uc upstreamConfig
	uc.flags(fs)
	file := fs.String("providers", envOr("BROKER_PROVIDERS", "providers.yaml"), "provider catalogue")
	publicURL := fs.String("public-url", envOr("BROKER_PUBLIC_URL", "http://127.0.0.1:8080"), "the broker's external base URL (names its redirect URI and metadata document)")
	if err := fs.Parse(args[1:]); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 1 {
		return usageError{fmt.Sprintf("upstreams check: unexpected argument %q", fs.Arg(1))}
	}
	if errs := uc.validate(); len(errs) > 0 {
		return usageError{errors.Join(errs...).Error()}
	}
	reg, err := provider.LoadProviders(*file, os.Getenv)
	if err != nil {
		return err
	}
	var names []string
	for _, n := range reg.Names() {
		p, _ := reg.Lookup(n)
		if _, ok := p.Kind.(provider.Gateway); ok && (fs.NArg() == 0 || fs.Arg(0) == n) {
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		if fs.NArg() == 1 {
			return fmt.Errorf("%s has no type: mcp provider %q", *file, fs.Arg(0))
		}
		return fmt.Errorf("%s has no type: mcp providers", *file)
	}
	authHTTP, mcpHTTP, err := uc.httpClients()
	if err != nil {
		return err
	}
	// An empty in-memory store: the check reads no connection and keeps
	// nothing.
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		return err
	}
	client, err := provider.New(provider.Options{Store: memstore.New(kr), Providers: reg, HTTPClient: outboundClient(),
		UpstreamHTTPClient: authHTTP, BrokerURL: *publicURL, ClientMetadataURL: uc.metadataURL(*publicURL),
		Logger: slog.New(slog.DiscardHandler)})
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
		era := upstreamEra(cctx, pool, n, c)
		cancel()
		if err != nil {
			failed++
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
// reported as such.
func upstreamEra(ctx context.Context, pool *mcpup.Pool, n string, c provider.UpstreamCheck) string {
	era, err := pool.Probe(ctx, mcpup.Target{Provider: n, URL: c.URL})
	switch {
	case errors.Is(err, mcpup.ErrTokenRequired) && !c.Open:
		return "(needs a connection to tell)"
	case err != nil:
		return "error: " + err.Error()
	}
	return era
}
