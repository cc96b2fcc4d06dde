package web

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"credbroker/internal/clientaddr"
	"credbroker/internal/outage"
	"credbroker/internal/tracing"
)

// KitOptions configures one browser door's Kit.
type KitOptions struct {
	// Door names the door in errors ("oauthflow", "authserver").
	Door string
	// Pages are the templates the door renders (names without .html);
	// none: every page, so a provider kind's own page is found by the
	// name its browser step gives.
	Pages []string
	// Unchanged is what a failure page says was left alone ("Nothing was
	// connected.").
	Unchanged string
	// RedactPath hides what a logged path must not show (a connect
	// link's id); nil: paths are logged as they are.
	RedactPath func(string) string
	// ClientAddr is the address of the client behind a request, which
	// security events name (nil: the connection's peer).
	ClientAddr func(*http.Request) string
	// Tracing, when set, makes each route registered with a span name a
	// server span (nil: off); SpanAttrs adds attributes of the request
	// (nil: none).
	Tracing   trace.TracerProvider
	SpanAttrs func(*http.Request) []attribute.KeyValue
	Logger    *slog.Logger
}

// Kit is what a browser door serves its pages with: the parsed
// templates, rendering to a buffer, the refusal and failure pages, the
// form preamble (Kit.PostedForm), security events and the server span.
type Kit struct {
	opts   KitOptions
	log    *slog.Logger
	pages  map[string]*template.Template
	tracer trace.Tracer // nil: tracing off
}

// NewKit parses the door's pages, each with layout.html (the page's
// frame) and partials.html (the parts pages share, such as a form step's
// fields).
func NewKit(o KitOptions) (*Kit, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ClientAddr == nil {
		o.ClientAddr = clientaddr.Trusted{}.Addr // the peer
	}
	if o.RedactPath == nil {
		o.RedactPath = func(p string) string { return p }
	}
	k := &Kit{opts: o, log: o.Logger, tracer: tracing.Tracer(o.Tracing)}
	names := o.Pages
	if len(names) == 0 {
		files, err := fs.Glob(Templates, "*.html")
		if err != nil {
			return nil, fmt.Errorf("%s: list pages: %w", o.Door, err)
		}
		for _, f := range files {
			if n := strings.TrimSuffix(f, ".html"); n != "layout" && n != "partials" {
				names = append(names, n)
			}
		}
	}
	k.pages = make(map[string]*template.Template, len(names))
	for _, n := range names {
		t, err := template.New(n).ParseFS(Templates, "layout.html", "partials.html", n+".html")
		if err != nil {
			return nil, fmt.Errorf("%s: parse page %s: %w", o.Door, n, err)
		}
		k.pages[n] = t
	}
	return k, nil
}

// Route registers h for pattern on rt (a side of the Site), in a server
// span named span when the door traces (span "": never): the method, the
// route, SpanAttrs and the status, nothing from the query, form or
// headers.
func (k *Kit) Route(rt *Routes, pattern, span string, h http.HandlerFunc) {
	if span == "" {
		rt.Handle(pattern, h)
		return
	}
	rt.Handle(pattern, tracing.Handler(k.tracer, span, h, k.opts.SpanAttrs))
}

// Chrome is the part of every page the layout draws: who is signed in
// (empty when nobody is) and their CSRF token for the sign-out form.
type Chrome struct {
	Identity string
	CSRF     string
}

// ErrorPage is any failure a person must read (error.html): Heading,
// Message, what to do Next, optionally a Detail from elsewhere (untrusted,
// escaped) and a Reference that the logs carry too.
type ErrorPage struct {
	Chrome    Chrome
	Status    int // 0: 400
	Heading   string
	Message   string
	Detail    string
	Next      string
	Reference string
}

// Render executes page with data into a buffer first, so a failed render
// is a clean 500, and writes it with status and the page headers;
// formAction lists origins the page's forms may lead to besides the
// broker (a redirect after a form post is checked against form-action).
func (k *Kit) Render(w http.ResponseWriter, status int, page string, data any, formAction ...string) {
	t, ok := k.pages[page]
	var buf bytes.Buffer
	err := fmt.Errorf("no such page")
	if ok {
		err = t.ExecuteTemplate(&buf, "layout", data)
	}
	if err != nil {
		k.log.Error("render page", "page", page, "err", err)
		SetPageHeaders(w.Header())
		http.Error(w, "internal error rendering the page", http.StatusInternalServerError)
		return
	}
	SetPageHeaders(w.Header(), formAction...)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// RenderError renders p (status 400 unless it says otherwise).
func (k *Kit) RenderError(w http.ResponseWriter, p ErrorPage) {
	if p.Status == 0 {
		p.Status = http.StatusBadRequest
	}
	k.Render(w, p.Status, "error", p)
}

// Fail logs err under a fresh reference and renders the generic failure
// page with status, naming the reference.
func (k *Kit) Fail(w http.ResponseWriter, r *http.Request, c Chrome, status int, what string, err error) {
	ref := reference()
	k.log.Error("request failed", "what", what, "path", k.opts.RedactPath(r.URL.Path), "ref", ref, "err", err)
	k.RenderError(w, ErrorPage{Chrome: c, Status: status, Heading: "Something went wrong",
		Message: "The broker could not finish this step. " + k.opts.Unchanged,
		Next:    "Try again in a moment. If it keeps happening, tell your administrator the reference below.", Reference: ref})
}

// Unavailable renders the page of a request the broker's storage
// outage stopped: 503 with Retry-After, saying the storage is unavailable
// and to try again in a few seconds (next: how, on this page; "" for
// reloading it). The cause (err, which names the database or the file)
// goes to the log only, under a reference the page shows.
func (k *Kit) Unavailable(w http.ResponseWriter, r *http.Request, c Chrome, what, next string, err error) {
	ref := reference()
	k.log.Warn("store unavailable; answered 503", "what", what, "path", k.opts.RedactPath(r.URL.Path), "ref", ref, "err", err)
	if next == "" {
		next = "Reload this page in a few seconds."
	}
	outage.SetRetryAfter(w.Header())
	k.RenderError(w, ErrorPage{Chrome: c, Status: http.StatusServiceUnavailable, Heading: "The broker's storage is unavailable",
		Message: "The broker cannot read or save anything right now, so this step did not complete. " + k.opts.Unchanged,
		Next:    next + " It usually works again within seconds; if it does not, tell your administrator the reference below.", Reference: ref})
}

// reference returns a short random reference for a failure.
func reference() string {
	var b [6]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
