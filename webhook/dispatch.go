package webhook

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// DispatchOptions configures a Dispatcher. Zero durations get defaults.
type DispatchOptions struct {
	Config *Config
	Store  vault.Store // its Outbox is sent
	// HTTPClient sends the requests; redirects are never followed (a
	// 3xx is a failure, as the specification recommends).
	HTTPClient *http.Client
	// Timeout bounds one attempt (default 15s). A claim lasts Timeout +
	// 5s: a replica that dies mid-send leaves its deliveries due again
	// that long after it claimed them.
	Timeout time.Duration
	// Backoff is the pause before the first retry, doubled after each
	// failure up to an hour, with jitter (default 5s).
	Backoff time.Duration
	// MaxAge: a delivery still failing this long after its event is
	// given up (default 24h).
	MaxAge time.Duration
	// Poll is how often the outbox is checked when idle (default 1s).
	Poll time.Duration
	// Batch bounds the deliveries claimed and sent at once (default 8).
	Batch     int
	Telemetry *telemetry.Recorder
	Logger    *slog.Logger
	Now       func() time.Time
	UserAgent string
}

// Dispatcher sends the outbox's deliveries, at least once each.
type Dispatcher struct {
	opts      DispatchOptions
	outbox    vault.Outbox
	endpoints map[string]Endpoint
	client    *http.Client
	log       *slog.Logger
	lease     time.Duration

	mu        sync.Mutex // guards lastDepth
	lastDepth time.Time
}

// NewDispatcher validates opts and builds a Dispatcher.
func NewDispatcher(opts DispatchOptions) (*Dispatcher, error) {
	o := opts.Store.Outbox()
	if opts.Timeout <= 0 {
		opts.Timeout = 15 * time.Second
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 5 * time.Second
	}
	if opts.MaxAge <= 0 {
		opts.MaxAge = 24 * time.Hour
	}
	if opts.Poll <= 0 {
		opts.Poll = time.Second
	}
	if opts.Batch <= 0 {
		opts.Batch = 8
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.UserAgent == "" {
		opts.UserAgent = "credbroker-webhooks"
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	c := *hc
	c.Timeout = opts.Timeout
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Dispatcher{opts: opts, outbox: o, endpoints: map[string]Endpoint{}, client: &c, log: log,
		lease: opts.Timeout + 5*time.Second}
	if opts.Config != nil {
		for _, e := range opts.Config.Endpoints {
			d.endpoints[e.Name] = e
		}
	}
	return d, nil
}

// Run sends deliveries until ctx ends: a full batch is followed at once
// by the next claim, otherwise the outbox is checked every Poll.
func (d *Dispatcher) Run(ctx context.Context) {
	t := time.NewTicker(d.opts.Poll)
	defer t.Stop()
	for {
		n, err := d.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("webhooks: reading the outbox failed", "err", err)
		}
		if n >= d.opts.Batch && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce claims one batch of due deliveries, sends them concurrently
// and records each outcome; it returns how many it claimed.
func (d *Dispatcher) RunOnce(ctx context.Context) (int, error) {
	d.recordDepth(ctx)
	ds, err := d.outbox.ClaimDeliveries(ctx, d.opts.Now(), d.opts.Batch, d.lease)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	for _, del := range ds {
		wg.Go(func() { d.deliver(ctx, del) })
	}
	wg.Wait()
	return len(ds), nil
}

// recordDepth refreshes the depth gauges at most every five seconds.
func (d *Dispatcher) recordDepth(ctx context.Context) {
	if d.opts.Telemetry == nil {
		return
	}
	d.mu.Lock()
	now := d.opts.Now()
	if now.Sub(d.lastDepth) < 5*time.Second {
		d.mu.Unlock()
		return
	}
	d.lastDepth = now
	d.mu.Unlock()
	n, oldest, err := d.outbox.OutboxDepth(ctx)
	if err != nil {
		return
	}
	age := time.Duration(0)
	if !oldest.IsZero() {
		age = now.Sub(oldest)
	}
	d.opts.Telemetry.OutboxDepth(n, age)
}

// deliver makes one attempt and stores what it came to. Store writes
// outlive ctx: a shutdown mid-send still records the outcome.
func (d *Dispatcher) deliver(ctx context.Context, del vault.Delivery) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	log := d.log.With("endpoint", del.Endpoint, "webhook_id", del.ID, "type", del.Type)
	e, ok := d.endpoints[del.Endpoint]
	if !ok {
		log.Warn("webhooks: delivery for an endpoint that is no longer configured; dropped")
		d.opts.Telemetry.WebhookDelivery(del.Endpoint, telemetry.WebhookDropped)
		d.finish(wctx, del, log)
		return
	}
	status, retryAfter, err := d.send(ctx, e, del)
	now := d.opts.Now()
	switch {
	case err == nil && status >= 200 && status < 300:
		d.opts.Telemetry.WebhookDelivery(e.Name, telemetry.WebhookDelivered)
		log.Debug("webhooks: delivered", "attempt", del.Attempts+1)
		d.finish(wctx, del, log)
		return
	case err == nil && status == http.StatusGone:
		log.Warn("webhooks: the endpoint answered 410 Gone; delivery given up")
		d.giveUp(wctx, del, telemetry.WebhookGone, "the endpoint answered 410 Gone", log)
		return
	}
	why := fmt.Sprintf("HTTP %d", status)
	if err != nil {
		why = err.Error()
	}
	del.Attempts++
	del.LastError = why
	d.opts.Telemetry.WebhookDelivery(e.Name, telemetry.WebhookFailed)
	if now.Sub(del.Created) >= d.opts.MaxAge {
		log.Error("webhooks: delivery given up after the maximum age", "attempts", del.Attempts, "err", why)
		d.giveUp(wctx, del, telemetry.WebhookExpired, why, log)
		return
	}
	wait := d.backoff(del.Attempts)
	if retryAfter > wait {
		wait = min(retryAfter, time.Hour)
	}
	del.Due = now.Add(wait)
	log.Info("webhooks: delivery failed; retrying later", "attempt", del.Attempts, "err", why, "retry_in", wait.Round(time.Millisecond))
	if err := d.outbox.RetryDelivery(wctx, del); err != nil && !errors.Is(err, vault.ErrNotFound) {
		log.Warn("webhooks: recording a failed attempt failed (the delivery is retried when its claim ends)", "err", err)
	}
}

func (d *Dispatcher) finish(ctx context.Context, del vault.Delivery, log *slog.Logger) {
	if err := d.outbox.FinishDelivery(ctx, del.ID, del.Endpoint); err != nil && !errors.Is(err, vault.ErrNotFound) {
		log.Warn("webhooks: removing a finished delivery failed (it may be sent again)", "err", err)
	}
}

func (d *Dispatcher) giveUp(ctx context.Context, del vault.Delivery, outcome, why string, log *slog.Logger) {
	if outcome != telemetry.WebhookFailed {
		d.opts.Telemetry.WebhookDelivery(del.Endpoint, outcome)
	}
	d.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventWebhookExpired, Outcome: outcome,
		Via: "webhook:" + del.Endpoint, Err: errors.New(why + " (event " + del.ID + ", " + del.Type + ")")})
	d.finish(ctx, del, log)
}

