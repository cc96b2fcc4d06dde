package provider

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"credbroker/internal/echoapi"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider/redact"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

// Keys the test API accepts. Each is a secret no answer may carry back.
const (
	bearerKey = "sk-BEARERKEY0123456789abcdefXYZ"
	xKey      = "xk_live_0123456789abcdefghij"
	jiraToken = "ATATT3xFfGF0jiraTOKEN0123456789"
	jiraEmail = "ada@example.com"
)

func keyProvidersDoc(base string) string {
	return `providers:
  bearer:
    display_name: Bearer Co
    type: api_key
    instructions: Create a key under Settings, API keys.
    instructions_url: https://bearer.example/settings/keys
    fields:
      - {name: api_key, label: API key, secret: true, pattern: 'sk-[A-Za-z0-9]{20,}'}
    inject: {header: "Authorization: Bearer {api_key}"}
    verify: {path: /me, account_id: /id, account_login: /email}
    api: {base_url: ` + base + `/bearer}
  xkey:
    type: api_key
    instructions: Copy your key from the dashboard.
    instructions_url: https://x.example/dashboard
    fields:
      - name: api_key
        label: Key
        secret: true
        max_length: 64
    inject: {header: "X-Api-Key: {api_key}"}
    verify: {method: get, path: /user, account_id: /data/id, account_login: /data/name}
    api: {base_url: ` + base + `/xkey, allowed_paths: [GET /user, GET /data, GET /echo/]}
  jira:
    display_name: Jira
    type: api_key
    instructions: Create an API token in your Atlassian account's security settings.
    instructions_url: https://id.atlassian.com/manage-profile/security/api-tokens
    fields:
      - {name: email, label: Email, secret: false, pattern: '[^@\s]+@[^@\s]+'}
      - {name: api_token, label: API token, secret: true}
    inject:
      basic: {username: "{email}", password: "{api_token}"}
    verify: {path: /rest/api/3/myself, account_id: /accountId, account_login: /emailAddress}
    api: {base_url: ` + base + `/jira}
`
}

