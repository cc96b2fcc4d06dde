package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"credbroker/apps"
	"credbroker/authserver"
	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/buildinfo"
	"credbroker/internal/telemetry"
	"credbroker/mcpapi"
	"credbroker/oauthflow"
	"credbroker/provider"
	"credbroker/provider/mcpup"
	"credbroker/vault"
	"credbroker/web"
	"credbroker/webhook"
)

// brokerDeps is what both `serve` and `dev` hand to mount.
type brokerDeps struct {
	PublicURL     string
	Resource      string
	Issuer        string
	ClientID      string
	ClientSecret  vault.Secret
	RequiredScope string
	DevMode       bool
	GrantTTL      time.Duration
	StateTTL      time.Duration

	Store     vault.Store
	Keys      *vault.Keyring
	Providers *provider.Registry
	Logger    *slog.Logger
	// HTTPClient is used for everything the broker says to the IdP and providers.
	HTTPClient *http.Client
	// Telemetry records metrics and audit events (nil: none).
	Telemetry *telemetry.Recorder
	// Tracing traces MCP requests, provider calls, refreshes, store
	// operations and browser steps (nil: off).
	Tracing trace.TracerProvider
	// MetricsOnMain serves GET /metrics on the main listener.
	MetricsOnMain bool
	// RefreshMargin: access tokens expiring sooner are refreshed before use (0: 5m).
	RefreshMargin time.Duration
	// Sidecar is the sidecar API listener (off when empty).
	Sidecar sidecarConfig
	// AuthServer, when set, makes the broker the authorization server of
	// its MCP endpoint (--mcp-auth broker); nil keeps the IdP's JWTs
	// (--mcp-auth issuer).
	AuthServer *authServerConfig
	// Events publishes the webhook events no store change carries
	// (connection.refresh_failed); nil: none.
	Events *webhook.Publisher
	// ClientAddr is the address of the client behind a request
	// (--trusted-proxies); nil (dev): the connection's peer.
	ClientAddr func(*http.Request) string
	// Upstreams is how the gateway reaches remote MCP servers.
	Upstreams upstreamConfig
}

// authServerConfig is the built-in authorization server's settings.
type authServerConfig struct {
	Registration         bool
	AllowPrivateMetadata bool
	AccessTokenTTL       time.Duration
	RefreshTokenTTL      time.Duration
	RefreshIdleTTL       time.Duration
	// IDJAG is the JWT bearer grant's policy; IDJAGIssuers the ID-JAG
	// issuers trusted besides the IdP.
	IDJAG        authserver.IDJAGPolicy
	IDJAGIssuers []string
	// Clients are configured clients (broker dev's host).
	Clients []authserver.StaticClient
}

// mounted is what mount built that its callers drive further.
type mounted struct {
	// Store is the observed store (observeStore) every part of the
	// broker uses.
	Store  vault.Store
	Grants *binding.Service
	// Auth is the built-in authorization server (nil in issuer mode).
	Auth *authserver.Server
	// Apps is the apps core.
	Apps *apps.Service
	// Conns and Client serve the admin API, the admin commands and the
	// keep-alive loop.
	Conns  *connections.Service
	Client *provider.Client
	// MCP is the MCP endpoint (its long-lived streams end at shutdown).
	MCP *mcpapi.Server
	// Upstreams are the gateway's sessions with upstream MCP servers,
	// closed once the listener has shut down.
	Upstreams *mcpup.Pool
	// Site holds every route of the main listener, pages and APIs apart.
	Site *web.Site
}

