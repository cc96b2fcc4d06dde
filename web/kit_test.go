package web

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

// siteWithRoutes is a site with one page and one API route that reports
// which cookies reached it.
func siteWithRoutes(t *testing.T) *Site {
	t.Helper()
	s := NewSite()
	s.Browser.HandleFunc("GET /page", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("page")) })
	s.Browser.HandleFunc("POST /page", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("posted")) })
	s.API.HandleFunc("POST /api", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("cookies:" + r.Header.Get("Cookie")))
	})
	return s
}

func serve(s *Site, method, target string, header http.Header) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		r.Header[k] = v
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// TestSiteKeepsPagesAndAPIsApart: every answer of the browser side (a
// page, the assets, a 404, a 405, a cross-site post refused) carries the
// page headers; no answer of the API side does (nor its 405), and no
// cookie reaches an API handler.
func TestSiteKeepsPagesAndAPIsApart(t *testing.T) {
	s := siteWithRoutes(t)
	cross := http.Header{"Sec-Fetch-Site": {"cross-site"}}
	for _, tc := range []struct {
		name, method, target string
		header               http.Header
		status               int
		page                 bool
	}{
		{"page", "GET", "/page", nil, 200, true},
		{"asset", "GET", "/static/style.css", nil, 200, true},
		{"asset directory", "GET", "/static/", nil, 404, true},
		{"unknown path", "GET", "/nothing", nil, 404, true},
		{"page, wrong method", "DELETE", "/page", nil, 405, true},
		{"page, same-origin post", "POST", "/page", http.Header{"Sec-Fetch-Site": {"same-origin"}}, 200, true},
		{"page, cross-site post", "POST", "/page", cross, 403, true},
		{"api", "POST", "/api", http.Header{"Cookie": {"session=alice"}}, 200, false},
		{"api, cross-site", "POST", "/api", cross, 200, false},
		{"api, wrong method", "GET", "/api", nil, 405, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := serve(s, tc.method, tc.target, tc.header)
			if w.Code != tc.status {
				t.Fatalf("HTTP %d, want %d: %s", w.Code, tc.status, w.Body)
			}
			csp, frame := w.Header().Get("Content-Security-Policy"), w.Header().Get("X-Frame-Options")
			if tc.page != (csp != "" && frame == "DENY") {
				t.Errorf("page headers: CSP %q, X-Frame-Options %q; want them: %v", csp, frame, tc.page)
			}
			if !tc.page && w.Body.String() != "cookies:" && w.Code == 200 {
				t.Errorf("the API handler saw %q", w.Body)
			}
		})
	}
	if got := serve(s, "GET", "/static/style.css", nil).Header().Get("Cache-Control"); got != "public, max-age=3600" {
		t.Errorf("the stylesheet's Cache-Control: %q", got)
	}
	if got := serve(s, "GET", "/page", nil).Header().Get("Cache-Control"); got != "no-store" {
		t.Errorf("a page's Cache-Control: %q", got)
	}
}

// TestSitePathIsOnOneSide: registering a path on the other side panics,
// and the patterns registered are the ones listed.
func TestSitePathIsOnOneSide(t *testing.T) {
	s := siteWithRoutes(t)
	if got := strings.Join(s.Browser.Patterns(), ","); got != AssetsPattern+",GET /page,POST /page" {
		t.Errorf("browser patterns: %s", got)
	}
	if got := strings.Join(s.API.Patterns(), ","); got != "POST /api" {
		t.Errorf("API patterns: %s", got)
	}
	for _, tc := range []struct {
		rt      *Routes
		pattern string
	}{{s.API, "GET /page"}, {s.Browser, "GET /api"}, {s.API, "/static/"}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s registered on both sides", tc.pattern)
				}
			}()
			tc.rt.HandleFunc(tc.pattern, func(http.ResponseWriter, *http.Request) {})
		}()
	}
}

