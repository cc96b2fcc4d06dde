package provider

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"

	"credbroker/internal/loopback"
	"credbroker/vault"
)

// kinds are the values of providers.yaml's type, each a kind of its own
// file (kind.go says what a kind is; the package documentation how to add
// one).
var kinds = []kindDef{oauth2Kind, oidcKind, apiKeyKind, mcpKind}

// kindDef is one value of providers.yaml's type: the keys its entries take
// (the yaml tags of its spec type) and how an entry of it is validated and
// built.
type kindDef struct {
	typ string
	// keys are the entry keys this kind takes.
	keys []string
	// foreign is the problem reported for a key another kind takes
	// (owner names that kind): "%s is only for type %q" by default.
	foreign func(key, owner string) string
	// build decodes and validates an entry and returns its Provider; nil
	// when the entry could not be decoded at all.
	build func(c *entryCheck) *Provider
}

// defineKind makes the kindDef of a kind whose entries decode into S.
func defineKind[S any](typ string, foreign func(key, owner string) string, build func(c *entryCheck, s *S) *Provider) kindDef {
	return kindDef{typ: typ, keys: yamlKeys(reflect.TypeFor[S]()), foreign: foreign,
		build: func(c *entryCheck) *Provider {
			var s S
			if !c.decode(&s) {
				return nil
			}
			return build(c, &s)
		}}
}

// yamlKeys lists the keys of a struct type's yaml tags, inline ones
// included.
func yamlKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline":
			out = append(out, yamlKeys(f.Type)...)
		case name != "" && name != "-":
			out = append(out, name)
		}
	}
	return out
}

// entrySpec are the keys of every entry.
type entrySpec struct {
	DisplayName string `yaml:"display_name"`
	Type        string `yaml:"type"`
}

// apiSpec is an entry's api key: where provider_request goes.
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

// Provider is one validated provider entry. Its fields are read-only after
// LoadProviders returns.
type Provider struct {
	// Name is the key in providers.yaml ("github"), used in URLs and tools.
	Name string
	// DisplayName is shown to people ("GitHub").
	DisplayName string
	// Kind is what the entry's type makes of it: *OAuth or *APIKey. What
	// it can do is found by type assertion (RedirectStep, FormStep,
	// Refresher, …); never nil for a catalogue entry.
	Kind Kind
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
	// access tokens (never refresh tokens) to co-located servers, when its
	// kind has tokens to hand out (TokenExporter).
	SidecarTokenExport bool
	// PropagateTrace: API requests carry the W3C trace context when
	// tracing is on (propagate_trace: true); never baggage.
	PropagateTrace bool
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
	// file names the document in messages; entries are its entries'
	// mapping nodes and lines (At).
	file    string
	entries map[string]*entryCheck
}

// At is "file:line" of the key at path (mapping keys, such as "mcp",
// "registration") in entry name's mapping, or of its deepest ancestor
// there (the entry's own line at least), as the catalogue's problems
// name places: for a problem found only where an entry meets the flags.
// It is the file alone for a name the catalogue does not have.
func (r *Registry) At(name string, path ...string) string {
	c, ok := r.entries[name]
	if !ok {
		return r.file
	}
	steps := make([]any, len(path))
	for i, k := range path {
		steps[i] = k
	}
	return fmt.Sprintf("%s:%d", r.file, c.lineOf(steps...))
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
	typeErrorRE    = regexp.MustCompile(`^line (\d+): (.*)$`)
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
	doc := &root
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		doc = doc.Content[0]
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
			addYAMLProblem(name, m, &probs)
		}
	}
	provNodes := mapValue(doc, "providers")
	if len(file.Providers) == 0 && len(probs) == 0 {
		addf(max(1, doc.Line), "no providers: want a top-level \"providers:\" map with at least one entry")
	}
	reg := &Registry{byName: map[string]*Provider{}, file: name, entries: map[string]*entryCheck{}}
	for pname := range file.Providers {
		pn := mapValue(provNodes, pname)
		c := &entryCheck{name: pname, node: pn, line: keyLine(provNodes, pname), file: name, addf: addf, getenv: getenv, probs: &probs}
		p := c.build()
		if !providerNameRE.MatchString(pname) {
			addf(c.line, "provider name %q: use 1-32 lowercase letters, digits, '-' or '_', starting with a letter", pname)
			c.bad = true
		}
		if p != nil && !c.bad && pn != nil {
			reg.byName[pname] = p
			reg.names = append(reg.names, pname)
			reg.entries[pname] = &entryCheck{node: pn, line: c.line}
		}
	}
	if len(probs) > 0 {
		sort.SliceStable(probs, func(i, j int) bool { return problemLine(probs[i]) < problemLine(probs[j]) })
		return nil, &ConfigError{Problems: probs}
	}
	sort.Strings(reg.names)
	return reg, nil
}

