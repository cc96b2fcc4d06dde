package provider

import (
	"bufio"
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/tracing"
	"credbroker/internal/untrusted"
	"credbroker/provider/redact"
	"credbroker/vault"
)

// RequestError is an API request the broker refuses to send: the message
// is safe to show to the caller and names the problem precisely.
type RequestError struct{ Msg string }

func (e *RequestError) Error() string { return e.Msg }

func reqErrorf(format string, args ...any) error {
	return &RequestError{Msg: fmt.Sprintf(format, args...)}
}

// apiMethods are the HTTP methods an API request may use.
var apiMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// apiMethods returns the HTTP methods an API request may use.
func APIMethods() []string { return slices.Clone(apiMethods) }

// allowedRequestHeaders may be set by the caller of an API request; every
// other header (Authorization above all) is refused.
var allowedRequestHeaders = []string{
	"Accept", "Accept-Language", "Content-Type", "If-Match", "If-None-Match",
	"If-Modified-Since", "If-Unmodified-Since", "X-GitHub-Api-Version",
}

// AllowedRequestHeaders returns the request headers a caller may set.
func AllowedRequestHeaders() []string { return slices.Clone(allowedRequestHeaders) }

// RequestPattern is one entry of a provider's API allow-list:
// "[METHOD[,METHOD…] ]PATH". PATH is relative to the API base; "*" matches
// one path segment; a PATH ending in "/" matches everything below it; any
// other PATH matches itself and everything below it ("/user" matches
// "/user" and "/user/repos" but not "/users").
type RequestPattern struct {
	Methods []string // empty: every method in apiMethods
	Path    string
}

// ParseRequestPattern parses one allow-list entry.
func ParseRequestPattern(s string) (RequestPattern, error) {
	var rp RequestPattern
	path := strings.TrimSpace(s)
	if m, rest, ok := strings.Cut(path, " "); ok {
		for meth := range strings.SplitSeq(m, ",") {
			meth = strings.ToUpper(strings.TrimSpace(meth))
			if !slices.Contains(apiMethods, meth) {
				return rp, fmt.Errorf("%q: method %q is not one of %s", s, meth, strings.Join(apiMethods, ", "))
			}
			rp.Methods = append(rp.Methods, meth)
		}
		path = strings.TrimSpace(rest)
	}
	if !strings.HasPrefix(path, "/") {
		return rp, fmt.Errorf("%q: the path must start with /", s)
	}
	if _, err := checkAPIPath(path); err != nil {
		return rp, fmt.Errorf("%q: %v", s, err)
	}
	rp.Path = path
	return rp, nil
}

// Match reports whether method and path (relative to the API base,
// already checked by checkAPIPath) are allowed by rp.
func (rp RequestPattern) Match(method, path string) bool {
	if len(rp.Methods) > 0 && !slices.Contains(rp.Methods, method) {
		return false
	}
	ps := strings.Split(strings.TrimPrefix(rp.Path, "/"), "/")
	xs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	prefix := strings.HasSuffix(rp.Path, "/")
	if prefix {
		ps = ps[:len(ps)-1]
	}
	if len(xs) < len(ps) || (prefix && len(xs) == len(ps)) {
		return false
	}
	for i, p := range ps {
		if p != "*" && p != xs[i] {
			return false
		}
	}
	return true
}

// requestAllowed applies the base's allow-list (empty: everything under
// the base).
func (b APIBase) requestAllowed(method, path string) bool {
	if len(b.AllowedRequests) == 0 {
		return true
	}
	for _, rp := range b.AllowedRequests {
		if rp.Match(method, path) {
			return true
		}
	}
	return false
}

// apiBase returns the API base a request names by host ("": the first).
func (p *Provider) apiBase(host string) (*APIBase, error) {
	if len(p.APIBases) == 0 {
		return nil, reqErrorf("provider %s has no API configured (api.base_url in providers.yaml)", p.Name)
	}
	if host == "" {
		return &p.APIBases[0], nil
	}
	for i, b := range p.APIBases {
		if strings.EqualFold(b.Host, host) {
			return &p.APIBases[i], nil
		}
	}
	hosts := make([]string, len(p.APIBases))
	for i, b := range p.APIBases {
		hosts[i] = b.Host
	}
	if len(host) > 256 {
		host = host[:256]
	}
	return nil, reqErrorf("host %q is not one of %s's API hosts (%s)", host, p.Name, strings.Join(hosts, ", "))
}

