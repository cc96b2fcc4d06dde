package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"credbroker/authserver"
	"credbroker/internal/demomcp"
	"credbroker/internal/demoprovider"
	"credbroker/internal/devidp"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/sidecar"
	"credbroker/vault"
)

// Development mode: everything on one loopback listener.
const (
	devIdPPath      = "/dev/idp"
	devProviderPath = "/dev/provider"
	devMCPPath      = "/dev/mcp-upstream"
	devClientID     = "credbroker"
	devDemoClientID = "credbroker-demo"
	devTokenTTL     = time.Hour
)

// devProvidersYAML configures the demo provider exactly as an operator
// would configure any other provider; only the URLs are filled in.
const devProvidersYAML = `providers:
  demo:
    display_name: Demo
    type: oauth2
    authorization_url: {{BASE}}/authorize
    token_url: {{BASE}}/token
    client_id: ` + devDemoClientID + `
    client_secret: ${DEMO_CLIENT_SECRET}
    default_scopes: [profile]
    allowed_scopes: [profile, repos]
    scope_descriptions:
      profile: See your demo profile (login and id)
      repos: List your demo repositories
    account:
      url: {{BASE}}/api/user
      id_field: id
      login_field: login
    api:
      base_url: {{BASE}}/api
    revocation:
      style: rfc7009
      url: {{BASE}}/revoke
  demo-keys:
    display_name: Demo keys
    type: api_key
    instructions: >-
      The demo provider's key page shows an API key for each demo account.
      Copy the key of your demo account (alice-demo or bob-demo) and paste it here.
    instructions_url: {{BASE}}/keys
    fields:
      - {name: api_key, label: API key, secret: true, pattern: '` + demoprovider.KeyPattern + `'}
    inject:
      header: "X-Api-Key: {api_key}"
    verify: {path: /me, account_id: /id, account_login: /login}
    api:
      base_url: {{BASE}}/keys-api
      allowed_paths: [GET /me]
  demo-mcp:
    display_name: Demo MCP server
    type: mcp
    mcp:
      url: {{MCP}}
      call_timeout: 30s
`

// devProviders is devProvidersYAML for a broker dev (or a test standing
// in for one) serving the demo provider and the demo MCP server at base.
func devProviders(base string) string {
	return strings.NewReplacer("{{BASE}}", base+devProviderPath, "{{MCP}}", base+devMCPPath).Replace(devProvidersYAML)
}

// devSidecarAddr is where broker dev serves the sidecar API unless told
// otherwise; devSidecarName is the name its development secret goes by.
const (
	devSidecarAddr = "127.0.0.1:8081"
	devSidecarName = "dev-sidecar"
)

func runDev(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runDevWith(ctx, args, stdout, stderr, devSidecarAddr)
}

