package authserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"credbroker/internal/egress"
)

// Fetching Client ID Metadata Documents: the client_id URL comes from
// whoever opens the authorize endpoint, so the fetch is a server-side
// request forgery vector. The dialer is internal/egress's (egress.NewDialer,
// the broker's one dial-time check): the host is resolved and every
// address it resolves to, and the address each socket connects to, is
// checked against egress's special-use ranges (egress.IsSpecialUse) and
// refused unless AllowPrivateMetadata is set. No proxy is used (it would
// connect on our behalf to anything); redirects are not followed; the
// answer must be 200 with a JSON type and at most maxDocumentBytes; only
// valid documents are cached, within bounds.

const (
	maxDocumentBytes = 5 << 10 // the draft recommends 5 KB
	fetchTimeout     = 5 * time.Second
	defaultDocTTL    = 5 * time.Minute
	maxDocTTL        = 24 * time.Hour
	// staleDocTTL is how long a cached document may stand in for one whose
	// fetch fails (the client's site is down), so its users keep working.
	staleDocTTL  = 24 * time.Hour
	maxCachedDoc = 1000
)

// FetchError is why a Client ID Metadata Document could not be used; its
// message is written for the person on the error page and the client.
type FetchError struct {
	Reason string
	Err    error // for logs
}

func (e *FetchError) Error() string { return e.Reason }
func (e *FetchError) Unwrap() error { return e.Err }

// newMetadataClient returns the HTTP client of metadata fetches.
func newMetadataClient(allowPrivate bool, tlsConfig *tls.Config) *http.Client {
	tr := &http.Transport{
		Proxy:                  nil,
		DialContext:            egress.NewDialer(egress.Options{AllowPrivate: allowPrivate, DialTimeout: fetchTimeout}),
		TLSClientConfig:        tlsConfig,
		TLSHandshakeTimeout:    fetchTimeout,
		ResponseHeaderTimeout:  fetchTimeout,
		MaxResponseHeaderBytes: 16 << 10,
		MaxIdleConns:           16,
		IdleConnTimeout:        30 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   fetchTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse // the draft forbids following redirects
		},
	}
}

type cachedDoc struct {
	meta    Metadata
	fetched time.Time
	until   time.Time
}

type flight struct {
	done chan struct{}
	meta Metadata
	err  error
}

// metadataCache fetches and caches Client ID Metadata Documents, one fetch
// per URL at a time.
type metadataCache struct {
	client *http.Client
	now    func() time.Time

	mu      sync.Mutex // guards the maps
	docs    map[string]cachedDoc
	flights map[string]*flight
}

func newMetadataCache(client *http.Client, now func() time.Time) *metadataCache {
	return &metadataCache{client: client, now: now, docs: map[string]cachedDoc{}, flights: map[string]*flight{}}
}

// get returns the validated metadata of clientID, from the cache while it
// is fresh, else fetched (concurrent callers share one fetch).
func (c *metadataCache) get(ctx context.Context, clientID string) (Metadata, error) {
	if err := checkClientIDURL(clientID); err != nil {
		return Metadata{}, &FetchError{Reason: err.Error()}
	}
	now := c.now()
	c.mu.Lock()
	if d, ok := c.docs[clientID]; ok && now.Before(d.until) {
		c.mu.Unlock()
		return d.meta, nil
	}
	f, ok := c.flights[clientID]
	if !ok {
		f = &flight{done: make(chan struct{})}
		c.flights[clientID] = f
		go c.fetch(clientID, f)
	}
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.meta, f.err
	case <-ctx.Done():
		return Metadata{}, ctx.Err()
	}
}

// fetch runs one fetch for clientID and publishes its result.
func (c *metadataCache) fetch(clientID string, f *flight) {
	ctx, cancel := context.WithTimeout(context.Background(), fetchTimeout)
	defer cancel()
	meta, ttl, err := c.fetchOnce(ctx, clientID)
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.flights, clientID)
	var fe *FetchError
	switch {
	case err == nil:
		if ttl > 0 {
			c.store(clientID, cachedDoc{meta: meta, fetched: now, until: now.Add(ttl)})
		} else {
			delete(c.docs, clientID)
		}
	case errors.As(err, &fe) && fe.Err != nil && transient(fe.Err):
		// The client's site cannot be reached: a recently valid document
		// stands in, so its users keep working through an outage.
		if d, ok := c.docs[clientID]; ok && now.Before(d.fetched.Add(staleDocTTL)) {
			meta, err = d.meta, nil
		}
	default:
		delete(c.docs, clientID) // never keep a document that is no longer valid
	}
	f.meta, f.err = meta, err
	close(f.done)
}

