package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"go.opentelemetry.io/otel/attribute"
	oteltrace "go.opentelemetry.io/otel/trace"
	"golang.org/x/oauth2"

	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/vault"
)

// Options configures a Client.
type Options struct {
	Store     vault.Store
	Providers *Registry
	// HTTPClient talks to token endpoints and APIs (redirects to other
	// hosts are never followed with a token, whatever its CheckRedirect).
	HTTPClient *http.Client
	Logger     *slog.Logger
	Now        func() time.Time
	// RefreshMargin: an access token expiring sooner than this is refreshed
	// before use (default 5 minutes).
	RefreshMargin time.Duration
	// RefreshAttempts bounds token requests per refresh when the request
	// provably never reached the provider (a dial or TLS failure) or the
	// provider answered 429 (default 3); RetryBackoff is the first pause,
	// doubled after each failure (default 200ms). A request that was
	// written is never re-sent within one refresh: the provider may have
	// spent a rotating refresh token.
	RefreshAttempts int
	RetryBackoff    time.Duration
	// MaxRequestBody caps API request bodies (default 1 MiB);
	// MaxResponseBody caps what is read of API responses (default 256 KiB).
	MaxRequestBody  int64
	MaxResponseBody int64
	// SaveTimeout bounds saving refreshed tokens, which survives the caller
	// going away (default 10s).
	SaveTimeout time.Duration
	// Telemetry counts refreshes and provider calls and records the
	// refresh_failed and needs_reconnect audit events (nil: log only).
	Telemetry *telemetry.Recorder
	// UserAgent is sent with every request to a provider (default
	// DefaultUserAgent()).
	UserAgent string
	// RefreshFailed, when set, is told about every refresh that failed
	// without ending the connection (the connection.refresh_failed
	// event); c is metadata only. A refresh the provider refused goes
	// through needs_reconnect instead, which the store reports.
	RefreshFailed func(ctx context.Context, c vault.Connection)
	// UpstreamHTTPClient talks to upstream MCP servers' authorization
	// servers (discovery, registration, tokens, revocation): the egress
	// policy for destinations the organisation does not control (default
	// HTTPClient).
	UpstreamHTTPClient *http.Client
	// UpstreamClients keeps the clients the broker registers at upstream
	// MCP servers' authorization servers (default: Store's own,
	// vault.Store.UpstreamClients, so a registration survives restarts
	// and replicas share it).
	UpstreamClients UpstreamClients
	// ClientMetadataURL is the broker's Client ID Metadata Document (an
	// https URL: upstream servers that support it identify the broker by
	// it); BrokerURL its public URL, named in registrations.
	ClientMetadataURL string
	BrokerURL         string
	// RedirectURL is the broker's provider callback of a provider (the
	// browser door's route; default BrokerURL + "/oauth/{name}/callback").
	RedirectURL func(provider string) string
	// IdP is the organisation's identity provider as the broker's client
	// there, and IdPSessions keeps people's sessions at it (their refresh
	// tokens, sealed): entries that connect by assertion (mcp.auth:
	// enterprise) need both; without them those use the code flow only.
	IdP         *OrgIdP
	IdPSessions vault.IdPSessionStore
	// Tracing, when set, traces API requests (provider.request), token
	// refreshes (provider.token_refresh per caller, a link from each
	// waiter to the one provider.token_refresh.flight) and every HTTP
	// request to a provider (otelhttp). Nil: off.
	Tracing oteltrace.TracerProvider
}