func TestAPIKeyCatalog(t *testing.T) {
	reg, err := ParseProviders("keys.yaml", []byte(keyProvidersDoc("https://api.example")), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := reg.Lookup("bearer")
	if keyOf(b) == nil || b.DisplayName != "Bearer Co" || keyOf(b).Header != "Authorization" || keyOf(b).HeaderValue.String() != "Bearer {api_key}" ||
		keyOf(b).VerifyMethod != http.MethodGet || keyOf(b).VerifyPath != "/me" || keyOf(b).AccountID.String() != "/id" ||
		keyOf(b).AccountName.String() != "/email" || keyOf(b).InstructionsURL != "https://bearer.example/settings/keys" ||
		len(keyOf(b).Fields) != 1 || !keyOf(b).Fields[0].Secret || keyOf(b).Fields[0].MaxLength != defaultKeyFieldLen ||
		b.APIBaseURL != "https://api.example/bearer" || b.SidecarTokenExport || len(b.DefaultScopes) != 0 {
		t.Errorf("bearer = %+v / %+v", b, keyOf(b))
	}
	x, _ := reg.Lookup("xkey")
	if x.DisplayName != "xkey" || keyOf(x).Header != "X-Api-Key" || keyOf(x).Fields[0].MaxLength != 64 || len(x.AllowedRequests) != 3 {
		t.Errorf("xkey = %+v / %+v", x, keyOf(x))
	}
	j, _ := reg.Lookup("jira")
	if keyOf(j).Header != "" || keyOf(j).BasicUser.String() != "{email}" || keyOf(j).BasicPass.String() != "{api_token}" ||
		len(keyOf(j).Fields) != 2 || keyOf(j).Fields[0].Secret || !keyOf(j).Fields[1].Secret ||
		strings.Join(keyOf(j).SecretFields(), ",") != "api_token" {
		t.Errorf("jira = %+v", keyOf(j))
	}
	// OAuth providers are not API-key providers.
	o, err := ParseProviders("o.yaml", []byte(goodOAuth2), env(map[string]string{"ACME_SECRET": "s"}))
	if err != nil {
		t.Fatal(err)
	}
	if acme, _ := o.Lookup("acme"); keyOf(acme) != nil || acme.Kind.Type() != TypeOAuth2 {
		t.Error("an oauth2 entry reads as an API-key entry")
	}
}

// TestAPIKeyCatalogProblems: every problem of an api_key entry is
// reported at once, each at the line it concerns.
func TestAPIKeyCatalogProblems(t *testing.T) {
	doc := `providers:
  k:
    type: api_key
    client_id: nope
    default_scopes: [x]
    sidecar_token_export: true
    instructions_url: http://keys.example/settings
    fields:
      - {name: api_key, label: Key, secret: true, pattern: 'sk-[a-z'}
      - {name: Email, label: Email, secret: false}
      - name: api_key
        label: ""
      - {name: user, label: User, secret: false, max_length: 99999}
    inject:
      basic: {username: "{api_key}", password: "{token}"}
    verify: {method: DELETE, path: "/me/../x", account_id: "id", account_login: "/a~2b"}
  h:
    type: api_key
    instructions: x
    instructions_url: https://h.example
    fields: [{name: k, label: K, secret: true}, {name: u, label: U, secret: false}]
    inject: {header: "Content-Length: {k}"}
    verify: {path: /me, account_id: /id}
  t:
    type: api_key
    instructions: x
    instructions_url: https://t.example
    fields: [{name: k, label: K, secret: true}]
    inject: {header: "X-Key: {k} }"}
    verify: {path: /me, account_id: /id}
    api: {base_url: https://t.example}
  u:
    type: api_key
    instructions: x
    instructions_url: https://u.example
    fields: [{name: k, label: K, secret: false}]
    inject: {header: "X-Key: {k}"}
    verify: {path: /me, account_id: /id}
    api: {base_url: https://u.example}
  o:
    type: oauth2
    authorization_url: https://o.example/a
    token_url: https://o.example/t
    client_id: c
    client_secret: ${S}
    account: {url: https://o.example/u, id_field: id}
    fields: [{name: k, label: K, secret: true}]
    verify: {path: /me, account_id: /id}
`
	_, err := ParseProviders("p.yaml", []byte(doc), env(map[string]string{"S": "s"}))
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want *ConfigError", err)
	}
	want := []string{
		`p.yaml:2: k: api (base_url, allowed_paths) is required`,
		`p.yaml:2: k: instructions are required`,
		`p.yaml:4: k: client_id is not used by type "api_key"`,
		`p.yaml:5: k: default_scopes is not used by type "api_key"`,
		`p.yaml:6: k: sidecar_token_export: an API key is never handed out`,
		`p.yaml:7: k: instructions_url: "http://keys.example/settings" must use https`,
		`p.yaml:9: k: fields[0].pattern is not a valid regular expression: missing closing ]`,
		`p.yaml:10: k: fields[1].name "Email": use 1-32 lowercase letters`,
		`p.yaml:11: k: fields[2].name "api_key" is used twice`,
		`p.yaml:11: k: fields[2].secret is required`,
		`p.yaml:12: k: fields[2].label is required`,
		`p.yaml:13: k: fields[3].max_length 99999: want 1 to 4096`,
		`p.yaml:15: k: inject.basic.username names the secret field {api_key} in a position that is not secret`,
		`p.yaml:15: k: inject.basic.password names {token}, which is not one of the fields`,
		`p.yaml:16: k: verify.method "DELETE": want GET or POST`,
		`p.yaml:16: k: verify.path "/me/../x": path must not contain . or .. segments`,
		`p.yaml:16: k: verify.account_id "id": a JSON pointer starts with "/"`,
		`p.yaml:16: k: verify.account_login "/a~2b": "~" must be followed by 0`,
		`p.yaml:17: h: api (base_url, allowed_paths) is required`,
		`p.yaml:22: h: inject.header: Content-Length is set by the transport or the caller`,
		`p.yaml:29: t: inject.header "{k} }": stray } at byte 4`,
		`p.yaml:36: u: fields: at least one field must be secret`,
		`p.yaml:47: o: fields is only for type "api_key"`,
		`p.yaml:48: o: verify is only for type "api_key"`,
	}
	wantProblems(t, ce, want)
}

