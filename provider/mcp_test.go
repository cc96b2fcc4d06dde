package provider

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/egress"
	"credbroker/provider/mcpup"
	"credbroker/vault"
)

var (
	alice = vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	bob   = vault.Principal{Issuer: "https://idp.test", Subject: "bob"}
)

// TestMCPDiscoveryRefusals: every way an upstream's metadata is wrong is
// an *UpstreamError naming the upstream and what is wrong, from `broker
// upstreams check` and from a connect request alike, and nothing is
// registered or stored.
func TestMCPDiscoveryRefusals(t *testing.T) {
	cases := []struct {
		name     string
		asHost   string
		mcpLines string
		setup    func(r *mcpRig)
		strict   bool // the egress policy without loopback
		want     string
		kind     string
	}{
		{name: "resource is not mcp.url", kind: UpstreamResourceMismatch, setup: func(r *mcpRig) {
			doc := r.up.prm(r.as.base)
			doc["resource"] = r.up.url + "/v2"
			r.up.docs[pathPRM] = doc
		}, want: `names the resource "` + "%MCP%" + `/v2", not mcp.url "%MCP%"`},
		{name: "path-inserted metadata names the origin", kind: UpstreamResourceMismatch, setup: func(r *mcpRig) {
			doc := r.up.prm(r.as.base)
			doc["resource"] = r.up.srv.URL
			r.up.docs[pathPRM] = doc
		}, want: `names the resource "%ORIGIN%", not mcp.url "%MCP%"`},
		{name: "root metadata names another origin", kind: UpstreamResourceMismatch, setup: func(r *mcpRig) {
			r.up.challenge = ""
			doc := r.up.prm(r.as.base)
			doc["resource"] = "http://127.0.0.2:1"
			r.up.docs = map[string]any{rootPRM: doc}
		}, want: `names the resource "http://127.0.0.2:1", not mcp.url "%MCP%"`},
		{name: "resource differs by a trailing slash", kind: UpstreamResourceMismatch, setup: func(r *mcpRig) {
			doc := r.up.prm(r.as.base)
			doc["resource"] = r.up.url + "/"
			r.up.docs[pathPRM] = doc
		}, want: `names the resource "%MCP%/", not mcp.url`},
		{name: "issuer with a trailing slash in the resource metadata", kind: UpstreamIssuerMismatch, setup: func(r *mcpRig) {
			r.up.docs[pathPRM] = r.up.prm(r.as.base + "/")
		}, want: `metadata names issuer "%AS%", not "%AS%/"`},
		{name: "issuer with a trailing slash in the server metadata", kind: UpstreamIssuerMismatch, setup: func(r *mcpRig) {
			r.as.set("issuer", r.as.base+"/")
		}, want: `metadata names issuer "%AS%/", not "%AS%"`},
		{name: "another issuer", kind: UpstreamMetadataRefused, setup: func(r *mcpRig) {
			r.as.set("issuer", "https://as.example.com")
		}, want: `could not be read (metadata issuer "https://as.example.com" does not match`},
		{name: "no S256", kind: UpstreamNoS256, setup: func(r *mcpRig) {
			r.as.set("code_challenge_methods_supported", []string{"plain"})
		}, want: "does not support PKCE with S256"},
		{name: "no PKCE", kind: UpstreamMetadataRefused, setup: func(r *mcpRig) {
			r.as.set("code_challenge_methods_supported", nil)
		}, want: "does not implement PKCE"},
		{name: "authorization server on another host", kind: UpstreamHostNotAllowed, asHost: "localhost",
			want: `its authorization server "%AS%" is on another host; list that host in mcp.allowed_hosts to trust it`},
		{name: "another host allowed, an endpoint on a third", kind: UpstreamHostNotAllowed, asHost: "localhost", mcpLines: "      allowed_hosts: [localhost]\n",
			setup: func(r *mcpRig) { r.as.set("token_endpoint", "https://tokens.example.com/token") },
			want:  `endpoint "https://tokens.example.com/token" is on a host that is not allowed`},
		{name: "metadata named by the challenge on another host", kind: UpstreamHostNotAllowed, setup: func(r *mcpRig) {
			r.up.docs = map[string]any{challengePRM: r.up.prm(r.as.base)}
			r.up.challenge = strings.Replace(r.up.srv.URL, "127.0.0.1", "localhost", 1) + challengePRM
		}, want: `its protected-resource metadata is on "localhost", a host the entry does not allow: list it in mcp.allowed_hosts to trust it`},
		{name: "an endpoint not https", kind: UpstreamHostNotAllowed, setup: func(r *mcpRig) {
			r.as.set("revocation_endpoint", "http://mcp.example.com/revoke")
		}, want: `endpoint "http://mcp.example.com/revoke" is on a host that is not allowed (list it in mcp.allowed_hosts) or not https`},
		{name: "no resource metadata", kind: UpstreamNoMetadata, setup: func(r *mcpRig) {
			r.up.challenge, r.up.docs = "", map[string]any{}
		}, want: "no protected-resource metadata (RFC 9728) was found for %MCP%"},
		{name: "no authorization server", kind: UpstreamNoMetadata, setup: func(r *mcpRig) {
			r.up.docs[pathPRM] = map[string]any{"resource": r.up.url}
		}, want: "names no authorization server"},
		{name: "a private address", kind: UpstreamPrivateAddress, strict: true,
			want: "127.0.0.1 is loopback (RFC 1122): start the broker with --upstream-allow-private to reach servers on private addresses"},
		{name: "a redirect", kind: UpstreamRedirect, setup: func(r *mcpRig) {
			r.up.challenge = ""
			r.up.redirects[pathPRM] = "https://elsewhere.example.com/prm"
			r.up.redirects[rootPRM] = "https://elsewhere.example.com/prm"
		}, want: `its protected-resource metadata at "%MCPHOST%" answered with a redirect (HTTP 302), which the broker does not follow`},
		{name: "no way to register", kind: UpstreamNoRegistration, setup: func(r *mcpRig) {
			r.as.set("registration_endpoint", nil)
		}, want: "offers no way to register (no pre-registered client_id, no Client ID Metadata Documents, no dynamic registration)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			host := c.asHost
			if host == "" {
				host = "127.0.0.1"
			}
			r := newMCPRig(t, host)
			if c.setup != nil {
				c.setup(r)
			}
			want := strings.NewReplacer("%MCP%", r.up.url, "%AS%", r.as.base, "%MCPHOST%", strings.TrimPrefix(r.up.srv.URL, "http://"),
				"%ORIGIN%", r.up.srv.URL).Replace(c.want)
			reg := r.registry(c.mcpLines, "")
			mod := func(o *Options) {}
			if c.strict {
				mod = func(o *Options) { o.UpstreamHTTPClient = egressClient(t, egress.Options{AllowLoopbackHTTP: true}) }
			}
			k := r.client(reg, mod)
			_, err := k.CheckUpstream(context.Background(), "linear")
			if ue := upstreamError(t, err); !strings.Contains(ue.Reason, want) || ue.Kind != c.kind {
				t.Fatalf("CheckUpstream: %s %q\n want %s, saying %q", ue.Kind, ue.Reason, c.kind, want)
			}
			p, _ := reg.Lookup("linear")
			_, err = r.client(reg, mod).AuthRequest(context.Background(), p, []string{"issues:read"}, mcpRedirect)
			if ue := upstreamError(t, err); !strings.Contains(ue.Reason, want) || ue.Kind != c.kind {
				t.Fatalf("AuthRequest: %s %q\n want %s, saying %q", ue.Kind, ue.Reason, c.kind, want)
			}
			if gets, puts := r.clients.counts(); puts != 0 || len(r.as.requests("/register")) != 0 || len(r.as.requests("/authorize")) != 0 {
				t.Fatalf("a refused upstream got %d registrations stored (%d lookups), %d registration requests", puts, gets, len(r.as.requests("/register")))
			}
		})
	}
	// The control: the same rigs pass with nothing wrong, the other host
	// when mcp.allowed_hosts lists it.
	for _, host := range []string{"127.0.0.1", "localhost"} {
		r := newMCPRig(t, host)
		lines := ""
		if host == "localhost" {
			lines = "      allowed_hosts: [localhost]\n"
		}
		chk, err := r.client(r.registry(lines, ""), nil).CheckUpstream(context.Background(), "linear")
		if err != nil || chk.Issuer != r.as.base {
			t.Fatalf("%s: CheckUpstream = %+v, %v", host, chk, err)
		}
	}
}