// Client uses stored connections without handing their tokens out: it keeps
// access tokens fresh (refreshing at most once per connection at a time)
// and performs provider API requests with them.
//
// Refresh protocol (per connection): in-process single flight keyed by the
// connection id → reload from the store → already refreshed by someone else?
// use theirs → refresh at the token endpoint with x/oauth2 (fixed AuthStyle:
// auto-detection would retry with the other style and spend a rotating
// refresh token twice) → save with the store's compare-and-swap, applied
// only if the stored refresh token is still the one spent (otherwise another
// process refreshed: reload and use theirs). The new access token is handed
// out only after the save succeeded, so a rotated refresh token is durable
// before the new access token is used.
type Client struct {
	opts Options
	log  *slog.Logger
	// tracer is nil when tracing is off.
	tracer oteltrace.Tracer
	// locker excludes other processes sharing the store (pgstore) from
	// refreshing the same connection at once; in-process for bbolt.
	locker vault.Locker
	// apiHTTP is opts.HTTPClient as given (traced when tracing is on),
	// without the User-Agent wrapper: API calls set User-Agent themselves.
	// apiClients holds the client for API calls on each API base of the
	// catalogue (apiClient), read-only after New.
	apiHTTP    *http.Client
	apiClients map[*APIBase]*http.Client

	mu         sync.Mutex // guards the fields below
	flights    map[string]*flight
	discovered map[string]*oidc.Provider
	upstreams  map[string]*upstreamState
	// registrations are by issuer.
	registrations map[string]*registrationState
}

// flight is one refresh in progress; waiters block on done. stale is the
// access token the flight was started to replace ("" for an ordinary
// refresh before expiry).
type flight struct {
	done   chan struct{}
	stale  vault.Secret
	joined int // callers that joined it after it started; guarded by Client.mu
	// olderThan, for a keep-alive flight, refreshes tokens last
	// refreshed before it even when the access token is fresh.
	olderThan time.Time
	conn      vault.Connection
	err       error
	// span is the flight's span context (invalid with tracing off):
	// waiters link to it.
	span oteltrace.SpanContext
}

