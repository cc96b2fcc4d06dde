package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"credbroker/adminapi"
	"credbroker/apps"
	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/webhook"
)

const adminUsage = `usage:
  broker admin connections --principal ISS SUB        a person's connections (metadata only)
  broker admin offboard --principal ISS SUB           revoke and delete everything the person holds
  broker admin provider disable NAME [--delete]       mark a provider's connections needs_reconnect, or delete them

Flags of every command: --store, --keys-file (or BROKER_KEYS), --providers,
--webhooks-file or --webhook (so the changes become webhook events), --admin
NAME (who you are, for the audit log; default $USER), --json.

With a bolt store the commands work offline: the running broker holds the
file, so stop it first, or use the admin API of the running broker
(serve --admin-claim). With PostgreSQL they work while replicas run.
`

// adminCommand is the configuration every admin command shares.
type adminCommand struct {
	Store     string
	KeysFile  string
	Providers string
	Admin     string
	JSON      bool
	Webhooks  webhookConfig
	// Principal: --principal ISS, then SUB as the first argument.
	Issuer string
}

func (c *adminCommand) flags(fs *flag.FlagSet, principal bool) {
	fs.StringVar(&c.Store, "store", envOr("BROKER_STORE", "bolt:./data/broker.db"), "store: bolt:PATH or postgres://…")
	fs.StringVar(&c.KeysFile, "keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	fs.StringVar(&c.Providers, "providers", envOr("BROKER_PROVIDERS", "providers.yaml"), "provider catalogue (revocation needs its client secrets)")
	fs.StringVar(&c.Admin, "admin", envOr("USER", "unknown"), "who runs the command, named in the audit log")
	fs.BoolVar(&c.JSON, "json", false, "print the admin API's JSON instead of a table")
	c.Webhooks.flags(fs)
	if principal {
		fs.StringVar(&c.Issuer, "principal", "", "the person: --principal ISSUER SUBJECT (the subject follows the flag)")
	}
}

// principal reads --principal ISS SUB (SUB is fs's first argument).
func (c *adminCommand) principal(fs *flag.FlagSet) (vault.Principal, error) {
	if c.Issuer == "" || fs.NArg() != 1 || fs.Arg(0) == "" {
		return vault.Principal{}, usageError{"want --principal ISSUER SUBJECT (the subject after the issuer)"}
	}
	return vault.Principal{Issuer: c.Issuer, Subject: fs.Arg(0)}, nil
}

// adminEnv is an opened store and the connections layer over it.
type adminEnv struct {
	store vault.Store
	conns *connections.Service
	admin connections.Admin
}

// open loads the keys, providers and webhooks, opens the store with the
// outbox hook and builds the connections layer. Audit events go to stderr.
func (c *adminCommand) open(stderr io.Writer) (*adminEnv, error) {
	keysEnv := os.Getenv("BROKER_KEYS")
	if keysEnv == "" && c.KeysFile == "" {
		return nil, errors.New("no encryption keys: set BROKER_KEYS or pass --keys-file")
	}
	if keysEnv != "" && c.KeysFile != "" {
		return nil, errors.New("keys given both in BROKER_KEYS and --keys-file; use one")
	}
	kr, err := loadKeyring(keysEnv, c.KeysFile)
	if err != nil {
		return nil, err
	}
	providers, err := provider.LoadProviders(c.Providers, os.Getenv)
	if err != nil {
		return nil, err
	}
	hooks, err := c.Webhooks.load(os.Getenv)
	if err != nil {
		return nil, err
	}
	events := webhook.NewPublisher(hooks, nil)
	store, err := openStoreHooked(c.Store, kr, events)
	if errors.Is(err, boltstore.ErrLocked) {
		return nil, fmt.Errorf("%w\nThe running broker holds this bolt file (a bolt store belongs to one process): stop the broker and run the command again, or use the admin API of the running broker (serve --admin-claim …, on --admin-addr)", err)
	}
	if err != nil {
		return nil, err
	}
	log := newLogger(stderr, "text", slog.LevelWarn)
	rec := telemetry.New(telemetry.Options{Providers: providers.Names(), Audit: newLogger(stderr, "text", slog.LevelInfo)})
	client, err := provider.New(provider.Options{Store: store, Providers: providers, HTTPClient: outboundClient(), Logger: log, Telemetry: rec})
	if err != nil {
		store.Close()
		return nil, err
	}
	appSvc, err := appsCore(store, soleWriter(store), apps.Policy{}, rec, log)
	if err != nil {
		store.Close()
		return nil, err
	}
	conns, err := connections.New(connections.Options{Store: store, Grants: binding.New(store, binding.Options{}), Client: client,
		PublicURL: "http://127.0.0.1", Telemetry: rec, Logger: log, Offboard: offboardApps(appSvc)})
	if err != nil {
		store.Close()
		return nil, err
	}
	return &adminEnv{store: store, conns: conns,
		admin: connections.Admin{Principal: vault.Principal{Issuer: "local", Subject: c.Admin}, Via: "cli"}}, nil
}

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, adminUsage)
		if len(args) == 0 {
			return usageError{"admin: no command given"}
		}
		return nil
	}
	var c adminCommand
	switch args[0] {
	case "connections", "offboard":
		fs := flag.NewFlagSet("admin "+args[0], flag.ContinueOnError)
		fs.SetOutput(stderr)
		c.flags(fs, true)
		if err := fs.Parse(args[1:]); err != nil {
			return usageError{err.Error()}
		}
		p, err := c.principal(fs)
		if err != nil {
			return err
		}
		env, err := c.open(stderr)
		if err != nil {
			return err
		}
		defer env.store.Close()
		if args[0] == "connections" {
			list, err := env.conns.AdminList(ctx, env.admin, p)
			if err != nil {
				return err
			}
			return printConnections(stdout, c.JSON, adminapi.Connections(p, list))
		}
		rep, err := env.conns.Offboard(ctx, env.admin, p)
		if err != nil {
			return err
		}
		if err := printOffboard(stdout, c.JSON, adminapi.Offboard(rep)); err != nil {
			return err
		}
		if !rep.Complete() {
			return errors.New("offboarding is incomplete: a revocation was not confirmed; run the command again later (the connection is deleted, its revocation is retried)")
		}
		return nil
	case "provider":
		if len(args) < 2 || args[1] != "disable" {
			fmt.Fprint(stderr, adminUsage)
			return usageError{"admin provider: want `provider disable NAME`"}
		}
		fs := flag.NewFlagSet("admin provider disable", flag.ContinueOnError)
		fs.SetOutput(stderr)
		c.flags(fs, false)
		del := fs.Bool("delete", false, "revoke and delete the connections instead of marking them needs_reconnect")
		// NAME may come before or after the flags.
		rest := args[2:]
		var name string
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			name, rest = rest[0], rest[1:]
		}
		if err := fs.Parse(rest); err != nil {
			return usageError{err.Error()}
		}
		if name == "" && fs.NArg() == 1 {
			name = fs.Arg(0)
		} else if fs.NArg() > 0 || name == "" {
			return usageError{"want `provider disable NAME [--delete]`"}
		}
		env, err := c.open(stderr)
		if err != nil {
			return err
		}
		defer env.store.Close()
		if _, ok := env.conns.Providers().Lookup(name); !ok && !*del {
			return fmt.Errorf("provider %q is not in %s (connections to a removed provider can still be deleted with --delete)", name, c.Providers)
		}
		rep, err := env.conns.DisableProvider(ctx, env.admin, name, *del)
		if err != nil {
			return err
		}
		out := adminapi.Disable(rep)
		if c.JSON {
			return json.NewEncoder(stdout).Encode(out)
		}
		if *del {
			fmt.Fprintf(stdout, "provider %s: %d connection(s) deleted; revocation: %s\n", name, out.Deleted, revocationSummary(out.Revocations))
		} else {
			fmt.Fprintf(stdout, "provider %s: %d connection(s) marked needs_reconnect\n", name, out.Marked)
		}
		return nil
	}
	fmt.Fprint(stderr, adminUsage)
	return usageError{fmt.Sprintf("admin: unknown command %q", args[0])}
}

