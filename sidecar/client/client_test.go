package client_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"credbroker/sidecar/client"
)

const (
	secret    = "sidecar-secret-0123456789abcdef"
	userToken = "user-token-abcdefghijklmnop"
)

// recorder is a loopback server that notes every request it receives.
type recorder struct {
	mu   sync.Mutex // guards seen
	seen []http.Header
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	rc.seen = append(rc.seen, r.Header.Clone())
	rc.mu.Unlock()
	w.Write([]byte(`{"status":"connected"}`))
}

func (rc *recorder) headers() []http.Header {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]http.Header(nil), rc.seen...)
}

// redirecting stands in for a sidecar relaying a provider's redirect to
// another host (as GitHub's tarball downloads do).
func redirecting(target string, got *recorder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.ServeHTTP(httptest.NewRecorder(), r)
		status := http.StatusFound
		if r.Method == http.MethodPost {
			status = http.StatusTemporaryRedirect // resends the body and, unchecked, every header
		}
		w.Header().Set("Location", target+"/elsewhere")
		w.WriteHeader(status)
	})
}

func startUnix(t *testing.T, h http.Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "unix://" + sock
}

func TestClientNeverForwardsCredentialsOnRedirect(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		unix   bool
		follow bool // the caller's own http.Client would follow redirects
	}{
		{"tcp", false, false},
		{"tcp, caller's client follows redirects", false, true},
		{"unix socket", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			other := &recorder{}
			otherSrv := httptest.NewServer(other)
			t.Cleanup(otherSrv.Close)
			atSidecar := &recorder{}
			h := redirecting(otherSrv.URL, atSidecar)
			var base string
			if tc.unix {
				base = startUnix(t, h)
			} else {
				srv := httptest.NewServer(h)
				t.Cleanup(srv.Close)
				base = srv.URL
			}
			var hc *http.Client
			if tc.follow {
				hc = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
			}
			c, err := client.New(base, secret, hc)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(ctx, userToken, "github", client.Request{Path: "/repos/o/r/tarball/main"})
			if err != nil || resp.Status != http.StatusFound || resp.Header.Get("Location") != otherSrv.URL+"/elsewhere" {
				t.Errorf("proxy GET: %+v %v; want the 302 itself", resp, err)
			}
			resp, err = c.Do(ctx, userToken, "github", client.Request{Method: http.MethodPost, Path: "/upload", Body: []byte("x")})
			if err != nil || resp.Status != http.StatusTemporaryRedirect {
				t.Errorf("proxy POST: %+v %v; want the 307 itself", resp, err)
			}
			var e *client.Error
			if _, err := c.Require(ctx, userToken, client.RequireRequest{Provider: "github"}); !errors.As(err, &e) || e.Status != http.StatusTemporaryRedirect {
				t.Errorf("require: %v; want an HTTP 307 error", err)
			}
			if _, err := c.Token(ctx, userToken, "github", ""); !errors.As(err, &e) || e.Status != http.StatusTemporaryRedirect {
				t.Errorf("token: %v; want an HTTP 307 error", err)
			}
			// The sidecar got both credentials on every call ...
			if got := atSidecar.headers(); len(got) != 4 {
				t.Fatalf("sidecar saw %d requests, want 4", len(got))
			} else {
				for _, h := range got {
					if h.Get("Broker-Sidecar-Secret") != secret || h.Get("Authorization") != "Bearer "+userToken {
						t.Fatalf("sidecar request without credentials: %v", h)
					}
				}
			}
			// ... the other host nothing at all, least of all a credential.
			for _, h := range other.headers() {
				for k, vs := range h {
					if v := strings.Join(vs, " "); strings.Contains(v, secret) || strings.Contains(v, userToken) {
						t.Errorf("redirect target received a credential in %s", k)
					}
				}
			}
			if n := len(other.headers()); n != 0 {
				t.Errorf("redirect target was called %d times; the client must not follow redirects", n)
			}
		})
	}
}
