package egress_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/internal/egress"
)

// tlsServer is an httptest TLS server (its certificate names 127.0.0.1,
// example.com and *.example.com) counting the connections it accepted and
// the requests it served, by Host.
type tlsServer struct {
	*httptest.Server
	conns atomic.Int64
	mu    sync.Mutex
	hits  map[string]int // "Host path" → count
	pool  *x509.CertPool
	port  string
}

func newTLSServer(t *testing.T, h http.HandlerFunc) *tlsServer {
	t.Helper()
	s := &tlsServer{hits: map[string]int{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.hits[r.Host+" "+r.URL.Path]++
		s.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.WriteString(w, "ok")
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.StartTLS()
	t.Cleanup(s.Close)
	s.pool = x509.NewCertPool()
	s.pool.AddCert(s.Certificate())
	_, s.port, _ = net.SplitHostPort(s.Listener.Addr().String())
	return s
}

func (s *tlsServer) hit(hostPath string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[hostPath]
}

// fakeDNS answers names from a table and counts lookups.
type fakeDNS struct {
	mu      sync.Mutex
	names   map[string][]string
	lookups map[string]int
}

var errNoSuchHost = errors.New("fake DNS: no such host")

func newFakeDNS(names map[string][]string) *fakeDNS {
	return &fakeDNS{names: names, lookups: map[string]int{}}
}

func (f *fakeDNS) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	host = strings.ToLower(host) // DNS names are case-insensitive
	f.lookups[host]++
	ss, ok := f.names[host]
	if !ok {
		return nil, errNoSuchHost
	}
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out, nil
}

func (f *fakeDNS) count(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups[host]
}

func client(t *testing.T, opts egress.Options) *http.Client {
	t.Helper()
	c, err := egress.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// get returns the body of a 200 answer, or the error.
func get(c *http.Client, u string, header ...string) (string, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), errors.New(resp.Status)
	}
	return string(b), nil
}

func wantRefused(t *testing.T, err, want error) *egress.RefusedError {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("error %v, want %v", err, want)
	}
	var re *egress.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("error %v is not a *RefusedError", err)
	}
	return re
}

// TestSpecialUseRefusedAtDial: a loopback server is not reached at all
// without AllowPrivate (no connection is accepted), and is with it.
func TestSpecialUseRefusedAtDial(t *testing.T) {
	srv := newTLSServer(t, nil)
	strict := client(t, egress.Options{TLSConfig: srvTLS(srv)})
	_, err := get(strict, srv.URL+"/x")
	re := wantRefused(t, err, egress.ErrSpecialAddress)
	if re.Addr != netip.MustParseAddr("127.0.0.1") || !strings.Contains(re.Error(), "loopback") {
		t.Fatalf("refusal %+v: %v", re, re)
	}
	if n := srv.conns.Load(); n != 0 {
		t.Fatalf("the server accepted %d connections", n)
	}
	open := client(t, egress.Options{AllowPrivate: true, TLSConfig: srvTLS(srv)})
	if body, err := get(open, srv.URL+"/x"); err != nil || body != "ok" {
		t.Fatalf("AllowPrivate: %q, %v", body, err)
	}
}

// TestResolvedNamesRefusedAfterDNS: a name whose answers include any
// special-use address is refused after the lookup, before connecting.
func TestResolvedNamesRefusedAfterDNS(t *testing.T) {
	srv := newTLSServer(t, nil)
	dns := newFakeDNS(map[string][]string{
		"loopback.example.com": {"127.0.0.1"},
		"private.example.com":  {"10.1.2.3"},
		"mapped.example.com":   {"::ffff:10.0.0.1"},
		"metadata.example.com": {"169.254.169.254"},
		"cgnat.example.com":    {"100.64.0.1"},
		"ula.example.com":      {"fd00::1"},
		"v6loop.example.com":   {"::1"},
		"mixed.example.com":    {"93.184.216.34", "192.168.1.1"},
	})
	c := client(t, egress.Options{Resolver: dns.resolve, TLSConfig: srvTLS(srv)})
	for name, addrs := range dns.names {
		t.Run(name, func(t *testing.T) {
			_, err := get(c, "https://"+name+":"+srv.port+"/")
			re := wantRefused(t, err, egress.ErrSpecialAddress)
			if re.Host != name || !re.Addr.IsValid() {
				t.Fatalf("refusal %+v", re)
			}
			if !strings.Contains(strings.Join(addrs, " "), re.Addr.String()) && re.Addr.String() != "10.0.0.1" {
				t.Fatalf("refused %s, not one of %v", re.Addr, addrs)
			}
			if dns.count(name) == 0 {
				t.Fatal("refused before the lookup")
			}
		})
	}
	if n := srv.conns.Load(); n != 0 {
		t.Fatalf("the server accepted %d connections", n)
	}
	// The same names with AllowPrivate reach the server (the certificate
	// names *.example.com).
	open := client(t, egress.Options{AllowPrivate: true, Resolver: dns.resolve, TLSConfig: srvTLS(srv)})
	if body, err := get(open, "https://loopback.example.com:"+srv.port+"/"); err != nil || body != "ok" {
		t.Fatalf("AllowPrivate: %q, %v", body, err)
	}
}

