package provider

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// TypeAPIKey is a service without OAuth for individuals: the person enters
// an API key or personal token (or an email plus an API token) on the
// broker's own page, the broker verifies it with one request, seals it and
// injects it into API requests.
const TypeAPIKey = "api_key"

// Limits of an api_key entry and of what a person may enter.
const (
	maxKeyFields       = 8
	defaultKeyFieldLen = 1024
	maxKeyFieldLen     = 4096
	// MinSecretLen is the shortest secret value accepted: shorter ones are
	// not keys, and redacting them from answers would mangle innocent text.
	MinSecretLen    = 8
	maxInstructions = 2000
	maxLabelLen     = 100
	maxPatternLen   = 512
)

// The YAML shape of an api_key entry's own keys (see providers.yaml).
type keyFieldSpec struct {
	Name      string `yaml:"name"`
	Label     string `yaml:"label"`
	Secret    *bool  `yaml:"secret"`
	Pattern   string `yaml:"pattern"`
	MaxLength int    `yaml:"max_length"`
}

type injectSpec struct {
	Header string     `yaml:"header"`
	Basic  *basicSpec `yaml:"basic"`
}

type basicSpec struct {
	Username string `yaml:"username"`
	Password string `yaml:"password"`
}

type verifySpec struct {
	Method       string `yaml:"method"`
	Path         string `yaml:"path"`
	AccountID    string `yaml:"account_id"`
	AccountLogin string `yaml:"account_login"`
}

// APIKey is the validated description of an api_key provider: what the
// entry page asks for, how the credential goes on a request, and the
// request that verifies it before anything is stored.
type APIKey struct {
	// Instructions are plain text shown on the entry page;
	// InstructionsURL is where the person creates (and revokes) a key.
	Instructions    string
	InstructionsURL string
	// Fields are the page's inputs, in order.
	Fields []KeyField
	// Header and HeaderValue: the credential goes in this header
	// ("X-Api-Key", "{api_key}"). Otherwise BasicUser and BasicPass give
	// HTTP basic authentication.
	Header                 string
	HeaderValue            Template
	BasicUser, BasicPass   Template
	VerifyMethod           string
	VerifyPath             string
	AccountID, AccountName Pointer
}

// KeyField is one input of an api_key entry page.
type KeyField struct {
	Name  string
	Label string
	// Secret: shown as a password input, sealed, redacted from answers,
	// never shown again.
	Secret bool
	// Pattern is the regular expression (as written) the whole value must
	// match before anything is sent anywhere; "" accepts any value.
	Pattern   string
	re        *regexp.Regexp
	MaxLength int
}

// IsAPIKey reports whether p is an api_key provider.
func (p *Provider) IsAPIKey() bool { return p != nil && p.Type == TypeAPIKey && p.APIKey != nil }

// Field returns the field named name.
func (a *APIKey) Field(name string) (KeyField, bool) {
	for _, f := range a.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return KeyField{}, false
}

// oauthOnlyKeys are providers.yaml keys that mean nothing for an api_key
// entry: each one present is a problem, so a half-converted entry cannot
// pass.
var oauthOnlyKeys = []string{
	"issuer", "authorization_url", "token_url", "client_id", "client_secret", "client_secret_file",
	"token_endpoint_auth", "pkce", "default_scopes", "allowed_scopes", "scope_descriptions",
	"scope_aliases", "scope_implies", "extra_auth_params", "hosted_domain", "account", "revocation",
}

// apiKeyOnlyKeys are the keys only an api_key entry may have.
var apiKeyOnlyKeys = []string{"instructions", "instructions_url", "fields", "inject", "verify"}

// managedHeaders are never injected: the transport, the broker or the
// caller sets them.
var managedHeaders = []string{
	"Host", "Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Keep-Alive",
	"Accept-Encoding", "Te", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Connection", "Cookie",
}

var headerNameRE = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")

// noAPIKeyKeys reports each api_key-only key of an OAuth entry; ok is
// false when there was one.
func noAPIKeyKeys(node *yaml.Node, perr func(key, format string, args ...any)) bool {
	ok := true
	for _, k := range apiKeyOnlyKeys {
		if keyLine(node, k) > 0 {
			perr(k, "%s is only for type %q", k, TypeAPIKey)
			ok = false
		}
	}
	return ok
}

