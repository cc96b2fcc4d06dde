package provider

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/loopback"
	"credbroker/vault"
)

// Provider types accepted in providers.yaml.
const (
	// TypeOAuth2 is a plain OAuth 2.0 provider: endpoints are configured and
	// the account is found through the account endpoint.
	TypeOAuth2 = "oauth2"
	// TypeOIDC is an OpenID Connect provider: endpoints come from discovery
	// of the issuer and the account is the verified ID token's subject.
	TypeOIDC = "oidc"
)

// Revocation styles accepted in providers.yaml.
const (
	// RevokeRFC7009 posts the token to an RFC 7009 revocation endpoint.
	RevokeRFC7009 = "rfc7009"
	// RevokeGitHubGrant deletes the whole OAuth app grant the GitHub way:
	// DELETE {url} with the client's basic credentials and the access token
	// in a JSON body. "{client_id}" in the URL is replaced. When another
	// connection uses the same GitHub account, only the one token is
	// deleted (DELETE {token_url}), since deleting the grant would end the
	// other connection's tokens too.
	RevokeGitHubGrant = "github_grant"
	// RevokeNone turns revocation off, also the one an OIDC provider's
	// discovery advertises.
	RevokeNone = "none"
)

// providersFile is the document shape of providers.yaml.
type providersFile struct {
	Providers map[string]providerSpec `yaml:"providers"`
}

// providerSpec is one entry as written in providers.yaml.
type providerSpec struct {
	DisplayName      string            `yaml:"display_name"`
	Type             string            `yaml:"type"`
	Issuer           string            `yaml:"issuer"`
	AuthorizationURL string            `yaml:"authorization_url"`
	TokenURL         string            `yaml:"token_url"`
	ClientID         string            `yaml:"client_id"`
	ClientSecret     string            `yaml:"client_secret"`
	ClientSecretFile string            `yaml:"client_secret_file"`
	TokenAuth        string            `yaml:"token_endpoint_auth"`
	PKCE             *bool             `yaml:"pkce"`
	DefaultScopes    []string          `yaml:"default_scopes"`
	AllowedScopes    []string          `yaml:"allowed_scopes"`
	ScopeDescription map[string]string `yaml:"scope_descriptions"`
	// ScopeAliases: scope → the other names the provider answers for it
	// (Google answers https://www.googleapis.com/auth/userinfo.email for
	// email).
	ScopeAliases map[string][]string `yaml:"scope_aliases"`
	// ScopeImplies: scope → the scopes it includes (GitHub's repo includes
	// public_repo and drops it from its answer).
	ScopeImplies    map[string][]string `yaml:"scope_implies"`
	ExtraAuthParams map[string]string   `yaml:"extra_auth_params"`
	// HostedDomain (OIDC): the Google Workspace domain accounts must
	// belong to; sent as hd= and checked against the ID token's hd claim.
	HostedDomain string          `yaml:"hosted_domain"`
	Account      *accountSpec    `yaml:"account"`
	API          *apiSpec        `yaml:"api"`
	Revocation   *revocationSpec `yaml:"revocation"`
	// SidecarTokenExport lets the sidecar API hand this provider's access
	// tokens to co-located servers (POST /v1/token). Off by default.
	SidecarTokenExport bool `yaml:"sidecar_token_export"`
	// PropagateTrace sends the W3C trace context (traceparent,
	// tracestate) on API requests to this provider. Off by default:
	// trace ids are the broker's to share.
	PropagateTrace bool `yaml:"propagate_trace"`

	// type: api_key entries (see apikey.go).
	Instructions    string         `yaml:"instructions"`
	InstructionsURL string         `yaml:"instructions_url"`
	Fields          []keyFieldSpec `yaml:"fields"`
	Inject          *injectSpec    `yaml:"inject"`
	Verify          *verifySpec    `yaml:"verify"`
	// KeepAlive and KeepAliveRefresh: background refresh (keepalive.go).
	KeepAlive        string `yaml:"keep_alive"`
	KeepAliveRefresh string `yaml:"keep_alive_refresh"`
}