// New validates opts and builds a Client.
func New(opts Options) (*Client, error) {
	if opts.Store == nil || opts.Providers == nil {
		return nil, errors.New("provider: New needs Store and Providers")
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: 30 * time.Second}
	}
	if opts.UserAgent == "" {
		opts.UserAgent = DefaultUserAgent()
	}
	// API calls set User-Agent themselves (send) and skip the wrapper,
	// which copies every request; the other requests to providers (token
	// endpoints through x/oauth2, discovery, revocation...) go through it.
	api := *opts.HTTPClient
	apiHTTP := &api
	if opts.UpstreamHTTPClient == nil {
		opts.UpstreamHTTPClient = opts.HTTPClient
	}
	opts.HTTPClient = withUserAgent(opts.HTTPClient, opts.UserAgent)
	opts.UpstreamHTTPClient = withUserAgent(opts.UpstreamHTTPClient, opts.UserAgent)
	if opts.Tracing != nil {
		opts.HTTPClient = withTracing(opts.HTTPClient, opts.Tracing)
		opts.UpstreamHTTPClient = withTracing(opts.UpstreamHTTPClient, opts.Tracing)
		apiHTTP = withTracing(apiHTTP, opts.Tracing)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.RefreshMargin <= 0 {
		opts.RefreshMargin = 5 * time.Minute
	}
	if opts.RefreshAttempts <= 0 {
		opts.RefreshAttempts = 3
	}
	if opts.RetryBackoff <= 0 {
		opts.RetryBackoff = 200 * time.Millisecond
	}
	if opts.MaxRequestBody <= 0 {
		opts.MaxRequestBody = 1 << 20
	}
	if opts.MaxResponseBody <= 0 {
		opts.MaxResponseBody = 256 << 10
	}
	if opts.SaveTimeout <= 0 {
		opts.SaveTimeout = 10 * time.Second
	}
	if opts.UpstreamClients == nil {
		opts.UpstreamClients = opts.Store.UpstreamClients()
	}
	if opts.RedirectURL == nil {
		base := strings.TrimRight(opts.BrokerURL, "/")
		opts.RedirectURL = func(name string) string { return base + "/oauth/" + name + "/callback" }
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &Client{opts: opts, log: log, locker: opts.Store.Locker(), tracer: tracing.Tracer(opts.Tracing),
		apiHTTP: apiHTTP, apiClients: map[*APIBase]*http.Client{},
		flights: map[string]*flight{}, discovered: map[string]*oidc.Provider{}, upstreams: map[string]*upstreamState{},
		registrations: map[string]*registrationState{}}
	for _, name := range opts.Providers.Names() {
		p, _ := opts.Providers.Lookup(name)
		for i := range p.APIBases {
			k.apiClients[&p.APIBases[i]] = k.apiClient(&p.APIBases[i])
		}
	}
	return k, nil
}

// fresh reports whether c's access token can be used without refreshing.
func (k *Client) fresh(c vault.Connection) bool {
	return k.opts.Now().Before(k.usableUntil(c))
}

// noExpiry is usableUntil's answer for a token without an expiry.
var noExpiry = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// usableUntil is when c's access token stops being usable without a
// refresh (the zero time when it never is: no access token).
func (k *Client) usableUntil(c vault.Connection) time.Time {
	if c.Token.AccessToken == "" {
		return time.Time{}
	}
	if c.Token.Expiry.IsZero() {
		return noExpiry
	}
	if c.Token.RefreshToken == "" {
		// Nothing to refresh with: use it until it actually expires.
		return c.Token.Expiry
	}
	// A token living shorter than twice the margin would be refreshed on
	// every use: cap the margin at half the token's lifetime.
	margin := k.opts.RefreshMargin
	issued := c.Updated
	if c.LastRefreshed.After(issued) {
		issued = c.LastRefreshed
	}
	if life := c.Token.Expiry.Sub(issued); !issued.IsZero() && life > 0 && life/2 < margin {
		margin = life / 2
	}
	return c.Token.Expiry.Add(-margin)
}

// Token returns connection id with an access token that is usable now,
// refreshing first when it expires within the refresh margin. The result
// holds token material: never log or return it to a client. An API-key
// connection has no token to give: ErrNotAToken.
func (k *Client) Token(ctx context.Context, id string) (vault.Connection, error) {
	c, err := k.opts.Store.GetConnection(ctx, id)
	if err != nil {
		return vault.Connection{}, fmt.Errorf("provider: connection %s: %w", id, err)
	}
	if isKeyConnection(c) {
		return vault.Connection{}, ErrNotAToken
	}
	return k.usable(ctx, c)
}

// usable returns c when its access token can be used now, else refreshes.
func (k *Client) usable(ctx context.Context, c vault.Connection) (vault.Connection, error) {
	if c.Status == vault.StatusNeedsReconnect {
		return c, ErrNeedsReconnect
	}
	if k.fresh(c) {
		return c, nil
	}
	return k.refresh(ctx, c.ID, "")
}

// ForceRefresh refreshes connection id because the provider refused its
// access token stale (a 401 on an unexpired token), unless the stored
// access token already differs from stale (someone refreshed meanwhile).
func (k *Client) ForceRefresh(ctx context.Context, id string, stale vault.Secret) (vault.Connection, error) {
	return k.refresh(ctx, id, stale)
}

// refresh joins or starts the connection's single refresh flight. The
// flight runs detached from ctx, so one caller leaving does not fail the
// others or lose a rotated refresh token; ctx only bounds the wait.
//
// A forced refresh (stale set) that joined a flight started for another
// reason may get back stale itself (that flight found it fresh): it then
// runs a flight of its own, so the token the provider refused is replaced.
func (k *Client) refresh(ctx context.Context, id string, stale vault.Secret) (conn vault.Connection, err error) {
	ctx, span := k.startSpan(ctx, "provider.token_refresh", attribute.Bool("refresh.forced", stale != ""))
	defer func() { endSpan(span, err, "token refresh failed") }()
	for attempt := 1; ; attempt++ {
		f, leader := k.join(ctx, id, stale, time.Time{})
		if k.tracer != nil {
			role := "leader"
			if !leader {
				// A waiter: the refresh it waits for is another caller's.
				role = "waiter"
				span.AddLink(oteltrace.Link{SpanContext: f.span, Attributes: []attribute.KeyValue{attribute.String("refresh.link", "flight")}})
				span.AddEvent("joined the refresh in flight")
			}
			span.SetAttributes(attribute.String("refresh.role", role), attribute.Int("refresh.attempt", attempt))
		}
		if err := ctx.Err(); err != nil {
			// The flight goes on without this caller; it leaves now, not
			// when a race with the flight's end decides.
			return vault.Connection{}, err
		}
		select {
		case <-f.done:
		case <-ctx.Done():
			return vault.Connection{}, ctx.Err()
		}
		// Bounded: other callers' flights cannot keep this one waiting.
		if f.err != nil || stale == "" || f.stale == stale || f.conn.Token.AccessToken != stale || attempt == 3 {
			return f.conn, f.err
		}
	}
}

// join returns the connection's flight in progress, starting one for
// stale (or olderThan) when there is none; leader reports whether this
// call started it.
func (k *Client) join(ctx context.Context, id string, stale vault.Secret, olderThan time.Time) (f *flight, leader bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if f := k.flights[id]; f != nil {
		f.joined++
		return f, false
	}
	f = &flight{done: make(chan struct{}), stale: stale, olderThan: olderThan}
	k.flights[id] = f
	fctx, span := k.startSpan(context.WithoutCancel(ctx), "provider.token_refresh.flight")
	f.span = span.SpanContext()
	go func() {
		fctx, cancel := context.WithTimeout(fctx, 2*k.opts.SaveTimeout+time.Minute)
		defer cancel()
		f.conn, f.err = k.refreshOnce(fctx, id, stale, olderThan)
		k.mu.Lock()
		joined := f.joined
		delete(k.flights, id)
		k.mu.Unlock()
		if k.tracer != nil {
			span.SetAttributes(attribute.Int("refresh.waiters", joined))
			if f.conn.Provider != "" {
				span.SetAttributes(attribute.String("provider", f.conn.Provider))
			}
		}
		endSpan(span, f.err, "token refresh failed")
		close(f.done)
	}()
	return f, true
}

// refreshOnce is the body of a flight: reload, re-check, refresh, save.
func (k *Client) refreshOnce(ctx context.Context, id string, stale vault.Secret, olderThan time.Time) (vault.Connection, error) {
	// Lock → reload → "already refreshed?" → refresh → save: the lock spans
	// other broker processes sharing the store, so a rotating refresh token
	// is spent once.
	unlock, err := k.locker.LockConnection(ctx, id)
	if err != nil {
		return vault.Connection{}, fmt.Errorf("%w: lock connection %s: %v", ErrProviderUnavailable, id, err)
	}
	defer unlock()
	cur, done, err := k.reload(ctx, id, stale, olderThan)
	if done {
		return cur, err
	}
	p, ok := k.opts.Providers.Lookup(cur.Provider)
	if !ok {
		return vault.Connection{}, fmt.Errorf("%w: %s", ErrUnknownProvider, cur.Provider)
	}
	log := k.log.With("provider", cur.Provider, "connection", cur.ID)
	if cur.Token.RefreshToken == "" && k.ConnectsByAssertion(p) {
		return k.renew(ctx, p, cur, log)
	}
	r, ok := p.Kind.(Refresher)
	if !ok {
		return vault.Connection{}, fmt.Errorf("%w: %s", ErrNotAToken, p.Name)
	}
	tok, err := k.spend(ctx, r, p, cur, log)
	if err != nil {
		if errors.Is(err, ErrRegistrationDropped) {
			k.auditDropped(ctx, err, cur.Principal, cur.ID)
			// The tokens were issued to the client the server forgot.
			c, merr := k.markNeedsReconnect(ctx, cur, log, reasonClientForgotten)
			if errors.Is(merr, ErrNeedsReconnect) {
				merr = fmt.Errorf("%w: %w", ErrNeedsReconnect, err)
			}
			return c, merr
		}
		if errors.Is(err, errGrantRefused) {
			// Lost a race with another process that rotated the token?
			if now, gerr := k.opts.Store.GetConnection(ctx, id); gerr == nil && now.Token.RefreshToken != cur.Token.RefreshToken {
				return now, nil
			}
			return k.markNeedsReconnect(ctx, cur, log, reasonInvalidGrant)
		}
		return vault.Connection{}, err
	}
	return k.saveRefreshed(ctx, p, cur, tok, log)
}

// reload reads connection id under the refresh lock and says whether a
// refresh is still due: done when it is not (someone else refreshed it
// meanwhile, it needs reconnecting, or it has nothing to refresh with; then
// the result is the answer).
func (k *Client) reload(ctx context.Context, id string, stale vault.Secret, olderThan time.Time) (cur vault.Connection, done bool, err error) {
	cur, err = k.opts.Store.GetConnection(ctx, id)
	switch {
	case err != nil:
		return vault.Connection{}, true, fmt.Errorf("provider: connection %s: %w", id, err)
	case cur.Status == vault.StatusNeedsReconnect:
		return cur, true, ErrNeedsReconnect
	case stale == "" && k.fresh(cur) && !RefreshedAt(cur).Before(olderThan):
		return cur, true, nil // refreshed by someone else meanwhile
	case stale != "" && cur.Token.AccessToken != stale && k.fresh(cur):
		return cur, true, nil
	case cur.Token.RefreshToken != "":
		return cur, false, nil
	case stale == "" && cur.Token.AccessToken != "" && (cur.Token.Expiry.IsZero() || k.opts.Now().Before(cur.Token.Expiry)):
		return cur, true, nil
	case k.renewable(cur):
		return cur, false, nil // renewed by a new ID-JAG (idjag.go)
	}
	c, err := k.markNeedsReconnect(ctx, cur, k.log.With("provider", cur.Provider, "connection", cur.ID), "expired access token and no refresh token")
	return c, true, err
}

// errGrantRefused: the provider refused the refresh token itself.
var errGrantRefused = errors.New("provider: refresh token refused")

// spend posts cur's refresh token to p's token endpoint. A request is
// re-sent only when it provably never reached the provider (a dial or TLS
// failure before it was written) or the provider said it did not process
// it (429), at most RefreshAttempts times: once it was written, the
// provider may have spent a rotating refresh token, and posting it again
// would look like theft (reuse detection ends the whole grant).
// errGrantRefused means the refresh token is dead (invalid_grant, GitHub's
// bad_refresh_token).
func (k *Client) spend(ctx context.Context, r Refresher, p *Provider, cur vault.Connection, log *slog.Logger) (*oauth2.Token, error) {
	var sent atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(info httptrace.WroteRequestInfo) {
		if info.Err == nil {
			sent.Store(true)
		}
	}}
	hctx := httptrace.WithClientTrace(context.WithValue(ctx, oauth2.HTTPClient, NoRedirectClient(k.httpFor(p))), trace)
	backoff := k.opts.RetryBackoff
	for attempt := 1; ; attempt++ {
		sent.Store(false)
		tok, err := r.refreshToken(hctx, k, p, cur.Token.RefreshToken.Reveal())
		if err == nil {
			if tok.AccessToken == "" {
				return nil, fmt.Errorf("provider: refresh %s: no access token in the answer", p.Name)
			}
			return tok, nil
		}
		var ue *UpstreamError
		switch {
		case errors.Is(err, ErrRegistrationDropped):
			return nil, err // the server no longer knows the broker's client (mcp.go)
		case errors.As(err, &ue) && ue.Kind == UpstreamClientRefused:
			k.refreshFailed(ctx, p, cur, err) // an operator must fix the client
			return nil, err
		case errors.Is(err, ErrProviderUnavailable):
			return nil, err // no configuration (discovery failed): nothing was sent
		}
		var re *oauth2.RetrieveError
		status := 0
		if errors.As(err, &re) && re.Response != nil {
			status = re.Response.StatusCode
		}
		if errors.As(err, &re) && grantRefused(re.ErrorCode) {
			return nil, errGrantRefused
		}
		if errors.As(err, &re) && status > 0 && status < 500 && status != http.StatusTooManyRequests {
			log.Warn("provider: token refresh refused", "err", DescribeTokenError(err))
			k.refreshFailed(ctx, p, cur, err)
			return nil, fmt.Errorf("provider: refresh %s: %s", p.Name, DescribeTokenError(err))
		}
		// A 429 says the request was not processed; anything else after
		// the request was written (a 5xx, a timeout, a dropped connection)
		// may have spent the refresh token: the connection stays as it is
		// and the next use checks again, rather than re-posting now.
		if sent.Load() && status != http.StatusTooManyRequests {
			log.Warn("provider: token refresh failed after the request reached the provider; not re-sent", "attempt", attempt, "err", describeRefreshErr(err))
			k.refreshFailed(ctx, p, cur, err)
			return nil, fmt.Errorf("%w: %s token endpoint: %s (not re-sent: the provider may have used the refresh token; the next use tries again)",
				ErrProviderUnavailable, p.Name, describeRefreshErr(err))
		}
		log.Warn("provider: token refresh failed", "attempt", attempt, "err", describeRefreshErr(err))
		if attempt >= k.opts.RefreshAttempts {
			k.refreshFailed(ctx, p, cur, err)
			return nil, fmt.Errorf("%w: %s token endpoint: %s after %d attempts", ErrProviderUnavailable, p.Name, describeRefreshErr(err), attempt)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %v", ErrProviderUnavailable, ctx.Err())
		}
		backoff *= 2
	}
}