// keyCheck collects the problems of one api_key entry, each at the line
// of the YAML node it concerns.
type keyCheck struct {
	node *yaml.Node
	line int // of the entry's name
	addf func(line int, format string, args ...any)
	name string
	bad  bool
}

// lineOf returns the line of the node at path (mapping keys as strings,
// sequence indexes as ints) below the entry, or of its deepest ancestor
// that exists.
func (c *keyCheck) lineOf(path ...any) int {
	n, line := c.node, c.line
	for _, step := range path {
		switch s := step.(type) {
		case string:
			if l := keyLine(n, s); l > 0 {
				line = l
			}
			n = mapValue(n, s)
		case int:
			if n == nil || n.Kind != yaml.SequenceNode || s >= len(n.Content) {
				return line
			}
			n = n.Content[s]
			line = n.Line
		}
		if n == nil {
			return line
		}
	}
	return line
}

func (c *keyCheck) fail(path []any, format string, args ...any) {
	c.bad = true
	c.addf(c.lineOf(path...), "%s: %s", c.name, fmt.Sprintf(format, args...))
}

func at(path ...any) []any { return path }

// validateAPIKeyProvider checks an api_key entry. node is the entry's
// mapping node and line the line of its name (for line numbers); addf
// reports a problem at a line.
func validateAPIKeyProvider(name string, s providerSpec, node *yaml.Node, line int, addf func(line int, format string, args ...any)) (*Provider, bool) {
	c := &keyCheck{node: node, line: line, addf: addf, name: name}
	p := &Provider{Name: name, DisplayName: s.DisplayName, Type: TypeAPIKey, APIKey: &APIKey{}}
	if p.DisplayName == "" {
		p.DisplayName = name
	}
	for _, k := range oauthOnlyKeys {
		if keyLine(node, k) > 0 {
			c.fail(at(k), "%s is not used by type %q (the person enters the credential on the broker's page)", k, TypeAPIKey)
		}
	}
	if keyLine(node, "sidecar_token_export") > 0 {
		c.fail(at("sidecar_token_export"), "sidecar_token_export: an API key is never handed out (use the sidecar proxy)")
	}
	a := p.APIKey
	c.instructions(a, s)
	c.fields(a, s.Fields)
	c.inject(a, s.Inject)
	c.verify(a, s.Verify)
	// The API section is the same as for OAuth providers.
	v := &specCheck{perr: func(key, format string, args ...any) {
		c.fail(at(key), format, args...)
	}}
	if s.API == nil {
		c.fail(nil, "api (base_url, allowed_paths) is required for type %q: the key is verified and used there", TypeAPIKey)
	}
	v.api(p, s)
	if v.bad {
		c.bad = true
	}
	return p, !c.bad
}

func (c *keyCheck) instructions(a *APIKey, s providerSpec) {
	switch {
	case strings.TrimSpace(s.Instructions) == "":
		c.fail(at("instructions"), "instructions are required: plain text telling the person where to create the key")
	case len(s.Instructions) > maxInstructions || !utf8.ValidString(s.Instructions):
		c.fail(at("instructions"), "instructions: at most %d bytes of UTF-8 text", maxInstructions)
	default:
		a.Instructions = strings.TrimSpace(s.Instructions)
	}
	if s.InstructionsURL == "" {
		c.fail(at("instructions_url"), "instructions_url is required: the page where the person creates and revokes keys")
	} else if err := checkEndpoint(s.InstructionsURL); err != nil {
		c.fail(at("instructions_url"), "instructions_url: %v", err)
	} else {
		a.InstructionsURL = s.InstructionsURL
	}
}