// TestNewDialer: the dialer alone, in a transport of the caller's, refuses
// what a client of New refuses at dial time (an address literal, a name
// with any special-use answer) without connecting, and with AllowPrivate
// reaches the server.
func TestNewDialer(t *testing.T) {
	srv := newTLSServer(t, nil)
	dns := newFakeDNS(map[string][]string{
		"loopback.example.com": {"127.0.0.1"},
		"mixed.example.com":    {"93.184.216.34", "192.168.1.1"},
	})
	viaDialer := func(opts egress.Options) *http.Client {
		tr := &http.Transport{Proxy: nil, DialContext: egress.NewDialer(opts), TLSClientConfig: srvTLS(srv)}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	strict := viaDialer(egress.Options{Resolver: dns.resolve})
	for _, u := range []string{srv.URL + "/x", "https://loopback.example.com:" + srv.port + "/", "https://mixed.example.com:" + srv.port + "/"} {
		_, err := get(strict, u)
		if re := wantRefused(t, err, egress.ErrSpecialAddress); !re.Addr.IsValid() || re.Range == "" {
			t.Fatalf("%s: refusal %+v", u, re)
		}
	}
	if n := srv.conns.Load(); n != 0 {
		t.Fatalf("the server accepted %d connections", n)
	}
	open := viaDialer(egress.Options{AllowPrivate: true, Resolver: dns.resolve})
	for _, u := range []string{srv.URL + "/x", "https://loopback.example.com:" + srv.port + "/"} {
		if body, err := get(open, u); err != nil || body != "ok" {
			t.Fatalf("AllowPrivate %s: %q, %v", u, body, err)
		}
	}
}

// TestAllowedHosts: https only, exact host (case-insensitive), the port as
// given; everything else is refused before any lookup or connection.
func TestAllowedHosts(t *testing.T) {
	srv := newTLSServer(t, nil)
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "plain") }))
	t.Cleanup(plain.Close)
	plainHost := plain.Listener.Addr().String()
	dns := newFakeDNS(map[string][]string{"api.example.com": {"127.0.0.1"}, "other.example.com": {"127.0.0.1"}})
	apiHost := "api.example.com:" + srv.port
	tests := []struct {
		name    string
		opts    egress.Options
		url     string
		want    error // nil: the body "ok" (or "plain")
		lookups bool  // whether a lookup is expected
	}{
		{"allowed", egress.Options{AllowedHosts: []string{apiHost}}, "https://" + apiHost + "/", nil, true},
		{"allowed, case-insensitive", egress.Options{AllowedHosts: []string{"API.example.COM:" + srv.port}}, "https://Api.Example.Com:" + srv.port + "/", nil, true},
		{"another name", egress.Options{AllowedHosts: []string{apiHost}}, "https://other.example.com:" + srv.port + "/", egress.ErrHostNotAllowed, false},
		{"the address instead of the name", egress.Options{AllowedHosts: []string{apiHost}}, srv.URL + "/", egress.ErrHostNotAllowed, false},
		{"another port", egress.Options{AllowedHosts: []string{apiHost}}, "https://api.example.com:1/", egress.ErrHostNotAllowed, false},
		{"entry without port: not another port", egress.Options{AllowedHosts: []string{"api.example.com"}}, "https://" + apiHost + "/", egress.ErrHostNotAllowed, false},
		// (nowhere.example.com is not in the DNS: a lookup shows the policy let it through)
		{"entry without port: 443", egress.Options{AllowedHosts: []string{"nowhere.example.com"}}, "https://nowhere.example.com:443/", errNoSuchHost, true},
		{"entry with 443: the default port", egress.Options{AllowedHosts: []string{"nowhere.example.com:443"}}, "https://nowhere.example.com/", errNoSuchHost, true},
		{"a subdomain is another host", egress.Options{AllowedHosts: []string{"example.com"}}, "https://api.example.com/", egress.ErrHostNotAllowed, false},
		{"a trailing dot is another host", egress.Options{AllowedHosts: []string{apiHost}}, "https://api.example.com.:" + srv.port + "/", egress.ErrHostNotAllowed, false},
		{"http to an allowed host", egress.Options{AllowedHosts: []string{apiHost}}, "http://" + apiHost + "/", egress.ErrNotHTTPS, false},
		{"http without AllowedHosts", egress.Options{}, "http://" + apiHost + "/", egress.ErrNotHTTPS, false},
		{"another scheme", egress.Options{}, "ftp://" + apiHost + "/", egress.ErrNotHTTPS, false},
		{"http to loopback, not allowed", egress.Options{AllowedHosts: []string{plainHost}}, plain.URL + "/", egress.ErrNotHTTPS, false},
		{"http to loopback, allowed", egress.Options{AllowedHosts: []string{plainHost}, AllowLoopbackHTTP: true}, plain.URL + "/", nil, false},
		{"http to a name that resolves to loopback", egress.Options{AllowLoopbackHTTP: true}, "http://" + apiHost + "/", egress.ErrNotHTTPS, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dns := newFakeDNS(dns.names)
			tc.opts.AllowPrivate, tc.opts.Resolver, tc.opts.TLSConfig = true, dns.resolve, srvTLS(srv)
			before := srv.conns.Load()
			body, err := get(client(t, tc.opts), tc.url)
			switch {
			case tc.want == nil && (err != nil || body != "ok" && body != "plain"):
				t.Fatalf("got %q, %v", body, err)
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			u, _ := url.Parse(tc.url)
			host := strings.ToLower(u.Hostname())
			if got := dns.count(host) > 0; got != tc.lookups {
				t.Fatalf("lookup of %s: %v, want %v", host, got, tc.lookups)
			}
			if tc.want != nil && srv.conns.Load() != before {
				t.Fatal("a refused request connected")
			}
		})
	}
}