// transient reports whether a fetch error is the network's, not the
// document's or the address policy's.
func transient(err error) bool {
	var refused *egress.RefusedError
	if errors.As(err, &refused) {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errServerError)
}

var errServerError = errors.New("server error")

// store adds d, evicting expired entries (then arbitrary ones) when full;
// c.mu must be held.
func (c *metadataCache) store(id string, d cachedDoc) {
	if len(c.docs) >= maxCachedDoc {
		now := c.now()
		for k, v := range c.docs {
			if !now.Before(v.fetched.Add(staleDocTTL)) {
				delete(c.docs, k)
			}
		}
		for k := range c.docs {
			if len(c.docs) < maxCachedDoc {
				break
			}
			delete(c.docs, k)
		}
	}
	c.docs[id] = d
}

func (c *metadataCache) fetchOnce(ctx context.Context, clientID string) (Metadata, time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientID, nil)
	if err != nil {
		return Metadata{}, 0, &FetchError{Reason: "the client_id is not a URL the broker can fetch", Err: err}
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		if errors.Is(err, egress.ErrSpecialAddress) {
			return Metadata{}, 0, &FetchError{Reason: "the client's metadata document is at a loopback, private or other special-use address, which this broker does not fetch from", Err: err}
		}
		return Metadata{}, 0, &FetchError{Reason: "the client's metadata document could not be fetched", Err: err}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		return Metadata{}, 0, &FetchError{Reason: fmt.Sprintf("the client's metadata document answered with a redirect (HTTP %d); redirects are not followed", resp.StatusCode)}
	case resp.StatusCode >= 500:
		return Metadata{}, 0, &FetchError{Reason: fmt.Sprintf("the client's metadata document answered HTTP %d", resp.StatusCode), Err: errServerError}
	case resp.StatusCode != http.StatusOK:
		return Metadata{}, 0, &FetchError{Reason: fmt.Sprintf("the client's metadata document answered HTTP %d, not 200", resp.StatusCode)}
	}
	if !jsonType(resp.Header.Get("Content-Type")) {
		return Metadata{}, 0, &FetchError{Reason: "the client's metadata document is not served as JSON"}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocumentBytes+1))
	if err != nil {
		return Metadata{}, 0, &FetchError{Reason: "the client's metadata document could not be read", Err: err}
	}
	if len(body) > maxDocumentBytes {
		return Metadata{}, 0, &FetchError{Reason: fmt.Sprintf("the client's metadata document is larger than %d bytes", maxDocumentBytes)}
	}
	meta, err := ParseClientIDMetadataDocument(clientID, body)
	if err != nil {
		return Metadata{}, 0, &FetchError{Reason: "the client's metadata document is not valid: " + err.(*MetadataError).Description}
	}
	return meta, cacheTTL(resp.Header.Values("Cache-Control")), nil
}

func jsonType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && (mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")))
}

// cacheTTL reads Cache-Control (RFC 9111): no-store and no-cache mean no
// caching, max-age is honoured up to maxDocTTL, and without either the
// document is kept defaultDocTTL.
func cacheTTL(values []string) time.Duration {
	ttl := defaultDocTTL
	for _, v := range values {
		for d := range strings.SplitSeq(v, ",") {
			d = strings.ToLower(strings.TrimSpace(d))
			switch {
			case d == "no-store" || d == "no-cache":
				return 0
			case strings.HasPrefix(d, "max-age="):
				n, err := strconv.Atoi(strings.Trim(strings.TrimPrefix(d, "max-age="), `"`))
				if err != nil || n < 0 {
					return 0
				}
				ttl = min(time.Duration(n)*time.Second, maxDocTTL)
			}
		}
	}
	return ttl
}