// runDevWith is runDev with the default sidecar address given (tests take
// one they hold, to see what dev mode does when it is in use).
func runDevWith(ctx context.Context, args []string, stdout, stderr io.Writer, defaultSidecar string) error {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "loopback address to listen on (port 0 picks a free port)")
	dataDir := fs.String("data", "./data", "directory for the database and the development keys")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	sidecarAddr := fs.String("sidecar-addr", defaultSidecar, "loopback address of the sidecar API for co-located MCP servers (off: none); when the default is in use, dev mode runs without it")
	if _, err := parseFlags(fs, args, stderr, 0); err != nil {
		return err
	}
	explicitSidecar := false
	fs.Visit(func(f *flag.Flag) { explicitSidecar = explicitSidecar || f.Name == "sidecar-addr" })
	if *sidecarAddr != "off" {
		if err := checkSidecarAddr(*sidecarAddr); err != nil {
			return usageError{err.Error()}
		}
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return usageError{fmt.Sprintf("--addr %q: %v", *addr, err)}
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return usageError{fmt.Sprintf("--addr %q: development mode only listens on a loopback address such as 127.0.0.1", *addr)}
	}
	if *logFormat != "text" && *logFormat != "json" {
		return usageError{fmt.Sprintf("--log-format %q: want text or json", *logFormat)}
	}
	log := newLogger(stderr, *logFormat, slog.LevelInfo)

	keys, dbPath, keysPath, err := devKeys(*dataDir)
	if err != nil {
		return err
	}
	store, err := openStore(dbPath, keys)
	if err != nil {
		return err
	}
	defer store.Close()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	base := "http://" + ln.Addr().String()
	resource := base + "/mcp"

	// The sidecar API, with a development secret kept next to the keys.
	// The default address may be taken (another development broker, say):
	// then dev mode says so and runs without it. An address given on the
	// command line must work.
	side := devSidecar{secretPath: filepath.Join(*dataDir, "sidecar.secret")}
	var sideCfg sidecarConfig
	if *sidecarAddr == "off" {
		side.off = "off (--sidecar-addr off)"
	} else {
		secret, err := devSidecarSecret(side.secretPath)
		if err != nil {
			ln.Close()
			return err
		}
		sln, err := net.Listen("tcp", *sidecarAddr)
		switch {
		case err != nil && explicitSidecar:
			ln.Close()
			return fmt.Errorf("sidecar API: listen on --sidecar-addr %s: %w", *sidecarAddr, err)
		case err != nil:
			side.off = fmt.Sprintf("off: %s is in use (another broker dev?); pass --sidecar-addr 127.0.0.1:PORT to choose another", *sidecarAddr)
			log.Warn("sidecar API off: its default address is in use", "addr", *sidecarAddr, "err", err.Error())
		default:
			side.url = "http://" + sln.Addr().String()
			sideCfg = sidecarConfig{Listener: sln, Callers: []sidecar.Caller{{Name: devSidecarName, Secret: vault.Secret(secret)}}}
			defer sln.Close() // closed by its server once mounted; this covers a failed start
		}
	}

	idpSecret, demoSecret := randomSecret(), randomSecret()
	idp, err := devidp.New(devidp.Options{
		Issuer: base + devIdPPath,
		Users:  devidp.DefaultUsers(),
		Clients: []devidp.Client{{
			ID: devClientID, Secret: idpSecret, RedirectURIs: []string{base + "/auth/callback"},
		}, {
			// The MCP hosts' client at the IdP, for enterprise-managed
			// authorization (README, "Enterprise-managed authorization").
			ID: devHostClientID, Secret: devHostSecret, RedirectURIs: []string{"http://127.0.0.1/callback"}, Native: true,
		}},
		IDJAGRules: devIDJAGRules(base, resource),
		Logger:     log.With("component", "devidp"),
	})
	if err != nil {
		ln.Close()
		return fmt.Errorf("development identity provider: %w", err)
	}
	demo, err := demoprovider.New(demoprovider.Options{
		BaseURL: base + devProviderPath, ClientID: devDemoClientID, ClientSecret: demoSecret,
		RedirectURIs: []string{base + "/oauth/demo/callback"},
		// It is also the authorization server of the demo MCP server.
		Resources: []string{base + devMCPPath},
		Logger:    log.With("component", "demoprovider"),
	})
	if err != nil {
		ln.Close()
		return fmt.Errorf("demo provider: %w", err)
	}
	// The demo provider keeps its registrations in memory, so the
	// broker's registration there from an earlier run (the store keeps
	// it) names a client this run's demo provider never heard of.
	err = store.UpstreamClients().DeleteUpstreamClient(ctx, provider.UpstreamClientKey(demo.Issuer(), base+"/oauth/demo-mcp/callback"), "")
	if err != nil && !errors.Is(err, vault.ErrNotFound) {
		ln.Close()
		return fmt.Errorf("forget the demo MCP server's registration of an earlier run: %w", err)
	}
	upstream, err := demomcp.New(demomcp.Options{URL: base + devMCPPath, AuthServer: demo, Logger: log.With("component", "demomcp")})
	if err != nil {
		ln.Close()
		return fmt.Errorf("demo MCP server: %w", err)
	}
	providers, err := provider.ParseProviders("dev providers",
		[]byte(devProviders(base)),
		func(k string) string {
			if k == "DEMO_CLIENT_SECRET" {
				return demoSecret
			}
			return ""
		})
	if err != nil {
		ln.Close()
		return err
	}
	// The gateway reaches the demo MCP server on this listener only.
	upstreams := upstreamConfig{AllowPrivate: true, AllowedHosts: []string{ln.Addr().String()}, MaxCallTimeout: provider.MaxCallTimeout}
	if problems := upstreams.checkProviders(providers, base); len(problems) > 0 {
		ln.Close()
		return fmt.Errorf("configuration has problems:\n%w", errors.Join(problems...))
	}

	tp, stopTracing, err := startTracing(ctx, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer stopTracing()
	// The development IdP and demo provider stand beside the broker on
	// its listener; the broker's own routes are its site, mounted at "/".
	mux := http.NewServeMux()
	mux.Handle(devIdPPath+"/", idp.Handler())
	demo.Mount(mux)
	upstream.Mount(mux)
	srv := newHTTPServer(mux, log)
	serveErr := make(chan error, 1)
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	go func() { serveErr <- serveUntilDone(sctx, srv, ln, log) }()

	// The broker discovers its IdP over HTTP, so it is mounted once the
	// listener serves the IdP.
	m, err := mount(ctx, mux, brokerDeps{
		PublicURL: base, Resource: resource, Issuer: idp.Issuer(),
		ClientID: devClientID, ClientSecret: vault.Secret(idpSecret), DevMode: true,
		GrantTTL: 10 * time.Minute, StateTTL: 10 * time.Minute,
		Store: store, Keys: keys, Providers: providers, Logger: log,
		HTTPClient: outboundClient(), Tracing: tp,
		Telemetry: telemetry.New(telemetry.Options{Providers: providers.Names(), Audit: log, ProcessMetrics: true,
			SidecarServers: []string{devSidecarName}}),
		// Loopback only: /metrics on the main listener.
		MetricsOnMain: true,
		Sidecar:       sideCfg,
		// MCP hosts get their tokens from the broker itself: dynamic
		// registration is open, metadata documents are fetched from
		// public addresses only.
		AuthServer: &authServerConfig{Registration: true,
			// Enterprise-managed authorization: any confidential client may
			// redeem the dev IdP's ID-JAGs, and the host client is
			// configured at the broker under the IdP's client id.
			IDJAG: authserver.IDJAGPolicy{Mode: authserver.IDJAGAny},
			Clients: []authserver.StaticClient{{ID: devHostClientID, Secret: devHostSecret, Name: "Development MCP host",
				RedirectURIs: []string{"http://127.0.0.1/callback"}}},
		},
		Upstreams: upstreams,
	})
	if err != nil {
		stopServing()
		<-serveErr
		return err
	}
	// /dev/token mints the broker's own tokens: an API of the broker's.
	m.Site.API.Handle("POST /dev/token", devTokenHandler(m.Auth, idp.Issuer()))
	srv.RegisterOnShutdown(m.MCP.EndStreams)
	go collectGrants(sctx, m.Grants, log)
	printDevBanner(stdout, base, dbPath, keysPath, side)
	err = <-serveErr
	m.Upstreams.Close()
	return err
}