// mount builds the provider client, the connections layer, the browser
// flow, the authorization server (in broker mode) and the MCP endpoint,
// registers their routes on a web.Site (pages on its browser side; MCP,
// the authorization server's endpoints, health and metrics on its API
// side) and serves the site at "/" on mux. The IdP must be reachable
// (discovery runs here). Background work (authorization server clean-up)
// runs until ctx ends.
func mount(ctx context.Context, mux *http.ServeMux, d brokerDeps) (mounted, error) {
	plainStore := d.Store
	sole := soleWriter(plainStore)
	// Every write of a connection in this process drops the person's
	// cached listing before its caller goes on. On a sole writer that is
	// what keeps the cache true; with other replicas (PostgreSQL) their
	// writes come through the feed, and this covers the writes of this
	// process that do not pass through the connections core (the provider
	// client's refreshes and needs_reconnect), which the gateway's token
	// reuse relies on (docs/SECURITY.md 12a).
	var listed connections.LateWrites // the connections core, once built
	d.Store = vault.Announced(d.Store, &listed)
	d.Store = observeStore(d.Store, d.Telemetry, d.Tracing)
	grants := binding.New(d.Store, binding.Options{TTL: d.GrantTTL})
	authHTTP, mcpHTTP, err := d.Upstreams.httpClients()
	if err != nil {
		return mounted{}, err
	}
	provOpts := provider.Options{
		Store: d.Store, Providers: d.Providers, HTTPClient: d.HTTPClient,
		Logger: d.Logger.With("component", "provider"), RefreshMargin: d.RefreshMargin,
		Telemetry: d.Telemetry, RefreshFailed: refreshFailedEvents(d.Events, d.Store, d.Logger),
		Tracing:            d.Tracing,
		UpstreamHTTPClient: authHTTP, BrokerURL: d.PublicURL, ClientMetadataURL: d.Upstreams.metadataURL(d.PublicURL),
		UpstreamClients: d.Store.UpstreamClients(),
	}
	idpSessions(&provOpts, d)
	client, err := provider.New(provOpts)
	if err != nil {
		return mounted{}, err
	}
	var policy apps.Policy
	if c := d.AuthServer; c != nil {
		policy = apps.Policy{AccessTokenTTL: c.AccessTokenTTL, FamilyTTL: c.RefreshTokenTTL, RefreshIdleTTL: c.RefreshIdleTTL}
	}
	appSvc, err := appsCore(d.Store, sole, policy, d.Telemetry, d.Logger.With("component", "apps"))
	if err != nil {
		return mounted{}, err
	}
	offboard := offboardApps(appSvc)
	if provOpts.IdPSessions != nil {
		offboard = append(offboard, connections.IdPSessionStep(client))
	}
	conns, err := connections.New(connections.Options{
		Store: d.Store, Grants: grants, Client: client, PublicURL: d.PublicURL,
		Telemetry: d.Telemetry, Logger: d.Logger.With("component", "connections"),
		Offboard: offboard, Watch: d.Store.AppWatch(), SoleWriter: sole,
	})
	if err != nil {
		return mounted{}, err
	}
	listed.Set(conns)
	// The authorization server signs people in through the browser flow's
	// session and the browser flow lists the apps the authorization server
	// knows: both refer to the other through the hooks wired here.
	var flow *oauthflow.Flow
	var as *authserver.Server
	if c := d.AuthServer; c != nil {
		var scopes []string
		if d.RequiredScope != "" {
			scopes = []string{d.RequiredScope}
		}
		jag := authserver.IDJAGOptions{Policy: c.IDJAG, TrustedIssuers: c.IDJAGIssuers, HTTPClient: d.HTTPClient}
		if c.IDJAG.Mode != "" && c.IDJAG.Mode != authserver.IDJAGOff {
			jag.Ledger = d.Store.Assertions()
		}
		as, err = authserver.New(authserver.Options{
			PublicURL: d.PublicURL, Resource: d.Resource, IdPIssuer: d.Issuer, Store: d.Store.Auth(), Keys: d.Keys,
			Person: func(r *http.Request) (authserver.Person, bool) {
				p, ok := flow.SignedIn(r)
				return authserver.Person{Principal: p.Principal, Display: p.Display, CSRF: p.CSRF}, ok
			},
			StartSignIn:  func(w http.ResponseWriter, r *http.Request, returnTo string) { flow.StartSignIn(w, r, returnTo) },
			Registration: c.Registration, AllowPrivateMetadata: c.AllowPrivateMetadata, Scopes: scopes, Apps: appSvc,
			Logger: d.Logger.With("component", "authserver"), Telemetry: d.Telemetry,
			ClientAddr: d.ClientAddr, Tracing: d.Tracing,
			IDJAG: jag, Clients: c.Clients, MoreResources: gatewayResources(d.PublicURL, d.Providers),
		})
		if err != nil {
			return mounted{}, fmt.Errorf("authorization server: %w", err)
		}
	}
	flowOpts := oauthflow.Options{
		PublicURL: d.PublicURL, Issuer: d.Issuer, ClientID: d.ClientID, ClientSecret: d.ClientSecret,
		Connections: conns, CookieKeys: d.Keys.Derive("cookies"), HTTPClient: d.HTTPClient,
		Logger: d.Logger.With("component", "oauthflow"), DevMode: d.DevMode,
		Telemetry: d.Telemetry, Tracing: d.Tracing, ClientAddr: d.ClientAddr,
		ClientMetadataURL: d.Upstreams.metadataURL(d.PublicURL),
	}
	if as != nil {
		flowOpts.Apps = appSvc
	}
	flow, err = oauthflow.New(ctx, flowOpts)
	if err != nil {
		return mounted{}, fmt.Errorf("browser flow: %w", err)
	}
	upstreams := mcpup.New(mcpup.Options{HTTPClient: mcpHTTP, Tokens: client.UpstreamTokens(),
		Version: buildinfo.Get().Version, Logger: d.Logger.With("component", "mcpup")})
	mcpOpts := mcpapi.Options{
		PublicURL: d.PublicURL, ResourceURI: d.Resource, Issuer: d.Issuer,
		RequiredScope: d.RequiredScope, DevMode: d.DevMode,
		Connections: conns,
		StateKeys:   d.Keys.Derive("requestState"), StateTTL: d.StateTTL,
		Logger: d.Logger.With("component", "mcpapi"), HTTPClient: d.HTTPClient,
		Telemetry: d.Telemetry, Tracing: d.Tracing,
		Upstreams: upstreams,
	}
	var brokerTokens bearer.Verifier
	if as != nil {
		brokerTokens = as.Verifier()
		mcpOpts.Verifier = brokerTokens
		mcpOpts.VerifierFor = as.VerifierFor
		mcpOpts.AuthorizationServers = []string{as.Issuer()}
	}
	mcp, err := mcpapi.New(mcpOpts)
	if err != nil {
		return mounted{}, fmt.Errorf("MCP endpoint: %w", err)
	}
	if _, err := startSidecar(ctx, d, conns, brokerTokens); err != nil {
		return mounted{}, err
	}
	site := web.NewSite()
	flow.Register(site)
	mcp.Register(site.API)
	if as != nil {
		as.Register(site)
		go collectAuth(ctx, as, d.Logger)
	}
	go func() {
		if err := appSvc.Follow(ctx); err != nil && ctx.Err() == nil {
			d.Logger.Error("apps: following the store's changes stopped; token checks read the store", "err", err)
		}
	}()
	go func() {
		if err := conns.Follow(ctx); err != nil && ctx.Err() == nil {
			d.Logger.Error("connections: following the store's changes stopped; listings read the store", "err", err)
		}
	}()
	// The readiness probe reads the store as opened: a probe is no
	// operation of the broker's to time or trace.
	registerHealth(site.API, newReadiness(plainStore, d.Keys, d.Issuer, d.HTTPClient, d.Telemetry))
	if d.MetricsOnMain && d.Telemetry != nil {
		site.API.Handle("GET /metrics", d.Telemetry.Handler())
	}
	mux.Handle("/", site)
	return mounted{Store: d.Store, Grants: grants, Auth: as, Apps: appSvc, Conns: conns, Client: client, MCP: mcp, Upstreams: upstreams, Site: site}, nil
}

