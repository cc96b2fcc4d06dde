package authserver

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
)

// pageNames are the templates of package web this package renders.
var pageNames = []string{"app_consent", "error"}

func parsePages(fsys fs.FS) (map[string]*template.Template, error) {
	pages := make(map[string]*template.Template, len(pageNames))
	for _, n := range pageNames {
		t, err := template.New(n).ParseFS(fsys, "layout.html", n+".html")
		if err != nil {
			return nil, fmt.Errorf("authserver: parse page %s: %w", n, err)
		}
		pages[n] = t
	}
	return pages, nil
}

// chrome is what the layout draws around every page.
type chrome struct {
	Identity string
	CSRF     string
}

func chromeOf(p Person) chrome { return chrome{Identity: p.Display, CSRF: p.CSRF} }

type scopeLine struct{ Scope, Words string }

// scopeLines describes the extra scopes an app asks for.
func scopeLines(scopes []string) []scopeLine {
	var out []scopeLine
	for _, sc := range scopes {
		switch sc {
		case scopeOffline:
			out = append(out, scopeLine{Scope: sc, Words: "keep access when you are not using it (refresh tokens)"})
		default:
			out = append(out, scopeLine{Scope: sc, Words: "the permission this broker's administrator requires of apps"})
		}
	}
	return out
}

type consentPage struct {
	Chrome       chrome
	ClientName   string
	Verified     string
	RedirectHost string
	// RedirectTarget is the redirect URI without its query, shown on the
	// one-click page (a loopback port is what tells two programs apart).
	RedirectTarget string
	Identity       string
	Scopes         []scopeLine
	Request        string
	Action         string
	// Remembered selects the one-click confirmation of a remembered
	// consent instead of the full consent page.
	Remembered bool
}

// errorPage is a failure the person must read (web/templates/error.html).
type errorPage struct {
	Chrome    chrome
	Status    int
	Heading   string
	Message   string
	Detail    string
	Next      string
	Reference string
}

// setPageHeaders sets the security headers of every page; formAction adds
// origins a form may lead to (browsers check a form's redirects too).
func setPageHeaders(h http.Header, formAction ...string) {
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

// render executes page into a buffer first, so a failed render is a clean 500.
func (s *Server) render(w http.ResponseWriter, status int, page string, data any, formAction ...string) {
	var buf bytes.Buffer
	if err := s.pages[page].ExecuteTemplate(&buf, "layout", data); err != nil {
		s.log.Error("authserver: render page", "page", page, "err", err)
		setPageHeaders(w.Header())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	setPageHeaders(w.Header(), formAction...)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func (s *Server) renderError(w http.ResponseWriter, p errorPage) {
	if p.Status == 0 {
		p.Status = http.StatusBadRequest
	}
	s.render(w, p.Status, "error", p)
}

// fail logs err with a reference and renders a generic error page.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, p Person, what string, err error) {
	ref := randomID(6)
	s.log.Error("authserver: request failed", "what", what, "path", r.URL.Path, "ref", ref, "err", err)
	s.renderError(w, errorPage{Chrome: chromeOf(p), Status: http.StatusInternalServerError, Heading: "Something went wrong",
		Message: "The broker could not finish this step. Nothing was authorized.",
		Next:    "Try again in a moment. If it keeps happening, tell your administrator the reference below.", Reference: ref})
}