type accountSpec struct {
	URL        string `yaml:"url"`
	IDField    string `yaml:"id_field"`
	LoginField string `yaml:"login_field"`
}

type apiSpec struct {
	BaseURL      string   `yaml:"base_url"`
	AllowedPaths []string `yaml:"allowed_paths"`
	// Hosts are further API bases of the same provider (Google serves its
	// APIs from several hosts), each with its own allow-list.
	Hosts []apiHostSpec `yaml:"hosts"`
}

type apiHostSpec struct {
	BaseURL      string   `yaml:"base_url"`
	AllowedPaths []string `yaml:"allowed_paths"`
}

type revocationSpec struct {
	Style    string `yaml:"style"`
	URL      string `yaml:"url"`
	TokenURL string `yaml:"token_url"`
	// AccountWide: revoking one token ends every token the provider
	// issued to this client for the account (Google's grant is per account
	// and client).
	AccountWide bool `yaml:"account_wide"`
}

// Provider is one validated provider entry. Its fields are read-only after
// LoadProviders returns.
type Provider struct {
	// Name is the key in providers.yaml ("github"), used in URLs and tools.
	Name string
	// DisplayName is shown to people ("GitHub").
	DisplayName string
	// Type is TypeOAuth2 or TypeOIDC.
	Type string
	// Issuer is the OIDC issuer (TypeOIDC only).
	Issuer string
	// AuthURL and TokenURL are the endpoints (TypeOAuth2; for TypeOIDC they
	// override discovery when set).
	AuthURL, TokenURL string
	ClientID          string
	ClientSecret      vault.Secret
	// TokenAuthInParams sends the client credentials in the token request
	// body (client_secret_post) instead of HTTP basic (client_secret_basic,
	// the default).
	TokenAuthInParams bool
	// PKCE reports whether S256 PKCE is sent (default true).
	PKCE bool
	// DefaultScopes are requested when a grant names none.
	DefaultScopes []string
	// AllowedScopes bounds what a grant may request (empty: anything).
	AllowedScopes []string
	// ScopeDescriptions are plain-words explanations shown on the consent page.
	ScopeDescriptions map[string]string
	// ScopeAliases maps each other name the provider answers for a scope
	// to the scope's name in the catalogue; ScopeImplies maps a scope to
	// the scopes it includes. NormalizeScopes and MissingScopes use both.
	ScopeAliases map[string]string
	ScopeImplies map[string][]string
	// ExtraAuthParams are added to the authorization request.
	ExtraAuthParams map[string]string
	// HostedDomain (OIDC only): the account's domain, sent as hd= and
	// required in the ID token's hd claim ("*": any Workspace domain).
	HostedDomain string
	// AccountURL answers the connected account's identity as JSON;
	// AccountIDField and AccountLoginField name the fields.
	AccountURL, AccountIDField, AccountLoginField string
	// APIBaseURL is where provider_request sends requests; AllowedPaths are
	// the allow-list entries as written ("[METHOD[,METHOD…] ]/path"; empty:
	// any request under the base), AllowedRequests their parsed form.
	APIBaseURL      string
	AllowedPaths    []string
	AllowedRequests []RequestPattern
	// APIBases are every API base of the provider, the first being
	// APIBaseURL; a request names one by its host (APIRequest.Host).
	APIBases []APIBase
	// SidecarTokenExport: the sidecar API may return this provider's
	// access tokens (never refresh tokens) to co-located servers.
	SidecarTokenExport bool
	// PropagateTrace: API requests carry the W3C trace context when
	// tracing is on (propagate_trace: true); never baggage.
	PropagateTrace bool
	// RevocationStyle is "", RevokeRFC7009 or RevokeGitHubGrant.
	// RevocationURL may be empty for an OIDC provider: discovery's
	// revocation_endpoint is used. RevocationTokenURL (GitHub) deletes one
	// token instead of the whole grant.
	RevocationStyle    string
	RevocationURL      string
	RevocationTokenURL string
	// RevocationAccountWide: revoking any token ends every token of the
	// app for the account (GitHub grants always do).
	RevocationAccountWide bool
	// RevocationDisabled: style none (an OIDC provider's discovered
	// revocation_endpoint is not used either).
	RevocationDisabled bool
	// APIKey describes a TypeAPIKey entry (nil for OAuth providers).
	APIKey *APIKey
	// KeepAlive: background refresh of idle connections (zero: off).
	KeepAlive KeepAliveSpec
}