// TestRedirects: none by default; with FollowRedirects, same host only,
// each hop checked, never for a request with credentials or a body.
func TestRedirects(t *testing.T) {
	var srv *tlsServer
	srv = newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/to-same":
			http.Redirect(w, r, "/ok", http.StatusFound)
		case "/to-same-307":
			http.Redirect(w, r, "/ok", http.StatusTemporaryRedirect)
		case "/to-other":
			http.Redirect(w, r, "https://other.example.com:"+srv.port+"/ok", http.StatusFound)
		case "/to-other-port":
			http.Redirect(w, r, "https://api.example.com:1/ok", http.StatusFound)
		case "/to-http":
			http.Redirect(w, r, "http://api.example.com:"+srv.port+"/ok", http.StatusMovedPermanently)
		case "/loop":
			http.Redirect(w, r, "/loop", http.StatusFound)
		case "/ok":
			io.WriteString(w, "ok")
		default:
			http.NotFound(w, r)
		}
	})
	dns := newFakeDNS(map[string][]string{"api.example.com": {"127.0.0.1"}, "other.example.com": {"127.0.0.1"}})
	base := "https://api.example.com:" + srv.port
	opts := egress.Options{AllowPrivate: true, Resolver: dns.resolve, TLSConfig: srvTLS(srv)}

	t.Run("not followed by default", func(t *testing.T) {
		_, err := get(client(t, opts), base+"/to-same")
		re := wantRefused(t, err, egress.ErrRedirectRefused)
		if re.Status != http.StatusFound || re.Host != "api.example.com:"+srv.port {
			t.Fatalf("refusal %+v", re)
		}
	})
	follow := opts
	follow.FollowRedirects = true
	follow.MaxRedirects = 3
	c := client(t, follow)
	t.Run("same host followed", func(t *testing.T) {
		if body, err := get(c, base+"/to-same"); err != nil || body != "ok" {
			t.Fatalf("%q, %v", body, err)
		}
	})
	for _, tc := range []struct {
		name, path string
		header     []string
	}{
		{"another host", "/to-other", nil},
		{"another port", "/to-other-port", nil},
		{"downgrade to http", "/to-http", nil},
		{"too many", "/loop", nil},
		{"with Authorization", "/to-same", []string{"Authorization", "Bearer upstream-token"}},
		{"with a cookie", "/to-same", []string{"Cookie", "s=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := srv.hit("other.example.com:" + srv.port + " /ok")
			_, err := get(c, base+tc.path, tc.header...)
			re := wantRefused(t, err, egress.ErrRedirectRefused)
			if re.Reason == "" || strings.Contains(re.Error(), "upstream-token") {
				t.Fatalf("refusal %v", re)
			}
			if srv.hit("other.example.com:"+srv.port+" /ok") != before {
				t.Fatal("the other host was reached")
			}
		})
	}
	t.Run("a body is not re-sent", func(t *testing.T) {
		resp, err := c.Post(base+"/to-same-307", "application/x-www-form-urlencoded", strings.NewReader("refresh_token=secret"))
		if err == nil {
			resp.Body.Close()
		}
		wantRefused(t, err, egress.ErrRedirectRefused)
		if srv.hit("api.example.com:"+srv.port+" /ok") != 1 { // the one "same host followed" hop
			t.Fatal("the body was re-sent")
		}
	})
	t.Run("a hop to a host outside AllowedHosts", func(t *testing.T) {
		o := follow
		o.AllowedHosts = []string{"api.example.com:" + srv.port}
		if body, err := get(client(t, o), base+"/to-same"); err != nil || body != "ok" {
			t.Fatalf("same host: %q, %v", body, err)
		}
		_, err := get(client(t, o), base+"/to-other")
		wantRefused(t, err, egress.ErrRedirectRefused)
	})
}

