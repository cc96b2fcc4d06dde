package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"credbroker/adminapi"
	"credbroker/connections"
	"credbroker/internal/bearer"
	"credbroker/internal/buildinfo"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
	"credbroker/webhook"
)

// webhookConfig is where webhook endpoints come from: a file, or one
// endpoint given by flags. serve and the admin commands share it (the
// commands write events into the outbox; the broker delivers them).
type webhookConfig struct {
	File   string
	URL    string
	Events string
	Secret string // BROKER_WEBHOOK_SECRET
}

func (c *webhookConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.File, "webhooks-file", os.Getenv("BROKER_WEBHOOKS_FILE"), "webhook endpoints (YAML: endpoints: NAME: {url, secret: ${ENV} or secret_file, events}); see docs/OPERATIONS.md")
	fs.StringVar(&c.URL, "webhook", os.Getenv("BROKER_WEBHOOK_URL"), "one webhook endpoint URL (named default), signed with the whsec_ secret in BROKER_WEBHOOK_SECRET; instead of --webhooks-file")
	fs.StringVar(&c.Events, "webhook-events", os.Getenv("BROKER_WEBHOOK_EVENTS"), "comma-separated event types sent to --webhook (default: all)")
}

// load returns the endpoints (nil when none is configured).
func (c *webhookConfig) load(getenv func(string) string) (*webhook.Config, error) {
	switch {
	case c.File != "" && c.URL != "":
		return nil, errors.New("give --webhooks-file or --webhook, not both")
	case c.File != "":
		return webhook.LoadConfig(c.File, getenv)
	case c.URL != "":
		var events []string
		for _, e := range strings.Split(c.Events, ",") {
			if e = strings.TrimSpace(e); e != "" {
				events = append(events, e)
			}
		}
		secret := c.Secret
		if secret == "" {
			secret = getenv("BROKER_WEBHOOK_SECRET")
		}
		if secret == "" {
			return nil, errors.New("--webhook: set its whsec_ secret in BROKER_WEBHOOK_SECRET")
		}
		ep, err := webhook.NewEndpoint("default", c.URL, secret, events)
		if err != nil {
			return nil, fmt.Errorf("--webhook: %w", err)
		}
		return &webhook.Config{Endpoints: []webhook.Endpoint{ep}}, nil
	case c.Events != "":
		return nil, errors.New("--webhook-events needs --webhook")
	}
	return nil, nil
}

// opsConfig is serve's operations settings: webhooks, the admin API and
// keep-alive.
type opsConfig struct {
	Webhooks       webhookConfig
	WebhookTimeout time.Duration
	WebhookBackoff time.Duration
	WebhookPoll    time.Duration

	AdminAddr     string
	AdminClaim    string
	AdminAudience string

	KeepAliveInterval time.Duration
	KeepAliveRate     float64
}

func (c *opsConfig) flags(fs *flag.FlagSet) {
	c.Webhooks.flags(fs)
	fs.DurationVar(&c.WebhookTimeout, "webhook-timeout", 15*time.Second, "time limit of one webhook delivery attempt")
	fs.DurationVar(&c.WebhookBackoff, "webhook-backoff", 5*time.Second, "pause before the first webhook retry (doubling, with jitter, up to 1h; given up after 24h)")
	fs.DurationVar(&c.WebhookPoll, "webhook-poll", time.Second, "how often the outbox is checked for due webhook deliveries")
	fs.StringVar(&c.AdminAddr, "admin-addr", envOr("BROKER_ADMIN_ADDR", "127.0.0.1:8082"), "listen address of the admin API (served only with --admin-claim)")
	fs.StringVar(&c.AdminClaim, "admin-claim", os.Getenv("BROKER_ADMIN_CLAIM"), "claim an admin's IdP token must carry, CLAIM=VALUE, e.g. groups=credbroker-admins (enables the admin API)")
	fs.StringVar(&c.AdminAudience, "admin-audience", os.Getenv("BROKER_ADMIN_AUDIENCE"), "audience admin tokens must name (default <public-url>/admin)")
	fs.DurationVar(&c.KeepAliveInterval, "keep-alive-interval", 10*time.Minute, "how often connections of keep_alive providers are checked")
	fs.Float64Var(&c.KeepAliveRate, "keep-alive-rate", 2, "at most this many keep-alive refreshes per second")
}

func (c *opsConfig) validate() []error {
	var errs []error
	if c.WebhookTimeout < 100*time.Millisecond || c.WebhookTimeout > time.Minute {
		errs = append(errs, fmt.Errorf("--webhook-timeout %s: must be between 100ms and 1m", c.WebhookTimeout))
	}
	if c.WebhookBackoff < 10*time.Millisecond || c.WebhookBackoff > time.Hour {
		errs = append(errs, fmt.Errorf("--webhook-backoff %s: must be between 10ms and 1h", c.WebhookBackoff))
	}
	if c.WebhookPoll < 10*time.Millisecond || c.WebhookPoll > time.Minute {
		errs = append(errs, fmt.Errorf("--webhook-poll %s: must be between 10ms and 1m", c.WebhookPoll))
	}
	if c.AdminClaim != "" {
		if _, err := adminapi.ParseClaim(c.AdminClaim); err != nil {
			errs = append(errs, fmt.Errorf("--admin-claim %v", err))
		}
		if _, _, err := net.SplitHostPort(c.AdminAddr); err != nil {
			errs = append(errs, fmt.Errorf("--admin-addr %q: %v", c.AdminAddr, err))
		}
	}
	if c.AdminAudience != "" && c.AdminClaim == "" {
		errs = append(errs, errors.New("--admin-audience needs --admin-claim (the admin API is off without it)"))
	}
	if c.KeepAliveInterval < 100*time.Millisecond || c.KeepAliveInterval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--keep-alive-interval %s: must be between 100ms and 24h", c.KeepAliveInterval))
	}
	if c.KeepAliveRate <= 0 || c.KeepAliveRate > 1000 {
		errs = append(errs, fmt.Errorf("--keep-alive-rate %v: must be above 0 and at most 1000", c.KeepAliveRate))
	}
	return errs
}