// checkAPIPath validates an untrusted API path relative to the API base and
// returns its segments' decoded form. It refuses anything that could leave
// the base: absolute or scheme-relative URLs, "." and ".." segments,
// encoded slashes, dots, backslashes or percent signs (double encoding),
// "@", backslashes, control characters, query or fragment markers.
func checkAPIPath(path string) (string, error) {
	switch {
	case path == "":
		return "", reqErrorf("path is required (relative to the API base, starting with /)")
	case len(path) > 2048:
		return "", reqErrorf("path is longer than 2048 bytes")
	case !strings.HasPrefix(path, "/"):
		return "", reqErrorf("path must start with / and be relative to the API base (absolute URLs are refused)")
	case strings.HasPrefix(path, "//"), strings.Contains(path, "//"):
		return "", reqErrorf("path must not contain empty segments (//)")
	case strings.ContainsAny(path, "\\"):
		return "", reqErrorf("path must not contain backslashes")
	case strings.Contains(path, "@"):
		return "", reqErrorf("path must not contain @")
	case strings.ContainsAny(path, "?#"):
		return "", reqErrorf("path must not contain ? or #: pass query parameters in query")
	}
	for _, r := range path {
		if r < 0x21 || r == 0x7f || r > 0x7e {
			return "", reqErrorf("path must be printable ASCII without spaces (percent-encode other characters)")
		}
	}
	low := strings.ToLower(path)
	for _, enc := range []string{"%2f", "%2e", "%5c", "%25", "%00", "%40", "%3f", "%23"} {
		if strings.Contains(low, enc) {
			return "", reqErrorf("path must not contain encoded slashes, dots, backslashes, @, ?, # or percent signs (%s)", enc)
		}
	}
	for seg := range strings.SplitSeq(path[1:], "/") {
		if seg == "." || seg == ".." {
			return "", reqErrorf("path must not contain . or .. segments")
		}
	}
	dec, err := url.PathUnescape(path)
	if err != nil {
		return "", reqErrorf("path has malformed percent-encoding")
	}
	return dec, nil
}

// ResolveAPIURL joins an untrusted path and query to the API base URL and
// checks that the result stays under the base (same scheme, host and path
// prefix).
func ResolveAPIURL(base, path string, query url.Values) (*url.URL, error) {
	b, err := url.Parse(base)
	if err != nil {
		b = nil
	}
	return resolveAPIURL(b, path, query)
}

// resolveAPIURL is ResolveAPIURL on a parsed base (nil: one that does
// not parse), which it does not change.
func resolveAPIURL(b *url.URL, path string, query url.Values) (*url.URL, error) {
	if b == nil || b.Host == "" {
		return nil, errors.New("provider: provider has an invalid API base URL")
	}
	dec, err := checkAPIPath(path)
	if err != nil {
		return nil, err
	}
	basePath := strings.TrimSuffix(b.Path, "/")
	u := &url.URL{Scheme: b.Scheme, Host: b.Host, Path: basePath + dec, RawPath: strings.TrimSuffix(b.EscapedPath(), "/") + path}
	if u.EscapedPath() != u.RawPath {
		u.RawPath = "" // canonical encoding equals what was given
	}
	if len(query) > 0 {
		for k, vs := range query {
			if k == "" || len(k) > 256 {
				return nil, reqErrorf("query parameter names must be 1-256 bytes")
			}
			for _, v := range vs {
				if len(v) > 4096 {
					return nil, reqErrorf("query parameter %q is longer than 4096 bytes", k)
				}
			}
		}
		u.RawQuery = query.Encode()
		if len(u.RawQuery) > 8192 {
			return nil, reqErrorf("query is longer than 8192 bytes once encoded")
		}
	}
	if err := underBase(b, u); err != nil {
		return nil, err
	}
	return u, nil
}

// underBase checks that u is on b's scheme and host, under b's path.
func underBase(b, u *url.URL) error {
	basePath := strings.TrimSuffix(b.Path, "/")
	if u.Scheme != b.Scheme || !strings.EqualFold(u.Host, b.Host) || u.User != nil ||
		!(u.Path == basePath || strings.HasPrefix(u.Path, basePath+"/")) {
		return reqErrorf("the request would leave the provider's API base URL")
	}
	return nil
}