// TestErrorsNameNoPathOrQuery: a refusal's message names the host, never
// the path, query or user info (which may carry a token).
func TestErrorsNameNoPathOrQuery(t *testing.T) {
	c := client(t, egress.Options{AllowedHosts: []string{"api.example.com"}})
	for _, u := range []string{
		"https://user:pw-secret@evil.example.com/p-secret?q=q-secret",
		"http://api.example.com/p-secret?q=q-secret",
		"https://127.0.0.1/p-secret?q=q-secret",
	} {
		_, err := c.Get(u)
		var re *egress.RefusedError
		if !errors.As(err, &re) {
			t.Fatalf("%s: %v", u, err)
		}
		if strings.Contains(re.Error(), "secret") {
			t.Fatalf("refusal message %q", re.Error())
		}
	}
}

func TestResponseCap(t *testing.T) {
	srv := newTLSServer(t, func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, strings.Repeat("x", 100)) })
	for _, tc := range []struct {
		limit int64
		want  error
	}{{100, nil}, {101, nil}, {99, egress.ErrTooLarge}, {1, egress.ErrTooLarge}} {
		c := client(t, egress.Options{AllowPrivate: true, TLSConfig: srvTLS(srv), MaxResponseBytes: tc.limit})
		body, err := get(c, srv.URL)
		if !errors.Is(err, tc.want) || tc.want == nil && len(body) != 100 {
			t.Fatalf("limit %d: %d bytes, %v", tc.limit, len(body), err)
		}
	}
	for _, tc := range []struct {
		n, limit int
		ok       bool
	}{{0, 0, true}, {1, 0, false}, {5, 5, true}, {6, 5, false}, {100000, 65536, false}} {
		b, err := egress.ReadAll(strings.NewReader(strings.Repeat("y", tc.n)), int64(tc.limit))
		if tc.ok != (err == nil) || tc.ok && len(b) != tc.n || !tc.ok && !errors.Is(err, egress.ErrTooLarge) {
			t.Fatalf("ReadAll(%d bytes, %d): %d, %v", tc.n, tc.limit, len(b), err)
		}
		// CapBody gives exactly the bytes up to the cap, whatever the
		// reads' sizes, then the error, again and again.
		for _, chunk := range []int{1, 3, 4096} {
			rc := egress.CapBody(io.NopCloser(strings.NewReader(strings.Repeat("y", tc.n))), int64(tc.limit))
			var got int
			var err error
			buf := make([]byte, chunk)
			for err == nil {
				var m int
				m, err = rc.Read(buf)
				got += m
			}
			if tc.ok != errors.Is(err, io.EOF) || !tc.ok && (!errors.Is(err, egress.ErrTooLarge) || got != tc.limit) {
				t.Fatalf("CapBody(%d bytes, %d) in %d-byte reads: %d, %v", tc.n, tc.limit, chunk, got, err)
			}
			if _, again := rc.Read(buf); !tc.ok && !errors.Is(again, egress.ErrTooLarge) {
				t.Fatalf("the cap is not sticky: %v", again)
			}
		}
	}
}