// TestMCPMetadataOrder: protected-resource metadata is taken from the
// 401 challenge's resource_metadata first, then the path-inserted
// well-known URI, then the root one; a document for another resource is
// passed over.
func TestMCPMetadataOrder(t *testing.T) {
	for _, c := range []struct {
		name            string
		challenge, path bool
		wrongFirst      bool
		want            string
		fetched         []string
	}{
		{name: "challenge", challenge: true, path: true, want: "via-challenge", fetched: []string{challengePRM}},
		{name: "path-inserted", path: true, want: "via-path", fetched: []string{pathPRM}},
		{name: "root", want: "via-root", fetched: []string{pathPRM, rootPRM}},
		{name: "challenge for another resource", challenge: true, path: true, wrongFirst: true, want: "via-path", fetched: []string{challengePRM, pathPRM}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			r.up.with(func() {
				r.up.docs = map[string]any{challengePRM: r.up.prm(r.as.base, "via-challenge"), rootPRM: r.up.prm(r.as.base, "via-root")}
				if c.wrongFirst {
					r.up.docs[challengePRM] = map[string]any{"resource": r.up.url + "/other", "authorization_servers": []string{r.as.base}}
				}
				if c.path {
					r.up.docs[pathPRM] = r.up.prm(r.as.base, "via-path")
				}
				r.up.challenge = ""
				if c.challenge {
					r.up.challenge = r.up.srv.URL + challengePRM
				}
			})
			chk, err := r.client(r.registry("", ""), nil).CheckUpstream(context.Background(), "linear")
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(chk.Scopes, " ") != c.want || !slices.Equal(r.up.fetched(), c.fetched) {
				t.Fatalf("scopes %v from %v; want %s from %v", chk.Scopes, r.up.fetched(), c.want, c.fetched)
			}
		})
	}
}

