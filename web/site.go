package web

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// Site is what the broker's main listener serves: the pages people open
// in a browser and the endpoints programs call, on two muxes that never
// share a route. Every answer of the browser side, its 404s and 405s
// included, carries the page headers (SetPageHeaders) and passes the
// cross-origin check (http.CrossOriginProtection: a cross-site POST never
// reaches a page's handler). The API side gets neither, and its handlers
// never see a cookie: a request's Cookie header is removed before the API
// mux routes it, so no API route can take the browser session as
// authentication.
//
// A request goes to the API side when a pattern registered there serves
// its path (for any method: a wrong method gets the mux's 405), else to
// the browser side.
type Site struct {
	// Browser holds the pages: the browser doors' routes and the static
	// assets (AssetsPattern), registered by NewSite.
	Browser *Routes
	// API holds the endpoints programs call: MCP, OAuth's JSON and
	// form endpoints, metadata, health and metrics.
	API *Routes

	browser, api http.Handler
}

// AssetsPattern is the route of the embedded stylesheet (Static): the one
// browser route cached publicly instead of Cache-Control no-store.
const AssetsPattern = "GET /static/"

// NewSite returns a site with the static assets mounted.
func NewSite() *Site {
	s := &Site{Browser: &Routes{mux: http.NewServeMux()}, API: &Routes{mux: http.NewServeMux()}}
	s.Browser.other, s.API.other = s.API, s.Browser
	s.Browser.Handle(AssetsPattern, assets())
	s.browser = pagePolicy(http.NewCrossOriginProtection().Handler(s.Browser.mux))
	s.api = APIPolicy(s.API.mux)
	return s
}

func (s *Site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.API.serves(r) {
		s.api.ServeHTTP(w, r)
		return
	}
	s.browser.ServeHTTP(w, r)
}

// SetPageHeaders sets the security headers of every page: a CSP that
// allows no script, no inline style and no framing, nosniff, no referrer,
// no caching, DENY framing for older browsers and a same-origin opener
// policy. formAction adds origins a page's forms may lead to.
func SetPageHeaders(h http.Header, formAction ...string) {
	fa := "'self'"
	for _, o := range formAction {
		if o != "" {
			fa += " " + o
		}
	}
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action "+fa+"; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// pagePolicy sets the page headers before anything answers, so that every
// answer of the browser side carries them: pages, redirects, refusals and
// the mux's own errors. A page that lets its forms lead elsewhere sets
// them again with more form-action origins (Kit.Render, SetPageHeaders).
func pagePolicy(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SetPageHeaders(w.Header())
		h.ServeHTTP(w, r)
	})
}

// APIPolicy is the API side's policy, for an API served on a listener of
// its own (the sidecar): h never sees a cookie.
func APIPolicy(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header["Cookie"]; ok {
			r.Header.Del("Cookie")
		}
		h.ServeHTTP(w, r)
	})
}

// assets serves Static: no directory listings, cached for an hour.
func assets() http.Handler {
	files := http.StripPrefix("/static/", http.FileServerFS(Static))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	})
}

// Routes is one side of a Site: a mux that remembers what was registered
// on it, so tests can walk every route.
type Routes struct {
	mux   *http.ServeMux
	other *Routes

	mu       sync.Mutex // guards the fields below
	patterns []string
	methods  []string // the methods the patterns name
}

// Handle registers h for pattern (http.ServeMux syntax). It panics, as
// the mux does for a conflict, when the other side of the site already
// has a route for the same path: a path is a page or an API, never both.
func (rt *Routes) Handle(pattern string, h http.Handler) {
	method, path := splitPattern(pattern)
	if rt.other.hasPath(path) {
		panic(fmt.Sprintf("web: %q is registered on both sides of the site", path))
	}
	rt.mux.Handle(pattern, h)
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.patterns = append(rt.patterns, pattern)
	if !slices.Contains(rt.methods, method) {
		rt.methods = append(rt.methods, method)
	}
}

// HandleFunc registers f for pattern, as Handle.
func (rt *Routes) HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request)) {
	rt.Handle(pattern, http.HandlerFunc(f))
}

// Patterns returns the registered patterns in registration order.
func (rt *Routes) Patterns() []string {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.patterns)
}

func (rt *Routes) hasPath(path string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.ContainsFunc(rt.patterns, func(p string) bool {
		_, q := splitPattern(p)
		return q == path
	})
}

// serves reports whether a route of rt serves r's path, with r's method or
// another one (the mux then answers 405).
func (rt *Routes) serves(r *http.Request) bool {
	if _, p := rt.mux.Handler(r); p != "" {
		return true
	}
	rt.mu.Lock()
	methods := rt.methods
	rt.mu.Unlock()
	for _, m := range methods {
		if m == r.Method || m == "" {
			continue
		}
		other := *r
		other.Method = m
		if _, p := rt.mux.Handler(&other); p != "" {
			return true
		}
	}
	return false
}

// splitPattern splits "[METHOD ][HOST]/PATH" into its method and the rest.
func splitPattern(pattern string) (method, path string) {
	if m, rest, ok := strings.Cut(pattern, " "); ok {
		return m, strings.TrimSpace(rest)
	}
	return "", pattern
}