// APIBase is one API base URL of a provider with its allow-list.
type APIBase struct {
	// URL is the base ("https://gmail.googleapis.com").
	URL string
	// Host is URL's host (with its port when it has one), how a request
	// names this base.
	Host string
	// AllowedPaths as written; AllowedRequests parsed (empty: anything
	// under URL).
	AllowedPaths    []string
	AllowedRequests []RequestPattern

	// parsed is URL parsed by the catalogue, once; parsedFrom the URL it
	// was parsed from (an APIBase made or changed elsewhere parses its URL
	// when used).
	parsed     *url.URL
	parsedFrom string
}

// baseURL returns b.URL parsed, or nil when it does not parse. The result
// may be shared: it must not be changed.
func (b *APIBase) baseURL() *url.URL {
	if b.parsed != nil && b.parsedFrom == b.URL {
		return b.parsed
	}
	u, err := url.Parse(b.URL)
	if err != nil {
		return nil
	}
	return u
}

// ScopeAllowed reports whether s may be requested from this provider:
// any scope when allowed_scopes is empty, else one it lists (an alias of a
// listed scope counts as that scope).
func (p *Provider) ScopeAllowed(s string) bool {
	return len(p.AllowedScopes) == 0 || slices.Contains(p.AllowedScopes, p.canonicalScope(s))
}

// Registry is the set of configured providers.
type Registry struct {
	byName map[string]*Provider
	names  []string
}

// Lookup returns the provider named name.
func (r *Registry) Lookup(name string) (*Provider, bool) {
	if r == nil {
		return nil, false
	}
	p, ok := r.byName[name]
	return p, ok
}

// Names returns the provider names, sorted.
func (r *Registry) Names() []string {
	if r == nil {
		return nil
	}
	return slices.Clone(r.names)
}

// ConfigError lists every problem found in a providers file.
type ConfigError struct {
	Problems []string
}

func (e *ConfigError) Error() string {
	return "providers: " + countProblems(len(e.Problems)) + ":\n  " + strings.Join(e.Problems, "\n  ")
}

func countProblems(n int) string {
	if n == 1 {
		return "1 problem"
	}
	return fmt.Sprintf("%d problems", n)
}

// LoadProviders reads and validates the providers file at path. Secrets are
// resolved through getenv (${NAME}) or read from client_secret_file. It
// changes nothing; every problem is reported at once.
func LoadProviders(path string, getenv func(string) string) (*Registry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("providers: %w", err)
	}
	return ParseProviders(path, data, getenv)
}

var (
	providerNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	envRefRE       = regexp.MustCompile(`^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$`)
	knownFieldRE   = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
)