// refreshFailedEvents returns provider.Options.RefreshFailed: a
// connection.refresh_failed event in store's outbox (nil without webhooks).
func refreshFailedEvents(pub *webhook.Publisher, store vault.Store, log *slog.Logger) func(context.Context, vault.Connection) {
	if pub == nil {
		return nil
	}
	return func(ctx context.Context, c vault.Connection) {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := pub.Publish(wctx, store, webhook.ConnectionRefreshFailed, webhook.ConnectionEvent(c)); err != nil {
			log.Warn("webhooks: storing a connection.refresh_failed event failed", "connection", c.ID, "err", err)
		}
	}
}

// opsDeps is what startOps needs.
type opsDeps struct {
	Config    opsConfig
	Webhooks  *webhook.Config
	Store     vault.Store // the observed store (mounted.Store): its Outbox and Locker
	Mounted   mounted
	Providers *provider.Registry
	Issuer    string
	PublicURL string
	HTTP      *http.Client
	Telemetry *telemetry.Recorder
	Tracing   trace.TracerProvider // nil: off
	Logger    *slog.Logger
}

// startOps starts the webhook dispatcher, the keep-alive loop and the
// admin API listener, each only when configured; they run until ctx ends.
func startOps(ctx context.Context, d opsDeps) error {
	if !d.Webhooks.Empty() {
		disp, err := webhook.NewDispatcher(webhook.DispatchOptions{Config: d.Webhooks, Store: d.Store, HTTPClient: d.HTTP,
			Timeout: d.Config.WebhookTimeout, Backoff: d.Config.WebhookBackoff, Poll: d.Config.WebhookPoll,
			Telemetry: d.Telemetry, Logger: d.Logger.With("component", "webhooks"),
			UserAgent: "credbroker-webhooks/" + buildinfo.Get().Version})
		if err != nil {
			return err
		}
		go disp.Run(ctx)
		d.Logger.Info("webhooks on", "endpoints", strings.Join(d.Webhooks.Names(), ","))
	}
	var kept []string
	for _, n := range d.Providers.Names() {
		if p, _ := d.Providers.Lookup(n); p.KeepAlive.Window > 0 {
			kept = append(kept, n)
		}
	}
	if len(kept) > 0 {
		go runKeepAlive(ctx, d.Mounted.Conns, d.Store.Locker(), d.Config.KeepAliveInterval, d.Config.KeepAliveRate,
			d.Logger.With("component", "keepalive"))
		d.Logger.Info("keep-alive on", "providers", strings.Join(kept, ","), "interval", d.Config.KeepAliveInterval)
	}
	if d.Config.AdminClaim == "" {
		return nil
	}
	claim, err := adminapi.ParseClaim(d.Config.AdminClaim)
	if err != nil {
		return err
	}
	aud := d.Config.AdminAudience
	if aud == "" {
		aud = d.PublicURL + "/admin"
	}
	verify, err := bearer.NewJWTVerifier(d.Issuer, []string{aud}, d.HTTP, nil)
	if err != nil {
		return err
	}
	opts := adminapi.Options{Connections: d.Mounted.Conns, Verify: bearer.Cached(verify, 1000, nil), Claim: claim,
		Telemetry: d.Telemetry, Logger: d.Logger.With("component", "adminapi"), Tracing: d.Tracing}
	if d.Mounted.Auth != nil {
		opts.Apps = d.Mounted.Apps.List
	}
	api, err := adminapi.New(opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", d.Config.AdminAddr)
	if err != nil {
		return fmt.Errorf("listen on --admin-addr %s: %w", d.Config.AdminAddr, err)
	}
	go serveUntilDone(ctx, newHTTPServer(web.APIPolicy(api.Handler()), d.Logger), ln, d.Logger)
	d.Logger.Info("admin API serving", "addr", ln.Addr().String(), "audience", aud, "claim", claim.String())
	return nil
}

// keepAliveJob names the lock that makes one replica run keep-alive.
const keepAliveJob = "job:keep-alive"

// runKeepAlive runs keep-alive passes every interval, at most rate
// refreshes per second, in one place: it first takes the keep-alive lock
// (with PostgreSQL an advisory lock, so one replica leads and another
// takes over when it dies; with bolt the single process), then keeps it.
func runKeepAlive(ctx context.Context, conns *connections.Service, locker vault.Locker, interval time.Duration, rate float64, log *slog.Logger) {
	unlock, err := locker.LockConnection(ctx, keepAliveJob)
	if err != nil {
		return // ctx ended while another replica led
	}
	defer unlock()
	log.Info("keep-alive: this process runs the passes")
	pace := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer pace.Stop()
	wait := func(ctx context.Context) error {
		select {
		case <-pace.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		rep, err := conns.KeepAlivePass(ctx, wait)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			log.Warn("keep-alive pass failed", "err", err)
		case rep.Refreshed+rep.Failed+rep.Reconnect > 0:
			log.Info("keep-alive pass", "checked", rep.Checked, "refreshed", rep.Refreshed, "failed", rep.Failed, "needs_reconnect", rep.Reconnect)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
