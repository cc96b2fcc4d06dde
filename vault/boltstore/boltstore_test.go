package boltstore_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/internal/record"
	"credbroker/vault/vaulttest"
)

var alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}

// editRecord rewrites a stored connection record through edit, which sees
// and changes its JSON form (record.RecordJSON); the record is written back
// in the format the codec writes.
func editRecord(t *testing.T, s *boltstore.Store, id string, edit func(rec map[string]any)) {
	t.Helper()
	err := s.DB().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("connections"))
		js, err := record.RecordJSON(b.Get([]byte(id)))
		if err != nil {
			return err
		}
		var rec map[string]any
		if err := json.Unmarshal(js, &rec); err != nil {
			return err
		}
		edit(rec)
		nb, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if nb, err = record.RecordFromJSON(nb); err != nil {
			return err
		}
		return b.Put([]byte(id), nb)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func sealedTokens(t *testing.T, s *boltstore.Store, id string) []byte {
	t.Helper()
	var ct []byte
	editRecord(t, s, id, func(rec map[string]any) {
		var err error
		ct, err = base64.StdEncoding.DecodeString(rec["tokens"].(string))
		if err != nil {
			t.Fatal(err)
		}
	})
	return ct
}

func setTokens(t *testing.T, s *boltstore.Store, id string, ct []byte) {
	t.Helper()
	editRecord(t, s, id, func(rec map[string]any) { rec["tokens"] = base64.StdEncoding.EncodeToString(ct) })
}

func wantCryptoErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("read of tampered record succeeded")
	}
	if !errors.Is(err, vault.ErrDecrypt) && !errors.Is(err, vault.ErrMalformed) && !errors.Is(err, vault.ErrUnknownKey) {
		t.Fatalf("err = %v; want ErrDecrypt, ErrMalformed or ErrUnknownKey", err)
	}
	if strings.Contains(err.Error(), "secret") {
		t.Fatalf("error leaks token material: %v", err)
	}
}

func TestTamperEveryByte(t *testing.T) {
	kr := newKeyring(t)
	s := openStore(t, filepath.Join(t.TempDir(), "v.db"), kr)
	s.DB().NoSync = true // hundreds of rewrites; durability is not under test here
	ctx := t.Context()
	if _, err := s.CreateConnection(ctx, vaulttest.Conn("c1", alice, "github", "1")); err != nil {
		t.Fatal(err)
	}
	orig := sealedTokens(t, s, "c1")
	for i := range orig {
		for _, mask := range []byte{0x01, 0x80} {
			ct := bytes.Clone(orig)
			ct[i] ^= mask
			setTokens(t, s, "c1", ct)
			_, err := s.GetConnection(ctx, "c1")
			if err == nil {
				t.Fatalf("byte %d ^ %#x: tampered ciphertext opened", i, mask)
			}
			wantCryptoErr(t, err)
			// A listing opens no token set, so it cannot tell a flipped
			// ciphertext byte (only a damaged envelope header); what it
			// returns is metadata, and the tokens still never open.
			list, err := s.ListConnections(ctx, alice)
			if err == nil && (len(list) != 1 || !list[0].Token.IsZero()) {
				t.Fatalf("byte %d ^ %#x: listing returned %d records with tokens", i, mask, len(list))
			}
			if err != nil {
				wantCryptoErr(t, err)
			}
		}
	}
	for _, n := range []int{0, 1, 2, len(orig) / 2, len(orig) - 1} {
		setTokens(t, s, "c1", orig[:n])
		_, err := s.GetConnection(ctx, "c1")
		wantCryptoErr(t, err)
	}
	setTokens(t, s, "c1", orig)
	if _, err := s.GetConnection(ctx, "c1"); err != nil {
		t.Fatalf("restored ciphertext: %v", err)
	}
}