// ParseProviders validates a providers document; name is used in messages.
func ParseProviders(name string, data []byte, getenv func(string) string) (*Registry, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, &ConfigError{Problems: []string{name + ": " + err.Error()}}
	}
	var probs []string
	addf := func(line int, format string, args ...any) {
		probs = append(probs, fmt.Sprintf("%s:%d: ", name, line)+fmt.Sprintf(format, args...))
	}
	var file providersFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, &ConfigError{Problems: []string{name + ": " + err.Error()}}
		}
		for _, m := range te.Errors {
			if sm := knownFieldRE.FindStringSubmatch(m); sm != nil {
				probs = append(probs, fmt.Sprintf("%s:%s: unknown key %q", name, sm[1], sm[2]))
				continue
			}
			if l, rest, ok := strings.Cut(strings.TrimPrefix(m, "line "), ": "); ok && strings.HasPrefix(m, "line ") {
				probs = append(probs, fmt.Sprintf("%s:%s: %s", name, l, rest))
				continue
			}
			probs = append(probs, name+": "+m)
		}
	}
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		doc = doc.Content[0]
	}
	provNodes := mapValue(doc, "providers")
	if len(file.Providers) == 0 && len(probs) == 0 {
		addf(max(1, doc.Line), "no providers: want a top-level \"providers:\" map with at least one entry")
	}
	reg := &Registry{byName: map[string]*Provider{}}
	for pname, spec := range file.Providers {
		pn := mapValue(provNodes, pname)
		line := keyLine(provNodes, pname)
		lineOf := func(key string) int {
			if l := keyLine(pn, key); l > 0 {
				return l
			}
			return line
		}
		perr := func(key, format string, args ...any) {
			addf(lineOf(key), "%s: %s", pname, fmt.Sprintf(format, args...))
		}
		var p *Provider
		var ok bool
		if spec.Type == TypeAPIKey {
			p, ok = validateAPIKeyProvider(pname, spec, pn, line, addf)
		} else {
			p, ok = validateProvider(pname, spec, getenv, perr)
			ok = noAPIKeyKeys(pn, perr) && ok
		}
		if !providerNameRE.MatchString(pname) {
			addf(line, "provider name %q: use 1-32 lowercase letters, digits, '-' or '_', starting with a letter", pname)
			ok = false
		}
		if ok && pn != nil {
			reg.byName[pname] = p
			reg.names = append(reg.names, pname)
		}
	}
	if len(probs) > 0 {
		sort.SliceStable(probs, func(i, j int) bool { return problemLine(probs[i]) < problemLine(probs[j]) })
		return nil, &ConfigError{Problems: probs}
	}
	sort.Strings(reg.names)
	return reg, nil
}

func problemLine(s string) int {
	var n int
	if i := strings.Index(s, ":"); i >= 0 {
		fmt.Sscanf(s[i+1:], "%d", &n)
	}
	return n
}

func validateProvider(name string, s providerSpec, getenv func(string) string, perr func(key, format string, args ...any)) (*Provider, bool) {
	v := &specCheck{perr: perr}
	p := &Provider{
		Name: name, DisplayName: s.DisplayName, Type: s.Type, PKCE: true,
		DefaultScopes: slices.Clone(s.DefaultScopes), AllowedScopes: slices.Clone(s.AllowedScopes),
		ScopeDescriptions: s.ScopeDescription, ExtraAuthParams: s.ExtraAuthParams,
		SidecarTokenExport: s.SidecarTokenExport, HostedDomain: s.HostedDomain,
		PropagateTrace: s.PropagateTrace,
	}
	if p.DisplayName == "" {
		p.DisplayName = name
	}
	if s.PKCE != nil {
		p.PKCE = *s.PKCE
	}
	v.endpoints(p, s)
	v.client(p, s, getenv)
	v.scopeTables(p, s)
	v.scopes(p, s)
	v.hostedDomain(p, s)
	v.account(p, s)
	v.api(p, s)
	v.revocation(p, s)
	v.keepAlive(p, s.KeepAlive, s.KeepAliveRefresh)
	return p, !v.bad
}

// specCheck collects the problems of one provider entry.
type specCheck struct {
	perr func(key, format string, args ...any)
	bad  bool
}

func (v *specCheck) fail(key, format string, args ...any) {
	v.bad = true
	v.perr(key, format, args...)
}

// url checks an endpoint URL; required ones must be present.
func (v *specCheck) url(key, val string, required bool) string {
	if val == "" {
		if required {
			v.fail(key, "%s is required", key)
		}
		return ""
	}
	if err := checkEndpoint(val); err != nil {
		v.fail(key, "%s: %v", key, err)
		return ""
	}
	return val
}

