package provider

import (
	"errors"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// wantProblems fails unless ce has exactly the problems want, each
// found as a substring of one of them.
func wantProblems(t *testing.T, ce *ConfigError, want []string) {
	t.Helper()
	got := strings.Join(ce.Problems, "\n")
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("missing problem %q", w)
		}
	}
	if t.Failed() {
		t.Logf("problems:\n%s", got)
	}
	if len(ce.Problems) != len(want) {
		t.Errorf("%d problems, want %d:\n%s", len(ce.Problems), len(want), got)
	}
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestLoadProvidersRepoFile(t *testing.T) {
	reg, err := LoadProviders(filepath.Join("..", "providers.yaml"), env(map[string]string{
		"GITHUB_CLIENT_ID": "gh-id", "GITHUB_CLIENT_SECRET": "gh-secret",
		"GOOGLE_CLIENT_ID": "g-id", "GOOGLE_CLIENT_SECRET": "g-secret",
	}))
	if err != nil {
		t.Fatalf("LoadProviders(providers.yaml): %v", err)
	}
	if got := strings.Join(reg.Names(), ","); got != "github,google" {
		t.Fatalf("Names() = %q, want github,google", got)
	}
	ghp, _ := reg.Lookup("github")
	gh := oauthOf(ghp)
	if ghp.Kind.Type() != TypeOAuth2 || gh.AuthURL != "https://github.com/login/oauth/authorize" || gh.AccountURL != "https://api.github.com/user" ||
		gh.AccountIDField != "id" || gh.AccountLoginField != "login" || gh.RevocationStyle != RevokeGitHubGrant || !gh.PKCE ||
		gh.ClientID != "gh-id" || gh.ClientSecret.Reveal() != "gh-secret" || ghp.APIBaseURL != "https://api.github.com" {
		t.Errorf("github entry = %+v / %+v", ghp, gh)
	}
	// GitHub documents the client credentials as body parameters; repo
	// covers public_repo, which GitHub drops from its answer; a shared
	// account's token can be deleted alone.
	if !gh.TokenAuthInParams || len(ghp.MissingScopes([]string{"repo"}, []string{"repo", "public_repo"})) != 0 ||
		gh.RevocationTokenURL != "https://api.github.com/applications/{client_id}/token" {
		t.Errorf("github entry: client_secret_post %v, scope_implies %v, token_url %q", gh.TokenAuthInParams, ghp.ScopeImplies, gh.RevocationTokenURL)
	}
	g, _ := reg.Lookup("google")
	go_ := oauthOf(g)
	if g.Kind.Type() != TypeOIDC || go_.Issuer != "https://accounts.google.com" || go_.ExtraAuthParams["access_type"] != "offline" ||
		go_.ExtraAuthParams["prompt"] != "consent" || go_.ExtraAuthParams["include_granted_scopes"] != "true" ||
		go_.RevocationURL != "" || go_.RevocationStyle != RevokeRFC7009 || !go_.RevocationAccountWide {
		t.Errorf("google entry = %+v / %+v", g, go_)
	}
	// The scopes the entry describes can be asked for; Google's answer
	// names cover the short names; the per-API hosts are there.
	for _, sc := range []string{"openid", "email", "https://www.googleapis.com/auth/calendar.readonly", "https://www.googleapis.com/auth/drive.readonly"} {
		if !g.ScopeAllowed(sc) {
			t.Errorf("google: %s not allowed", sc)
		}
	}
	if g.ScopeAllowed("https://www.googleapis.com/auth/drive") {
		t.Error("google: full Drive access allowed")
	}
	answered := ParseScopeAnswer("https://www.googleapis.com/auth/userinfo.email openid https://www.googleapis.com/auth/userinfo.profile")
	if m := g.MissingScopes(answered, g.DefaultScopes); len(m) != 0 {
		t.Errorf("google: %v missing from Google's answer", m)
	}
	var hosts []string
	for _, b := range g.APIBases {
		hosts = append(hosts, b.Host)
	}
	if strings.Join(hosts, " ") != "www.googleapis.com gmail.googleapis.com people.googleapis.com" {
		t.Errorf("google API hosts = %v", hosts)
	}
	if _, ok := reg.Lookup("gitlab"); ok {
		t.Error("Lookup(gitlab) found an unconfigured provider")
	}
}