// saveRefreshed stores the answer tok to spending cur's refresh token,
// compare-and-swap: applied only if the stored refresh token is still the
// one spent. The new access token is used only after the save succeeded.
func (k *Client) saveRefreshed(ctx context.Context, p *Provider, cur vault.Connection, tok *oauth2.Token, log *slog.Logger) (vault.Connection, error) {
	ts := TokenSet(tok)
	if ts.RefreshToken == "" {
		ts.RefreshToken = cur.Token.RefreshToken
	}
	if ts.IDToken == "" {
		ts.IDToken = cur.Token.IDToken
	}
	spent := cur.Token.RefreshToken
	now := k.opts.Now()
	// What the answer says it granted, when it says (Google lists the
	// grant's scopes; a GitHub App answers "", which says nothing), and
	// when the refresh token it returned expires.
	granted := grantedScopes(tok)
	rexp := refreshExpiry(tok, now)
	saved, err := k.save(ctx, cur.ID, func(old vault.Connection) (vault.Connection, error) {
		if old.Token.RefreshToken != spent {
			return old, errRotatedElsewhere
		}
		old.Token, old.LastRefreshed, old.Updated, old.Status = ts, now, now, vault.StatusActive
		if granted != nil {
			old.Scopes = p.NormalizeScopes(granted)
		}
		if !rexp.IsZero() || ts.RefreshToken != spent {
			// A new refresh token lives as long as its answer says
			// (unknown when it does not say); a kept one keeps its date.
			old.RefreshExpires = rexp
		}
		return old, nil
	})
	if errors.Is(err, errRotatedElsewhere) {
		log.Info("provider: connection refreshed by another process; using its tokens")
		return k.opts.Store.GetConnection(ctx, cur.ID)
	}
	if err != nil {
		log.Error("provider: saving refreshed tokens failed; the new access token is not used", "err", err)
		return vault.Connection{}, fmt.Errorf("provider: save refreshed tokens: %w", err)
	}
	log.Info("provider: access token refreshed", "rotated", ts.RefreshToken != spent)
	k.opts.Telemetry.Refresh(p.Name, telemetry.RefreshOK)
	return saved, nil
}