// endpoints checks the type and the authorization and token endpoints.
func (v *specCheck) endpoints(p *Provider, s providerSpec) {
	switch s.Type {
	case TypeOAuth2:
		p.AuthURL = v.url("authorization_url", s.AuthorizationURL, true)
		p.TokenURL = v.url("token_url", s.TokenURL, true)
		if s.Issuer != "" {
			v.fail("issuer", "issuer is only for type %q", TypeOIDC)
		}
		if s.Account == nil {
			v.fail("account", "account (url, id_field, login_field) is required for type %q: it tells which account was connected", TypeOAuth2)
		}
	case TypeOIDC:
		p.Issuer = v.url("issuer", s.Issuer, true)
		p.AuthURL = v.url("authorization_url", s.AuthorizationURL, false)
		p.TokenURL = v.url("token_url", s.TokenURL, false)
	case "":
		v.fail("type", "type is required (%q, %q or %q)", TypeOAuth2, TypeOIDC, TypeAPIKey)
	default:
		v.fail("type", "type %q: want %q, %q or %q", s.Type, TypeOAuth2, TypeOIDC, TypeAPIKey)
	}
	switch s.TokenAuth {
	case "", "client_secret_basic":
	case "client_secret_post":
		p.TokenAuthInParams = true
	default:
		v.fail("token_endpoint_auth", "token_endpoint_auth %q: want client_secret_basic or client_secret_post", s.TokenAuth)
	}
}

// client resolves the client id and the secret, given by reference only.
func (v *specCheck) client(p *Provider, s providerSpec, getenv func(string) string) {
	if s.ClientID == "" {
		v.fail("client_id", "client_id is required")
	} else if m := envRefRE.FindStringSubmatch(s.ClientID); m != nil {
		p.ClientID = getenv(m[1])
		if p.ClientID == "" {
			v.fail("client_id", "client_id: environment variable %s is not set", m[1])
		}
	} else if strings.Contains(s.ClientID, "${") {
		v.fail("client_id", "client_id: malformed reference %q (want ${NAME})", s.ClientID)
	} else {
		p.ClientID = s.ClientID
	}
	switch {
	case s.ClientSecret != "" && s.ClientSecretFile != "":
		v.fail("client_secret", "give client_secret or client_secret_file, not both")
	case s.ClientSecret != "":
		m := envRefRE.FindStringSubmatch(s.ClientSecret)
		if m == nil {
			v.fail("client_secret", "client_secret must be a reference ${NAME} to an environment variable (or use client_secret_file); secrets are never written in this file")
			return
		}
		val := getenv(m[1])
		if val == "" {
			v.fail("client_secret", "client_secret: environment variable %s is not set", m[1])
		}
		p.ClientSecret = vault.Secret(val)
	case s.ClientSecretFile != "":
		b, err := os.ReadFile(s.ClientSecretFile)
		if err != nil {
			v.fail("client_secret_file", "client_secret_file: cannot read %s", s.ClientSecretFile)
			return
		}
		val := strings.TrimSpace(string(b))
		if val == "" {
			v.fail("client_secret_file", "client_secret_file: %s is empty", s.ClientSecretFile)
		}
		p.ClientSecret = vault.Secret(val)
	default:
		v.fail("client_id", "client_secret or client_secret_file is required")
	}
}

// scopes checks the scope lists and the extra authorization parameters.
func (v *specCheck) scopes(p *Provider, s providerSpec) {
	for _, sc := range s.DefaultScopes {
		if !validScope(sc) {
			v.fail("default_scopes", "default scope %q is not a valid scope token", sc)
		} else if !p.ScopeAllowed(sc) {
			v.fail("default_scopes", "default scope %q is not in allowed_scopes", sc)
		}
	}
	for _, sc := range s.AllowedScopes {
		if !validScope(sc) {
			v.fail("allowed_scopes", "allowed scope %q is not a valid scope token", sc)
		} else if c := p.ScopeAliases[sc]; c != "" {
			v.fail("allowed_scopes", "allowed scope %q is an alias: name it %s", sc, c)
		}
	}
	for k := range s.ExtraAuthParams {
		switch k {
		case "state", "code_challenge", "code_challenge_method", "nonce", "redirect_uri", "client_id", "response_type", "scope":
			v.fail("extra_auth_params", "extra_auth_params: %q is set by the broker and cannot be configured", k)
		case "hd":
			v.fail("extra_auth_params", "extra_auth_params: set hosted_domain instead of hd (the broker then also checks the ID token's hd claim)")
		}
	}
}

