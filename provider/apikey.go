package provider

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
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

var (
	_ FormStep  = (*APIKey)(nil)
	_ apiCaller = (*APIKey)(nil)
)

// Type is TypeAPIKey.
func (a *APIKey) Type() string { return TypeAPIKey }

// Form is the key entry page.
func (a *APIKey) Form() Form {
	return Form{Page: "keyentry", Instructions: a.Instructions, InstructionsURL: a.InstructionsURL, Fields: slices.Clone(a.Fields)}
}

// Field returns the field named name.
func (a *APIKey) Field(name string) (KeyField, bool) {
	for _, f := range a.Fields {
		if f.Name == name {
			return f, true
		}
	}
	return KeyField{}, false
}

// apiKeySpec is an api_key entry as written in providers.yaml.
type apiKeySpec struct {
	entrySpec       `yaml:",inline"`
	Instructions    string         `yaml:"instructions"`
	InstructionsURL string         `yaml:"instructions_url"`
	Fields          []keyFieldSpec `yaml:"fields"`
	Inject          *injectSpec    `yaml:"inject"`
	Verify          *verifySpec    `yaml:"verify"`
	API             *apiSpec       `yaml:"api"`
	PropagateTrace  bool           `yaml:"propagate_trace"`
	// SidecarTokenExport is refused: a key is never handed out.
	SidecarTokenExport bool `yaml:"sidecar_token_export"`
}

var apiKeyKind = defineKind(TypeAPIKey, func(key, _ string) string {
	return fmt.Sprintf("%s is not used by type %q (the person enters the credential on the broker's page)", key, TypeAPIKey)
}, buildAPIKey)

// managedHeaders are never injected: the transport, the broker or the
// caller sets them.
var managedHeaders = []string{
	"Host", "Content-Length", "Content-Encoding", "Transfer-Encoding", "Connection", "Keep-Alive",
	"Accept-Encoding", "Te", "Trailer", "Upgrade", "Proxy-Authorization", "Proxy-Connection", "Cookie",
}

var headerNameRE = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")

// buildAPIKey checks an api_key entry.
func buildAPIKey(c *entryCheck, s *apiKeySpec) *Provider {
	a := &APIKey{}
	p := c.newProvider(s.entrySpec, a)
	p.PropagateTrace = s.PropagateTrace
	if keyLine(c.node, "sidecar_token_export") > 0 {
		c.fail("sidecar_token_export", "sidecar_token_export: an API key is never handed out (use the sidecar proxy)")
	}
	c.instructions(a, s)
	c.fields(a, s.Fields)
	c.inject(a, s.Inject)
	c.verify(a, s.Verify)
	// The API section is the same as for OAuth providers.
	if s.API == nil {
		c.failAt(nil, "api (base_url, allowed_paths) is required for type %q: the key is verified and used there", TypeAPIKey)
	}
	c.api(p, s.API)
	return p
}

func (c *entryCheck) instructions(a *APIKey, s *apiKeySpec) {
	switch {
	case strings.TrimSpace(s.Instructions) == "":
		c.failAt(at("instructions"), "instructions are required: plain text telling the person where to create the key")
	case len(s.Instructions) > maxInstructions || !utf8.ValidString(s.Instructions):
		c.failAt(at("instructions"), "instructions: at most %d bytes of UTF-8 text", maxInstructions)
	default:
		a.Instructions = strings.TrimSpace(s.Instructions)
	}
	if s.InstructionsURL == "" {
		c.failAt(at("instructions_url"), "instructions_url is required: the page where the person creates and revokes keys")
	} else if err := checkEndpoint(s.InstructionsURL); err != nil {
		c.failAt(at("instructions_url"), "instructions_url: %v", err)
	} else {
		a.InstructionsURL = s.InstructionsURL
	}
}