// appsCore builds the apps core on store, telling its liveness cache how
// the store is shared: PostgreSQL reports other replicas' changes
// (Store.AppWatch); a bolt file has this process as its only writer
// (sole, soleWriter of the store as opened).
func appsCore(store vault.Store, sole bool, policy apps.Policy, rec *telemetry.Recorder, log *slog.Logger) (*apps.Service, error) {
	return apps.New(apps.Options{Store: store.Auth(), Watch: store.AppWatch(), SoleWriter: sole,
		Policy: policy, Telemetry: rec, Logger: log})
}

// idpSessions gives the provider layer the organisation's IdP and the
// store of people's IdP sessions when an entry of the catalogue connects
// by ID-JAG (mcp.auth: enterprise).
func idpSessions(o *provider.Options, d brokerDeps) {
	if !d.Providers.NeedsIdPSessions() {
		return
	}
	if d.ClientSecret == "" {
		d.Logger.Warn("mcp.auth enterprise entries need the broker to authenticate at the IdP's token exchange, and no client secret is configured (BROKER_CLIENT_SECRET): the IdP will likely refuse every ID-JAG")
	}
	o.IdP = &provider.OrgIdP{Issuer: d.Issuer, ClientID: d.ClientID, ClientSecret: d.ClientSecret}
	o.IdPSessions = d.Store.IdPSessions()
}

