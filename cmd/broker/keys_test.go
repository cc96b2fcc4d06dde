package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// clearKeyEnv isolates a test from the operator's environment.
func clearKeyEnv(t *testing.T) {
	for _, k := range []string{"BROKER_KEYS", "BROKER_KEYS_FILE", "BROKER_STORE"} {
		t.Setenv(k, "")
	}
}

func runCmd(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(t.Context(), args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// seedStore writes n connections sealed with kr into a new store at path.
func seedStore(t *testing.T, path string, kr *vault.Keyring, n int) {
	t.Helper()
	s, err := openStore(path, kr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		p := vault.Principal{Issuer: "https://idp.example", Subject: fmt.Sprintf("u%d", i%3)}
		if _, err := s.CreateConnection(t.Context(), vaulttest.Conn(fmt.Sprintf("c%03d", i), p, "github", fmt.Sprint(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// checkSealed opens path with the ring in keysFile and checks that all n
// records decrypt and are sealed with the ring's primary key.
func checkSealed(t *testing.T, path, keysFile string, n int) *vault.Keyring {
	t.Helper()
	kr, err := loadKeyring("", keysFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openStore(path, kr)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		id := fmt.Sprintf("c%03d", i)
		c, err := s.GetConnection(t.Context(), id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if c.SealedWith != kr.Primary() || c.Token.AccessToken.Reveal() != "at-"+id+"-secret" {
			t.Fatalf("%s sealed with %s, want %s", id, c.SealedWith, kr.Primary())
		}
	}
	return kr
}

func TestKeysGenerate(t *testing.T) {
	clearKeyEnv(t)
	seen := map[string]bool{}
	for range 3 {
		out, _, err := runCmd(t, "keys", "generate")
		if err != nil {
			t.Fatal(err)
		}
		line := strings.TrimSuffix(out, "\n")
		if strings.Contains(line, "\n") || seen[line] {
			t.Fatalf("output %q: want one fresh key line", out)
		}
		seen[line] = true
		kr, err := vault.ParseKeys(line)
		if err != nil || len(kr.IDs()) != 1 {
			t.Fatalf("generated line does not parse: %v", err)
		}
	}
}

func TestKeysErrors(t *testing.T) {
	clearKeyEnv(t)
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysFile, []byte(vault.GenerateKey()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		env      string
		args     []string
		want     string
		exitCode int
	}{
		{"no subcommand", "", []string{"keys"}, "keys: no command given", 2},
		{"unknown subcommand", "", []string{"keys", "frobnicate"}, `keys: unknown command "frobnicate"`, 2},
		{"generate with argument", "", []string{"keys", "generate", "x"}, `unexpected argument "x"`, 2},
		{"status without keys", "", []string{"keys", "status", "--store", filepath.Join(dir, "v.db")},
			"no encryption keys: set BROKER_KEYS or pass --keys-file (generate one with `broker keys generate`)", 1},
		{"rotate without keys", "", []string{"keys", "rotate"}, "no encryption keys: set BROKER_KEYS", 1},
		{"rotate with env keys only", vault.GenerateKey(), []string{"keys", "rotate"}, "keys rotate writes the new key into --keys-file", 1},
		{"rotate with both", vault.GenerateKey(), []string{"keys", "rotate", "--keys-file", keysFile}, "use one", 1},
		{"rotate with missing keys file", "", []string{"keys", "rotate", "--keys-file", filepath.Join(dir, "nope")}, "read keys file", 1},
		{"status of missing store", "", []string{"keys", "status", "--keys-file", keysFile, "--store", filepath.Join(dir, "none.db")}, "none.db", 1},
		{"remote postgres without TLS", "", []string{"keys", "status", "--keys-file", keysFile, "--store", "postgres://x"}, "not on loopback", 1},
		{"rotate postgres", "", []string{"keys", "rotate", "--keys-file", keysFile, "--store", "postgres://127.0.0.1/db"}, "two rolling restarts", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("BROKER_KEYS", tt.env)
			before, _ := os.ReadFile(keysFile)
			_, _, err := runCmd(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
			if exitCode(err) != tt.exitCode {
				t.Fatalf("exit code %d, want %d", exitCode(err), tt.exitCode)
			}
			if after, _ := os.ReadFile(keysFile); !bytes.Equal(before, after) {
				t.Fatal("a failed command changed the key file")
			}
		})
	}
}

func TestKeysRotateAndStatus(t *testing.T) {
	clearKeyEnv(t)
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys")
	dbPath := filepath.Join(dir, "data", "broker.db")
	firstLine := vault.GenerateKey()
	if err := os.WriteFile(keysFile, []byte(firstLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	oldKR, _ := vault.ParseKeys(firstLine)
	const n = 40
	seedStore(t, dbPath, oldKR, n)

	out, errOut, err := runCmd(t, "keys", "rotate", "--keys-file", keysFile, "--store", "bolt:"+dbPath)
	if err != nil {
		t.Fatalf("rotate: %v", err)
	}
	kr := checkSealed(t, dbPath, keysFile, n)
	// The rotation is recorded as an audit event naming the new key, never a key.
	for _, want := range []string{"audit: key_rotation", "key_id=" + kr.Primary(), fmt.Sprintf("records=%d", n), "via=cli"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("audit line lacks %q: %s", want, errOut)
		}
	}
	if keyLines, _ := os.ReadFile(keysFile); strings.Contains(errOut, strings.Split(strings.Split(string(keyLines), "\n")[1], ":")[1]) {
		t.Error("the audit line contains key material")
	}
	if ids := kr.IDs(); len(ids) != 2 || ids[1] != oldKR.Primary() {
		t.Fatalf("key file holds %v; want the new primary then %s", ids, oldKR.Primary())
	}
	if want := fmt.Sprintf("re-encrypted %d records with key %s", n, kr.Primary()); !strings.Contains(out, want) {
		t.Fatalf("rotate output %q lacks %q", out, want)
	}
	if fi, _ := os.Stat(keysFile); fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v, want 0600", fi.Mode().Perm())
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".keys.tmp-*")); len(leftovers) > 0 {
		t.Fatalf("temporary files left: %v", leftovers)
	}

	// A second rotation is safe and re-encrypts everything again.
	out, _, err = runCmd(t, "keys", "rotate", "--keys-file", keysFile, "--store", dbPath)
	if err != nil || !strings.Contains(out, fmt.Sprintf("re-encrypted %d records", n)) {
		t.Fatalf("second rotate: %q, %v", out, err)
	}
	kr = checkSealed(t, dbPath, keysFile, n)

	out, _, err = runCmd(t, "keys", "status", "--keys-file", keysFile, "--store", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	ids := kr.IDs()
	for _, want := range []string{
		ids[0] + "  primary       " + fmt.Sprint(n),
		ids[1] + "  decrypt-only  0",
		"key " + ids[1] + " seals no records: it can be removed",
		"key " + ids[2] + " seals no records: it can be removed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	// Removing the old keys leaves a working store (status via BROKER_KEYS).
	primaryOnly := strings.SplitN(strings.TrimPrefix(kr.Format(), "# credbroker keys: the first is primary; the others are decrypt-only.\n"), "\n", 2)[0]
	t.Setenv("BROKER_KEYS", primaryOnly)
	out, _, err = runCmd(t, "keys", "status", "--store", dbPath)
	if err != nil || !strings.Contains(out, fmt.Sprintf("%s  primary  %d", ids[0], n)) {
		t.Fatalf("status with the primary key alone: %q, %v", out, err)
	}
}

func TestKeysStatusMissingKey(t *testing.T) {
	clearKeyEnv(t)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "v.db")
	oldLine := vault.GenerateKey()
	oldKR, _ := vault.ParseKeys(oldLine)
	newKR, _ := oldKR.WithNewPrimary()
	seedStore(t, dbPath, oldKR, 3)
	// One record gets sealed by the new key; then status runs with the old key only.
	s, err := openStore(dbPath, newKR)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateConnection(t.Context(), "c000", func(c vault.Connection) (vault.Connection, error) { return c, nil }); err != nil {
		t.Fatal(err)
	}
	s.Close()
	t.Setenv("BROKER_KEYS", oldLine)
	out, _, err := runCmd(t, "keys", "status", "--store", dbPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, newKR.Primary()+"  MISSING") || !strings.Contains(out, "1 records are sealed with key "+newKR.Primary()+", which the key ring lacks") {
		t.Fatalf("status output:\n%s", out)
	}
}

func TestKeysRotateWhileBrokerRuns(t *testing.T) {
	clearKeyEnv(t)
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys")
	dbPath := filepath.Join(dir, "broker.db")
	line := vault.GenerateKey()
	if err := os.WriteFile(keysFile, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	oldKR, _ := vault.ParseKeys(line)
	const n = 25
	seedStore(t, dbPath, oldKR, n)
	running, err := openStore(dbPath, oldKR) // "the broker"
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, _, err := runCmd(t, "keys", "rotate", "--keys-file", keysFile, "--store", dbPath)
	running.Close()
	if err != nil {
		t.Fatalf("rotate against a running broker: %v", err)
	}
	if !strings.Contains(out, "in use by a running broker: the key file was updated") || !strings.Contains(out, "re-encrypts every record when it next starts") {
		t.Fatalf("output %q does not explain what happened", out)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("rotate waited too long for the lock")
	}

	// The broker restarts with the new key file and re-encrypts in the background.
	kr, err := loadKeyring("", keysFile)
	if err != nil {
		t.Fatal(err)
	}
	s, err := openStore(dbPath, kr)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-startBackgroundRekey(t.Context(), s, s, kr, nil, nil):
	case <-time.After(30 * time.Second):
		t.Fatal("background rekey did not finish")
	}
	// The next start knows there is nothing to do.
	select {
	case <-startBackgroundRekey(context.Background(), s, s, kr, nil, nil):
	default:
		t.Fatal("second background rekey did not return at once")
	}
	s.Close()
	checkSealed(t, dbPath, keysFile, n)
}

// TestKeysStatusPostgres: keys status reads a shared PostgreSQL store, so
// operators can follow a rolling rotation there.
func TestKeysStatusPostgres(t *testing.T) {
	srv := pgtest.StartT(t)
	url := srv.Schema(t)
	dir := t.TempDir()
	oldLine, newLine := vault.GenerateKey(), vault.GenerateKey()
	oldRing, err := vault.ParseKeys(oldLine)
	if err != nil {
		t.Fatal(err)
	}
	st, err := openPostgres(url, oldRing)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"c1", "c2"} {
		if _, err := st.CreateConnection(context.Background(), vault.Connection{ID: id, Principal: vault.Principal{Issuer: "i", Subject: "s"},
			Provider: "demo", AccountID: id, Token: vault.TokenSet{AccessToken: vault.Secret("at-" + id)}}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	// Step 1 of the rolling procedure: the new key is added decrypt-only.
	keysFile := filepath.Join(dir, "keys")
	if err := os.WriteFile(keysFile, []byte(oldLine+"\n"+newLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, "keys", "status", "--keys-file", keysFile, "--store", url)
	if err != nil {
		t.Fatal(err)
	}
	oldID, _, _ := strings.Cut(oldLine, ":")
	newID, _, _ := strings.Cut(newLine, ":")
	for _, want := range []string{oldID + "  primary       2", newID + "  decrypt-only  0", "key " + newID + " seals no records"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
}

// TestParseFlagsArguments: arguments may come before, between or after
// the flags, and everything after "--" is an argument; one too many is a
// usage error naming the subcommand and the argument.
func TestParseFlagsArguments(t *testing.T) {
	for _, c := range []struct {
		args []string
		max  int
		want []string
		v    string
		err  string
	}{
		{[]string{"p", "-v", "1"}, 1, []string{"p"}, "1", ""},
		{[]string{"-v", "1", "p"}, 1, []string{"p"}, "1", ""},
		{[]string{"a", "-v", "1", "b"}, 2, []string{"a", "b"}, "1", ""},
		{[]string{"-v", "1", "--", "-x", "y"}, 2, []string{"-x", "y"}, "1", ""},
		{[]string{"--", "-v"}, 1, []string{"-v"}, "", ""},
		{nil, 1, nil, "", ""},
		{[]string{"p", "-v", "1", "x"}, 1, nil, "", `t: unexpected argument "x"`},
		{[]string{"p", "-nope"}, 1, nil, "", "flag provided but not defined: -nope"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		v := fs.String("v", "", "")
		got, err := parseFlags(fs, c.args, io.Discard, c.max)
		switch {
		case c.err != "":
			if err == nil || err.Error() != c.err || exitCode(err) != 2 {
				t.Errorf("%q: %v, want the usage error %q", c.args, err, c.err)
			}
		case err != nil || !slices.Equal(got, c.want) || *v != c.v:
			t.Errorf("%q: %q, -v %q, %v; want %q, -v %q", c.args, got, *v, err, c.want, c.v)
		}
	}
}

// TestUnexpectedArguments: every subcommand that takes no argument besides
// its flags (upstreams check takes one) refuses one more with a usage
// error naming the subcommand, and runs nothing.
func TestUnexpectedArguments(t *testing.T) {
	clearKeyEnv(t)
	for _, args := range [][]string{
		{"serve", "x"},
		{"dev", "--addr", "127.0.0.1:0", "x"},
		{"version", "x"},
		{"keys", "generate", "x"},
		{"keys", "status", "x"},
		{"keys", "rotate", "x"},
		{"upstreams", "check", "p", "x"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			name := strings.Join(args[:len(args)-1], " ")
			if args[0] == "upstreams" {
				name = "upstreams check"
			} else if args[0] == "dev" {
				name = "dev"
			}
			stdout, _, err := runCmd(t, args...)
			want := name + `: unexpected argument "x"`
			if err == nil || err.Error() != want || exitCode(err) != 2 {
				t.Fatalf("err = %v (exit %d), want %q (exit 2)", err, exitCode(err), want)
			}
			if stdout != "" {
				t.Fatalf("a refused command wrote %q", stdout)
			}
		})
	}
}