// The development MCP host's client, at the IdP and at the broker alike
// (so the ID-JAG's client_id needs no mapping). Its secret is fixed so the
// README's curl steps work; broker dev listens on loopback only.
const (
	devHostClientID = "credbroker-dev-host"
	devHostSecret   = "dev-host-secret"
)

// devIDJAGRules is the dev IdP's token-exchange policy: alice's host may
// get ID-JAGs for this broker, bob's may not (the IdP saying no).
func devIDJAGRules(base, resource string) []devidp.IDJAGRule {
	return []devidp.IDJAGRule{
		{User: "alice", Client: devHostClientID, Audience: base, Resources: []string{resource}},
		{User: "bob", Client: devHostClientID, Audience: base, Deny: true},
	}
}

// devSidecar is what the banner says about the sidecar API.
type devSidecar struct {
	url        string // "" when off
	off        string // why it is off
	secretPath string
}

// devSidecarSecret reads the development sidecar secret at path, creating
// it (random, mode 0600) on the first run.
func devSidecarSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		s := strings.TrimSpace(string(b))
		if len(s) < 16 {
			return "", fmt.Errorf("%s: the sidecar secret must be at least 16 characters (remove the file to get a new one)", path)
		}
		return s, nil
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	s := randomSecret()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	_, werr := f.WriteString(s + "\n")
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("write %s: %w", path, werr)
	}
	return s, nil
}

// devKeys loads the development keys from dir, creating them on the very
// first run. It never creates a key next to an existing database.
func devKeys(dir string) (kr *vault.Keyring, dbPath, keysPath string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", "", fmt.Errorf("data directory %s: %w", dir, err)
	}
	dbPath, keysPath = filepath.Join(dir, "broker.db"), filepath.Join(dir, "dev.keys")
	b, err := os.ReadFile(keysPath)
	switch {
	case err == nil:
		kr, err := vault.ParseKeys(string(b))
		if err != nil {
			return nil, "", "", fmt.Errorf("%s: %w", keysPath, err)
		}
		return kr, dbPath, keysPath, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, "", "", fmt.Errorf("read %s: %w", keysPath, err)
	}
	if _, err := os.Stat(dbPath); err == nil {
		return nil, "", "", fmt.Errorf("%s exists but its key file %s is missing: refusing to create a new key over existing data (restore the key file, or remove the database to start afresh)", dbPath, keysPath)
	}
	line := vault.GenerateKey()
	kr, err = vault.ParseKeys(line)
	if err != nil {
		return nil, "", "", err
	}
	content := "# credbroker development keys: for `broker dev` only.\n" + line + "\n"
	f, err := os.OpenFile(keysPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, "", "", fmt.Errorf("create %s: %w", keysPath, err)
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return nil, "", "", fmt.Errorf("write %s: %w", keysPath, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, "", "", fmt.Errorf("sync %s: %w", keysPath, err)
	}
	if err := f.Close(); err != nil {
		return nil, "", "", err
	}
	return kr, dbPath, keysPath, nil
}