// TestAPIKeyCatalogRefusals: one problem per entry, each alone.
func TestAPIKeyCatalogRefusals(t *testing.T) {
	entry := func(mod string) string {
		lines := map[string]string{
			"fields":   `    fields: [{name: api_key, label: Key, secret: true}]`,
			"inject":   `    inject: {header: "Authorization: Bearer {api_key}"}`,
			"verify":   `    verify: {path: /me, account_id: /id}`,
			"api":      `    api: {base_url: https://k.example}`,
			"instr":    `    instructions: Make a key.`,
			"instrurl": `    instructions_url: https://k.example/keys`,
		}
		k, v, _ := strings.Cut(mod, "=")
		if v == "-" {
			delete(lines, k)
		} else if k != "" {
			lines[k] = v
		}
		doc := "providers:\n  k:\n    type: api_key\n"
		for _, key := range []string{"instr", "instrurl", "fields", "inject", "verify", "api", "extra"} {
			if l, ok := lines[key]; ok {
				doc += l + "\n"
			}
		}
		return doc
	}
	if _, err := ParseProviders("p.yaml", []byte(entry("")), nil); err != nil {
		t.Fatalf("the base entry is refused: %v", err)
	}
	for _, tc := range []struct{ mod, want string }{
		{"inject=-", "inject is required"},
		{"verify=-", "verify is required"},
		{"fields=-", "fields: at least one input is required"},
		{"instrurl=-", "instructions_url is required"},
		{`inject=    inject: {header: "Authorization: Bearer {api_key}", basic: {username: a, password: "{api_key}"}}`, "give header or basic, not both"},
		{`inject=    inject: {header: "Bad Name: {api_key}"}`, `"Bad Name" is not a header name`},
		{`inject=    inject: {header: "Authorization Bearer {api_key}"}`, `want "Name: template"`},
		{`inject=    inject: {header: "X-Static: abc"}`, "names no field"},
		{`inject=    inject: {header: "Accept: {api_key}"}`, "Accept is set by the transport or the caller"},
		{`inject=    inject: {header: "Proxy-Foo: {api_key}"}`, "Proxy-Foo is set by the transport or the caller"},
		{`inject=    inject: {header: "X-Key: {api_key"}`, "unclosed {"},
		{`inject=    inject: {header: "X-Key: {API}"}`, `"{API}" at byte 0 is not a field reference`},
		{"inject=    inject: {header: \"X-Key: \\t\\x01{api_key}\"}", "control or non-ASCII character"},
		{`inject=    inject: {basic: {username: "a:b", password: "{api_key}"}}`, "cannot contain ':'"},
		{`inject=    inject: {basic: {username: "a", password: "literal"}}`, "must name a secret field"},
		{`inject=    inject: {basic: {username: "a"}}`, "needs username and password"},
		{`fields=    fields: [{name: api_key, label: Key, secret: true}, {name: other, label: O, secret: true}]`, `fields[1] "other" is never injected`},
		{`fields=    fields: [{name: api_key, label: Key, secret: true, max_length: 4}]`, "a secret is at least 8 characters"},
		{`fields=    fields: [{name: api_key, label: Key, secret: true, colour: red}]`, `unknown key "colour"`},
		{`verify=    verify: {path: "/me/{api_key}", account_id: /id}`, "verify.path cannot name fields"},
		{`verify=    verify: {path: me, account_id: /id}`, "must start with /"},
		{`verify=    verify: {path: /me}`, "verify.account_id is required"},
		{`extra=    pkce: false`, `pkce is not used by type "api_key"`},
		{`extra=    revocation: {style: rfc7009, url: https://k.example/revoke}`, `revocation is not used by type "api_key"`},
		{`extra=    account: {url: https://k.example/u, id_field: id}`, `account is not used by type "api_key"`},
		{`api=    api: {base_url: https://k.example, allowed_paths: [FETCH /x]}`, "api.allowed_paths"},
		{`instr=    instructions: "   "`, "instructions are required"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			_, err := ParseProviders("p.yaml", []byte(entry(tc.mod)), nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a problem containing %q", err, tc.want)
			}
			if !regexp.MustCompile(`p\.yaml:\d+: `).MatchString(err.Error()) {
				t.Fatalf("problem without a line: %v", err)
			}
		})
	}
}

// repoExamples parses the commented-out block "# --- kind examples" …
// "# --- end of kind examples" of the repository's providers.yaml, as it
// reads once uncommented.
func repoExamples(t *testing.T, kind string) *Registry {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "providers.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(b, []byte("# --- "+kind+" examples"))
	end := bytes.Index(b, []byte("# --- end of "+kind+" examples"))
	if start < 0 || end < start {
		t.Fatalf("providers.yaml has no %s examples block", kind)
	}
	var doc strings.Builder
	doc.WriteString("providers:\n")
	for _, line := range strings.Split(string(b[start:end]), "\n")[1:] {
		indent := len(line) - len(strings.TrimLeft(line, " "))
		rest := line[indent:]
		if r, ok := strings.CutPrefix(rest, "# "); ok {
			rest = r
		} else if r, ok := strings.CutPrefix(rest, "#"); ok {
			rest = r
		}
		if strings.HasPrefix(rest, "#") || strings.HasPrefix(strings.TrimSpace(rest), "<public-url>") {
			continue // a comment of the block itself
		}
		doc.WriteString(line[:indent] + rest + "\n")
	}
	reg, err := ParseProviders("providers.yaml examples", []byte(doc.String()), func(string) string { return "from-env" })
	if err != nil {
		t.Fatalf("%v\n%s", err, doc.String())
	}
	return reg
}