// providersFile is the document shape of providers.yaml; each entry is
// decoded by its kind.
type providersFile struct {
	Providers map[string]yaml.Node `yaml:"providers"`
}

// addYAMLProblem turns one of yaml's type errors ("line 3: cannot
// unmarshal …") into a problem of file name.
func addYAMLProblem(name, m string, probs *[]string) {
	if sm := knownFieldRE.FindStringSubmatch(m); sm != nil {
		*probs = append(*probs, fmt.Sprintf("%s:%s: unknown key %q", name, sm[1], sm[2]))
		return
	}
	if sm := typeErrorRE.FindStringSubmatch(m); sm != nil {
		*probs = append(*probs, fmt.Sprintf("%s:%s: %s", name, sm[1], sm[2]))
		return
	}
	*probs = append(*probs, name+": "+m)
}

func problemLine(s string) int {
	var n int
	if i := strings.Index(s, ":"); i >= 0 {
		fmt.Sscanf(s[i+1:], "%d", &n)
	}
	return n
}

// entryCheck validates one entry, collecting its problems, each at the
// line of the YAML node it concerns.
type entryCheck struct {
	name   string     // the entry's name
	node   *yaml.Node // its mapping node
	line   int        // of its name
	file   string
	addf   func(line int, format string, args ...any)
	getenv func(string) string
	probs  *[]string
	bad    bool
}

// build finds the entry's kind, checks its keys and builds it. An entry
// of no known type is checked as the first kind would be, after saying
// so, so that every problem is reported at once.
func (c *entryCheck) build() *Provider {
	if c.node == nil || c.node.Kind != yaml.MappingNode {
		c.failAt(nil, "want a mapping of the entry's keys")
		return nil
	}
	typ := ""
	if t := mapValue(c.node, "type"); t != nil {
		typ = t.Value
	}
	def, known := kindNamed(typ)
	switch {
	case typ == "":
		c.fail("type", "type is required (%s)", kindList())
	case !known:
		c.fail("type", "type %q: want %s", typ, kindList())
	}
	for _, key := range entryKeys(c.node) {
		if slices.Contains(def.keys, key.Value) {
			continue
		}
		c.bad = true
		if owner := keyOwner(key.Value); owner != "" {
			c.addf(key.Line, "%s: %s", c.name, def.foreign(key.Value, owner))
		} else {
			c.addf(key.Line, "unknown key %q", key.Value)
		}
	}
	return def.build(c)
}

// entryKeys returns the key nodes of mapping m, those of the mappings it
// merges ("<<: *anchor") included.
func entryKeys(m *yaml.Node) []*yaml.Node {
	var out []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Tag != "!!merge" {
			out = append(out, k)
			continue
		}
		merged := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			merged = v.Content
		}
		for _, n := range merged {
			if n.Kind == yaml.AliasNode {
				n = n.Alias
			}
			if n != nil && n.Kind == yaml.MappingNode {
				out = append(out, entryKeys(n)...)
			}
		}
	}
	return out
}

// kindNamed returns the kind of type typ; the first kind, and false, when
// there is none.
func kindNamed(typ string) (kindDef, bool) {
	for _, k := range kinds {
		if k.typ == typ {
			return k, true
		}
	}
	return kinds[0], false
}

// keyOwner names a kind that takes key ("" when none does).
func keyOwner(key string) string {
	for _, k := range kinds {
		if slices.Contains(k.keys, key) {
			return k.typ
		}
	}
	return ""
}

// kindList lists the types for a message: "oauth2", "oidc" or "api_key".
func kindList() string {
	var qs []string
	for _, k := range kinds {
		qs = append(qs, fmt.Sprintf("%q", k.typ))
	}
	if len(qs) == 1 {
		return qs[0]
	}
	return strings.Join(qs[:len(qs)-1], ", ") + " or " + qs[len(qs)-1]
}

// onlyFor is the default foreign-key problem.
func onlyFor(key, owner string) string { return fmt.Sprintf("%s is only for type %q", key, owner) }

// decode decodes the entry into spec; type errors become problems, and so
// do keys spec's nested mappings do not have (the entry's own keys were
// checked against its kind).
func (c *entryCheck) decode(spec any) bool {
	for i := 0; i+1 < len(c.node.Content); i += 2 {
		if f, ok := fieldOf(reflect.TypeOf(spec).Elem(), c.node.Content[i].Value); ok {
			c.unknownKeys(c.node.Content[i+1], f.Type)
		}
	}
	err := c.node.Decode(spec)
	if err == nil {
		return true
	}
	c.bad = true
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		c.failAt(nil, "%v", err)
		return false
	}
	for _, m := range te.Errors {
		addYAMLProblem(c.file, m, c.probs)
	}
	return true
}