func TestTamperMovedAndRelabelled(t *testing.T) {
	kr := newKeyring(t)
	s := openStore(t, filepath.Join(t.TempDir(), "v.db"), kr)
	ctx := t.Context()
	bob := vault.Principal{Issuer: alice.Issuer, Subject: "bob"}
	for _, c := range []vault.Connection{
		vaulttest.Conn("a1", alice, "github", "1"),
		vaulttest.Conn("b1", bob, "github", "2"),
	} {
		if _, err := s.CreateConnection(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name string
		edit func(t *testing.T)
		get  string
	}{
		{"ciphertext moved to another record", func(t *testing.T) { setTokens(t, s, "b1", sealedTokens(t, s, "a1")) }, "b1"},
		{"record relabelled to another principal", func(t *testing.T) {
			editRecord(t, s, "b1", func(r map[string]any) { r["sub"] = "alice" })
		}, "b1"},
		{"record relabelled to another account", func(t *testing.T) {
			editRecord(t, s, "a1", func(r map[string]any) { r["account_id"] = "666" })
		}, "a1"},
		{"record relabelled to another provider", func(t *testing.T) {
			editRecord(t, s, "a1", func(r map[string]any) { r["provider"] = "google" })
		}, "a1"},
		{"unknown key id", func(t *testing.T) {
			ct := sealedTokens(t, s, "a1")
			kid := string(ct[2 : 2+int(ct[1])])
			setTokens(t, s, "a1", bytes.Replace(ct, []byte(kid), []byte(strings.Repeat("z", len(kid))), 1))
		}, "a1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := map[string]map[string]any{}
			for _, id := range []string{"a1", "b1"} {
				editRecord(t, s, id, func(r map[string]any) { before[id] = r })
			}
			tt.edit(t)
			_, err := s.GetConnection(ctx, tt.get)
			wantCryptoErr(t, err)
			if tt.name == "unknown key id" && !errors.Is(err, vault.ErrUnknownKey) {
				t.Fatalf("err = %v, want ErrUnknownKey", err)
			}
			for id, r := range before {
				editRecord(t, s, id, func(cur map[string]any) { clear(cur); maps(cur, r) })
			}
		})
	}
	// Copying a whole record under another id is caught too.
	err := s.DB().Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("connections"))
		return b.Put([]byte("b1"), bytes.Clone(b.Get([]byte("a1"))))
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.GetConnection(ctx, "b1")
	wantCryptoErr(t, err)
	_, err = s.ListConnections(ctx, bob)
	wantCryptoErr(t, err)
}

func maps(dst, src map[string]any) {
	for k, v := range src {
		dst[k] = v
	}
}

func TestFileNeverHoldsPlaintextTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	kr := newKeyring(t)
	s := openStore(t, path, kr)
	ctx := t.Context()
	var tokens []string
	for i := range 20 {
		c := vaulttest.Conn(fmt.Sprintf("c%02d", i), alice, "github", fmt.Sprint(i))
		tokens = append(tokens, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(), c.Token.IDToken.Reveal())
		if _, err := s.CreateConnection(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 10 {
		rt := fmt.Sprintf("rotated-refresh-%02d-secret", i)
		tokens = append(tokens, rt)
		if _, err := s.UpdateConnection(ctx, fmt.Sprintf("c%02d", i), func(c vault.Connection) (vault.Connection, error) {
			c.Token.RefreshToken = vault.Secret(rt)
			return c, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 5 {
		if err := s.DeleteConnection(ctx, fmt.Sprintf("c%02d", 10+i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The search works: metadata is stored in the clear.
	if !bytes.Contains(raw, []byte("19@example.com")) {
		t.Fatal("account login not found in the file: the byte search is broken")
	}
	for _, tok := range tokens {
		for _, form := range []string{tok, base64.StdEncoding.EncodeToString([]byte(tok)), strings.TrimSuffix(tok, "-secret")} {
			if bytes.Contains(raw, []byte(form)) {
				t.Errorf("database file contains token %q in plaintext", form)
			}
		}
	}
}

func TestFileMode(t *testing.T) {
	dir := t.TempDir()
	kr := newKeyring(t)
	fresh := filepath.Join(dir, "fresh.db")
	openStore(t, fresh, kr)
	loose := filepath.Join(dir, "loose.db")
	s, err := boltstore.Open(loose, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	openStore(t, loose, kr)
	for _, p := range []string{fresh, loose} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(p), fi.Mode().Perm())
		}
	}
}

func TestLocked(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	kr := newKeyring(t)
	openStore(t, path, kr)
	start := time.Now()
	_, err := boltstore.Open(path, kr, boltstore.Options{Timeout: 100 * time.Millisecond})
	if !errors.Is(err, boltstore.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if want := "database " + path + " is locked: is another broker running?"; err.Error() != want {
		t.Fatalf("error = %q, want %q", err, want)
	}
	if time.Since(start) > 2*time.Second {
		t.Fatal("second open waited too long")
	}
}

func TestCorruptFiles(t *testing.T) {
	dir := t.TempDir()
	kr := newKeyring(t)
	valid := func(t *testing.T) []byte {
		p := filepath.Join(t.TempDir(), "ok.db")
		s, err := boltstore.Open(p, kr, boltstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 50 {
			if _, err := s.CreateConnection(t.Context(), vaulttest.Conn(fmt.Sprintf("c%d", i), alice, "github", fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	foreign := func(t *testing.T) []byte {
		p := filepath.Join(t.TempDir(), "foreign.db")
		db, err := bolt.Open(p, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
		db.Close()
		b, _ := os.ReadFile(p)
		return b
	}
	pageSize := os.Getpagesize()
	tests := []struct {
		name    string
		content func(t *testing.T) []byte
		want    error
	}{
		{"text file", func(*testing.T) []byte { return []byte(strings.Repeat("not a database\n", 1000)) }, boltstore.ErrCorrupt},
		{"random bytes", func(*testing.T) []byte {
			b := make([]byte, 4*pageSize)
			for i := range b {
				b[i] = byte(i*7 + i>>8)
			}
			return b
		}, boltstore.ErrCorrupt},
		{"truncated header", func(t *testing.T) []byte { return valid(t)[:100] }, boltstore.ErrCorrupt},
		{"both meta pages damaged", func(t *testing.T) []byte {
			b := valid(t)
			b[0x20] ^= 0xff
			b[pageSize+0x20] ^= 0xff
			return b
		}, boltstore.ErrCorrupt},
		{"data pages overwritten", func(t *testing.T) []byte {
			b := valid(t)
			for i := 2 * pageSize; i < len(b); i++ {
				b[i] = 0xab
			}
			return b
		}, boltstore.ErrCorrupt},
		{"bolt file of another program", foreign, boltstore.ErrCorrupt},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("bad%d.db", i))
			if err := os.WriteFile(path, tt.content(t), 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := boltstore.Open(path, kr, boltstore.Options{})
			if err == nil {
				// Some damage only shows on reads; it must still be an error.
				_, err = s.ListConnections(t.Context(), alice)
				s.Close()
			}
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if !strings.Contains(err.Error(), path) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q must be one line naming the file", err)
			}
		})
	}
}

func TestWrongKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	kr := newKeyring(t)
	s, err := boltstore.Open(path, kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateConnection(t.Context(), vaulttest.Conn("c1", alice, "github", "1")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	id := kr.Primary()
	sameIDOtherKey, err := vault.ParseKeys(id + ":" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		kr   *vault.Keyring
		msg  string
	}{
		{"same id, other key", sameIDOtherKey, "key " + id + " does not match the one this database was written with"},
		{"unrelated key ring", newKeyring(t), "was written with " + id},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := boltstore.Open(path, tt.kr, boltstore.Options{})
			if !errors.Is(err, boltstore.ErrWrongKey) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("err = %v, want ErrWrongKey mentioning %q", err, tt.msg)
			}
		})
	}
	// The right key still opens everything.
	s = openStore(t, path, kr)
	if _, err := s.GetConnection(t.Context(), "c1"); err != nil {
		t.Fatal(err)
	}
}

func TestUnknownKeyOnRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	old := newKeyring(t)
	next, err := old.WithNewPrimary()
	if err != nil {
		t.Fatal(err)
	}
	s, err := boltstore.Open(path, next, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateConnection(t.Context(), vaulttest.Conn("c1", alice, "github", "1")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	// Opening with only the old key works (it matches its canary), but the
	// record sealed with the new key names a key the ring lacks.
	s = openStore(t, path, old)
	_, err = s.GetConnection(t.Context(), "c1")
	if !errors.Is(err, vault.ErrUnknownKey) || !strings.Contains(err.Error(), next.Primary()) {
		t.Fatalf("err = %v, want ErrUnknownKey naming %s", err, next.Primary())
	}
}

func TestSchemaVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.db")
	kr := newKeyring(t)
	s := openStore(t, path, kr)
	if err := s.DB().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte("9"))
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	_, err := boltstore.Open(path, kr, boltstore.Options{})
	if err == nil || !strings.Contains(err.Error(), `schema version "9"`) {
		t.Fatalf("err = %v, want a schema version error", err)
	}
}

func TestImport(t *testing.T) {
	s := openStore(t, filepath.Join(t.TempDir(), "v.db"), newKeyring(t))
	ctx := t.Context()
	var batch []vault.Connection
	for i := range 5 {
		batch = append(batch, vaulttest.Conn(fmt.Sprintf("i%d", i), alice, "github", fmt.Sprint(i)))
	}
	if err := s.Import(ctx, batch); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListConnections(ctx, alice)
	if err != nil || len(list) != 5 || list[0].Version != 1 {
		t.Fatalf("after import: %d listed, %v", len(list), err)
	}
	// One taken id aborts the whole import.
	again := []vault.Connection{vaulttest.Conn("new", alice, "github", "9"), batch[2]}
	if err := s.Import(ctx, again); !errors.Is(err, vault.ErrExists) {
		t.Fatalf("import with a taken id: %v, want ErrExists", err)
	}
	if _, err := s.GetConnection(ctx, "new"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("failed import stored a record: %v", err)
	}
}

// storedRecord returns connection id's record as stored.
func storedRecord(t *testing.T, s *boltstore.Store, id string) []byte {
	t.Helper()
	var rec []byte
	if err := s.DB().View(func(tx *bolt.Tx) error {
		rec = bytes.Clone(tx.Bucket([]byte("connections")).Get([]byte(id)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestFormat1RecordsInAFile: a file written by an earlier release (a
// format 1 JSON record around a JSON token plaintext, from vault's
// testdata, sealed with the fixed fuzz key) serves reads as before, and
// its record is rewritten in format 2 by the next metadata update and by
// the next full update, tokens intact.
func TestFormat1RecordsInAFile(t *testing.T) {
	old, err := os.ReadFile("../internal/record/testdata/connection-before-key-fields.json")
	if err != nil {
		t.Fatal(err)
	}
	old = bytes.TrimSpace(old)
	kr, err := vault.NewKeyring([]string{"fz"}, [][]byte{bytes.Repeat([]byte{1}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, filepath.Join(t.TempDir(), "v.db"), kr)
	ctx := t.Context()
	want := vaulttest.Conn("old1", alice, "github", "1")
	if _, err := s.CreateConnection(ctx, want); err != nil { // the index entries
		t.Fatal(err)
	}
	if err := s.DB().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("connections")).Put([]byte("old1"), old)
	}); err != nil {
		t.Fatal(err)
	}
	c, err := s.GetConnection(ctx, "old1")
	if err != nil || !c.Token.Equal(want.Token) || c.AccountLogin != want.AccountLogin {
		t.Fatalf("format 1 record: %+v %v", c, err)
	}
	if list, err := s.ListConnections(ctx, alice); err != nil || len(list) != 1 || list[0].ID != "old1" {
		t.Fatalf("listing a format 1 record: %v %v", list, err)
	}
	if !bytes.Equal(storedRecord(t, s, "old1"), old) {
		t.Fatal("a read rewrote the record")
	}
	if _, err := s.UpdateConnectionMeta(ctx, "old1", func(c vault.Connection) (vault.Connection, error) {
		c.LastUsed = c.Updated
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if rec := storedRecord(t, s, "old1"); rec[0] != 0x02 {
		t.Fatalf("after a metadata update the record starts %q, want format 2", rec[:1])
	}
	if c, err := s.GetConnection(ctx, "old1"); err != nil || !c.Token.Equal(want.Token) || c.LastUsed.IsZero() {
		t.Fatalf("after a metadata update: %v", err)
	}
	if _, err := s.UpdateConnection(ctx, "old1", func(c vault.Connection) (vault.Connection, error) {
		c.Token.AccessToken = "at-new-secret"
		return c, nil
	}); err != nil {
		t.Fatal(err)
	}
	if rec := storedRecord(t, s, "old1"); rec[0] != 0x02 {
		t.Fatalf("after an update the record starts %q, want format 2", rec[:1])
	}
	if c, err := s.GetConnection(ctx, "old1"); err != nil || c.Token.AccessToken != "at-new-secret" || c.Token.RefreshToken != want.Token.RefreshToken {
		t.Fatalf("after an update: %v", err)
	}
}