// TestMCPRegistrationOrder: auto takes a pre-registered client when
// client_id is set, else a Client ID Metadata Document when the
// authorization server supports them and the broker's document is https,
// else dynamic registration; static, cimd and dcr take that one. The
// authorization request and the code exchange are made as that client.
func TestMCPRegistrationOrder(t *testing.T) {
	static := "    client_id: static-client\n    client_secret: ${LINEAR_SECRET}\n"
	for _, c := range []struct {
		name              string
		mcpLines, entry   string
		cimd              bool
		metadataURL       string
		want, wantClient  string
		wantRegistrations int
		wantErr           string
	}{
		{name: "auto: pre-registered", entry: static, cimd: true, want: "static", wantClient: "static-client"},
		{name: "auto: client metadata document", cimd: true, want: "cimd", wantClient: mcpClientMeta},
		{name: "auto: document not https", cimd: true, metadataURL: "http://127.0.0.1:8080/oauth/client-metadata.json", want: "dcr",
			wantClient: "dcr-client-", wantRegistrations: 1},
		{name: "auto: no document support", want: "dcr", wantClient: "dcr-client-", wantRegistrations: 1},
		{name: "static", mcpLines: "      registration: static\n", entry: static, cimd: true, want: "static", wantClient: "static-client"},
		{name: "cimd", mcpLines: "      registration: cimd\n", cimd: true, want: "cimd", wantClient: mcpClientMeta},
		{name: "dcr with document support", mcpLines: "      registration: dcr\n", cimd: true, want: "dcr",
			wantClient: "dcr-client-", wantRegistrations: 1},
		{name: "cimd unsupported", mcpLines: "      registration: cimd\n",
			wantErr: "registration cimd needs an authorization server that supports Client ID Metadata Documents and an https --client-metadata-url"},
		{name: "cimd with an http document", mcpLines: "      registration: cimd\n", cimd: true, metadataURL: "http://127.0.0.1:8080/m.json",
			wantErr: "registration cimd needs"},
		{name: "dcr without an endpoint", mcpLines: "      registration: dcr\n",
			wantErr: "offers no way to register"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			if c.cimd {
				r.as.set("client_id_metadata_document_supported", true)
			}
			if c.name == "dcr without an endpoint" {
				r.as.set("registration_endpoint", nil)
			}
			reg := r.registry(c.mcpLines, c.entry)
			k := r.client(reg, func(o *Options) {
				if c.metadataURL != "" {
					o.ClientMetadataURL = c.metadataURL
				}
			})
			chk, err := k.CheckUpstream(context.Background(), "linear")
			if c.wantErr != "" {
				if ue := upstreamError(t, err); !strings.Contains(ue.Reason, c.wantErr) {
					t.Fatalf("CheckUpstream: %q, want %q", ue.Reason, c.wantErr)
				}
				return
			}
			if err != nil || chk.Registration != c.want {
				t.Fatalf("CheckUpstream = %+v, %v; want registration %s", chk, err, c.want)
			}
			a, code := r.authorize(k, nil)
			u, _ := url.Parse(a.URL)
			if got := u.Query().Get("client_id"); !strings.HasPrefix(got, c.wantClient) {
				t.Fatalf("authorization request as %q, want %q", got, c.wantClient)
			}
			p, _ := reg.Lookup("linear")
			if _, err := k.Exchange(context.Background(), p, alice, mcpRedirect, code, a); err != nil {
				t.Fatalf("Exchange: %v", err)
			}
			tr := r.as.requests("/token")
			if len(tr) != 1 || !strings.HasPrefix(tr[0].BasicUser+tr[0].Values.Get("client_id"), c.wantClient) {
				t.Fatalf("token requests %+v, want one as %s", tr, c.wantClient)
			}
			if n := len(r.as.requests("/register")); n != c.wantRegistrations {
				t.Fatalf("%d registrations, want %d", n, c.wantRegistrations)
			}
		})
	}
}

