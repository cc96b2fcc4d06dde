package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/devidp"
	"credbroker/internal/devidp/devidptest"
	"credbroker/internal/htmlform"
	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/web"
)

// routeStack is the broker mounted in-process as `serve` mounts it in
// broker mode (authorization server, metrics on the main listener, the
// sidecar API on a listener of its own), and a browser signed in to it.
type routeStack struct {
	t       *testing.T
	base    string
	site    *web.Site
	sidecar string
	// cookies are the signed-in browser's cookies at the broker; csrf is
	// the session's form token, read from a page.
	cookies []*http.Cookie
	csrf    string
}

const routeSidecarSecret = "routes-sidecar-secret-0123456789"

func newRouteStack(t *testing.T) *routeStack {
	t.Helper()
	idp := devidptest.Start(t, nil, nil)
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	if err := idp.AddClient(devidp.Client{ID: "broker", Secret: "routes-idp-secret", RedirectURIs: []string{srv.URL + "/auth/callback"}}); err != nil {
		t.Fatal(err)
	}
	reg := unreachableDemo(t)
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	side, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m, err := mount(ctx, mux, brokerDeps{
		PublicURL: srv.URL, Resource: srv.URL + "/mcp", Issuer: idp.Issuer(),
		ClientID: "broker", ClientSecret: vault.Secret("routes-idp-secret"), DevMode: true,
		GrantTTL: time.Minute, StateTTL: time.Minute,
		Store: memstore.New(kr), Keys: kr, Providers: reg, Logger: newLogger(&discard{}, "json", 0),
		HTTPClient: outboundClient(), MetricsOnMain: true, Telemetry: telemetry.New(telemetry.Options{Providers: reg.Names()}),
		Sidecar:    sidecarConfig{Listener: side, Secret: vault.Secret(routeSidecarSecret)},
		AuthServer: &authServerConfig{Registration: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := &routeStack{t: t, base: srv.URL, site: m.Site, sidecar: "http://" + side.Addr().String()}
	s.signIn("alice")
	return s
}

// signIn signs a browser in through the IdP's form and keeps its cookies
// and the session's CSRF token (from the sign-out form every page has).
func (s *routeStack) signIn(user string) {
	s.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 20 * time.Second, Transport: testClient.Transport}
	get := func(req *http.Request) (*url.URL, string) {
		resp, err := c.Do(req)
		if err != nil {
			s.t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.Request.URL, string(b)
	}
	req, _ := http.NewRequest(http.MethodGet, s.base+"/connections", nil)
	u, body := get(req)
	target, vals, err := htmlform.Find(u, body, "login", url.Values{"username": {user}, "password": {user}})
	if err != nil {
		s.t.Fatalf("no sign-in form at %s: %v", u, err)
	}
	req, _ = http.NewRequest(http.MethodPost, target.String(), strings.NewReader(vals.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	u, body = get(req)
	_, vals, err = htmlform.Find(u, body, "/logout", nil)
	if err != nil || vals.Get("csrf") == "" {
		s.t.Fatalf("signed in, %s has no sign-out form: %v\n%.800s", u, err, body)
	}
	bu, _ := url.Parse(s.base)
	s.cookies, s.csrf = jar.Cookies(bu), vals.Get("csrf")
	if len(s.cookies) == 0 {
		s.t.Fatal("signed in without a cookie")
	}
}

// answer is one response, its body read.
type answer struct {
	status int
	header http.Header
	body   string
}

// do sends method path to base with form as the body (nil: none) and the
// signed-in cookies (signedIn), following no redirect.
func (s *routeStack) do(base, method, path string, signedIn bool, form url.Values, header http.Header) answer {
	s.t.Helper()
	return s.send(base, method, path, signedIn, func() (io.Reader, string) {
		if form == nil {
			return nil, ""
		}
		return strings.NewReader(form.Encode()), "application/x-www-form-urlencoded"
	}, header)
}

// send is do with a body of its content type.
func (s *routeStack) send(base, method, path string, signedIn bool, body func() (io.Reader, string), header ...http.Header) answer {
	s.t.Helper()
	b, ctype := body()
	req, err := http.NewRequest(method, base+path, b)
	if err != nil {
		s.t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for _, h := range header {
		for k, v := range h {
			req.Header[k] = v
		}
	}
	if signedIn {
		for _, c := range s.cookies {
			req.AddCookie(c)
		}
	}
	c := &http.Client{Timeout: 20 * time.Second, Transport: testClient.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: string(rb)}
}

var placeholderRE = regexp.MustCompile(`\{[^}]*\}`)

// requestOf turns a route pattern into a request that reaches it: its
// method (GET when it names none) and a path with every wildcard filled
// ({provider} with the configured provider, a subtree with the stylesheet,
// the one file the broker serves under one).
func requestOf(pattern string) (method, path string) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = http.MethodGet, pattern
	}
	path = placeholderRE.ReplaceAllStringFunc(path, func(p string) string {
		if p == "{provider}" {
			return "demo"
		}
		return "x"
	})
	if strings.HasSuffix(path, "/") && path != "/" {
		path += "style.css"
	}
	return method, path
}

// pagePolicyProblems says how h differs from the page policy: the CSP
// directives, nosniff, no referrer, no framing, the opener policy, and
// cacheControl.
func pagePolicyProblems(h http.Header, cacheControl string) []string {
	var out []string
	csp := h.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "style-src 'self'", "form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'"} {
		if !strings.Contains(csp, d) {
			out = append(out, "CSP "+strings.TrimSpace(csp)+" lacks "+d)
		}
	}
	if strings.Contains(csp, "script-src") || strings.Contains(csp, "unsafe-inline") {
		out = append(out, "CSP allows scripts or inline code: "+csp)
	}
	for k, v := range map[string]string{
		"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY",
		"Cross-Origin-Opener-Policy": "same-origin", "Cache-Control": cacheControl,
	} {
		if got := h.Get(k); got != v {
			out = append(out, k+": "+got+", want "+v)
		}
	}
	return out
}

// apiEndpoints are the endpoints programs call, which must be API routes
// wherever they are registered (a sanity check of the split, not the list
// of routes: that comes from the site's muxes).
var apiEndpoints = []string{"POST /mcp", "POST /token", "POST /register", "POST /revoke",
	"GET /.well-known/oauth-authorization-server", "GET /.well-known/oauth-protected-resource", "GET /.well-known/jwks.json"}

// TestEveryBrowserRouteCarriesThePagePolicy walks every route registered
// on the site's browser side (both browser doors and the static assets)
// and checks the page headers on each answer: signed out, signed in (a
// POST with the session's CSRF token) and, for every POST, a cross-site
// post, which the cross-origin check refuses before any handler runs.
func TestEveryBrowserRouteCarriesThePagePolicy(t *testing.T) {
	s := newRouteStack(t)
	patterns := s.site.Browser.Patterns()
	for _, want := range []string{"GET /connections", "POST /connections/{provider}/connect", "GET /authorize", web.AssetsPattern} {
		if !slices.Contains(patterns, want) {
			t.Fatalf("browser routes %v lack %s: a door did not register on the site", patterns, want)
		}
	}
	for _, p := range patterns {
		if slices.Contains(apiEndpoints, p) {
			t.Errorf("%s is a browser route; programs call it", p)
		}
	}
	patterns = append(patterns, "GET /no-such-page") // the browser side's own 404
	for _, pattern := range patterns {
		t.Run(pattern, func(t *testing.T) {
			method, path := requestOf(pattern)
			var form url.Values
			if method == http.MethodPost {
				form = url.Values{"csrf": {s.csrf}, "decision": {"deny"}}
			}
			check := func(what string, a answer) {
				t.Helper()
				cache := "no-store"
				if pattern == web.AssetsPattern && a.status == http.StatusOK {
					cache = "public, max-age=3600"
				}
				for _, p := range pagePolicyProblems(a.header, cache) {
					t.Errorf("%s %s %s (HTTP %d): %s", what, method, path, a.status, p)
				}
			}
			out, in := s.do(s.base, method, path, false, form, nil), s.do(s.base, method, path, true, form, nil)
			t.Logf("%s %s: HTTP %d signed out, %d signed in", method, path, out.status, in.status)
			check("signed out", out)
			check("signed in", in)
			if method == http.MethodPost {
				a := s.do(s.base, method, path, true, form, http.Header{"Sec-Fetch-Site": {"cross-site"}})
				if a.status != http.StatusForbidden {
					t.Errorf("a cross-site %s %s answered %d, want 403 from the cross-origin check", method, path, a.status)
				}
				check("cross-site", a)
			}
		})
	}
}

// TestNoAPIRouteCarriesPagePolicyOrTakesCookies walks every route on the
// site's API side, and the sidecar API's routes (docs/sidecar.openapi.yaml),
// with and without the signed-in browser's cookies: no answer carries a
// page header, is a page or sets a cookie (a sign-in's, say), and the
// cookies change no answer, so none of these routes takes the browser
// session as authentication.
func TestNoAPIRouteCarriesPagePolicyOrTakesCookies(t *testing.T) {
	s := newRouteStack(t)
	patterns := s.site.API.Patterns()
	for _, want := range apiEndpoints {
		if !slices.Contains(patterns, want) {
			t.Errorf("%s is not an API route (API routes: %v)", want, patterns)
		}
	}
	type route struct{ listener, base, pattern string }
	var routes []route
	for _, p := range patterns {
		routes = append(routes, route{"main", s.base, p})
	}
	for _, p := range sidecarPatterns(t) {
		routes = append(routes, route{"sidecar", s.sidecar, p})
	}
	for _, rt := range routes {
		t.Run(rt.listener+" "+rt.pattern, func(t *testing.T) {
			method, path := requestOf(rt.pattern)
			// A POST is sent as a form and as JSON, so that whichever an
			// endpoint reads, its authentication is reached.
			bodies := map[string]func() (io.Reader, string){"no body": func() (io.Reader, string) { return nil, "" }}
			if method == http.MethodPost {
				bodies = map[string]func() (io.Reader, string){
					"form": func() (io.Reader, string) {
						return strings.NewReader(url.Values{"csrf": {s.csrf}}.Encode()), "application/x-www-form-urlencoded"
					},
					"JSON": func() (io.Reader, string) { return strings.NewReader(`{}`), "application/json" },
				}
			}
			for kind, body := range bodies {
				without := s.send(rt.base, method, path, false, body)
				with := s.send(rt.base, method, path, true, body)
				t.Logf("%s %s (%s): HTTP %d", method, path, kind, without.status)
				for what, a := range map[string]answer{"without cookies": without, "with the session's cookies": with} {
					for _, h := range []string{"Content-Security-Policy", "X-Frame-Options", "Cross-Origin-Opener-Policy", "Referrer-Policy"} {
						if v := a.header.Get(h); v != "" {
							t.Errorf("%s %s (%s) %s answered with the page header %s: %s", method, path, kind, what, h, v)
						}
					}
					if strings.Contains(a.header.Get("Content-Type"), "text/html") {
						t.Errorf("%s %s (%s) %s answered a page (HTTP %d)", method, path, kind, what, a.status)
					}
					if c := a.header.Values("Set-Cookie"); len(c) > 0 {
						t.Errorf("%s %s (%s) %s set a cookie (HTTP %d): %v", method, path, kind, what, a.status, c)
					}
				}
				if with.status != without.status {
					t.Errorf("%s %s (%s): HTTP %d with the browser's cookies, %d without: the cookies count as authentication",
						method, path, kind, with.status, without.status)
				}
			}
		})
	}
}

// sidecarPatterns are the sidecar API's routes as its contract lists them.
func sidecarPatterns(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "sidecar.openapi.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for path, ops := range doc.Paths {
		for m := range ops {
			switch m {
			case "get", "put", "post", "delete", "patch", "head", "options":
				out = append(out, strings.ToUpper(m)+" "+path)
			}
		}
	}
	if len(out) < 3 {
		t.Fatalf("the sidecar contract lists %v", out)
	}
	slices.Sort(out)
	return out
}