func (c *keyCheck) fields(a *APIKey, specs []keyFieldSpec) {
	switch {
	case len(specs) == 0:
		c.fail(at("fields"), "fields: at least one input is required (e.g. {name: api_key, label: API key, secret: true})")
		return
	case len(specs) > maxKeyFields:
		c.fail(at("fields"), "fields: at most %d inputs", maxKeyFields)
		return
	}
	secrets := 0
	for i, fs := range specs {
		f := KeyField{Name: fs.Name, Label: strings.TrimSpace(fs.Label), Pattern: fs.Pattern, MaxLength: fs.MaxLength}
		switch {
		case fs.Name == "":
			c.fail(at("fields", i), "fields[%d].name is required", i)
		case !KeyFieldNameRE.MatchString(fs.Name):
			c.fail(at("fields", i, "name"), "fields[%d].name %q: use 1-32 lowercase letters, digits or _, starting with a letter", i, fs.Name)
		case slices.ContainsFunc(a.Fields, func(g KeyField) bool { return g.Name == fs.Name }):
			c.fail(at("fields", i, "name"), "fields[%d].name %q is used twice", i, fs.Name)
		}
		if f.Label == "" || len(f.Label) > maxLabelLen || !utf8.ValidString(f.Label) {
			c.fail(at("fields", i, "label"), "fields[%d].label is required (at most %d bytes): it is shown next to the input", i, maxLabelLen)
		}
		if fs.Secret == nil {
			c.fail(at("fields", i), "fields[%d].secret is required: say true (a key, token or password) or false (an email, a user name)", i)
		} else {
			f.Secret = *fs.Secret
		}
		if f.Secret {
			secrets++
		}
		if fs.Pattern != "" {
			re, err := regexp.Compile(`^(?:` + fs.Pattern + `)$`)
			switch {
			case len(fs.Pattern) > maxPatternLen:
				c.fail(at("fields", i, "pattern"), "fields[%d].pattern is longer than %d bytes", i, maxPatternLen)
			case err != nil:
				c.fail(at("fields", i, "pattern"), "fields[%d].pattern is not a valid regular expression: %s", i, strings.TrimPrefix(err.Error(), "error parsing regexp: "))
			default:
				f.re = re
			}
		}
		switch {
		case fs.MaxLength == 0:
			f.MaxLength = defaultKeyFieldLen
		case fs.MaxLength < 1 || fs.MaxLength > maxKeyFieldLen:
			c.fail(at("fields", i, "max_length"), "fields[%d].max_length %d: want 1 to %d", i, fs.MaxLength, maxKeyFieldLen)
		case f.Secret && fs.MaxLength < MinSecretLen:
			c.fail(at("fields", i, "max_length"), "fields[%d].max_length %d: a secret is at least %d characters", i, fs.MaxLength, MinSecretLen)
		}
		a.Fields = append(a.Fields, f)
	}
	if secrets == 0 {
		c.fail(at("fields"), "fields: at least one field must be secret (the key or token)")
	}
}

// template parses one injection template and checks its references.
func (c *keyCheck) template(a *APIKey, path []any, what, raw string, secretPosition bool) (Template, bool) {
	t, err := ParseTemplate(raw)
	if err != nil {
		c.fail(path, "%s %q: %v", what, raw, err)
		return Template{}, false
	}
	ok := true
	for _, name := range t.Fields() {
		f, known := a.Field(name)
		switch {
		case !known:
			c.fail(path, "%s names {%s}, which is not one of the fields", what, name)
			ok = false
		case f.Secret && !secretPosition:
			c.fail(path, "%s names the secret field {%s} in a position that is not secret", what, name)
			ok = false
		}
	}
	return t, ok
}