// TestMCPRegistrationOnce: concurrent first connects register the broker
// once, and all use that registration.
func TestMCPRegistrationOnce(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	reg := r.registry("", "")
	k := r.client(reg, nil)
	p, _ := reg.Lookup("linear")
	if _, err := k.CheckUpstream(context.Background(), "linear"); err != nil {
		t.Fatal(err)
	}
	// Every caller looks for a stored registration before any goes on
	// (so each of them could start one of its own).
	const callers = 16
	all := make(chan struct{})
	r.clients.afterGet = func(n int) {
		switch {
		case n == callers:
			close(all)
		case n < callers:
			<-all
		}
	}
	ids := make([]string, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			a, err := k.AuthRequest(context.Background(), p, []string{"issues:read"}, mcpRedirect)
			if err != nil {
				t.Error(err)
				return
			}
			u, _ := url.Parse(a.URL)
			ids[i] = u.Query().Get("client_id")
		})
	}
	wg.Wait()
	if n := len(r.as.requests("/register")); n != 1 {
		t.Fatalf("%d registrations, want 1", n)
	}
	for _, id := range ids {
		if id != ids[0] || !strings.HasPrefix(id, "dcr-client-") {
			t.Fatalf("client ids %v, want one registered client", ids)
		}
	}
}

// TestMCPRegistrationBackoff: after a failed registration the broker
// tries again at that authorization server only after a minute, for any
// entry using it; a registration that worked does not hold back the next
// one (another redirect URI).
func TestMCPRegistrationBackoff(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	// wiki is a second entry on the same server, so on the same
	// authorization server, with its own callback.
	reg := r.registry("", "  wiki:\n    type: mcp\n    display_name: Wiki\n    mcp:\n      url: "+r.up.url+"\n")
	k := r.client(reg, nil)
	p, _ := reg.Lookup("linear")
	wiki, _ := reg.Lookup("wiki")
	r.as.with(func() { r.as.regFail = 1 })
	try := func(redirect string) error {
		_, err := k.AuthRequest(context.Background(), p, []string{"issues:read"}, redirect)
		return err
	}
	ue := upstreamError(t, try(mcpRedirect))
	if !strings.Contains(ue.Reason, "dynamic registration at its authorization server failed") || ue.Kind != UpstreamRegistrationFailed || len(r.as.requests("/register")) != 1 {
		t.Fatalf("first attempt: %q, %d registration requests", ue.Reason, len(r.as.requests("/register")))
	}
	r.clock.Advance(59 * time.Second)
	ue = upstreamError(t, try(mcpRedirect))
	if !strings.Contains(ue.Reason, "try again in a minute") || ue.Kind != UpstreamRegistrationBackoff || len(r.as.requests("/register")) != 1 {
		t.Fatalf("within the minute: %q, %d registration requests", ue.Reason, len(r.as.requests("/register")))
	}
	_, err := k.AuthRequest(context.Background(), wiki, nil, "https://broker.test/oauth/wiki/callback")
	if ue, ok := errors.AsType[*UpstreamError](err); !ok || ue.Kind != UpstreamRegistrationBackoff || ue.Provider != "Wiki" || len(r.as.requests("/register")) != 1 {
		t.Fatalf("another entry on the same authorization server within the minute: %v, %d registration requests", err, len(r.as.requests("/register")))
	}
	r.clock.Advance(2 * time.Second)
	if err := try(mcpRedirect); err != nil || len(r.as.requests("/register")) != 2 {
		t.Fatalf("after the minute: %v, %d registration requests", err, len(r.as.requests("/register")))
	}
	// A registration for another redirect URI right after one that worked.
	if err := try("https://broker.test/other/callback"); err != nil || len(r.as.requests("/register")) != 3 {
		t.Fatalf("second redirect URI: %v, %d registration requests", err, len(r.as.requests("/register")))
	}
	if err := try(mcpRedirect); err != nil || len(r.as.requests("/register")) != 3 {
		t.Fatalf("reuse: %v, %d registration requests", err, len(r.as.requests("/register")))
	}
}