// APIRequest is a request to a provider's API, relative to its base URL.
type APIRequest struct {
	// Host names one of the provider's API bases by host
	// ("gmail.googleapis.com"); empty: the first, api.base_url.
	Host   string
	Method string
	Path   string
	Query  url.Values
	Header http.Header // only AllowedRequestHeaders
	Body   []byte
}

// APIResponse is the provider's answer. Body holds at most the response
// cap; Truncated says there was more.
type APIResponse struct {
	Status    int
	Header    http.Header // selected headers only (see responseHeader)
	Body      []byte
	Truncated bool
	// Decoded names the Content-Encoding (gzip, deflate) the provider
	// applied although the broker asked for none, which the broker undid
	// to check the answer for secrets; "" when the answer came plain.
	Decoded string
}

// UninspectableError is an answer the broker could not check for secrets:
// Why says what (no token material). It matches ErrUninspectableAnswer.
type UninspectableError struct {
	Provider string
	Why      string
}

func (e *UninspectableError) Error() string {
	return fmt.Sprintf("%v: %s", ErrUninspectableAnswer, e.Detail())
}

// Detail is what was wrong, naming the provider's API.
func (e *UninspectableError) Detail() string { return e.Provider + " API: " + e.Why }

func (e *UninspectableError) Unwrap() error { return ErrUninspectableAnswer }

// decodedBody returns resp's body with a gzip or deflate content encoding
// undone (the broker asked for identity; a provider may still compress),
// and which encoding that was. Any other encoding is refused.
func decodedBody(resp *http.Response) (io.Reader, string, error) {
	enc := strings.ToLower(strings.TrimSpace(resp.Header.Get("Content-Encoding")))
	switch enc {
	case "", "identity":
		return resp.Body, "", nil
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			return nil, "", fmt.Errorf("the gzip answer does not decode")
		}
		return zr, "gzip", nil
	case "deflate":
		// HTTP's deflate is the zlib format; some servers send raw deflate.
		br := bufio.NewReader(resp.Body)
		if head, err := br.Peek(2); err == nil && (uint16(head[0])<<8|uint16(head[1]))%31 == 0 && head[0]&0x0f == 8 {
			zr, err := zlib.NewReader(br)
			if err != nil {
				return nil, "", fmt.Errorf("the deflate answer does not decode")
			}
			return zr, "deflate", nil
		}
		return flate.NewReader(br), "deflate", nil
	}
	return nil, "", fmt.Errorf("the answer uses Content-Encoding %q, which the broker does not decode", untrusted.Clip(enc, 32))
}

// responseHeader reports whether an upstream response header is passed on:
// content description, caching validators, pagination and rate limits.
func responseHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Content-Type", "Content-Language", "Etag", "Last-Modified", "Link", "Retry-After", "Location",
		"X-Github-Request-Id", "X-Oauth-Scopes", "X-Accepted-Oauth-Scopes":
		return true
	}
	return hasLowerPrefix(name, "x-ratelimit-") || hasLowerPrefix(name, "ratelimit")
}

