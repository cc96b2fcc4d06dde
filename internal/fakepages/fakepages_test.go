package fakepages

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRender: a page is rendered whole with the page headers; a page that
// fails half-way is a clean 500 holding nothing of it, and logged.
func TestRender(t *testing.T) {
	const csp = "default-src 'none'; style-src 'self'"
	set := Parse(csp, `{{define "ok"}}{{template "head" "Title"}}<p>{{.}}</p>{{end}}
{{define "half"}}<p>started</p>{{.Missing}}{{end}}`)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	rr := httptest.NewRecorder()
	set.Render(rr, log, http.StatusTeapot, "ok", "<b>")
	want := map[string]string{"Content-Type": "text/html; charset=utf-8", "Content-Security-Policy": csp,
		"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
	for k, v := range want {
		if got := rr.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	body := rr.Body.String()
	if rr.Code != http.StatusTeapot || !strings.HasPrefix(body, "<!doctype html>") || !strings.Contains(body, "<title>Title</title>") ||
		!strings.Contains(body, `href="style.css"`) || !strings.Contains(body, "<p>&lt;b&gt;</p>") {
		t.Errorf("HTTP %d:\n%s", rr.Code, body)
	}

	rr = httptest.NewRecorder()
	set.Render(rr, log, http.StatusOK, "half", "a string has no field Missing")
	if rr.Code != http.StatusInternalServerError || strings.Contains(rr.Body.String(), "started") || rr.Header().Get("Content-Security-Policy") != "" {
		t.Errorf("a failed render: HTTP %d, CSP %q:\n%s", rr.Code, rr.Header().Get("Content-Security-Policy"), rr.Body.String())
	}
	if !strings.Contains(logs.String(), "page=half") {
		t.Errorf("the failed render is not logged: %s", logs.String())
	}

	rr = httptest.NewRecorder()
	Stylesheet("main{margin:0}")(rr, httptest.NewRequest(http.MethodGet, "/style.css", nil))
	if rr.Header().Get("Content-Type") != "text/css; charset=utf-8" || rr.Header().Get("X-Content-Type-Options") != "nosniff" || rr.Body.String() != "main{margin:0}" {
		t.Errorf("style.css: %v %q", rr.Header(), rr.Body.String())
	}
}