// TestMCPRegistrationStored: a dynamic registration goes to the
// UpstreamClients store, secret included, and another replica sharing
// the store uses it instead of registering again.
func TestMCPRegistrationStored(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	reg := r.registry("", "")
	first := r.client(reg, nil)
	a1, _ := r.authorize(first, nil)
	if _, puts := r.clients.counts(); puts != 1 {
		t.Fatalf("%d registrations stored, want 1", puts)
	}
	stored := r.clients.puts[0]
	if stored.Key != r.as.base+" "+mcpRedirect || !strings.HasPrefix(stored.ClientID, "dcr-client-") ||
		!strings.HasPrefix(stored.ClientSecret.Reveal(), "dcr-secret-") || stored.AuthMethod != "client_secret_basic" || !stored.Created.Equal(r.clock.Now()) {
		t.Fatalf("stored %+v", stored)
	}
	second := r.client(reg, nil)
	c, ex := r.connect(second, alice, "conn-1", nil)
	u1, _ := url.Parse(a1.URL)
	if n := len(r.as.requests("/register")); n != 1 {
		t.Fatalf("%d registrations, want 1 (the second replica registered again)", n)
	}
	tr := r.as.requests("/token")
	if len(tr) != 1 || tr[0].BasicUser != u1.Query().Get("client_id") || tr[0].BasicPass != stored.ClientSecret.Reveal() {
		t.Fatalf("the second replica's code exchange authenticated as %q, want the stored client %q", tr[0].BasicUser, stored.ClientID)
	}
	if ex.Account.ID == "" || c.ID != "conn-1" {
		t.Fatalf("connection %+v", c)
	}
}

// TestMCPResourceOnEveryLeg: the upstream's URL goes as resource on the
// authorization request, the code exchange and the refresh, once each;
// with resource_on_refresh: false not on the refresh.
func TestMCPResourceOnEveryLeg(t *testing.T) {
	for _, onRefresh := range []bool{true, false} {
		t.Run(fmt.Sprintf("resource_on_refresh %v", onRefresh), func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			lines := ""
			if !onRefresh {
				lines = "      resource_on_refresh: false\n"
			}
			k := r.client(r.registry(lines, ""), nil)
			c, _ := r.connect(k, alice, "conn-1", nil)
			fresh, err := k.Token(context.Background(), "conn-1")
			if err != nil || fresh.Token.AccessToken == c.Token.AccessToken {
				t.Fatalf("Token did not refresh: %v", err)
			}
			az, tr := r.as.requests("/authorize"), r.as.requests("/token")
			if len(az) != 1 || len(tr) != 2 || tr[0].Values.Get("grant_type") != "authorization_code" || tr[1].Values.Get("grant_type") != "refresh_token" {
				t.Fatalf("requests: %d authorize, %d token", len(az), len(tr))
			}
			for leg, v := range map[string][]string{"authorize": az[0].Values["resource"], "code": tr[0].Values["resource"]} {
				if len(v) != 1 || v[0] != r.up.url {
					t.Errorf("%s: resource %q, want %q once", leg, v, r.up.url)
				}
			}
			refresh := tr[1].Values["resource"]
			if onRefresh && (len(refresh) != 1 || refresh[0] != r.up.url) || !onRefresh && len(refresh) != 0 {
				t.Errorf("refresh: resource %q (resource_on_refresh %v)", refresh, onRefresh)
			}
		})
	}
}

