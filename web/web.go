// Package web holds credbroker's page templates and static assets, embedded
// into the binary. The templates are html/template files, each page with
// layout.html, rendered by the browser doors (oauthflow, which parses every
// page so a provider kind's own page is found by the name its browser step
// gives, and authserver); they carry no inline scripts and no inline styles
// (the pages are served with a Content-Security-Policy that forbids both).
package web

import (
	"embed"
	"io/fs"
)

//go:embed templates/*.html
var templatesFS embed.FS

//go:embed static/*
var staticFS embed.FS

// Templates holds the page templates: layout.html plus one file per page.
var Templates fs.FS = mustSub(templatesFS, "templates")

// Static holds the files served under /static/.
var Static fs.FS = mustSub(staticFS, "static")

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic("web: " + err.Error())
	}
	return s
}