var errRotatedElsewhere = errors.New("provider: refresh token rotated by another process")

// save applies fn with the store's compare-and-swap, detached from the
// caller's cancellation and bounded by SaveTimeout.
func (k *Client) save(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.opts.SaveTimeout)
	defer cancel()
	var (
		c   vault.Connection
		err error
	)
	for range 3 {
		c, err = k.opts.Store.UpdateConnection(sctx, id, fn)
		if !errors.Is(err, vault.ErrConflict) {
			break
		}
	}
	return c, err
}

// markNeedsReconnect records that the user must connect again (an audit
// event), unless the stored tokens changed meanwhile (refreshed by another
// process, or reconnected in the browser).
func (k *Client) markNeedsReconnect(ctx context.Context, cur vault.Connection, log *slog.Logger, why string) (vault.Connection, error) {
	now := k.opts.Now()
	rt, at := cur.Token.RefreshToken, cur.Token.AccessToken
	saved, err := k.save(ctx, cur.ID, func(old vault.Connection) (vault.Connection, error) {
		if old.Token.RefreshToken != rt || old.Token.AccessToken != at {
			return old, errRotatedElsewhere
		}
		old.Status, old.Updated = vault.StatusNeedsReconnect, now
		return old, nil
	})
	if errors.Is(err, errRotatedElsewhere) {
		return k.opts.Store.GetConnection(ctx, cur.ID)
	}
	if err != nil {
		return vault.Connection{}, fmt.Errorf("provider: mark %s needs_reconnect: %w", cur.ID, err)
	}
	if k.opts.Telemetry == nil {
		log.Warn("audit: connection needs reconnecting", "event", telemetry.EventNeedsReconnect, "reason", why,
			"iss", cur.Principal.Issuer, "sub", cur.Principal.Subject)
		return saved, ErrNeedsReconnect
	}
	if why == reasonInvalidGrant {
		k.opts.Telemetry.Refresh(cur.Provider, telemetry.RefreshInvalidGrant)
	}
	k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventNeedsReconnect, Principal: cur.Principal,
		Provider: cur.Provider, Account: cur.AccountLogin, Connection: cur.ID, Via: "background", Outcome: why})
	return saved, ErrNeedsReconnect
}