// TestNoCompression: a request asks for no compression (Go's transport
// would add Accept-Encoding: gzip and decompress), and an answer
// compressed anyway is handed over as it came: no decoder runs on what an
// untrusted server sends, and a cap counts the bytes it sent.
func TestNoCompression(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	io.WriteString(zw, strings.Repeat("z", 1000))
	zw.Close()
	gz := buf.Bytes()
	var asked atomic.Value
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.Header.Values("Accept-Encoding"))
		w.Header().Set("Content-Encoding", "gzip")
		w.Write(gz)
	})
	c := client(t, egress.Options{AllowPrivate: true, TLSConfig: srvTLS(srv), MaxResponseBytes: int64(len(gz))})
	body, err := get(c, srv.URL)
	if err != nil || !bytes.Equal([]byte(body), gz) {
		t.Fatalf("%d bytes (%v), want the %d bytes sent", len(body), err, len(gz))
	}
	if v := asked.Load().([]string); len(v) != 0 {
		t.Fatalf("Accept-Encoding %q sent", v)
	}
}

// TestTimeouts: a server that never answers is given up on.
func TestTimeouts(t *testing.T) {
	release := make(chan struct{})
	srv := newTLSServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	t.Cleanup(func() { close(release) })
	for _, opts := range []egress.Options{
		{Timeout: 200 * time.Millisecond},
		{Timeout: -1, ResponseHeaderTimeout: 200 * time.Millisecond},
	} {
		opts.AllowPrivate, opts.TLSConfig = true, srvTLS(srv)
		_, err := get(client(t, opts), srv.URL)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("%+v: %v, want a timeout", opts, err)
		}
	}
}

func TestOptionsRefused(t *testing.T) {
	for _, h := range []string{"", "https://api.example.com", "api.example.com/path", "user@api.example.com", "api.example.com:0",
		"api.example.com:70000", "api.example.com:x", "api.example.com:080", "[::1", "a b", "[]:443", "a:b:c"} {
		if _, err := egress.New(egress.Options{AllowedHosts: []string{h}}); err == nil {
			t.Errorf("allowed host %q accepted", h)
		}
	}
	for _, h := range []string{"api.example.com", "api.example.com:8443", "[::1]:443", "[2001:db8::1]", "2001:db8::1", "127.0.0.1"} {
		if _, err := egress.New(egress.Options{AllowedHosts: []string{h}}); err != nil {
			t.Errorf("allowed host %q refused: %v", h, err)
		}
	}
	// Every problem at once.
	_, err := egress.New(egress.Options{AllowedHosts: []string{"a/b", "c:0"}, MaxRedirects: -1})
	if err == nil || !strings.Contains(err.Error(), `"a/b"`) || !strings.Contains(err.Error(), `"c:0"`) || !strings.Contains(err.Error(), "MaxRedirects") {
		t.Fatalf("error %v", err)
	}
	if _, err := egress.NewTransport(egress.Options{MaxResponseBytes: -1}); err == nil {
		t.Fatal("negative MaxResponseBytes accepted")
	}
}

func srvTLS(s *tlsServer) *tls.Config { return &tls.Config{RootCAs: s.pool} }