// TestRepoProvidersYAMLMCPExamples: the commented-out mcp examples are
// valid mcp entries once uncommented.
func TestRepoProvidersYAMLMCPExamples(t *testing.T) {
	reg := repoExamples(t, "mcp")
	if len(reg.Names()) < 2 {
		t.Fatalf("examples %v, want at least two", reg.Names())
	}
	for _, name := range reg.Names() {
		p, _ := reg.Lookup(name)
		if _, ok := p.Kind.(*MCP); !ok {
			t.Errorf("%s is a %T, not an mcp entry with auth: oauth", name, p.Kind)
		}
	}
}

// TestRepoProvidersYAMLKeyExamples: the commented-out api_key examples in
// the repository's providers.yaml are valid once uncommented.
func TestRepoProvidersYAMLKeyExamples(t *testing.T) {
	reg := repoExamples(t, "api_key")
	var header, xkey, basic bool
	for _, name := range reg.Names() {
		p, _ := reg.Lookup(name)
		if keyOf(p) == nil || keyOf(p).Instructions == "" {
			t.Errorf("%s is not an api_key example with instructions", name)
			continue
		}
		a := keyOf(p)
		switch {
		case a.Header == "Authorization" && strings.HasPrefix(a.HeaderValue.String(), "Bearer "):
			header = true
		case a.Header == "X-Api-Key":
			xkey = true
		case a.Header == "" && len(a.Fields) == 2:
			basic = true
		}
	}
	if !header || !xkey || !basic {
		t.Errorf("examples: bearer %v, X-Api-Key %v, email+token basic %v; want all three", header, xkey, basic)
	}
}

// keyAPI is a loopback API behind the three test entries: it accepts the
// test keys, records what it was sent, and echoes credentials under
// /echo/ (echoapi) like a careless API.
type keyAPI struct {
	srv *httptest.Server

	mu      sync.Mutex
	headers []http.Header
	revoked map[string]bool
}