// TestMCPRootMetadataNamesOrigin: metadata found only at the root
// well-known URI may name the server's origin (RFC 9728 §3.3: the
// identifier that URI is built from; the conformance suite's
// auth/metadata-var2); the broker then sends that origin as resource on
// the authorization request, the code exchange and the refresh. The same
// document at the path-inserted URI is for another resource
// (TestMCPDiscoveryRefusals).
func TestMCPRootMetadataNamesOrigin(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	origin := r.up.srv.URL
	doc := r.up.prm(r.as.base)
	doc["resource"] = origin
	r.up.with(func() { r.up.challenge, r.up.docs = "", map[string]any{rootPRM: doc} })
	r.as.with(func() { r.as.resource = origin })
	k := r.client(r.registry("", ""), nil)
	r.connect(k, alice, "conn-1", nil)
	if _, err := k.Token(context.Background(), "conn-1"); err != nil {
		t.Fatalf("refresh: %v", err)
	}
	az, tr := r.as.requests("/authorize"), r.as.requests("/token")
	if len(az) != 1 || len(tr) != 2 {
		t.Fatalf("requests: %d authorize, %d token", len(az), len(tr))
	}
	for leg, v := range map[string][]string{"authorize": az[0].Values["resource"], "code": tr[0].Values["resource"], "refresh": tr[1].Values["resource"]} {
		if len(v) != 1 || v[0] != origin {
			t.Errorf("%s: resource %q, want %q once", leg, v, origin)
		}
	}
}

// TestMCPDefaultScopes: a connect request that names no scopes asks for
// those of the server's 401 challenge, else its metadata's
// scopes_supported, else none (no scope parameter); the entry's
// default_scopes come before all of them. broker upstreams check says the
// same.
func TestMCPDefaultScopes(t *testing.T) {
	for _, c := range []struct {
		name                 string
		entry                string
		challenge, supported []string // supported nil: the rig's
		want                 string
	}{
		{name: "the challenge's", challenge: []string{"issues:read"}, want: "issues:read"},
		{name: "scopes_supported", want: "issues:read issues:write"},
		{name: "none", supported: []string{}, want: ""},
		{name: "default_scopes", entry: "    default_scopes: [issues:write]\n", challenge: []string{"issues:read"}, want: "issues:write"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			r.as.set("scopes_supported", nil) // no offline_access added
			r.up.with(func() {
				r.up.scopes = c.challenge
				if c.supported != nil {
					r.up.docs[pathPRM] = r.up.prm(r.as.base, c.supported...)
				}
			})
			reg := r.registry("", c.entry)
			p, _ := reg.Lookup("linear")
			k := r.client(reg, nil)
			chk, err := k.CheckUpstream(context.Background(), "linear")
			if err != nil || strings.Join(chk.Scopes, " ") != c.want {
				t.Fatalf("CheckUpstream = %+v, %v; want scopes %q", chk, err, c.want)
			}
			a, _ := r.authorize(k, p.DefaultScopes)
			u, _ := url.Parse(a.URL)
			if got, ok := u.Query()["scope"]; strings.Join(got, " ") != c.want || c.want == "" && ok {
				t.Fatalf("authorization request scope %q (present %v), want %q", got, ok, c.want)
			}
		})
	}
}