// hasLowerPrefix is strings.HasPrefix(strings.ToLower(s), prefix) for a
// lower-case ASCII prefix, without making the lower-case copy when s is
// ASCII.
func hasLowerPrefix(s, prefix string) bool {
	for i := range len(s) {
		if s[i] >= 0x80 {
			// ToLower maps some non-ASCII letters to ASCII ones (the
			// Kelvin sign to k).
			return strings.HasPrefix(strings.ToLower(s), prefix)
		}
	}
	if len(s) < len(prefix) {
		return false
	}
	for i := range len(prefix) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

// prepare validates req against p and returns the API base, the upstream
// URL and headers.
func (k *Client) prepare(p *Provider, req APIRequest) (*APIBase, *url.URL, http.Header, error) {
	base, err := p.apiBase(req.Host)
	if err != nil {
		return nil, nil, nil, err
	}
	u, h, err := k.prepareOn(p, base, req)
	return base, u, h, err
}

func (k *Client) prepareOn(p *Provider, base *APIBase, req APIRequest) (*url.URL, http.Header, error) {
	if !slices.Contains(apiMethods, req.Method) {
		return nil, nil, reqErrorf("method %q is not allowed: use %s", req.Method, strings.Join(apiMethods, ", "))
	}
	if int64(len(req.Body)) > k.opts.MaxRequestBody {
		return nil, nil, reqErrorf("request body is %d bytes, more than the %d allowed", len(req.Body), k.opts.MaxRequestBody)
	}
	u, err := resolveAPIURL(base.baseURL(), req.Path, req.Query)
	if err != nil {
		return nil, nil, err
	}
	if !base.requestAllowed(req.Method, req.Path) {
		return nil, nil, reqErrorf("%s %s is not in the broker's allow-list for %s (%s)", req.Method, req.Path, p.Name, base.Host)
	}
	h := http.Header{}
	for name, vs := range req.Header {
		canon := http.CanonicalHeaderKey(name)
		if !slices.Contains(allowedRequestHeaders, canon) {
			return nil, nil, reqErrorf("request header %q is not allowed; allowed: %s", name, strings.Join(allowedRequestHeaders, ", "))
		}
		for _, v := range vs {
			if len(v) > 1024 || strings.ContainsAny(v, "\r\n\x00") {
				return nil, nil, reqErrorf("request header %q has an invalid value", name)
			}
			h.Add(canon, v)
		}
	}
	if h.Get("Accept") == "" {
		h.Set("Accept", "application/json")
	}
	if len(req.Body) > 0 && h.Get("Content-Type") == "" {
		h.Set("Content-Type", "application/json")
	}
	return u, h, nil
}

// Do performs req against the API of connection id's provider with its
// access token (refreshed before expiry; refreshed once more and retried
// when the API answers 401 to an unexpired token). The connection's token
// set is opened once; a refresh reloads it under the refresh lock.
// Requests that could leave the API base req.Host names, or that its
// allow-list does not name, return a *RequestError before anything is sent
// (a refresh included). Redirects are followed only on that base's host,
// within its path, to a method and path its allow-list names; any other
// redirect is returned as is. Do does not record the use (the connections
// layer does).
//
// A 401 the broker cannot cure marks the connection needs_reconnect and
// returns ErrNeedsReconnect, so the next call asks the person to connect
// again: a 401 to a token with no refresh token (a GitHub OAuth app token
// revoked by its owner, or unused for a year), or a 401 again right after
// a refresh.
//
// For an api_key provider the stored key is injected as the entry's
// inject says, every secret field is redacted from the answer, and a 401
// marks the connection needs_reconnect and returns ErrNeedsReconnect.
func (k *Client) Do(ctx context.Context, id string, req APIRequest) (resp APIResponse, err error) {
	if k.tracer != nil {
		var span trace.Span
		ctx, span = k.startSpan(ctx, "provider.request", attribute.String("http.request.method", req.Method))
		defer func() {
			span.SetAttributes(attribute.Int("http.response.status_code", resp.Status))
			endSpan(span, err, "provider request failed")
		}()
	}
	conn, err := k.opts.Store.GetConnection(ctx, id)
	if err != nil {
		return APIResponse{}, fmt.Errorf("provider: connection %s: %w", id, err)
	}
	p, ok := k.opts.Providers.Lookup(conn.Provider)
	if !ok {
		return APIResponse{}, fmt.Errorf("%w: %s", ErrUnknownProvider, conn.Provider)
	}
	if k.tracer != nil {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("provider", p.Name))
	}
	base, u, hdr, err := k.prepare(p, req)
	if err != nil {
		return APIResponse{}, err
	}
	caller, ok := p.Kind.(apiCaller)
	if !ok {
		return APIResponse{}, reqErrorf("%s has no API the broker calls", p.DisplayName)
	}
	return caller.do(ctx, k, p, apiCall{base: base, conn: conn, method: req.Method, u: u, hdr: hdr, body: req.Body})
}

// apiCall is one checked API request on a connection's behalf.
type apiCall struct {
	base   *APIBase
	conn   vault.Connection
	method string
	u      *url.URL
	hdr    http.Header
	body   []byte
}