func (c *entryCheck) fields(a *APIKey, specs []keyFieldSpec) {
	switch {
	case len(specs) == 0:
		c.failAt(at("fields"), "fields: at least one input is required (e.g. {name: api_key, label: API key, secret: true})")
		return
	case len(specs) > maxKeyFields:
		c.failAt(at("fields"), "fields: at most %d inputs", maxKeyFields)
		return
	}
	secrets := 0
	for i, fs := range specs {
		f := KeyField{Name: fs.Name, Label: strings.TrimSpace(fs.Label), Pattern: fs.Pattern, MaxLength: fs.MaxLength}
		switch {
		case fs.Name == "":
			c.failAt(at("fields", i), "fields[%d].name is required", i)
		case !keyFieldNameRE.MatchString(fs.Name):
			c.failAt(at("fields", i, "name"), "fields[%d].name %q: use 1-32 lowercase letters, digits or _, starting with a letter", i, fs.Name)
		case slices.ContainsFunc(a.Fields, func(g KeyField) bool { return g.Name == fs.Name }):
			c.failAt(at("fields", i, "name"), "fields[%d].name %q is used twice", i, fs.Name)
		}
		if f.Label == "" || len(f.Label) > maxLabelLen || !utf8.ValidString(f.Label) {
			c.failAt(at("fields", i, "label"), "fields[%d].label is required (at most %d bytes): it is shown next to the input", i, maxLabelLen)
		}
		if fs.Secret == nil {
			c.failAt(at("fields", i), "fields[%d].secret is required: say true (a key, token or password) or false (an email, a user name)", i)
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
				c.failAt(at("fields", i, "pattern"), "fields[%d].pattern is longer than %d bytes", i, maxPatternLen)
			case err != nil:
				c.failAt(at("fields", i, "pattern"), "fields[%d].pattern is not a valid regular expression: %s", i, regexpProblem(err))
			default:
				f.re = re
			}
		}
		switch {
		case fs.MaxLength == 0:
			f.MaxLength = defaultKeyFieldLen
		case fs.MaxLength < 1 || fs.MaxLength > maxKeyFieldLen:
			c.failAt(at("fields", i, "max_length"), "fields[%d].max_length %d: want 1 to %d", i, fs.MaxLength, maxKeyFieldLen)
		case f.Secret && fs.MaxLength < MinSecretLen:
			c.failAt(at("fields", i, "max_length"), "fields[%d].max_length %d: a secret is at least %d characters", i, fs.MaxLength, MinSecretLen)
		}
		a.Fields = append(a.Fields, f)
	}
	if secrets == 0 {
		c.failAt(at("fields"), "fields: at least one field must be secret (the key or token)")
	}
}

// template parses one injection template and checks its references.
func (c *entryCheck) template(a *APIKey, path []any, what, raw string, secretPosition bool) (Template, bool) {
	t, err := ParseTemplate(raw)
	if err != nil {
		c.failAt(path, "%s %q: %v", what, raw, err)
		return Template{}, false
	}
	ok := true
	for _, name := range t.Fields() {
		f, known := a.Field(name)
		switch {
		case !known:
			c.failAt(path, "%s names {%s}, which is not one of the fields", what, name)
			ok = false
		case f.Secret && !secretPosition:
			c.failAt(path, "%s names the secret field {%s} in a position that is not secret", what, name)
			ok = false
		}
	}
	return t, ok
}