// TestMCPRediscoveryAfterRefusal: once the server refuses a connection's
// token for good (the refresh after its 401 is refused, or it refuses
// the refreshed token too), its metadata is discovered again, so a server
// that moved to another authorization server is followed there: the
// broker registers at the new one and asks it (the conformance suite's
// auth/authorization-server-migration). Until then the discovered
// metadata is reused.
func TestMCPRediscoveryAfterRefusal(t *testing.T) {
	for _, how := range []string{"refresh refused", "refused after a refresh"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			r := newMCPRig(t, "127.0.0.1")
			reg := r.registry("", "")
			p, _ := reg.Lookup("linear")
			k := r.client(reg, nil)
			c, _ := r.connect(k, alice, "conn-1", nil)
			moved := newUpstreamAS(t, "127.0.0.1", r.clock)
			moved.resource = r.up.url
			r.up.with(func() { r.up.docs[pathPRM] = r.up.prm(moved.base) })
			issuerOf := func() string {
				t.Helper()
				a, err := k.AuthRequest(ctx, p, nil, mcpRedirect)
				if err != nil {
					t.Fatal(err)
				}
				return strings.TrimSuffix(a.URL[:strings.Index(a.URL, "?")], "/authorize")
			}
			if got := issuerOf(); got != r.as.base {
				t.Fatalf("before any refusal: authorization request at %s, want the discovered %s", got, r.as.base)
			}
			switch how {
			case "refresh refused":
				r.as.with(func() { clear(r.as.refresh) })
				if _, err := k.UpstreamTokens().ForceRefresh(ctx, "conn-1", c.Token.AccessToken.Reveal()); !errors.Is(err, mcpup.ErrNoToken) {
					t.Fatalf("ForceRefresh: %v, want ErrNoToken", err)
				}
			default:
				if err := k.Unauthorized(ctx, "conn-1"); !errors.Is(err, ErrNeedsReconnect) {
					t.Fatalf("Unauthorized: %v", err)
				}
			}
			if got := issuerOf(); got != moved.base {
				t.Fatalf("after the refusal: authorization request at %s, want the new %s", got, moved.base)
			}
			if n := len(moved.requests("/register")); n != 1 {
				t.Fatalf("%d registrations at the new authorization server, want 1", n)
			}
		})
	}
}

// TestMCPAccountNames: the account is the ID token's subject (verified
// with the authorization server's keys), else the entry's account
// endpoint's id, else a hash of the person and the provider: two people
// never share an account id, one person keeps theirs.
func TestMCPAccountNames(t *testing.T) {
	for _, alg := range []string{"ES256", "RS256"} {
		t.Run("id token "+alg, func(t *testing.T) {
			r := newMCPRig(t, "127.0.0.1")
			r.as.with(func() { r.as.idAlg, r.as.sub = alg, "person-42" })
			_, ex := r.connect(r.client(r.registry("", ""), nil), alice, "conn-1", []string{"openid", "issues:read"})
			if ex.Account.ID != "person-42" || ex.Account.Login != "person-42@example.com" {
				t.Fatalf("account %+v, want person-42", ex.Account)
			}
		})
	}
	t.Run("id token signed with another key", func(t *testing.T) {
		r := newMCPRig(t, "127.0.0.1")
		r.as.with(func() { r.as.idAlg = "stray" })
		k := r.client(r.registry("", ""), nil)
		a, code := r.authorize(k, []string{"openid"})
		p, _ := k.opts.Providers.Lookup("linear")
		if _, err := k.Exchange(context.Background(), p, alice, mcpRedirect, code, a); !errors.Is(err, ErrAccountUnknown) {
			t.Fatalf("Exchange = %v, want ErrAccountUnknown", err)
		}
	})
	t.Run("account endpoint", func(t *testing.T) {
		r := newMCPRig(t, "127.0.0.1")
		r.as.with(func() { r.as.sub = "person-7" })
		reg := r.registry("", "    account: {url: "+r.as.base+"/me, id_field: id, login_field: login}\n")
		_, ex := r.connect(r.client(reg, nil), alice, "conn-1", nil)
		if ex.Account.ID != "acct-person-7" || ex.Account.Login != "person-7@example.com" {
			t.Fatalf("account %+v, want acct-person-7", ex.Account)
		}
	})
	t.Run("hash", func(t *testing.T) {
		r := newMCPRig(t, "127.0.0.1")
		k := r.client(r.registry("", ""), nil)
		// The same upstream account (the fake approves person-1 for
		// everyone) connected by two people, and by one of them twice.
		_, a1 := r.connect(k, alice, "conn-1", nil)
		_, a2 := r.connect(k, alice, "conn-2", nil)
		_, b := r.connect(k, bob, "conn-3", nil)
		if a1.Account.ID == "" || a1.Account.ID != a2.Account.ID || a1.Account.ID == b.Account.ID || !strings.HasPrefix(a1.Account.Login, "Linear account ") {
			t.Fatalf("alice %q and %q, bob %q: want alice's equal, bob's another", a1.Account.ID, a2.Account.ID, b.Account.ID)
		}
		// Another provider's connection of alice's is another account.
		p, _ := k.opts.Providers.Lookup("linear")
		other := *p
		other.Name = "notion"
		tok := a1.Token
		acct, err := p.Kind.(*MCP).lookupAccount(context.Background(), k, &other, alice, tokenOf(tok), "")
		if err != nil || acct.ID == a1.Account.ID {
			t.Fatalf("another provider: %+v, %v", acct, err)
		}
	})
}