// backoff is the pause after the n-th failure: Backoff·2^(n-1), at most
// an hour, between half of that and all of it (jitter).
func (d *Dispatcher) backoff(n int) time.Duration {
	w := d.opts.Backoff
	for i := 1; i < n && w < time.Hour; i++ {
		w *= 2
	}
	w = min(w, time.Hour)
	return w/2 + rand.N(w/2+1)
}

// send posts del to e, signed, and returns the status and any
// Retry-After.
func (d *Dispatcher) send(ctx context.Context, e Endpoint, del vault.Delivery) (int, time.Duration, error) {
	ts := d.opts.Now().Unix()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL, bytes.NewReader(del.Payload))
	if err != nil {
		return 0, 0, fmt.Errorf("building the request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", d.opts.UserAgent)
	req.Header.Set("webhook-id", del.ID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("webhook-signature", Sign(e.Keys, del.ID, ts, del.Payload))
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, 0, errors.New(describeSendErr(err))
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, retryAfter(resp.Header.Get("Retry-After"), d.opts.Now()), nil
}

// Sign returns the webhook-signature header value: for each key,
// "v1," and the base64 HMAC-SHA256 of "id.timestamp.body", separated by
// spaces.
func Sign(keys []vault.Secret, id string, ts int64, body []byte) string {
	sigs := make([]string, 0, len(keys))
	for _, k := range keys {
		m := hmac.New(sha256.New, []byte(k.Reveal()))
		m.Write([]byte(id + "." + strconv.FormatInt(ts, 10) + "."))
		m.Write(body)
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
	}
	return strings.Join(sigs, " ")
}

// retryAfter parses a Retry-After header (seconds or an HTTP date).
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return t.Sub(now)
	}
	return 0
}

// describeSendErr says why a request got no answer, without the URL (it
// may carry a token of the receiver's).
func describeSendErr(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.Is(err, context.Canceled):
		return "cancelled"
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return "connection failed: " + oe.Op
	}
	return "no answer"
}