func TestLoadProvidersMissingEnv(t *testing.T) {
	_, err := LoadProviders(filepath.Join("..", "providers.yaml"), env(nil))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	// Four references, four problems, all reported at once.
	if len(ce.Problems) != 4 {
		t.Fatalf("problems = %q, want 4", ce.Problems)
	}
	for _, p := range ce.Problems {
		if !strings.Contains(p, "is not set") || !strings.HasPrefix(p, filepath.Join("..", "providers.yaml")+":") {
			t.Errorf("problem %q: want file:line and 'is not set'", p)
		}
	}
}

const goodOAuth2 = `providers:
  acme:
    type: oauth2
    authorization_url: https://acme.example/authorize
    token_url: https://acme.example/token
    client_id: acme
    client_secret: ${ACME_SECRET}
    account: {url: https://api.acme.example/me, id_field: id}
`

func TestParseProviders(t *testing.T) {
	secretFile := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secretFile, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		yaml string
		// want are substrings, each of which must appear in some problem;
		// nil means the document is valid.
		want []string
	}{
		{name: "valid oauth2", yaml: goodOAuth2},
		{name: "valid oidc with secret file and loopback http", yaml: `providers:
  corp:
    type: oidc
    issuer: http://127.0.0.1:9999/issuer
    client_id: ${CORP_ID}
    client_secret_file: ` + secretFile + `
    pkce: false
`},
		{name: "empty", yaml: ``, want: []string{"x.yaml:1: no providers"}},
		{name: "not yaml", yaml: "providers: [", want: []string{"x.yaml"}},
		{name: "unknown keys everywhere", yaml: strings.Replace(goodOAuth2, "    client_id: acme\n",
			"    client_id: acme\n    clientsecret: x\n    account_url: y\n", 1) + "extra: 1\n",
			want: []string{"x.yaml:7: unknown key \"clientsecret\"", "x.yaml:8: unknown key \"account_url\"", "x.yaml:11: unknown key \"extra\""}},
		{name: "missing fields", yaml: "providers:\n  bare:\n    display_name: Bare\n",
			want: []string{"x.yaml:2: bare: type is required", "client_id is required", "client_secret or client_secret_file is required"}},
		{name: "oauth2 without endpoints", yaml: "providers:\n  p:\n    type: oauth2\n    client_id: a\n    client_secret: ${ACME_SECRET}\n",
			want: []string{"authorization_url is required", "token_url is required", "account (url, id_field, login_field) is required"}},
		{name: "bad urls", yaml: strings.NewReplacer(
			"https://acme.example/authorize", "http://acme.example/authorize",
			"https://acme.example/token", "/token",
			"https://api.acme.example/me", "ftp://api.acme.example/me").Replace(goodOAuth2),
			want: []string{"x.yaml:4: acme: authorization_url: \"http://acme.example/authorize\" must use https", "x.yaml:5: acme: token_url", "x.yaml:8: acme: account"}},
		{name: "inline secret", yaml: strings.Replace(goodOAuth2, "${ACME_SECRET}", "hunter2", 1),
			want: []string{"x.yaml:7: acme: client_secret must be a reference"}},
		{name: "unset env", yaml: strings.Replace(goodOAuth2, "${ACME_SECRET}", "${NOPE}", 1),
			want: []string{"environment variable NOPE is not set"}},
		{name: "both secrets", yaml: strings.Replace(goodOAuth2, "    client_secret: ${ACME_SECRET}\n", "    client_secret: ${ACME_SECRET}\n    client_secret_file: /x\n", 1),
			want: []string{"not both"}},
		{name: "bad type and name", yaml: strings.NewReplacer("type: oauth2", "type: saml", "acme:", "Acme!:").Replace(goodOAuth2),
			want: []string{"type \"saml\"", "provider name \"Acme!\""}},
		{name: "reserved extra param and scopes", yaml: goodOAuth2 + "    extra_auth_params: {state: x}\n    default_scopes: [\"a b\", c]\n    allowed_scopes: [a]\n",
			want: []string{"\"state\" is set by the broker", "default scope \"a b\" is not a valid", "default scope \"c\" is not in allowed_scopes"}},
		{name: "bad revocation", yaml: goodOAuth2 + "    revocation: {style: magic, url: http://evil.example/revoke}\n",
			want: []string{"revocation.style \"magic\"", "must use https"}},
		{name: "wrong value type", yaml: goodOAuth2 + "    pkce: maybe\n",
			want: []string{"x.yaml:9:"}},
		{name: "valid scope tables, api hosts and github token url", yaml: goodOAuth2 + `    scope_aliases: {email: [https://acme.example/auth/email]}
    scope_implies: {admin: [write, read], write: [read]}
    api:
      base_url: https://api.acme.example
      hosts: [{base_url: https://mail.acme.example, allowed_paths: [GET /v1/me]}]
    revocation: {style: github_grant, url: "https://api.acme.example/a/{client_id}/grant", token_url: "https://api.acme.example/a/{client_id}/token"}
`},
		{name: "valid oidc with hosted domain and discovered revocation", yaml: `providers:
  corp:
    type: oidc
    issuer: https://accounts.example
    client_id: a
    client_secret: ${ACME_SECRET}
    hosted_domain: corp.example
    revocation: {style: rfc7009, account_wide: true}
`},
		{name: "bad scope tables", yaml: goodOAuth2 + `    scope_aliases: {email: [email, "a b"], profile: [long], long: [x], mail: [m2], post: [m2]}
    scope_implies: {repo: [repo], "x y": [z], admin: [m2]}
    allowed_scopes: [m2, mail, post]
`, want: []string{"email is given as its own alias", `alias "a b" is not a valid`, `"long" is both a scope with aliases`,
			`"m2" is an alias of both mail and post`, "repo is given as implying itself", `"x y" is not a valid scope token`,
			"name scopes by their catalogue names", `allowed scope "m2" is an alias`}},
		{name: "bad hosted domain, hd param, api hosts, revocation", yaml: goodOAuth2 + `    hosted_domain: Corp.Example
    extra_auth_params: {hd: corp.example}
    api:
      base_url: https://api.acme.example
      hosts: [{base_url: https://API.acme.example/v2}, {base_url: http://mail.acme.example, allowed_paths: [x]}]
    revocation: {style: rfc7009, token_url: https://acme.example/t}
`, want: []string{"hosted_domain is only for type \"oidc\"", "hosted_domain \"Corp.Example\"", "set hosted_domain instead of hd",
			"api.acme.example is given twice", "must use https", "api.hosts[1].allowed_paths", "revocation.url is required", "token_url is only for style"}},
		{name: "revocation none with a url", yaml: goodOAuth2 + "    revocation: {style: none, url: https://acme.example/r}\n",
			want: []string{"style none takes no other field"}},
	}
	getenv := env(map[string]string{"ACME_SECRET": "s3cret", "CORP_ID": "corp"})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := ParseProviders("x.yaml", []byte(tc.yaml), getenv)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("ParseProviders: %v", err)
				}
				if len(reg.Names()) != 1 {
					t.Fatalf("Names() = %v", reg.Names())
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseProviders accepted the document; want problems %q", tc.want)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %T %v, want *ConfigError", err, err)
			}
			for _, w := range tc.want {
				found := false
				for _, p := range ce.Problems {
					found = found || strings.Contains(p, w)
				}
				if !found {
					t.Errorf("no problem contains %q; got:\n  %s", w, strings.Join(ce.Problems, "\n  "))
				}
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cret") {
				t.Errorf("error text reveals a secret: %v", err)
			}
		})
	}
}