func testKit(t *testing.T, logs *bytes.Buffer) *Kit {
	t.Helper()
	k, err := NewKit(KitOptions{Door: "test", Pages: []string{"error", "consent"}, Unchanged: "Nothing changed.",
		RedactPath: func(p string) string { return strings.ReplaceAll(p, "secret", "REF") },
		Logger:     slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRender: a page is rendered whole with the page headers and any
// extra form-action origin; a failed render, or an unknown page, is a
// clean 500 with nothing of the page in it.
func TestRender(t *testing.T) {
	var logs bytes.Buffer
	k := testKit(t, &logs)
	w := httptest.NewRecorder()
	k.RenderError(w, ErrorPage{Chrome: Chrome{Identity: "alice@example.test", CSRF: "tok"}, Heading: "Oops <b>", Message: "m", Next: "n"})
	if w.Code != 400 || !strings.Contains(w.Body.String(), "Oops &lt;b&gt;") || !strings.Contains(w.Body.String(), `value="tok"`) {
		t.Fatalf("error page: HTTP %d\n%s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	k.Render(w, 200, "consent", struct{ Nothing int }{}, "https://provider.example")
	if w.Code != 500 || strings.Contains(w.Body.String(), "<html") || !strings.Contains(logs.String(), "render page") {
		t.Fatalf("a failed render: HTTP %d\n%s", w.Code, w.Body)
	}
	if w.Header().Get("X-Frame-Options") != "DENY" {
		t.Errorf("a failed render lacks the page headers")
	}
	w = httptest.NewRecorder()
	k.Render(w, 200, "no_such_page", nil)
	if w.Code != 500 {
		t.Fatalf("an unknown page: HTTP %d", w.Code)
	}
	w = httptest.NewRecorder()
	k.RenderError(w, ErrorPage{Status: http.StatusGone, Heading: "h"})
	if w.Code != http.StatusGone {
		t.Errorf("an error page with its status: HTTP %d", w.Code)
	}
	w = httptest.NewRecorder()
	k.Render(w, 200, "error", ErrorPage{Heading: "h"}, "https://provider.example")
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "form-action 'self' https://provider.example;") {
		t.Errorf("CSP with a form target: %s", csp)
	}
}

// TestPostedForm: nobody signed in is a 401 page; a post without the
// session's CSRF token, with another one, or with a body over the limit
// is a 403 page and a security event naming the actor and the redacted
// path; the right token passes with the form parsed.
func TestPostedForm(t *testing.T) {
	var logs bytes.Buffer
	k := testKit(t, &logs)
	alice := &Visitor{Issuer: "https://idp.example", Subject: "alice", Display: "alice@example.test", CSRF: "alice-token"}
	f := Form{Limit: 64, SignedOut: ErrorPage{Message: "signed out words"}, Refused: ErrorPage{Message: "refused words"}}
	post := func(v *Visitor, body string) (*httptest.ResponseRecorder, bool, *http.Request) {
		r := httptest.NewRequest("POST", "/connect/secret", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		w := httptest.NewRecorder()
		return w, k.PostedForm(w, r, v, f), r
	}
	if w, ok, _ := post(nil, "csrf=alice-token"); ok || w.Code != 401 || !strings.Contains(w.Body.String(), "signed out words") {
		t.Errorf("signed out: %v, HTTP %d", ok, w.Code)
	}
	for name, body := range map[string]string{
		"no token":      "decision=approve",
		"another token": "csrf=bob-token",
		"empty token":   "csrf=",
		"too large":     "csrf=alice-token&x=" + strings.Repeat("a", 100),
	} {
		logs.Reset()
		w, ok, _ := post(alice, body)
		if ok || w.Code != 403 || !strings.Contains(w.Body.String(), "refused words") || !strings.Contains(w.Body.String(), "alice@example.test") {
			t.Errorf("%s: %v, HTTP %d", name, ok, w.Code)
		}
		if l := logs.String(); !strings.Contains(l, "event=csrf_rejected") || !strings.Contains(l, "actor_sub=alice") ||
			!strings.Contains(l, "path=/connect/REF") || strings.Contains(l, "alice-token") {
			t.Errorf("%s: security event %s", name, l)
		}
	}
	w, ok, r := post(alice, url.Values{"csrf": {"alice-token"}, "decision": {"approve"}}.Encode())
	if !ok || w.Body.Len() != 0 || r.PostFormValue("decision") != "approve" {
		t.Errorf("the right token: %v, wrote %q", ok, w.Body)
	}
}

// TestSecurityEventNamesTheActor: the event names the client's address
// and the signed-in person when there is one.
func TestSecurityEventNamesTheActor(t *testing.T) {
	var logs bytes.Buffer
	k := testKit(t, &logs)
	r := httptest.NewRequest("GET", "/x", nil)
	r.RemoteAddr = "10.1.2.3:5000"
	k.SecurityEvent(r, "login_state_mismatch", nil, "k", "v")
	if l := logs.String(); !strings.Contains(l, "event=login_state_mismatch remote=10.1.2.3 k=v") || strings.Contains(l, "actor") {
		t.Errorf("signed out: %s", l)
	}
}

// TestFail: the generic failure page names a reference the log line
// carries, with the path redacted, and nothing of the error.
func TestFail(t *testing.T) {
	var logs bytes.Buffer
	k := testKit(t, &logs)
	w := httptest.NewRecorder()
	k.Fail(w, httptest.NewRequest("GET", "/connect/secret", nil), Chrome{}, 502, "load", errSecret)
	ref := logs.String()[strings.Index(logs.String(), "ref=")+4:]
	ref = ref[:strings.IndexByte(ref, ' ')]
	if w.Code != 502 || !strings.Contains(w.Body.String(), "Reference: "+ref) || strings.Contains(w.Body.String(), errSecret.Error()) ||
		!strings.Contains(w.Body.String(), "Nothing changed.") || !strings.Contains(logs.String(), "path=/connect/REF") {
		t.Fatalf("HTTP %d, ref %q\n%s\n%s", w.Code, ref, w.Body, logs.String())
	}
}

var errSecret = &secretError{}

type secretError struct{}

func (*secretError) Error() string { return "the-database-password" }

// TestConsentWords: both doors' consent pages take these words.
func TestConsentWords(t *testing.T) {
	if ClientName("", "") != UnnamedClient || ClientName("", "indexer") != "" || ClientName("Claude", "") != "Claude" {
		t.Error("ClientName")
	}
	if w, ok := ScopeWords("offline_access"); !ok || w != "Keep access when you are not using the app" {
		t.Errorf("offline_access: %q", w)
	}
	if _, ok := ScopeWords("repo"); ok {
		t.Error("a provider's scope has standard words")
	}
}