func (c *entryCheck) inject(a *APIKey, s *injectSpec) {
	if s == nil {
		c.failAt(at("inject"), `inject is required: header: "Authorization: Bearer {api_key}" or basic: {username: "{email}", password: "{api_token}"}`)
		return
	}
	var used []string
	switch {
	case s.Header != "" && s.Basic != nil:
		c.failAt(at("inject"), "inject: give header or basic, not both")
		return
	case s.Header != "":
		name, value, found := strings.Cut(s.Header, ":")
		name = strings.TrimSpace(name)
		switch {
		case !found:
			c.failAt(at("inject", "header"), `inject.header %q: want "Name: template", e.g. "X-Api-Key: {api_key}"`, s.Header)
			return
		case !headerNameRE.MatchString(name):
			c.failAt(at("inject", "header"), "inject.header: %q is not a header name", name)
			return
		case slices.Contains(managedHeaders, http.CanonicalHeaderKey(name)) || slices.Contains(allowedRequestHeaders, http.CanonicalHeaderKey(name)) ||
			strings.HasPrefix(strings.ToLower(name), "proxy-"):
			c.failAt(at("inject", "header"), "inject.header: %s is set by the transport or the caller and cannot carry the credential", http.CanonicalHeaderKey(name))
			return
		}
		t, ok := c.template(a, at("inject", "header"), "inject.header", strings.TrimLeft(value, " \t"), true)
		if !ok {
			return
		}
		if len(t.Fields()) == 0 {
			c.failAt(at("inject", "header"), "inject.header names no field: the credential would never be sent")
			return
		}
		a.Header, a.HeaderValue = http.CanonicalHeaderKey(name), t
		used = t.Fields()
	case s.Basic != nil:
		if s.Basic.Username == "" || s.Basic.Password == "" {
			c.failAt(at("inject", "basic"), "inject.basic needs username and password templates")
			return
		}
		u, ok1 := c.template(a, at("inject", "basic", "username"), "inject.basic.username", s.Basic.Username, false)
		pw, ok2 := c.template(a, at("inject", "basic", "password"), "inject.basic.password", s.Basic.Password, true)
		if !ok1 || !ok2 {
			return
		}
		if strings.Contains(lit(u), ":") {
			c.failAt(at("inject", "basic", "username"), "inject.basic.username: a basic-auth user name cannot contain ':'")
			return
		}
		if !slices.ContainsFunc(pw.Fields(), func(n string) bool { f, _ := a.Field(n); return f.Secret }) {
			c.failAt(at("inject", "basic", "password"), "inject.basic.password must name a secret field (secrets are never written in this file)")
			return
		}
		a.BasicUser, a.BasicPass = u, pw
		used = append(u.Fields(), pw.Fields()...)
	default:
		c.failAt(at("inject"), "inject: give header or basic")
		return
	}
	for i, f := range a.Fields {
		if f.Name != "" && !slices.Contains(used, f.Name) {
			c.failAt(at("fields", i, "name"), "fields[%d] %q is never injected: name it in inject", i, f.Name)
		}
	}
}

// regexpProblem says what is wrong with a pattern.
func regexpProblem(err error) string {
	var se *syntax.Error
	if errors.As(err, &se) {
		return fmt.Sprintf("%s: `%s`", se.Code, se.Expr)
	}
	return "it does not compile"
}

// lit returns t's literal text.
func lit(t Template) string {
	var b strings.Builder
	for _, p := range t.parts {
		b.WriteString(p.lit)
	}
	return b.String()
}

func (c *entryCheck) verify(a *APIKey, s *verifySpec) {
	if s == nil {
		c.failAt(at("verify"), "verify is required: a request (path under api.base_url) that answers 2xx with the account, and JSON pointers to its id and login")
		return
	}
	switch strings.ToUpper(s.Method) {
	case "", http.MethodGet:
		a.VerifyMethod = http.MethodGet
	case http.MethodPost:
		a.VerifyMethod = http.MethodPost
	default:
		c.failAt(at("verify", "method"), "verify.method %q: want GET or POST", s.Method)
	}
	switch {
	case s.Path == "":
		c.failAt(at("verify"), "verify.path is required (relative to api.base_url, e.g. /user)")
	case strings.ContainsAny(s.Path, "{}"):
		c.failAt(at("verify", "path"), "verify.path cannot name fields: credentials only go where inject says")
	default:
		if _, err := checkAPIPath(s.Path); err != nil {
			c.failAt(at("verify", "path"), "verify.path %q: %v", s.Path, err)
		} else {
			a.VerifyPath = s.Path
		}
	}
	if s.AccountID == "" {
		c.failAt(at("verify"), "verify.account_id is required: the JSON pointer to the account's stable id in the answer (e.g. /id)")
	} else if ptr, err := ParsePointer(s.AccountID); err != nil {
		c.failAt(at("verify", "account_id"), "verify.account_id %q: %v", s.AccountID, err)
	} else {
		a.AccountID = ptr
	}
	a.AccountName = a.AccountID
	if s.AccountLogin != "" {
		if ptr, err := ParsePointer(s.AccountLogin); err != nil {
			c.failAt(at("verify", "account_login"), "verify.account_login %q: %v", s.AccountLogin, err)
		} else {
			a.AccountName = ptr
		}
	}
}