// TestMCPRevocation: a connection is revoked at the authorization
// server's RFC 7009 endpoint (its refresh token, as the registered
// client); without one, revocation is not supported and nothing is sent.
func TestMCPRevocation(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	k := r.client(r.registry("", ""), nil)
	c, _ := r.connect(k, alice, "conn-1", nil)
	got, err := k.Revoke(context.Background(), c, false)
	rv := r.as.requests("/revoke")
	if err != nil || got != Revoked || len(rv) != 1 || rv[0].Values.Get("token") != c.Token.RefreshToken.Reveal() ||
		rv[0].Values.Get("token_type_hint") != "refresh_token" || !strings.HasPrefix(rv[0].BasicUser, "dcr-client-") {
		t.Fatalf("Revoke = %v, %v; requests %+v", got, err, rv)
	}

	r = newMCPRig(t, "127.0.0.1")
	r.as.set("revocation_endpoint", nil)
	k = r.client(r.registry("", ""), nil)
	c, _ = r.connect(k, alice, "conn-1", nil)
	if got, err := k.Revoke(context.Background(), c, false); err != nil || got != NotSupported || len(r.as.requests("/revoke")) != 0 {
		t.Fatalf("without an endpoint: Revoke = %v, %v; %d requests", got, err, len(r.as.requests("/revoke")))
	}
}

// TestCheckUpstreamStoresNothing: `broker upstreams check` reports the
// issuer, the registration method and the default scopes, registering
// nothing and storing nothing; an open server needs no discovery.
func TestCheckUpstreamStoresNothing(t *testing.T) {
	r := newMCPRig(t, "127.0.0.1")
	for _, c := range []struct {
		name, mcpLines, entry string
		want                  UpstreamCheck
	}{
		{name: "dcr", want: UpstreamCheck{Registration: "dcr", Scopes: []string{"issues:read", "issues:write"}}},
		{name: "default scopes", entry: "    default_scopes: [issues:read]\n", want: UpstreamCheck{Registration: "dcr", Scopes: []string{"issues:read"}}},
		{name: "static", entry: "    client_id: static-client\n", want: UpstreamCheck{Registration: "static", Scopes: []string{"issues:read", "issues:write"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := r.client(r.registry(c.mcpLines, c.entry), nil)
			got, err := k.CheckUpstream(context.Background(), "linear")
			c.want.URL, c.want.Issuer = r.up.url, r.as.base
			if err != nil || got.URL != c.want.URL || got.Issuer != c.want.Issuer || got.Registration != c.want.Registration ||
				!slices.Equal(got.Scopes, c.want.Scopes) || got.Open {
				t.Fatalf("CheckUpstream = %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
	gets, puts := r.clients.counts()
	conns, err := r.store.ListConnections(context.Background(), alice)
	if gets != 0 || puts != 0 || len(r.as.requests("/register")) != 0 || len(r.as.requests("/token")) != 0 || err != nil || len(conns) != 0 {
		t.Fatalf("check touched the store: %d lookups, %d stored, %d registration requests, %d token requests, %d connections (%v)",
			gets, puts, len(r.as.requests("/register")), len(r.as.requests("/token")), len(conns), err)
	}
	open, err := ParseProviders("o.yaml", []byte("providers:\n  open:\n    type: mcp\n    mcp: {url: "+r.up.url+", auth: none}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	before := len(r.up.fetched())
	got, err := r.client(open, nil).CheckUpstream(context.Background(), "open")
	if err != nil || !got.Open || got.URL != r.up.url || got.Issuer != "" || len(r.up.fetched()) != before {
		t.Fatalf("open: CheckUpstream = %+v, %v", got, err)
	}
	if _, err := r.client(open, nil).CheckUpstream(context.Background(), "nope"); !errors.Is(err, ErrUnknownProvider) {
		t.Fatalf("unknown provider: %v", err)
	}
}
