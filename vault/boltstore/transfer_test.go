package boltstore_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/vaulttest"
)

// copyAll exports src into dst, a few records per call, and counts what
// dst added and skipped by kind.
func copyAll(t *testing.T, src, dst *boltstore.Store) map[transfer.RecordKind][2]int {
	t.Helper()
	n := map[transfer.RecordKind][2]int{}
	err := src.ExportRecords(t.Context(), 2, func(rs transfer.Records) error {
		if len(rs.Recs) > 2 {
			t.Errorf("%s: a batch of %d, more than asked", rs.Kind, len(rs.Recs))
		}
		added, skipped, err := dst.ImportRecords(t.Context(), rs)
		c := n[rs.Kind]
		n[rs.Kind] = [2]int{c[0] + added, c[1] + skipped}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestExportImportEveryKind: every kind of record moves from one store
// to another byte for byte, with the indexes the target needs to serve
// it; a second copy adds nothing.
func TestExportImportEveryKind(t *testing.T) {
	kr := newKeyring(t)
	src := openStore(t, filepath.Join(t.TempDir(), "src.db"), kr)
	want := vaulttest.FillEveryKind(t, src)
	dst := openStore(t, filepath.Join(t.TempDir(), "dst.db"), kr)

	n := copyAll(t, src, dst)
	for k, w := range want {
		if n[k] != [2]int{w, 0} {
			t.Errorf("%s: added and skipped %v, want [%d 0]", k, n[k], w)
		}
	}
	if n[transfer.KindKeyCanary] != [2]int{0, 1} {
		t.Errorf("key canaries: added and skipped %v; the target has its own", n[transfer.KindKeyCanary])
	}
	vaulttest.SameRecords(t, src, dst)

	// The target's indexes were made: it serves what it imported.
	ctx := t.Context()
	alice := vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	if list, err := dst.ListConnections(ctx, alice); err != nil || len(list) != 3 {
		t.Fatalf("alice's connections in the target: %d, %v", len(list), err)
	}
	now := time.Date(2026, 7, 28, 12, 1, 0, 0, time.UTC) // FillEveryKind's records are of 12:00
	if created, open, err := dst.CountGrants(ctx, alice, time.Time{}, now); err != nil || created != 2 || open != 1 {
		t.Fatalf("alice's grants in the target: %d created, %d open, %v", created, open, err)
	}
	if _, err := dst.FindAppAccess(ctx, alice, "client-public"); err != nil {
		t.Fatalf("app access by person and client: %v", err)
	}
	if n, _, err := dst.OutboxDepth(ctx); err != nil || n != 3 {
		t.Fatalf("outbox depth %d, %v", n, err)
	}
	vaulttest.StillSpent(t, dst)
	vaulttest.UpstreamClientsKept(t, dst)
	vaulttest.IdPSessionsKept(t, dst)

	again := copyAll(t, src, dst)
	for k, w := range want {
		if again[k] != [2]int{0, w} {
			t.Errorf("second copy, %s: added and skipped %v, want [0 %d]", k, again[k], w)
		}
	}
	vaulttest.SameRecords(t, src, dst)
	vaulttest.MovedIdPSessionShut(t, vaulttest.Exported(t, src)[transfer.KindIdPSession], dst, dst)
}

// TestImportRefusals: an import that cannot be served by the target
// stores nothing of its batch and says why.
func TestImportRefusals(t *testing.T) {
	kr, other := newKeyring(t), newKeyring(t)
	src := openStore(t, filepath.Join(t.TempDir(), "src.db"), kr)
	vaulttest.FillEveryKind(t, src)
	all := vaulttest.Exported(t, src)
	dst := openStore(t, filepath.Join(t.TempDir(), "dst.db"), other)
	sameID, err := vault.NewKeyring([]string{kr.Primary()}, [][]byte{bytes.Repeat([]byte{7}, 32)})
	if err != nil {
		t.Fatal(err)
	}
	impostor := openStore(t, filepath.Join(t.TempDir(), "impostor.db"), sameID)

	tests := []struct {
		name string
		dst  *boltstore.Store
		rs   transfer.Records
		want error
		say  string
	}{
		{"connection sealed with a key the target lacks", dst, transfer.Records{Kind: transfer.KindConnection, Recs: all[transfer.KindConnection]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"retired connection too", dst, transfer.Records{Kind: transfer.KindRetiredConnection, Recs: all[transfer.KindRetiredConnection]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"canary of another key with the same id", impostor, transfer.Records{Kind: transfer.KindKeyCanary, Recs: all[transfer.KindKeyCanary]}, boltstore.ErrWrongKey, "does not match the one the source was written with"},
		{"a grant that is not one", dst, transfer.Records{Kind: transfer.KindGrant, Recs: append(slices.Clone(all[transfer.KindGrant]), []byte(`{"v":9}`))}, nil, "grant record version 9"},
		{"a spent assertion whose key is no assertion key", dst, transfer.Records{Kind: transfer.KindSpentAssertion,
			Recs: append(slices.Clone(all[transfer.KindSpentAssertion]), []byte(`{"v":1,"key":"jti-1","expires_ns":1}`))}, nil, "assertion key must be 43"},
		{"upstream client secret sealed with a key the target lacks", dst, transfer.Records{Kind: transfer.KindUpstreamClient, Recs: all[transfer.KindUpstreamClient]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"an upstream client without client id", dst, transfer.Records{Kind: transfer.KindUpstreamClient,
			Recs: [][]byte{[]byte(`{"v":1,"key":"https://as.example https://broker.example/cb"}`)}}, vault.ErrMalformed, "without client id"},
		{"IdP session sealed with a key the target lacks", dst, transfer.Records{Kind: transfer.KindIdPSession, Recs: all[transfer.KindIdPSession]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"an IdP session without a person", dst, transfer.Records{Kind: transfer.KindIdPSession,
			Recs: [][]byte{[]byte(`{"v":1,"iss":"https://idp.example","sub":"","tokens":""}`)}}, nil, "IdP session record without a person"},
		{"a record of no kind", dst, transfer.Records{Kind: 99, Recs: all[transfer.KindGrant]}, nil, "unknown record kind 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := vaulttest.Exported(t, tt.dst)
			added, skipped, err := tt.dst.ImportRecords(t.Context(), tt.rs)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.say) {
				t.Fatalf("import: %v; want %v saying %q", err, tt.want, tt.say)
			}
			if added != 0 || skipped != 0 {
				t.Fatalf("a refused import reports %d added, %d skipped", added, skipped)
			}
			after := vaulttest.Exported(t, tt.dst)
			for k := range transfer.LastKind + 1 {
				if !slices.EqualFunc(before[k], after[k], bytes.Equal) {
					t.Fatalf("a refused import changed the %s", k)
				}
			}
		})
	}
}

// TestImportClearsFullySealed: records imported into a file marked fully
// sealed may be sealed with another key of the ring, so an import that adds
// any clears the mark and the next start's re-seal pass looks at them; one
// that adds nothing keeps it.
func TestImportClearsFullySealed(t *testing.T) {
	kr := newKeyring(t)
	src := openStore(t, filepath.Join(t.TempDir(), "src.db"), kr)
	vaulttest.FillEveryKind(t, src)
	dst := openStore(t, filepath.Join(t.TempDir(), "dst.db"), kr)
	if err := dst.MarkFullySealed(); err != nil || !dst.FullySealed() {
		t.Fatalf("marked: FullySealed %v, %v", dst.FullySealed(), err)
	}
	copyAll(t, src, dst)
	if dst.FullySealed() {
		t.Fatal("FullySealed after an import that added records")
	}
	if err := dst.MarkFullySealed(); err != nil {
		t.Fatal(err)
	}
	copyAll(t, src, dst) // everything is there already: nothing added
	if !dst.FullySealed() {
		t.Fatal("an import that added nothing cleared the mark")
	}
}