func FuzzParseProviders(f *testing.F) {
	f.Add([]byte(goodOAuth2))
	if b, err := os.ReadFile(filepath.Join("..", "providers.yaml")); err == nil {
		f.Add(b)
	}
	f.Add([]byte("providers:\n  x: {type: oidc, issuer: 'http://[::1]:1/', client_id: a, client_secret: ${A}}\n"))
	f.Add([]byte("providers:\n  x: {type: oidc, issuer: 'https://i', client_id: a, client_secret: ${A}, hosted_domain: a.b,\n" +
		"    scope_aliases: {e: [l, m]}, scope_implies: {r: [p, e]},\n" +
		"    api: {base_url: 'https://a', hosts: [{base_url: 'https://b/x', allowed_paths: [GET /y]}]}, revocation: {style: rfc7009}}\n"))
	f.Add([]byte(keyProvidersDoc("http://127.0.0.1:1")))
	f.Add([]byte(goodMCP))
	f.Add([]byte("providers:\n  m: {type: mcp, mcp: {url: 'https://m.example/mcp', registration: static}, client_id: ${A}}\n" +
		"  o: {type: mcp, mcp: {url: 'http://[::1]:1/x', auth: none, tools: {deny: ['a?[b-c]*']}, input_requests: []}}\n" +
		"  n: {type: mcp, mcp: {url: 'https://n.example', call_timeout: 10m, max_result_bytes: 64MiB, offline_access: never,\n" +
		"    resource_on_refresh: false, allowed_hosts: [auth.n.example], registration: dcr}, account: {url: 'https://n.example/me', id_field: id}}\n"))
	f.Add([]byte("providers:\n  e: {type: mcp, mcp: {url: 'https://e.example/mcp', auth: enterprise, registration: cimd}, default_scopes: [r]}\n" +
		"  s: {type: mcp, mcp: {url: 'https://s.example/mcp', auth: enterprise}, client_id: ${A}, client_secret: ${A}}\n" +
		"  d: {type: mcp, mcp: {url: 'https://d.example/mcp', auth: enterprise, registration: dcr}}\n"))
	getenv := env(map[string]string{"ACME_SECRET": "s", "A": "a", "GITHUB_CLIENT_ID": "i", "GITHUB_CLIENT_SECRET": "s", "GOOGLE_CLIENT_ID": "i", "GOOGLE_CLIENT_SECRET": "s",
		"LINEAR_ID": "i", "LINEAR_SECRET": "s"})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		reg, err := ParseProviders("fuzz.yaml", data, getenv)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error is not a ConfigError with problems: %v", err)
			}
			return
		}
		for _, n := range reg.Names() {
			p, ok := reg.Lookup(n)
			if g, isMCP := p.Kind.(Gateway); isMCP {
				checkAcceptedMCP(t, n, p, g)
				continue
			}
			o := oauthOf(p)
			if !ok || keyOf(p) == nil && (o == nil || o.ClientID == "") {
				t.Fatalf("accepted provider %q is incomplete: %+v", n, p)
			}
			if o == nil {
				o = &OAuth{}
			}
			if a := keyOf(p); a != nil && (len(a.Fields) == 0 || a.VerifyPath == "" || a.AccountID.IsZero() ||
				a.Header == "" && a.BasicPass.Empty() || p.APIBaseURL == "" || checkEndpoint(a.InstructionsURL) != nil) {
				t.Fatalf("accepted api_key provider %q is incomplete: %+v", n, a)
			}
			urls := []string{o.AuthURL, o.TokenURL, o.Issuer, o.AccountURL, p.APIBaseURL,
				strings.ReplaceAll(o.RevocationURL, "{client_id}", "c"), strings.ReplaceAll(o.RevocationTokenURL, "{client_id}", "c")}
			hosts := map[string]bool{}
			for _, b := range p.APIBases {
				urls = append(urls, b.URL)
				if hosts[b.Host] || b.Host == "" {
					t.Fatalf("accepted provider %q has API host %q twice or empty", n, b.Host)
				}
				hosts[b.Host] = true
			}
			for _, u := range urls {
				if u != "" && checkEndpoint(u) != nil {
					t.Fatalf("accepted provider %q has bad URL %q", n, u)
				}
			}
			if o.HostedDomain != "" && !o.OIDC {
				t.Fatalf("accepted provider %q has hosted_domain without OIDC", n)
			}
			for alias, c := range p.ScopeAliases {
				if alias == c || p.ScopeAliases[c] != "" || !validScope(alias) || !validScope(c) {
					t.Fatalf("accepted provider %q has a bad alias %q -> %q", n, alias, c)
				}
			}
			// Scope comparison: whatever was granted covers itself, and
			// normalising twice changes nothing.
			granted := append(slices.Collect(maps.Keys(p.ScopeAliases)), p.DefaultScopes...)
			if m := p.MissingScopes(granted, granted); len(m) != 0 {
				t.Fatalf("provider %q: %v missing from itself", n, m)
			}
			if once := p.NormalizeScopes(granted); !slices.Equal(p.NormalizeScopes(once), once) {
				t.Fatalf("provider %q: NormalizeScopes is not idempotent on %v", n, granted)
			}
		}
	})
}