// offboardApps is offboarding's step for the apps core.
func offboardApps(a *apps.Service) []connections.OffboardStep {
	return []connections.OffboardStep{{Name: "app grants", Remove: func(ctx context.Context, p vault.Principal, admin connections.Admin) (int, error) {
		return a.Offboard(ctx, p, apps.Actor{Admin: admin.Principal, Via: admin.Via})
	}}}
}

// collectAuth removes expired codes and never-used registered clients
// every ten minutes until ctx ends.
func collectAuth(ctx context.Context, as *authserver.Server, log *slog.Logger) {
	every(ctx, 10*time.Minute, func(ctx context.Context) {
		if codes, clients, err := as.GC(ctx); err != nil {
			log.Warn("authorization server clean-up failed", "err", err)
		} else if codes+clients > 0 {
			log.Debug("authorization server clean-up", "codes", codes, "clients", clients)
		}
	})
}

// every runs f every interval (the first time one interval from now)
// until ctx ends.
func every(ctx context.Context, interval time.Duration, f func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// newHTTPServer returns a server with every timeout set.
func newHTTPServer(h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// outboundClient bounds every call the broker makes (dial, TLS, headers, total).
func outboundClient() *http.Client {
	return &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSHandshakeTimeout:   5 * time.Second,
			ResponseHeaderTimeout: 15 * time.Second,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       90 * time.Second,
			ForceAttemptHTTP2:     true,
		},
	}
}

// serveUntilDone serves on ln until ctx ends, then shuts down gracefully,
// letting in-flight requests finish.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener, log *slog.Logger) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing in-flight requests")
	// Shutdown closes the listener first, then runs these hooks.
	addr := ln.Addr().String()
	srv.RegisterOnShutdown(func() { log.Info("listener closed: no new connections", "addr", addr) })
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// collectGrants removes long-expired grants every minute until ctx ends.
func collectGrants(ctx context.Context, g *binding.Service, log *slog.Logger) {
	every(ctx, time.Minute, func(ctx context.Context) {
		if n, err := g.GC(ctx, time.Hour); err != nil {
			log.Warn("grant garbage collection failed", "err", err)
		} else if n > 0 {
			log.Debug("expired grants removed", "count", n)
		}
	})
}

// gatewayResources reports the gateway endpoints of the catalogue's
// type: mcp entries, <public-url>/mcp/u/<key>: the resources the built-in
// authorization server issues tokens for besides the MCP endpoint.
func gatewayResources(publicURL string, reg *provider.Registry) func(string) bool {
	prefix := strings.ToLower(strings.TrimSuffix(publicURL, "/")) + "/mcp/u/"
	return func(resource string) bool {
		name, ok := strings.CutPrefix(resource, prefix)
		if !ok {
			return false
		}
		p, ok := reg.Lookup(name)
		if !ok {
			return false
		}
		_, gw := p.Kind.(provider.Gateway)
		return gw
	}
}