func randomSecret() string {
	var b [32]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// devTokenClient is the built-in client /dev/token's tokens are issued
// to; "My connections" lists it like any app, so its access can be removed.
const (
	devTokenClient     = "urn:credbroker:dev-token"
	devTokenClientName = "Development token (POST /dev/token)"
)

// devTokenHandler mints an MCP bearer token for a development user without
// a browser, issued by the broker's authorization server exactly as for an
// MCP host: POST /dev/token with user=alice, and resource=<a gateway
// endpoint> for one of /mcp/u/PROVIDER (default: /mcp). With "Accept:
// text/plain" the answer is the bare token, for shell scripts.
func devTokenHandler(as *authserver.Server, issuer string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
		w.Header().Set("Cache-Control", "no-store")
		fail := func(status int, code, desc string) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
		}
		user := r.PostFormValue("user")
		var subject string
		for _, u := range devidp.DefaultUsers() {
			if u.Username == user {
				subject = u.Subject
			}
		}
		if subject == "" {
			fail(http.StatusBadRequest, "invalid_request", "form field user must name a development user (alice or bob)")
			return
		}
		resource := r.PostFormValue("resource")
		tok, exp, err := as.MintAccessToken(r.Context(), vault.Principal{Issuer: issuer, Subject: subject},
			devTokenClient, devTokenClientName, resource, devTokenTTL)
		if err != nil && resource != "" {
			fail(http.StatusBadRequest, "invalid_target", "form field resource must be the broker's MCP endpoint or a gateway endpoint (/mcp/u/PROVIDER)")
			return
		}
		if err != nil {
			fail(http.StatusInternalServerError, "server_error", "the token could not be issued")
			return
		}
		if strings.HasPrefix(r.Header.Get("Accept"), "text/plain") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintln(w, tok)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"access_token": tok, "token_type": "Bearer", "expires_in": int(time.Until(exp).Seconds()),
		})
	})
}

func printDevBanner(w io.Writer, base, dbPath, keysPath string, side devSidecar) {
	fmt.Fprintf(w, `
credbroker development mode (loopback only; not for real accounts)

  MCP endpoint      %[1]s/mcp
  my connections    %[1]s/connections
  identity provider %[1]s%[2]s   users: alice / alice, bob / bob
  demo provider     %[1]s%[3]s   (API keys of demo-keys: %[1]s%[3]s/keys)
  demo MCP server   %[1]s%[6]s, relayed at %[1]s/mcp/u/demo-mcp
  data              %[4]s (keys: %[5]s)
`, base, devIdPPath, devProviderPath, dbPath, keysPath, devMCPPath)
	if side.url != "" {
		fmt.Fprintf(w, "  sidecar API       %s (secret: %s)\n", side.url, side.secretPath)
	} else {
		fmt.Fprintf(w, "  sidecar API       %s\n", side.off)
	}
	fmt.Fprintf(w, `
Connect an MCP host: give it the server URL %[1]s/mcp and nothing else.
It registers itself, you sign in (alice / alice) and allow it, and it gets
its own tokens from the broker.

Or get a token for alice without a browser (valid one hour):
  curl -s -X POST -d user=alice %[1]s/dev/token

Try it with the reference client:
  export BROKER_TOKEN=$(curl -s -H 'Accept: text/plain' -d user=alice %[1]s/dev/token)
  go run ./cmd/brokerctl --url %[1]s/mcp connect demo

A remote MCP server through the gateway (a token for its endpoint):
  export GATEWAY_TOKEN=$(curl -s -H 'Accept: text/plain' -d user=alice -d resource=%[1]s/mcp/u/demo-mcp %[1]s/dev/token)
  BROKER_TOKEN=$GATEWAY_TOKEN go run ./cmd/brokerctl --url %[1]s/mcp/u/demo-mcp tools
`, base)
	if side.url != "" {
		fmt.Fprintf(w, `
Start the example MCP server on the sidecar API, then call its tool:
  %s
  go run ./cmd/brokerctl --url http://%s/mcp call list_demo_repos
`, demoreposCommand(side), demoreposAddr)
	}
	fmt.Fprint(w, `
Ready.
`)
}

// demoreposAddr is where the banner's command starts examples/demorepos.
const demoreposAddr = "127.0.0.1:8090"

// demoreposCommand is the one command that starts examples/demorepos
// against this broker's sidecar API.
func demoreposCommand(side devSidecar) string {
	return fmt.Sprintf("go run ./examples/demorepos -addr %s -sidecar-url %s -secret-file %s", demoreposAddr, side.url, side.secretPath)
}