// checkAcceptedMCP holds an accepted mcp entry to what the catalogue
// promises: an https (or loopback http) canonical URL, limits within their
// bounds, known input kinds, and whatever its registration needs.
func checkAcceptedMCP(t *testing.T, n string, p *Provider, g Gateway) {
	t.Helper()
	up := g.Upstream()
	u, err := url.Parse(up.URL)
	if checkEndpoint(up.URL) != nil || err != nil || u.RawQuery != "" || strings.HasSuffix(u.Path, "/") && u.Path != "/" {
		t.Fatalf("accepted mcp provider %q has bad url %q", n, up.URL)
	}
	if up.CallTimeout <= 0 || up.CallTimeout > MaxCallTimeout || up.MaxResultBytes <= 0 || up.MaxResultBytes > maxResultBytesCap {
		t.Fatalf("accepted mcp provider %q has limits %v, %d", n, up.CallTimeout, up.MaxResultBytes)
	}
	for _, k := range up.InputRequests {
		if k != "elicitation" && k != "sampling" && k != "roots" {
			t.Fatalf("accepted mcp provider %q relays input %q", n, k)
		}
	}
	for _, pat := range append(slices.Clone(up.Tools.Allow), up.Tools.Deny...) {
		if _, err := path.Match(pat, ""); err != nil || pat == "" {
			t.Fatalf("accepted mcp provider %q has tool pattern %q", n, pat)
		}
	}
	switch m := g.(type) {
	case *OpenMCP:
		if !up.Open || len(p.DefaultScopes) != 0 {
			t.Fatalf("accepted open mcp provider %q: %+v", n, p)
		}
	case *MCP:
		if up.Open || !slices.Contains([]string{"auto", "static", "cimd", "dcr"}, m.Registration) ||
			!slices.Contains([]string{"auto", "always", "never"}, m.OfflineAccess) ||
			m.Registration == "static" && m.ClientID == "" || m.ClientSecret != "" && m.ClientID == "" ||
			m.AccountURL != "" && checkEndpoint(m.AccountURL) != nil || m.Enterprise && m.Registration == "dcr" {
			t.Fatalf("accepted mcp provider %q: %+v", n, m)
		}
		for _, h := range m.AllowedHosts {
			if h == "" || strings.ContainsAny(h, "/:@ ") || strings.ToLower(h) != h {
				t.Fatalf("accepted mcp provider %q allows host %q", n, h)
			}
		}
	default:
		t.Fatalf("accepted mcp provider %q is a %T", n, g)
	}
}