// account checks the account endpoint (required for plain OAuth 2.0).
func (v *specCheck) account(p *Provider, s providerSpec) {
	a := s.Account
	if a == nil {
		return
	}
	p.AccountURL = v.url("account", a.URL, s.Type == TypeOAuth2)
	p.AccountIDField, p.AccountLoginField = a.IDField, a.LoginField
	if a.IDField == "" {
		v.fail("account", "account.id_field is required")
	}
	if a.LoginField == "" {
		p.AccountLoginField = a.IDField
	}
}

// api checks the API base URL and the allow-list.
func (v *specCheck) api(p *Provider, s providerSpec) {
	a := s.API
	if a == nil {
		return
	}
	p.APIBaseURL = v.url("api", a.BaseURL, true)
	p.AllowedRequests = v.patterns("api.allowed_paths", a.AllowedPaths)
	p.AllowedPaths = slices.Clone(a.AllowedPaths)
	if p.APIBaseURL == "" {
		return
	}
	seen := map[string]bool{}
	add := func(base string, paths []string, reqs []RequestPattern) {
		u, _ := url.Parse(base)
		host := strings.ToLower(u.Host)
		if seen[host] {
			v.fail("api", "api.hosts: %s is given twice (one base per host)", host)
			return
		}
		seen[host] = true
		p.APIBases = append(p.APIBases, APIBase{URL: base, Host: host, AllowedPaths: slices.Clone(paths), AllowedRequests: reqs,
			parsed: u, parsedFrom: base})
	}
	add(p.APIBaseURL, a.AllowedPaths, p.AllowedRequests)
	for i, h := range a.Hosts {
		key := fmt.Sprintf("api.hosts[%d]", i)
		base := v.url("api", h.BaseURL, true)
		reqs := v.patterns(key+".allowed_paths", h.AllowedPaths)
		if base != "" {
			add(base, h.AllowedPaths, reqs)
		}
	}
}

// patterns parses an allow-list.
func (v *specCheck) patterns(key string, list []string) []RequestPattern {
	var out []RequestPattern
	for _, ap := range list {
		rp, err := ParseRequestPattern(ap)
		if err != nil {
			v.fail("api", "%s: %v", key, err)
			continue
		}
		out = append(out, rp)
	}
	return out
}

// revocation checks the revocation style and endpoint.
func (v *specCheck) revocation(p *Provider, s providerSpec) {
	rv := s.Revocation
	if rv == nil {
		return
	}
	switch rv.Style {
	case RevokeRFC7009, RevokeGitHubGrant:
		p.RevocationStyle = rv.Style
		p.RevocationAccountWide = rv.AccountWide || rv.Style == RevokeGitHubGrant
	case RevokeNone:
		p.RevocationDisabled = true
		if rv.URL != "" || rv.TokenURL != "" || rv.AccountWide {
			v.fail("revocation", "revocation.style none takes no other field")
		}
		return
	default:
		v.fail("revocation", "revocation.style %q: want %q, %q or %q", rv.Style, RevokeRFC7009, RevokeGitHubGrant, RevokeNone)
	}
	// An OIDC provider's RFC 7009 endpoint may come from discovery
	// (revocation_endpoint).
	if rv.URL == "" && !(s.Type == TypeOIDC && rv.Style == RevokeRFC7009) {
		v.fail("revocation", "revocation.url is required (only an oidc provider's rfc7009 endpoint can come from discovery)")
	} else if v.url("revocation", strings.ReplaceAll(rv.URL, "{client_id}", "client_id"), false) != "" {
		p.RevocationURL = rv.URL
	}
	if rv.TokenURL != "" && rv.Style != RevokeGitHubGrant {
		v.fail("revocation", "revocation.token_url is only for style %q", RevokeGitHubGrant)
	} else if v.url("revocation", strings.ReplaceAll(rv.TokenURL, "{client_id}", "client_id"), false) != "" {
		p.RevocationTokenURL = rv.TokenURL
	}
}

