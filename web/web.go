// Package web is the broker's browser kit, in the spirit of tailscale's
// safeweb: what both browser doors (oauthflow and authserver) serve pages
// with, written once.
//
//   - The page templates and static assets, embedded: html/template
//     files, each page with layout.html and partials.html (the blocks
//     pages share: a form step's error, facts, instructions and form),
//     with no inline scripts and no inline styles (the CSP forbids both).
//   - Site: the main listener's two muxes. Browser routes get the page
//     headers (SetPageHeaders: CSP, nosniff, no-referrer, frame options,
//     COOP, no-store) on every answer and cross-origin protection on
//     every POST; API routes (MCP, token, registration, revocation,
//     metadata, health) get neither and never see a cookie (APIPolicy,
//     also around the listeners of the sidecar, the admin API and the
//     metrics). A path is on one side only.
//   - Kit, one per door: template parsing and render-to-buffer (a failed
//     render is a clean 500), the error and failure pages, the form
//     preamble (PostedForm: signed in, bounded body, CSRF token compared
//     in constant time, the refusal and its security event) and the
//     server span of a route.
//   - The consent wording both consent pages share (ClientName,
//     ScopeWords).
package web

import (
	"embed"
	"io/fs"
)

//go:embed templates/*.html
var templatesFS embed.FS

//go:embed static/*
var staticFS embed.FS

// Templates holds the page templates: layout.html, partials.html and one
// file per page.
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
