package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/vault/boltstore"
)

var errNoKeys = errors.New("no encryption keys: set BROKER_KEYS or pass --keys-file (generate one with `broker keys generate`)")

const keysUsage = `usage: broker keys <command> [flags]

commands:
  generate  print a new random key line ("id:base64") for BROKER_KEYS or a keys file
  rotate    --keys-file F [--store PATH]: put a new primary key first in F (old keys
            stay, decrypt-only) and re-encrypt every record with it
  status    [--keys-file F] [--store PATH]: how many records each key seals, so you
            know when an old key can be removed
`

func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return dispatch(ctx, "keys: ", keysUsage, map[string]command{
		"generate": runKeysGenerate, "rotate": runKeysRotate, "status": runKeysStatus,
	}, args, stdout, stderr)
}

func runKeysGenerate(_ context.Context, args []string, stdout, stderr io.Writer) error {
	if _, err := parseFlags(flag.NewFlagSet("keys generate", flag.ContinueOnError), args, stderr, 0); err != nil {
		return err
	}
	fmt.Fprintln(stdout, vault.GenerateKey())
	return nil
}

// keyFlags are the flags rotate and status share.
type keyFlags struct {
	keysFile string
	store    string
}

func (k *keyFlags) parse(name string, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&k.keysFile, "keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	fs.StringVar(&k.store, "store", envOr("BROKER_STORE", "bolt:./data/broker.db"), "store: bolt:PATH (or a plain path)")
	_, err := parseFlags(fs, args, stderr, 0)
	return err
}

// loadKeys reads the key ring from BROKER_KEYS or file.
func loadKeys(file string) (*vault.Keyring, error) {
	env := os.Getenv("BROKER_KEYS")
	if env == "" && file == "" {
		return nil, errNoKeys
	}
	return loadKeyring(env, file)
}

// loadKeyring reads the key ring from the value of BROKER_KEYS (env) or,
// when env is empty, from --keys-file (file). Neither set → vault.ErrNoKeys.
func loadKeyring(env, file string) (*vault.Keyring, error) {
	switch {
	case env != "" && file != "":
		return nil, errors.New("vault: keys given both in BROKER_KEYS and --keys-file; use one")
	case env != "":
		return vault.ParseKeys(env)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("vault: read keys file: %w", err)
		}
		return vault.ParseKeys(string(b))
	}
	return nil, vault.ErrNoKeys
}

// existingStore resolves a --store value and insists the file exists: key
// commands never create a database.
func existingStore(s string) (string, error) {
	path, err := storePath(s)
	if err != nil {
		return "", fmt.Errorf("--store: %w", err)
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return path, fmt.Errorf("no store at %s: check --store or BROKER_STORE", path)
	} else if err != nil {
		return path, fmt.Errorf("store %s: %w", path, err)
	}
	return path, nil
}

func runKeysRotate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f keyFlags
	if err := f.parse("keys rotate", args, stderr); err != nil {
		return err
	}
	if f.keysFile == "" {
		if os.Getenv("BROKER_KEYS") != "" {
			return errors.New("keys rotate writes the new key into --keys-file; with BROKER_KEYS, put the line of `broker keys generate` first in BROKER_KEYS (keep the old keys after it) and restart the broker: it re-encrypts on start")
		}
		return errNoKeys
	}
	if os.Getenv("BROKER_KEYS") != "" {
		return errors.New("keys given both in BROKER_KEYS and --keys-file; use one")
	}
	kr, err := loadKeyring("", f.keysFile)
	if err != nil {
		return err
	}
	if isPostgresStore(f.store) {
		return errors.New(pgRotateHelp)
	}
	path, err := storePath(f.store)
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	next, err := kr.WithNewPrimary()
	if err != nil {
		return err
	}
	if err := writeFileAtomic(f.keysFile, []byte(next.Format())); err != nil {
		return fmt.Errorf("write keys file: %w (the key file is unchanged)", err)
	}
	fmt.Fprintf(stdout, "new primary key %s written to %s; kept for decryption only: %s\n",
		next.Primary(), f.keysFile, strings.Join(kr.IDs(), ", "))

	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stdout, "no store at %s: nothing to re-encrypt\n", path)
		return nil
	}
	s, err := openBolt(path, next)
	switch {
	case errors.Is(err, boltstore.ErrLocked):
		fmt.Fprintf(stdout, "store %s is in use by a running broker: the key file was updated, and the broker re-encrypts every record when it next starts (restart it to use the new key)\n", path)
		return nil
	case err != nil:
		return fmt.Errorf("the key file was updated, but re-encryption could not start: %w", err)
	}
	defer s.Close()
	n, err := vault.Rekey(ctx, s, next, rekeyBatch)
	if err != nil {
		return fmt.Errorf("re-encrypted %d records, then: %w (run `broker keys rotate` again or start the broker to finish; both resume)", n, err)
	}
	if err := s.MarkFullySealed(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "re-encrypted %d records with key %s\n", n, next.Primary())
	// The rotation is an audit event like the broker's own (key_rotation).
	telemetry.New(telemetry.Options{Audit: newLogger(stderr, "text", slog.LevelInfo)}).
		Audit(ctx, telemetry.Event{Kind: telemetry.EventKeyRotation, KeyID: next.Primary(), Count: n, Via: "cli"})
	return nil
}

// pgRotateHelp is the rotation procedure for replicas sharing PostgreSQL.
// One command cannot do it: replicas still running with the old key ring
// could not open records sealed with a key they do not have.
const pgRotateHelp = `keys rotate re-seals a store that one broker uses; replicas sharing PostgreSQL rotate in two rolling restarts instead:
  1. run ` + "`broker keys generate`" + ` and append its line LAST to every replica's key file (decrypt-only), then restart the replicas one by one;
  2. move that line FIRST (the new primary) in every key file and restart them one by one again: each replica re-seals the records in the background on start (safe to run on all at once);
  3. ` + "`broker keys status --store postgres://…`" + ` shows when the old key seals nothing; then remove it from every key file`

func runKeysStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f keyFlags
	if err := f.parse("keys status", args, stderr); err != nil {
		return err
	}
	kr, err := loadKeys(f.keysFile)
	if err != nil {
		return err
	}
	s, err := openExistingStore(f.store, kr)
	if err != nil {
		return err
	}
	defer s.Close()
	usage, err := s.KeyUsage(ctx)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tROLE\tRECORDS")
	var notes []string
	for i, id := range kr.IDs() {
		role := "decrypt-only"
		if i == 0 {
			role = "primary"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\n", id, role, usage[id])
		if i > 0 && usage[id] == 0 {
			notes = append(notes, fmt.Sprintf("key %s seals no records: it can be removed from the key ring", id))
		}
	}
	var missing []string
	for id := range usage {
		if !kr.Has(id) {
			missing = append(missing, id)
		}
	}
	for _, id := range slices.Sorted(slices.Values(missing)) {
		fmt.Fprintf(tw, "%s\t%s\t%d\n", id, "MISSING", usage[id])
		notes = append(notes, fmt.Sprintf("%d records are sealed with key %s, which the key ring lacks: they cannot be decrypted until it is added back", usage[id], id))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintln(stdout, n)
	}
	return nil
}

// writeFileAtomic replaces path with data: a 0600 temporary file in the same
// directory, fsync, rename, then fsync of the directory. A crash leaves the
// old file or the new one, never a torn one.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return nil // renamed; the directory sync is best effort
	}
	defer d.Close()
	_ = d.Sync()
	return nil
}