// do sends an OAuth connection's request with its access token (refreshed
// before expiry): a 401 to an unexpired token is refreshed once and
// retried once; one that cannot be cured marks the connection
// needs_reconnect.
func (o *OAuth) do(ctx context.Context, k *Client, p *Provider, call apiCall) (APIResponse, error) {
	conn, err := k.usable(ctx, call.conn)
	if err != nil {
		return APIResponse{}, err
	}
	resp, err := k.send(ctx, p, call.base, bearerCredential(conn), call.method, call.u, call.hdr, call.body)
	if err != nil || resp.Status != http.StatusUnauthorized || !conn.Token.Expiry.IsZero() && !k.opts.Now().Before(conn.Token.Expiry) {
		return resp, err
	}
	// An unexpired token was refused.
	log := k.log.With("provider", p.Name, "connection", conn.ID)
	if conn.Token.RefreshToken == "" {
		// Nothing to refresh with: revoked outside the broker.
		return APIResponse{}, k.refused(ctx, conn, log, "the provider refused the access token, and there is no refresh token")
	}
	// Refresh once and retry once.
	fresh, err := k.ForceRefresh(ctx, conn.ID, conn.Token.AccessToken)
	if err != nil {
		return APIResponse{}, err
	}
	if fresh.Token.AccessToken == conn.Token.AccessToken {
		return resp, nil
	}
	if resp, err = k.send(ctx, p, call.base, bearerCredential(fresh), call.method, call.u, call.hdr, call.body); err != nil {
		return APIResponse{}, err
	}
	if resp.Status == http.StatusUnauthorized {
		return APIResponse{}, k.refused(ctx, fresh, log, "the provider refused the access token again right after a refresh")
	}
	return resp, nil
}

// refused marks c needs_reconnect because the provider refused its access
// token and refreshing cannot help, and returns ErrNeedsReconnect (or the
// failure to record it). When c's tokens changed meanwhile (reconnected in
// the browser), c is left as it is and the caller's request fails with
// ErrNeedsReconnect all the same; it is not retried.
func (k *Client) refused(ctx context.Context, c vault.Connection, log *slog.Logger, why string) error {
	_, err := k.markNeedsReconnect(ctx, c, log, why)
	if err == nil || errors.Is(err, ErrNeedsReconnect) {
		return fmt.Errorf("%w: %s", ErrNeedsReconnect, why)
	}
	return err
}

// credential is what goes on an API request on a connection's behalf:
// set puts it on the request's headers; forms are the byte strings the
// answer is scrubbed of (the secrets in the encodings an echo would use).
type credential struct {
	set   func(h http.Header)
	forms [][]byte
}

// bearerCredential is an OAuth connection's access token.
func bearerCredential(conn vault.Connection) credential {
	tt := conn.Token.TokenType
	if tt == "" || strings.EqualFold(tt, "bearer") {
		tt = "Bearer"
	}
	at := conn.Token.AccessToken.Reveal()
	return credential{
		set:   func(h http.Header) { h.Set("Authorization", tt+" "+at) },
		forms: redact.Forms(at),
	}
}

// call sends req to p with cl, counting it (ProviderCall): the caller's
// cancellation as it is, any other failure ErrProviderUnavailable naming
// what (no response body, no request material).
func (k *Client) call(ctx context.Context, p *Provider, cl *http.Client, req *http.Request, what string) (*http.Response, error) {
	start := time.Now()
	resp, err := cl.Do(req)
	status := 0
	if err == nil {
		status = resp.StatusCode
	}
	k.opts.Telemetry.ProviderCall(p.Name, status, time.Since(start))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %s %s: %s", ErrProviderUnavailable, p.Name, what, describeRefreshErr(err))
	}
	return resp, nil
}