// reasonInvalidGrant is markNeedsReconnect's reason when the provider
// refused the refresh token; reasonClientForgotten when an upstream MCP
// server's authorization server no longer knows the client it was issued
// to (ErrRegistrationDropped).
const (
	reasonInvalidGrant    = "the provider answered invalid_grant"
	reasonClientForgotten = "the upstream's authorization server no longer knows the broker's registration (invalid_client)"
)

// grantRefused reports whether a token endpoint error code means the
// refresh token is dead: RFC 6749's invalid_grant, or GitHub's
// bad_refresh_token (which GitHub answers with HTTP 200).
func grantRefused(code string) bool {
	return code == "invalid_grant" || code == "bad_refresh_token"
}

// refreshFailed counts and audits a refresh that failed without killing
// the connection (its stored tokens stay as they were).
func (k *Client) refreshFailed(ctx context.Context, p *Provider, cur vault.Connection, err error) {
	k.opts.Telemetry.Refresh(p.Name, telemetry.RefreshFailed)
	k.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventRefreshFailed, Principal: cur.Principal,
		Provider: p.Name, Account: cur.AccountLogin, Connection: cur.ID, Via: "background", Err: errors.New(describeRefreshErr(err))})
	if k.opts.RefreshFailed != nil {
		meta := cur
		meta.Token = vault.TokenSet{}
		k.opts.RefreshFailed(ctx, meta)
	}
}
