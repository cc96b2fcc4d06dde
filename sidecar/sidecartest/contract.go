package sidecartest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// SpecPath is the sidecar API's OpenAPI 3.1 document in this repository.
func SpecPath() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "docs", "sidecar.openapi.yaml")
}

var (
	specOnce sync.Once
	spec     *openapi3.T
	specErr  error
)

// loadSpec loads and validates docs/sidecar.openapi.yaml once per process.
func loadSpec() (*openapi3.T, error) {
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		spec, specErr = loader.LoadFromFile(SpecPath())
		if specErr != nil {
			specErr = fmt.Errorf("load %s: %w", SpecPath(), specErr)
			return
		}
		if !spec.IsOpenAPI31OrLater() {
			specErr = fmt.Errorf("%s is OpenAPI %s, want 3.1", SpecPath(), spec.OpenAPI)
			return
		}
		if err := spec.Validate(loader.Context); err != nil {
			specErr = fmt.Errorf("%s is not a valid OpenAPI document: %w", SpecPath(), err)
		}
	})
	return spec, specErr
}

// Contract checks real sidecar exchanges against the OpenAPI document:
// every response must be one the document describes for its route
// (status, headers, body schema; the broker's refusals on /v1/proxy
// against the Error schema), and every request the broker accepted (2xx)
// must match the document's request schema. A mismatch fails the test.
type Contract struct {
	tb  testing.TB
	doc *openapi3.T

	mu      sync.Mutex // guards checked
	checked map[string]int
}

// NewContract loads the document (failing tb when it is missing or
// invalid) and returns a checker that reports to tb.
func NewContract(tb testing.TB) *Contract {
	tb.Helper()
	doc, err := loadSpec()
	if err != nil {
		tb.Fatal(err)
	}
	return &Contract{tb: tb, doc: doc, checked: map[string]int{}}
}

// Checked returns how many exchanges were checked, per "METHOD template status".
func (c *Contract) Checked() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.checked))
	for k, v := range c.checked {
		out[k] = v
	}
	return out
}

// route finds the document's operation for a request.
func (c *Contract) route(r *http.Request) (*routers.Route, map[string]string, error) {
	path := r.URL.EscapedPath()
	tmpl, params := path, map[string]string{}
	if rest, ok := strings.CutPrefix(path, "/v1/proxy/"); ok {
		provider, sub, _ := strings.Cut(rest, "/")
		tmpl, params = "/v1/proxy/{provider}/{path}", map[string]string{"provider": provider, "path": sub}
	}
	item := c.doc.Paths.Value(tmpl)
	if item == nil {
		return nil, nil, fmt.Errorf("%s %s: no such path in the document", r.Method, path)
	}
	op := item.GetOperation(r.Method)
	if op == nil {
		return nil, nil, fmt.Errorf("%s %s: the document has no %s operation for %s", r.Method, path, r.Method, tmpl)
	}
	return &routers.Route{Spec: c.doc, Path: tmpl, PathItem: item, Method: r.Method, Operation: op}, params, nil
}

// Check validates one exchange: the request (its body given apart) and
// the response's status, header and body.
func (c *Contract) Check(r *http.Request, reqBody []byte, status int, header http.Header, body []byte) {
	c.tb.Helper()
	if err := c.check(r, reqBody, status, header, body); err != nil {
		c.tb.Errorf("sidecar contract (docs/sidecar.openapi.yaml): %s %s → HTTP %d %s\n%v", r.Method, r.URL.Path, status, clip(body), err)
	}
}

func (c *Contract) check(r *http.Request, reqBody []byte, status int, header http.Header, body []byte) error {
	route, params, err := c.route(r)
	if err != nil {
		return err
	}
	ctx := context.Background()
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	req := r.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	if status >= 200 && status < 300 {
		if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
			return fmt.Errorf("the broker accepted a request the document does not describe: %w", err)
		}
	}
	proxy := strings.HasPrefix(route.Path, "/v1/proxy/")
	ropts := *opts
	// A relayed answer's body is the provider's, of any type; the
	// broker's refusals are checked against Error below.
	ropts.ExcludeResponseBody = proxy
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: &ropts}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		return err
	}
	if proxy && header.Get("Broker-Error") == "true" {
		// A refusal of the broker's own, among relayed answers of any shape.
		var v any
		if err := json.Unmarshal(body, &v); err != nil {
			return fmt.Errorf("a Broker-Error answer is not JSON: %w", err)
		}
		if err := c.doc.Components.Schemas["Error"].Value.VisitJSON(v, openapi3.EnableJSONSchema2020()); err != nil {
			return fmt.Errorf("a Broker-Error answer is not an Error: %w", err)
		}
	}
	if !proxy || header.Get("Broker-Error") == "true" {
		if cc := header.Get("Cache-Control"); cc != "no-store" {
			return fmt.Errorf("Cache-Control %q, want no-store", cc)
		}
	}
	c.mu.Lock()
	c.checked[fmt.Sprintf("%s %s %d", r.Method, route.Path, status)]++
	c.mu.Unlock()
	return nil
}

func clip(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// Handler serves next and checks every exchange.
func (c *Contract) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqBody, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "reading the request", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(reqBody))
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, r)
		c.Check(r, reqBody, rec.Code, rec.Header(), rec.Body.Bytes())
		for k, vs := range rec.Header() {
			w.Header()[k] = vs
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	})
}

// Proxy starts a loopback reverse proxy to the sidecar API at target
// (http://host:port, or unix:///path/to.sock) that checks every exchange,
// and returns its URL: point a co-located server at it to check a running
// broker's answers.
func (c *Contract) Proxy(target string) string {
	c.tb.Helper()
	var transport http.RoundTripper = http.DefaultTransport
	if sock, ok := strings.CutPrefix(target, "unix://"); ok {
		transport = &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}}
		target = "http://sidecar"
	}
	u, err := url.Parse(target)
	if err != nil {
		c.tb.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u) }, Transport: transport}
	srv := httptest.NewServer(c.Handler(rp))
	c.tb.Cleanup(srv.Close)
	return srv.URL
}