func revocationSummary(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func printConnections(w io.Writer, asJSON bool, out adminapi.ConnectionsJSON) error {
	if asJSON {
		return json.NewEncoder(w).Encode(out)
	}
	if len(out.Connections) == 0 {
		fmt.Fprintf(w, "%s %s has no connections\n", out.Principal.Issuer, out.Principal.Subject)
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROVIDER\tACCOUNT\tSTATUS\tSCOPES\tLAST USED")
	for _, c := range out.Connections {
		used := "never"
		if c.LastUsed != nil {
			used = c.LastUsed.UTC().Format("2006-01-02 15:04")
		}
		acct := c.AccountLogin
		if acct == "" {
			acct = c.AccountID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", c.ID, c.Provider, acct, c.Status, strings.Join(c.Scopes, " "), used)
	}
	return tw.Flush()
}

func printOffboard(w io.Writer, asJSON bool, out adminapi.OffboardJSON) error {
	if asJSON {
		return json.NewEncoder(w).Encode(out)
	}
	fmt.Fprintf(w, "offboarding %s %s\n", out.Principal.Issuer, out.Principal.Subject)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONNECTION\tPROVIDER\tACCOUNT\tREVOCATION\tRESULT")
	for _, c := range out.Connections {
		result := "deleted"
		switch {
		case c.Pending && c.Retry:
			result = "already deleted; revocation still not confirmed, retried on the next run: " + c.Error
		case c.Pending:
			result = "deleted; revocation not confirmed, retried on the next run: " + c.Error
		case c.Retry:
			result = "revocation retried from an earlier run: done"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.ID, c.Provider, c.Account, c.Revocation, result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "connect requests deleted: %d\n", out.GrantsDeleted)
	for _, st := range out.Steps {
		fmt.Fprintf(w, "%s removed: %d %s\n", st.Name, st.Removed, st.Error)
	}
	if out.Complete {
		fmt.Fprintln(w, "complete: nothing is left for this person")
	} else {
		fmt.Fprintln(w, "INCOMPLETE: run the command again to retry the revocations above")
	}
	return nil
}