func (c *keyCheck) inject(a *APIKey, s *injectSpec) {
	if s == nil {
		c.fail(at("inject"), `inject is required: header: "Authorization: Bearer {api_key}" or basic: {username: "{email}", password: "{api_token}"}`)
		return
	}
	var used []string
	switch {
	case s.Header != "" && s.Basic != nil:
		c.fail(at("inject"), "inject: give header or basic, not both")
		return
	case s.Header != "":
		name, value, found := strings.Cut(s.Header, ":")
		name = strings.TrimSpace(name)
		switch {
		case !found:
			c.fail(at("inject", "header"), `inject.header %q: want "Name: template", e.g. "X-Api-Key: {api_key}"`, s.Header)
			return
		case !headerNameRE.MatchString(name):
			c.fail(at("inject", "header"), "inject.header: %q is not a header name", name)
			return
		case slices.Contains(managedHeaders, http.CanonicalHeaderKey(name)) || slices.Contains(allowedRequestHeaders, http.CanonicalHeaderKey(name)) ||
			strings.HasPrefix(strings.ToLower(name), "proxy-"):
			c.fail(at("inject", "header"), "inject.header: %s is set by the transport or the caller and cannot carry the credential", http.CanonicalHeaderKey(name))
			return
		}
		t, ok := c.template(a, at("inject", "header"), "inject.header", strings.TrimLeft(value, " \t"), true)
		if !ok {
			return
		}
		if len(t.Fields()) == 0 {
			c.fail(at("inject", "header"), "inject.header names no field: the credential would never be sent")
			return
		}
		a.Header, a.HeaderValue = http.CanonicalHeaderKey(name), t
		used = t.Fields()
	case s.Basic != nil:
		if s.Basic.Username == "" || s.Basic.Password == "" {
			c.fail(at("inject", "basic"), "inject.basic needs username and password templates")
			return
		}
		u, ok1 := c.template(a, at("inject", "basic", "username"), "inject.basic.username", s.Basic.Username, false)
		pw, ok2 := c.template(a, at("inject", "basic", "password"), "inject.basic.password", s.Basic.Password, true)
		if !ok1 || !ok2 {
			return
		}
		if strings.Contains(lit(u), ":") {
			c.fail(at("inject", "basic", "username"), "inject.basic.username: a basic-auth user name cannot contain ':'")
			return
		}
		if !slices.ContainsFunc(pw.Fields(), func(n string) bool { f, _ := a.Field(n); return f.Secret }) {
			c.fail(at("inject", "basic", "password"), "inject.basic.password must name a secret field (secrets are never written in this file)")
			return
		}
		a.BasicUser, a.BasicPass = u, pw
		used = append(u.Fields(), pw.Fields()...)
	default:
		c.fail(at("inject"), "inject: give header or basic")
		return
	}
	for i, f := range a.Fields {
		if f.Name != "" && !slices.Contains(used, f.Name) {
			c.fail(at("fields", i, "name"), "fields[%d] %q is never injected: name it in inject", i, f.Name)
		}
	}
}

// lit returns t's literal text.
func lit(t Template) string {
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.lit)
	}
	return b.String()
}

func (c *keyCheck) verify(a *APIKey, s *verifySpec) {
	if s == nil {
		c.fail(at("verify"), "verify is required: a request (path under api.base_url) that answers 2xx with the account, and JSON pointers to its id and login")
		return
	}
	switch strings.ToUpper(s.Method) {
	case "", http.MethodGet:
		a.VerifyMethod = http.MethodGet
	case http.MethodPost:
		a.VerifyMethod = http.MethodPost
	default:
		c.fail(at("verify", "method"), "verify.method %q: want GET or POST", s.Method)
	}
	switch {
	case s.Path == "":
		c.fail(at("verify"), "verify.path is required (relative to api.base_url, e.g. /user)")
	case strings.ContainsAny(s.Path, "{}"):
		c.fail(at("verify", "path"), "verify.path cannot name fields: credentials only go where inject says")
	default:
		if _, err := checkAPIPath(s.Path); err != nil {
			c.fail(at("verify", "path"), "verify.path %q: %v", s.Path, err)
		} else {
			a.VerifyPath = s.Path
		}
	}
	if s.AccountID == "" {
		c.fail(at("verify"), "verify.account_id is required: the JSON pointer to the account's stable id in the answer (e.g. /id)")
	} else if ptr, err := ParsePointer(s.AccountID); err != nil {
		c.fail(at("verify", "account_id"), "verify.account_id %q: %v", s.AccountID, err)
	} else {
		a.AccountID = ptr
	}
	a.AccountName = a.AccountID
	if s.AccountLogin != "" {
		if ptr, err := ParsePointer(s.AccountLogin); err != nil {
			c.fail(at("verify", "account_login"), "verify.account_login %q: %v", s.AccountLogin, err)
		} else {
			a.AccountName = ptr
		}
	}
}