// scopeTables checks scope_aliases and scope_implies.
func (v *specCheck) scopeTables(p *Provider, s providerSpec) {
	if len(s.ScopeAliases) > 0 {
		p.ScopeAliases = map[string]string{}
	}
	for _, sc := range sortedKeys(s.ScopeAliases) {
		if !validScope(sc) {
			v.fail("scope_aliases", "scope_aliases: %q is not a valid scope token", sc)
			continue
		}
		for _, alias := range s.ScopeAliases[sc] {
			switch {
			case !validScope(alias):
				v.fail("scope_aliases", "scope_aliases: %s: alias %q is not a valid scope token", sc, alias)
			case alias == sc:
				v.fail("scope_aliases", "scope_aliases: %s is given as its own alias", sc)
			case s.ScopeAliases[alias] != nil:
				v.fail("scope_aliases", "scope_aliases: %q is both a scope with aliases and an alias of %s", alias, sc)
			case p.ScopeAliases[alias] != "":
				v.fail("scope_aliases", "scope_aliases: %q is an alias of both %s and %s", alias, p.ScopeAliases[alias], sc)
			default:
				p.ScopeAliases[alias] = sc
			}
		}
	}
	if len(s.ScopeImplies) > 0 {
		p.ScopeImplies = map[string][]string{}
	}
	for _, sc := range sortedKeys(s.ScopeImplies) {
		if !validScope(sc) {
			v.fail("scope_implies", "scope_implies: %q is not a valid scope token", sc)
			continue
		}
		for _, in := range s.ScopeImplies[sc] {
			switch {
			case !validScope(in):
				v.fail("scope_implies", "scope_implies: %s: %q is not a valid scope token", sc, in)
			case in == sc:
				v.fail("scope_implies", "scope_implies: %s is given as implying itself", sc)
			case p.ScopeAliases[in] != "" || p.ScopeAliases[sc] != "":
				v.fail("scope_implies", "scope_implies: %s: name scopes by their catalogue names, not by aliases", sc)
			default:
				p.ScopeImplies[sc] = append(p.ScopeImplies[sc], in)
			}
		}
	}
}

var hostedDomainRE = regexp.MustCompile(`^(\*|[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+)$`)

// hostedDomain checks hosted_domain (OIDC only: it is verified in the ID
// token).
func (v *specCheck) hostedDomain(p *Provider, s providerSpec) {
	if s.HostedDomain == "" {
		return
	}
	if s.Type != TypeOIDC {
		v.fail("hosted_domain", "hosted_domain is only for type %q (it is checked in the ID token's hd claim)", TypeOIDC)
	}
	if len(s.HostedDomain) > 253 || !hostedDomainRE.MatchString(s.HostedDomain) {
		v.fail("hosted_domain", "hosted_domain %q: want a lowercase domain name such as example.com, or * for any Workspace domain", s.HostedDomain)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func validScope(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r <= 0x20 || r == '"' || r == '\\' || r > 0x7e {
			return false
		}
	}
	return true
}

// checkEndpoint accepts absolute https URLs, and http only on loopback.
func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil {
		return fmt.Errorf("%q is not a URL", v)
	}
	if u.Host == "" || u.User != nil || u.Fragment != "" {
		return fmt.Errorf("%q is not an absolute URL with a host (no user info, no fragment)", v)
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		if loopback.Host(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("%q must use https (http is allowed on loopback only)", v)
	}
	return fmt.Errorf("%q must use https", v)
}

// mapValue returns the value node for key in mapping node m.
func mapValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// keyLine returns the line of key in mapping node m, or 0.
func keyLine(m *yaml.Node, key string) int {
	if m == nil || m.Kind != yaml.MappingNode {
		return 0
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i].Line
		}
	}
	return 0
}