// send performs one upstream request and reads the capped answer.
func (k *Client) send(ctx context.Context, p *Provider, api *APIBase, cred credential, method string, u *url.URL, hdr http.Header, body []byte) (APIResponse, error) {
	if p.PropagateTrace && k.tracer != nil {
		ctx = tracing.WithPropagation(ctx)
	}
	hreq, err := newRequestTo(ctx, method, u, body)
	if err != nil {
		return APIResponse{}, reqErrorf("the request could not be built")
	}
	hreq.Header = hdr.Clone()
	cred.set(hreq.Header)
	// An answer must be read to be redacted: ask for it uncompressed (and
	// keep Go's transport from decompressing behind our back).
	hreq.Header.Set("Accept-Encoding", "identity")
	// Set here rather than by the User-Agent RoundTripper the other
	// requests go through, which copies every request.
	hreq.Header.Set("User-Agent", k.opts.UserAgent)
	cl := k.apiClients[api]
	if cl == nil {
		cl = k.apiClient(api)
	}
	resp, err := k.call(ctx, p, cl, hreq, "API")
	if err != nil {
		return APIResponse{}, err
	}
	defer resp.Body.Close()
	// An API that echoes the request (a debugging endpoint, an error
	// message) must not hand the token back to the caller, in any of the
	// encodings an echo is likely to use. A token starting before the cap
	// is read whole so it is redacted whole, then the body is cut.
	forms := cred.forms
	longest := 0
	for _, f := range forms {
		longest = max(longest, len(f))
	}
	answer, decoded, err := decodedBody(resp)
	if err != nil {
		return APIResponse{}, &UninspectableError{Provider: p.Name, Why: err.Error()}
	}
	readCap := k.opts.MaxResponseBody + int64(longest) + 1
	size := int64(-1)
	if decoded == "" {
		// The announced length sizes the buffer (within the cap); it does
		// not decide what is read.
		size = min(resp.ContentLength, readCap)
	}
	b, err := readAnswer(io.LimitReader(answer, readCap), size)
	if err != nil {
		if decoded != "" {
			return APIResponse{}, &UninspectableError{Provider: p.Name, Why: "the " + decoded + " answer does not decode"}
		}
		return APIResponse{}, fmt.Errorf("%w: %s API: reading the answer failed", ErrProviderUnavailable, p.Name)
	}
	out := APIResponse{Status: resp.StatusCode, Header: http.Header{}, Decoded: decoded}
	out.Body, out.Truncated = redact.Capped(b, forms, k.opts.MaxResponseBody)
	for name, vs := range resp.Header {
		if responseHeader(name) {
			for _, v := range vs {
				for _, f := range forms {
					if containsForm(v, f) {
						v = strings.ReplaceAll(v, string(f), redact.Replacement)
					}
				}
				out.Header.Add(name, v)
			}
		}
	}
	return out, nil
}

// newRequestTo is http.NewRequestWithContext for a URL already resolved and
// checked: the request carries a copy of u itself rather than a parse of
// its text, so what was checked is what is sent (and no parse is paid per
// call).
func newRequestTo(ctx context.Context, method string, u *url.URL, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, "", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	sent := *u
	sent.Host = strings.TrimSuffix(sent.Host, ":") // as NewRequest does
	req.URL, req.Host = &sent, sent.Host
	return req, nil
}

// apiClient returns the HTTP client for API calls on api: it follows a
// redirect only as redirectAllowed says. New makes one for each API base
// of the catalogue, so that requests need not.
func (k *Client) apiClient(api *APIBase) *http.Client {
	base := api.baseURL()
	cl := *k.apiHTTP
	cl.CheckRedirect = func(r *http.Request, via []*http.Request) error {
		if len(via) >= 5 || !redirectAllowed(api, base, r) {
			// Never follow with the token to another host, outside the base
			// or to a method and path the allow-list does not name (a 307
			// or 308 replays the method and body): the caller gets the 3xx.
			return http.ErrUseLastResponse
		}
		return nil
	}
	return &cl
}

// redirectAllowed reports whether the API client may follow a redirect to
// r: on the request's API host, under its base path, to a path that passes
// checkAPIPath and, with r's method, that base's allow-list. A redirect to
// another of the provider's API hosts is not followed either.
func redirectAllowed(api *APIBase, base *url.URL, r *http.Request) bool {
	if underBase(base, r.URL) != nil {
		return false
	}
	rel, ok := strings.CutPrefix(r.URL.EscapedPath(), strings.TrimSuffix(base.EscapedPath(), "/"))
	if !ok || rel == "" {
		return false
	}
	if _, err := checkAPIPath(rel); err != nil {
		return false
	}
	return slices.Contains(apiMethods, r.Method) && api.requestAllowed(r.Method, rel)
}

// containsForm is strings.Contains(s, string(f)) without copying f into a
// string, which every header value and form would otherwise cost.
func containsForm(s string, f []byte) bool {
	if len(f) == 0 {
		return true
	}
	for i := 0; i+len(f) <= len(s); i++ {
		j := strings.IndexByte(s[i:len(s)-len(f)+1], f[0])
		if j < 0 {
			return false
		}
		i += j
		if s[i:i+len(f)] == string(f) {
			return true
		}
	}
	return false
}

// readAnswer is io.ReadAll(r) into a buffer made for size bytes (unknown
// when not positive), so that an answer of the size announced is read
// without growing the buffer on the way.
func readAnswer(r io.Reader, size int64) ([]byte, error) {
	if size <= 0 {
		return io.ReadAll(r)
	}
	// One byte more than announced: reading EOF needs room.
	b := make([]byte, 0, size+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
	}
}