// unknownKeys reports every key of a mapping in n that the type t it
// decodes into has no field for (maps take any key).
func (c *entryCheck) unknownKeys(n *yaml.Node, t reflect.Type) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for _, e := range n.Content {
			c.unknownKeys(e, t.Elem())
		}
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		for _, key := range entryKeys(n) {
			f, ok := fieldOf(t, key.Value)
			if !ok {
				c.bad = true
				c.addf(key.Line, "unknown key %q", key.Value)
				continue
			}
			if v := mapValue(n, key.Value); v != nil {
				c.unknownKeys(v, f.Type)
			}
		}
	}
}

// fieldOf returns the field of struct type t that yaml key name decodes
// into, inline structs included.
func fieldOf(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if g, ok := fieldOf(f.Type, name); ok {
				return g, true
			}
			continue
		}
		if tag == name && tag != "" && tag != "-" {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// lineOf returns the line of the node at path (mapping keys as strings,
// sequence indexes as ints) below the entry, or of its deepest ancestor
// that exists.
func (c *entryCheck) lineOf(path ...any) int {
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

// failAt reports a problem at the node at path.
func (c *entryCheck) failAt(path []any, format string, args ...any) {
	c.bad = true
	c.addf(c.lineOf(path...), "%s: %s", c.name, fmt.Sprintf(format, args...))
}

// fail reports a problem at the entry's key.
func (c *entryCheck) fail(key, format string, args ...any) { c.failAt(at(key), format, args...) }

func at(path ...any) []any { return path }

// newProvider starts the entry's Provider from the keys every entry has.
func (c *entryCheck) newProvider(s entrySpec, k Kind) *Provider {
	p := &Provider{Name: c.name, DisplayName: s.DisplayName, Kind: k}
	if p.DisplayName == "" {
		p.DisplayName = c.name
	}
	return p
}

// url checks an endpoint URL; required ones must be present.
func (c *entryCheck) url(key, val string, required bool) string {
	if val == "" {
		if required {
			c.fail(key, "%s is required", key)
		}
		return ""
	}
	if err := checkEndpoint(val); err != nil {
		c.fail(key, "%s: %v", key, err)
		return ""
	}
	return val
}

// secretRef resolves a value given by reference (${NAME}); literal
// values are taken as they are when literal is true.
func (c *entryCheck) secretRef(key, val string, literal bool) (string, bool) {
	if m := envRefRE.FindStringSubmatch(val); m != nil {
		v := c.getenv(m[1])
		if v == "" {
			c.fail(key, "%s: environment variable %s is not set", key, m[1])
		}
		return v, true
	}
	if strings.Contains(val, "${") {
		c.fail(key, "%s: malformed reference %q (want ${NAME})", key, val)
		return "", false
	}
	return val, literal
}

// clientSecret resolves an entry's client secret: client_secret (a
// reference) or client_secret_file, not both. given reports that either
// key is set, whatever its problems.
func (c *entryCheck) clientSecret(ref, file string) (secret vault.Secret, given bool) {
	switch {
	case ref != "" && file != "":
		c.fail("client_secret", "give client_secret or client_secret_file, not both")
	case ref != "":
		val, ok := c.secretRef("client_secret", ref, false)
		if !ok {
			c.fail("client_secret", "client_secret must be a reference ${NAME} to an environment variable (or use client_secret_file); secrets are never written in this file")
			return "", true
		}
		return vault.Secret(val), true
	case file != "":
		return vault.Secret(c.readSecretFile("client_secret_file", file)), true
	default:
		return "", false
	}
	return "", true
}

// readSecretFile reads a secret given by file name.
func (c *entryCheck) readSecretFile(key, path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		c.fail(key, "%s: cannot read %s", key, path)
		return ""
	}
	val := strings.TrimSpace(string(b))
	if val == "" {
		c.fail(key, "%s: %s is empty", key, path)
	}
	return val
}

// api checks the API base URL and the allow-list.
func (c *entryCheck) api(p *Provider, a *apiSpec) {
	if a == nil {
		return
	}
	p.APIBaseURL = c.url("api", a.BaseURL, true)
	p.AllowedRequests = c.patterns("api.allowed_paths", a.AllowedPaths)
	p.AllowedPaths = slices.Clone(a.AllowedPaths)
	if p.APIBaseURL == "" {
		return
	}
	seen := map[string]bool{}
	add := func(base string, paths []string, reqs []RequestPattern) {
		u, _ := url.Parse(base)
		host := strings.ToLower(u.Host)
		if seen[host] {
			c.fail("api", "api.hosts: %s is given twice (one base per host)", host)
			return
		}
		seen[host] = true
		p.APIBases = append(p.APIBases, APIBase{URL: base, Host: host, AllowedPaths: slices.Clone(paths), AllowedRequests: reqs,
			parsed: u, parsedFrom: base})
	}
	add(p.APIBaseURL, a.AllowedPaths, p.AllowedRequests)
	for i, h := range a.Hosts {
		key := fmt.Sprintf("api.hosts[%d]", i)
		base := c.url("api", h.BaseURL, true)
		reqs := c.patterns(key+".allowed_paths", h.AllowedPaths)
		if base != "" {
			add(base, h.AllowedPaths, reqs)
		}
	}
}

// patterns parses an allow-list.
func (c *entryCheck) patterns(key string, list []string) []RequestPattern {
	var out []RequestPattern
	for _, ap := range list {
		rp, err := ParseRequestPattern(ap)
		if err != nil {
			c.fail("api", "%s: %v", key, err)
			continue
		}
		out = append(out, rp)
	}
	return out
}

// scopeSpec are the keys of an entry whose connections hold scopes.
type scopeSpec struct {
	DefaultScopes    []string          `yaml:"default_scopes"`
	AllowedScopes    []string          `yaml:"allowed_scopes"`
	ScopeDescription map[string]string `yaml:"scope_descriptions"`
	// ScopeAliases: scope → the other names the provider answers for it
	// (Google answers https://www.googleapis.com/auth/userinfo.email for
	// email).
	ScopeAliases map[string][]string `yaml:"scope_aliases"`
	// ScopeImplies: scope → the scopes it includes (GitHub's repo includes
	// public_repo and drops it from its answer).
	ScopeImplies map[string][]string `yaml:"scope_implies"`
}

// scopes checks the scope lists and tables.
func (c *entryCheck) scopes(p *Provider, s scopeSpec) {
	p.DefaultScopes, p.AllowedScopes, p.ScopeDescriptions = slices.Clone(s.DefaultScopes), slices.Clone(s.AllowedScopes), s.ScopeDescription
	c.scopeTables(p, s)
	for _, sc := range s.DefaultScopes {
		if !validScope(sc) {
			c.fail("default_scopes", "default scope %q is not a valid scope token", sc)
		} else if !p.ScopeAllowed(sc) {
			c.fail("default_scopes", "default scope %q is not in allowed_scopes", sc)
		}
	}
	for _, sc := range s.AllowedScopes {
		if !validScope(sc) {
			c.fail("allowed_scopes", "allowed scope %q is not a valid scope token", sc)
		} else if canon := p.ScopeAliases[sc]; canon != "" {
			c.fail("allowed_scopes", "allowed scope %q is an alias: name it %s", sc, canon)
		}
	}
}

// scopeTables checks scope_aliases and scope_implies.
func (c *entryCheck) scopeTables(p *Provider, s scopeSpec) {
	if len(s.ScopeAliases) > 0 {
		p.ScopeAliases = map[string]string{}
	}
	c.scopeTable("scope_aliases", s.ScopeAliases, func(sc, alias string) {
		switch {
		case !validScope(alias):
			c.fail("scope_aliases", "scope_aliases: %s: alias %q is not a valid scope token", sc, alias)
		case alias == sc:
			c.fail("scope_aliases", "scope_aliases: %s is given as its own alias", sc)
		case s.ScopeAliases[alias] != nil:
			c.fail("scope_aliases", "scope_aliases: %q is both a scope with aliases and an alias of %s", alias, sc)
		case p.ScopeAliases[alias] != "":
			c.fail("scope_aliases", "scope_aliases: %q is an alias of both %s and %s", alias, p.ScopeAliases[alias], sc)
		default:
			p.ScopeAliases[alias] = sc
		}
	})
	if len(s.ScopeImplies) > 0 {
		p.ScopeImplies = map[string][]string{}
	}
	c.scopeTable("scope_implies", s.ScopeImplies, func(sc, in string) {
		switch {
		case !validScope(in):
			c.fail("scope_implies", "scope_implies: %s: %q is not a valid scope token", sc, in)
		case in == sc:
			c.fail("scope_implies", "scope_implies: %s is given as implying itself", sc)
		case p.ScopeAliases[in] != "" || p.ScopeAliases[sc] != "":
			c.fail("scope_implies", "scope_implies: %s: name scopes by their catalogue names, not by aliases", sc)
		default:
			p.ScopeImplies[sc] = append(p.ScopeImplies[sc], in)
		}
	})
}

// scopeTable walks a table of scope_aliases or scope_implies (scope →
// scope tokens) in key order: a key that is not a valid scope token is
// reported under field and its list passed over; every token listed under
// a valid key goes to check.
func (c *entryCheck) scopeTable(field string, table map[string][]string, check func(sc, tok string)) {
	for _, sc := range sortedKeys(table) {
		if !validScope(sc) {
			c.fail(field, "%s: %q is not a valid scope token", field, sc)
			continue
		}
		for _, tok := range table[sc] {
			check(sc, tok)
		}
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
func checkEndpoint(v string) error { return loopback.CheckURL(v) }

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
