// Package fakepages serves the pages of the broker's stand-ins for outside
// services (the dev IdP, the demo provider, the fake providers of the
// tests): templates parsed once and rendered to a buffer first, so a
// failed render is a clean 500; every page with the headers of a page that
// loads nothing but its own stylesheet; the stylesheet itself.
package fakepages

import (
	"bytes"
	"html/template"
	"io"
	"log/slog"
	"net/http"
)

// Head is the template "head" a stand-in's page starts with,
// {{template "head" "Title"}}: the document's head, linking style.css.
const Head = `{{define "head"}}<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{.}}</title><link rel="stylesheet" href="style.css"></head>{{end}}`

// Set is a stand-in's pages and the Content-Security-Policy they are
// served with.
type Set struct {
	t   *template.Template
	csp string
}

// Parse parses defs, the {{define}}s of a stand-in's pages (Head among
// them), to be served with the policy csp. It panics on a bad template,
// as template.Must: the templates are constants of the program.
func Parse(csp, defs string) *Set {
	return &Set{t: template.Must(template.New("").Parse(Head + defs)), csp: csp}
}

// Render writes the page name with data and status. A failed render is
// logged to log (nil: not logged) and answered 500.
func (s *Set) Render(w http.ResponseWriter, log *slog.Logger, status int, name string, data any) {
	var buf bytes.Buffer
	if err := s.t.ExecuteTemplate(&buf, name, data); err != nil {
		if log != nil {
			log.Error("render failed", "page", name, "err", err)
		}
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", s.csp)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// Stylesheet serves css as a stand-in's style.css.
func Stylesheet(css string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		_, _ = io.WriteString(w, css)
	}
}