func newKeyAPI(t *testing.T) *keyAPI {
	a := &keyAPI{revoked: map[string]bool{}}
	mux := http.NewServeMux()
	for _, prov := range []string{"bearer", "xkey", "jira"} {
		mux.Handle("/"+prov+"/echo/", http.StripPrefix("/"+prov, echoapi.Handler()))
	}
	answer := func(w http.ResponseWriter, r *http.Request, ok bool, body string) {
		a.mu.Lock()
		a.headers = append(a.headers, r.Header.Clone())
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"error":"invalid key"}`)
			return
		}
		fmt.Fprint(w, body)
	}
	valid := func(k string) bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return (k == bearerKey || k == xKey || k == jiraToken) && !a.revoked[k]
	}
	bearerOK := func(r *http.Request) bool {
		k, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		return ok && valid(k)
	}
	jiraOK := func(r *http.Request) bool {
		u, p, ok := r.BasicAuth()
		return ok && u == jiraEmail && valid(p)
	}
	mux.HandleFunc("GET /bearer/me", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, bearerOK(r), `{"id":4242,"email":"bea@example.com"}`)
	})
	mux.HandleFunc("GET /bearer/data", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, bearerOK(r), `{"ok":true,"key_hint":"`+r.Header.Get("Authorization")+`"}`)
	})
	mux.HandleFunc("GET /xkey/user", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, valid(r.Header.Get("X-Api-Key")), `{"data":{"id":"u-7","name":"Xavier"}}`)
	})
	mux.HandleFunc("GET /xkey/data", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, valid(r.Header.Get("X-Api-Key")), `{"ok":true}`)
	})
	mux.HandleFunc("GET /jira/rest/api/3/myself", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, jiraOK(r), `{"accountId":"5b10ac8d82e05b22cc7d4ef5","emailAddress":"`+jiraEmail+`"}`)
	})
	mux.HandleFunc("GET /jira/data", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, jiraOK(r), `{"ok":true}`)
	})
	mux.HandleFunc("GET /status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.PathValue("code"))
		a.mu.Lock()
		a.headers = append(a.headers, r.Header.Clone())
		a.mu.Unlock()
		w.WriteHeader(code)
	})
	mux.HandleFunc("GET /bearer/echo-id", func(w http.ResponseWriter, r *http.Request) {
		k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		answer(w, r, true, `{"id":"`+k+`","email":"x@example.com"}`)
	})
	mux.HandleFunc("GET /bearer/no-id", func(w http.ResponseWriter, r *http.Request) {
		answer(w, r, true, `{"email":"x@example.com"}`)
	})
	mux.HandleFunc("GET /bearer/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/bearer/me", http.StatusFound)
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

func (a *keyAPI) requests() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.headers)
}

func (a *keyAPI) last() http.Header {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.headers[len(a.headers)-1]
}

func (a *keyAPI) revoke(k string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.revoked[k] = true
}

type keyRig struct {
	api    *keyAPI
	reg    *Registry
	store  *memstore.Store
	client *Client
	logs   *logbuf.Buffer
}

func newKeyRig(t *testing.T) *keyRig {
	r := &keyRig{api: newKeyAPI(t), logs: &logbuf.Buffer{}}
	var err error
	r.reg, err = ParseProviders("keys.yaml", []byte(keyProvidersDoc(r.api.srv.URL)), nil)
	if err != nil {
		t.Fatal(err)
	}
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	r.store = memstore.New(kr)
	log := slog.New(slog.NewJSONHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.client, err = New(Options{Store: r.store, Providers: r.reg, Logger: log,
		Telemetry: telemetry.New(telemetry.Options{Providers: r.reg.Names(), Audit: log})})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *keyRig) provider(t *testing.T, name string) *Provider {
	p, ok := r.reg.Lookup(name)
	if !ok {
		t.Fatalf("no provider %s", name)
	}
	return p
}

// store verifies values for provider name and stores the connection as
// the connections layer would.
func (r *keyRig) store1(t *testing.T, name string, values map[string]string) vault.Connection {
	t.Helper()
	ex, err := r.client.VerifyKey(t.Context(), r.provider(t, name), values)
	if err != nil {
		t.Fatalf("VerifyKey(%s): %v", name, err)
	}
	c, err := r.store.CreateConnection(t.Context(), vault.Connection{ID: "conn-" + name, Principal: vault.Principal{Issuer: "i", Subject: "alice"},
		Provider: name, AccountID: ex.Account.ID, AccountLogin: ex.Account.Login, Token: ex.Token, Status: vault.StatusActive,
		Created: time.Now(), Updated: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestVerifyKey(t *testing.T) {
	r := newKeyRig(t)
	ctx := t.Context()
	ex, err := r.client.VerifyKey(ctx, r.provider(t, "bearer"), map[string]string{"api_key": "  " + bearerKey + "\n"})
	if err != nil || ex.Account.ID != "4242" || ex.Account.Login != "bea@example.com" || ex.Token.Fields["api_key"].Reveal() != bearerKey ||
		ex.Token.AccessToken != "" || len(ex.Scopes) != 0 {
		t.Fatalf("bearer: %+v, %v", ex.Account, err)
	}
	if got := r.api.last().Get("Authorization"); got != "Bearer "+bearerKey {
		t.Errorf("verify request sent Authorization %q", got)
	}
	if ex, err = r.client.VerifyKey(ctx, r.provider(t, "xkey"), map[string]string{"api_key": xKey}); err != nil || ex.Account.ID != "u-7" || ex.Account.Login != "Xavier" {
		t.Fatalf("xkey: %+v, %v", ex.Account, err)
	}
	ex, err = r.client.VerifyKey(ctx, r.provider(t, "jira"), map[string]string{"email": jiraEmail, "api_token": jiraToken})
	if err != nil || ex.Account.ID != "5b10ac8d82e05b22cc7d4ef5" || ex.Account.Login != jiraEmail || ex.Token.Fields["email"].Reveal() != jiraEmail {
		t.Fatalf("jira: %+v, %v", ex.Account, err)
	}
	if u, p, ok := (&http.Request{Header: r.api.last()}).BasicAuth(); !ok || u != jiraEmail || p != jiraToken {
		t.Errorf("jira verify sent basic %q/%q", u, p)
	}

	// Refusals: nothing comes back but the status or the field's label.
	before := r.api.requests()
	_, err = r.client.VerifyKey(ctx, r.provider(t, "bearer"), map[string]string{"api_key": "not-a-key-at-all"})
	var fe *KeyFormatError
	if !errors.As(err, &fe) || len(fe.Problems) != 1 || fe.Problems[0].Label != "API key" || fe.Problems[0].Problem != "did not match the expected format" {
		t.Fatalf("pattern mismatch: %v", err)
	}
	_, err = r.client.VerifyKey(ctx, r.provider(t, "jira"), map[string]string{"email": "", "api_token": "short"})
	if !errors.As(err, &fe) || len(fe.Problems) != 2 || !strings.Contains(err.Error(), "Email: is required") || !strings.Contains(err.Error(), "too short") {
		t.Fatalf("jira with a missing email and a short token: %v", err)
	}
	for _, bad := range []string{"sk-" + strings.Repeat("a", 30) + "\x00", strings.Repeat("sk-a", 300)} {
		if _, err := r.client.VerifyKey(ctx, r.provider(t, "bearer"), map[string]string{"api_key": bad}); !errors.As(err, &fe) {
			t.Fatalf("hostile value accepted: %v", err)
		}
	}
	if r.api.requests() != before {
		t.Fatalf("a value that failed the checks reached the provider")
	}
	wrong := "sk-WRONGKEY0123456789abcdefXYZ"
	_, err = r.client.VerifyKey(ctx, r.provider(t, "bearer"), map[string]string{"api_key": wrong})
	var ke *KeyRefusedError
	if !errors.As(err, &ke) || err.Error() != "the key was refused by Bearer Co (401)" {
		t.Fatalf("wrong key: %v", err)
	}
	variant := func(base, path string) *Provider {
		p := *r.provider(t, "bearer")
		a := *keyOf(&p)
		p.APIBaseURL, a.VerifyPath = r.api.srv.URL+base, path
		p.Kind = &a
		return &p
	}
	for _, tc := range []struct {
		base, path string
		want       error
	}{
		{"/status", "/403", nil},
		{"/bearer", "/no-id", ErrAccountUnknown},
		{"/bearer", "/echo-id", ErrAccountUnknown},
		{"/bearer", "/redirect", nil},
	} {
		_, err := r.client.VerifyKey(ctx, variant(tc.base, tc.path), map[string]string{"api_key": bearerKey})
		if tc.want != nil && !errors.Is(err, tc.want) || tc.want == nil && !errors.As(err, &ke) {
			t.Errorf("verify at %s: %v", tc.path, err)
		}
		if err != nil && strings.Contains(err.Error(), bearerKey) {
			t.Errorf("verify at %s: the error holds the key: %v", tc.path, err)
		}
	}
	// A redirect is not followed with the key (302 is a refusal).
	if h := r.api.last(); h.Get("Authorization") == "" {
		t.Error("the last request seen is not the verify request")
	}
	for _, s := range []string{bearerKey, xKey, jiraToken, wrong} {
		if strings.Contains(r.logs.String(), s) {
			t.Errorf("the log holds a key (%d bytes)", len(s))
		}
	}
}

// TestVerifyKeyProviderDown: a 5xx or no answer is the provider being
// unavailable, not a refused key.
func TestVerifyKeyProviderDown(t *testing.T) {
	r := newKeyRig(t)
	p := *r.provider(t, "bearer")
	p.APIBaseURL = r.api.srv.URL + "/status"
	a := *keyOf(&p)
	a.VerifyPath = "/503"
	p.Kind = &a
	if _, err := r.client.VerifyKey(t.Context(), &p, map[string]string{"api_key": bearerKey}); !errors.Is(err, ErrProviderUnavailable) {
		t.Fatalf("503: %v", err)
	}
	p.APIBaseURL = "http://127.0.0.1:1/none"
	if _, err := r.client.VerifyKey(t.Context(), &p, map[string]string{"api_key": bearerKey}); !errors.Is(err, ErrProviderUnavailable) || strings.Contains(err.Error(), bearerKey) {
		t.Fatalf("no answer: %v", err)
	}
}

// TestKeyInjectionAndRedaction: API calls carry the credential as the
// entry says, and no answer carries any secret field back in any of the
// encodings an echo uses (the basic-auth value included).
func TestKeyInjectionAndRedaction(t *testing.T) {
	r := newKeyRig(t)
	ctx := t.Context()
	cases := []struct {
		name, secret string
		values       map[string]string
		check        func(h http.Header) bool
	}{
		{"bearer", bearerKey, map[string]string{"api_key": bearerKey}, func(h http.Header) bool { return h.Get("Authorization") == "Bearer "+bearerKey }},
		{"xkey", xKey, map[string]string{"api_key": xKey}, func(h http.Header) bool { return h.Get("X-Api-Key") == xKey && h.Get("Authorization") == "" }},
		{"jira", jiraToken, map[string]string{"email": jiraEmail, "api_token": jiraToken}, func(h http.Header) bool {
			u, p, ok := (&http.Request{Header: h}).BasicAuth()
			return ok && u == jiraEmail && p == jiraToken
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := r.store1(t, tc.name, tc.values)
			resp, err := r.client.Do(ctx, c.ID, APIRequest{Method: http.MethodGet, Path: "/data"})
			if err != nil || resp.Status != 200 || !tc.check(r.api.last()) {
				t.Fatalf("GET /data: %+v %v; sent %v", resp, err, r.api.last())
			}
			if strings.Contains(string(resp.Body), tc.secret) {
				t.Fatalf("the answer holds the key: %s", resp.Body)
			}
			basic := ""
			if tc.name == "jira" {
				basic = r.api.last().Get("Authorization")
			}
			for _, form := range echoapi.Forms {
				resp, err := r.client.Do(ctx, c.ID, APIRequest{Method: http.MethodGet, Path: "/echo/" + form})
				if err != nil {
					t.Fatalf("echo %s: %v", form, err)
				}
				text := string(resp.Body) + fmt.Sprint(resp.Header)
				for _, s := range []string{tc.secret, strings.TrimPrefix(basic, "Basic ")} {
					if s == "" {
						continue
					}
					if leaks := echoapi.Leaks(text, s); len(leaks) > 0 {
						t.Errorf("echo %s: %v of a secret leaked: %s", form, leaks, text)
					}
				}
				if !strings.Contains(text, redact.Replacement) {
					t.Errorf("echo %s: nothing was redacted: %s", form, text)
				}
			}
			// The email of the basic-auth entry is not a secret.
			if tc.name == "jira" {
				if acct, _ := r.store.GetConnection(ctx, c.ID); acct.AccountLogin != jiraEmail {
					t.Errorf("login = %q", acct.AccountLogin)
				}
			}
		})
	}
}

// TestKeyRejectedNeedsReconnect: a 401 to a stored key marks the
// connection needs_reconnect (audited), later calls send nothing, and a
// key replaced meanwhile is not marked.
func TestKeyRejectedNeedsReconnect(t *testing.T) {
	r := newKeyRig(t)
	ctx := t.Context()
	c := r.store1(t, "xkey", map[string]string{"api_key": xKey})
	if _, err := r.client.Do(ctx, c.ID, APIRequest{Method: http.MethodGet, Path: "/data"}); err != nil {
		t.Fatal(err)
	}
	r.api.revoke(xKey)
	_, err := r.client.Do(ctx, c.ID, APIRequest{Method: http.MethodGet, Path: "/data"})
	if !errors.Is(err, ErrNeedsReconnect) {
		t.Fatalf("after the key was revoked: %v, want ErrNeedsReconnect", err)
	}
	got, _ := r.store.GetConnection(ctx, c.ID)
	if got.Status != vault.StatusNeedsReconnect || got.Token.Fields["api_key"].Reveal() != xKey {
		t.Fatalf("status %s; the key must be kept until replaced", got.Status)
	}
	if !strings.Contains(r.logs.String(), `"event":"needs_reconnect"`) {
		t.Error("no needs_reconnect audit event")
	}
	n := r.api.requests()
	if _, err := r.client.Do(ctx, c.ID, APIRequest{Method: http.MethodGet, Path: "/data"}); !errors.Is(err, ErrNeedsReconnect) || r.api.requests() != n {
		t.Fatalf("a needs_reconnect key was sent again (%v)", err)
	}

	// A 401 that races with a replacement leaves the new key alone.
	c2 := r.store1(t, "bearer", map[string]string{"api_key": bearerKey})
	if _, err := r.store.UpdateConnection(ctx, c2.ID, func(old vault.Connection) (vault.Connection, error) {
		old.Token.Fields = map[string]vault.Secret{"api_key": "sk-REPLACEDKEY0123456789abcdef"}
		return old, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.client.markKeyRejected(ctx, c2, "test"); !errors.Is(err, ErrNeedsReconnect) {
		t.Fatal(err)
	}
	if got, _ := r.store.GetConnection(ctx, c2.ID); got.Status != vault.StatusActive {
		t.Fatalf("a replaced key was marked %s", got.Status)
	}
	// Stored fields that no longer fit the entry: enter the key again.
	c3, err := r.store.CreateConnection(ctx, vault.Connection{ID: "odd", Principal: c.Principal, Provider: "jira", AccountID: "x",
		Token: vault.TokenSet{Fields: map[string]vault.Secret{"api_token": jiraToken}}, Status: vault.StatusActive})
	if err != nil {
		t.Fatal(err)
	}
	n = r.api.requests()
	if _, err := r.client.Do(ctx, c3.ID, APIRequest{Method: http.MethodGet, Path: "/data"}); !errors.Is(err, ErrNeedsReconnect) || r.api.requests() != n {
		t.Fatalf("incomplete stored key: %v", err)
	}
}

// TestKeyIsNeverAToken: an API-key connection gives no OAuth token (the
// sidecar's token export goes through Token) and nothing is marked.
func TestKeyIsNeverAToken(t *testing.T) {
	r := newKeyRig(t)
	c := r.store1(t, "bearer", map[string]string{"api_key": bearerKey})
	got, err := r.client.Token(t.Context(), c.ID)
	if !errors.Is(err, ErrNotAToken) || !got.Token.IsZero() {
		t.Fatalf("Token of a key connection: %v", err)
	}
	if now, _ := r.store.GetConnection(t.Context(), c.ID); now.Status != vault.StatusActive {
		t.Fatalf("asking for a token changed the connection to %s", now.Status)
	}
	if rv, err := r.client.Revoke(t.Context(), mustGetConn(t, r, c.ID), false); rv != NotSupported || err != nil {
		t.Fatalf("Revoke of a key: %s %v", rv, err)
	}
}

func mustGetConn(t *testing.T, r *keyRig, id string) vault.Connection {
	c, err := r.store.GetConnection(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTemplates(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		fields   []string
	}{
		{"Bearer {api_key}", "Bearer K1", []string{"api_key"}},
		{"{a}:{b}{a}", "K1:K2K1", []string{"a", "b"}},
		{"Token token={{{a}}}", "Token token={K1}", []string{"a"}},
		{"plain", "plain", nil},
	} {
		tp, err := ParseTemplate(tc.in)
		if err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		vals := map[string]string{"api_key": "K1", "a": "K1", "b": "K2"}
		out, ok := tp.Render(func(n string) (string, bool) { v, ok := vals[n]; return v, ok })
		if !ok || out != tc.want || fmt.Sprint(tp.Fields()) != fmt.Sprint(tc.fields) || tp.String() != tc.in {
			t.Errorf("%q: rendered %q (%v), fields %v, written %q", tc.in, out, ok, tp.Fields(), tp.String())
		}
	}
	for _, bad := range []string{"{", "}", "{x", "{A}", "{}", "{a b}", "a\r\nX-Evil: 1", "ü", strings.Repeat("x", 600)} {
		if _, err := ParseTemplate(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestPointers(t *testing.T) {
	var doc any
	dec := json.NewDecoder(strings.NewReader(`{"id":12345678901234567890,"a/b":{"m~n":"x"},"list":[{"v":"first"},{"v":true}],"":"empty"}`))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ptr, want string
		ok        bool
	}{
		{"/id", "12345678901234567890", true},
		{"/a~1b/m~0n", "x", true},
		{"/list/0/v", "first", true},
		{"/list/1/v", "", false},
		{"/list/01/v", "", false},
		{"/list/-", "", false},
		{"/list/2", "", false},
		{"/", "empty", true},
		{"/missing", "", false},
		{"/id/x", "", false},
	} {
		p, err := ParsePointer(tc.ptr)
		if err != nil {
			t.Fatalf("%q: %v", tc.ptr, err)
		}
		got, ok := p.LookupString(doc)
		if ok != tc.ok || got != tc.want || p.String() != tc.ptr {
			t.Errorf("%q: %q %v (written %q)", tc.ptr, got, ok, p.String())
		}
	}
	for _, bad := range []string{"id", "/a~", "/a~2", "~1"} {
		if _, err := ParsePointer(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func FuzzKeyTemplate(f *testing.F) {
	for _, s := range []string{"Bearer {api_key}", "{a}:{b}", "{{x}}", "{", "}", "{A}", "a\nb", "Token {{{k}}}"} {
		f.Add(s, "value")
	}
	f.Fuzz(func(t *testing.T, s, value string) {
		tp, err := ParseTemplate(s)
		if err != nil {
			return
		}
		again, err := ParseTemplate(tp.String())
		if err != nil || again.String() != tp.String() || fmt.Sprint(again.Fields()) != fmt.Sprint(tp.Fields()) {
			t.Fatalf("%q written as %q does not parse back the same: %v", s, tp.String(), err)
		}
		for _, name := range tp.Fields() {
			if !keyFieldNameRE.MatchString(name) {
				t.Fatalf("field %q accepted", name)
			}
		}
		out, ok := tp.Render(func(string) (string, bool) { return "v", true })
		if !ok || strings.ContainsAny(out, "\r\n\x00") {
			t.Fatalf("%q rendered %q", s, out)
		}
		if strings.ContainsAny(lit(tp), "\r\n\x00") {
			t.Fatalf("%q keeps a control character", s)
		}
	})
}

func FuzzJSONPointer(f *testing.F) {
	for _, s := range []string{"/id", "", "/a~1b/m~0n", "/0", "/-", "/~", "id", "/a/b/c"} {
		f.Add(s, `{"id":1,"a/b":{"m~n":"x"},"0":[1,2]}`)
	}
	f.Fuzz(func(t *testing.T, ptr, doc string) {
		p, err := ParsePointer(ptr)
		if err != nil {
			return
		}
		if p.String() != ptr {
			t.Fatalf("%q written back as %q", ptr, p.String())
		}
		dec := json.NewDecoder(strings.NewReader(doc))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			return
		}
		got, ok := p.LookupString(v)
		if !ok && got != "" {
			t.Fatalf("not found but %q", got)
		}
	})
}

// keyOf returns p's api_key kind, nil for another kind.
func keyOf(p *Provider) *APIKey {
	a, _ := p.Kind.(*APIKey)
	return a
}

// oauthOf returns p's OAuth kind, nil for another kind.
func oauthOf(p *Provider) *OAuth {
	o, _ := p.Kind.(*OAuth)
	return o
}
