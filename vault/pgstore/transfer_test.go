package pgstore_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

type transferEnd interface {
	vaulttest.Exporter
	vaulttest.Importer
}

// copyAll exports src into dst, a few records per call, and counts what
// dst added and skipped by kind.
func copyAll(t *testing.T, src, dst transferEnd) map[transfer.RecordKind][2]int {
	t.Helper()
	n := map[transfer.RecordKind][2]int{}
	err := src.ExportRecords(t.Context(), 2, func(rs transfer.Records) error {
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

// TestExportImportEveryKind: every kind of record written in PostgreSQL
// moves into bolt and from there into another database, each step
// keeping every record byte for byte; what PostgreSQL keeps in columns
// (a code's redemption, the outbox) comes out as the other stores keep
// it. A second copy adds nothing.
func TestExportImportEveryKind(t *testing.T) {
	srv := pgtest.Shared(t)
	kr := newKeyring(t)
	src := open(t, srv.Schema(t), kr)
	want := vaulttest.FillEveryKind(t, src)
	mid, err := boltstore.Open(filepath.Join(t.TempDir(), "mid.db"), kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mid.Close() })
	dst := open(t, srv.Schema(t), kr)

	for _, step := range []struct {
		name     string
		from, to transferEnd
	}{{"into bolt", src, mid}, {"into PostgreSQL", mid, dst}} {
		n := copyAll(t, step.from, step.to)
		for k, w := range want {
			if n[k] != [2]int{w, 0} {
				t.Errorf("%s, %s: added and skipped %v, want [%d 0]", step.name, k, n[k], w)
			}
		}
		vaulttest.SameRecords(t, step.from, step.to)
	}
	// Spent assertions stay spent in both: replay protection survives.
	vaulttest.StillSpent(t, mid)
	vaulttest.StillSpent(t, dst)
	vaulttest.UpstreamClientsKept(t, mid)
	vaulttest.UpstreamClientsKept(t, dst)
	vaulttest.IdPSessionsKept(t, mid)
	vaulttest.IdPSessionsKept(t, dst)
	// The code PostgreSQL redeemed (its column says so) is redeemed in bolt.
	if _, err := mid.RedeemAuthCode(t.Context(), vault.SecretKey("code-redeemed")); !errors.Is(err, vault.ErrCodeRedeemed) {
		t.Fatalf("a code redeemed in PostgreSQL, in bolt: %v; want ErrCodeRedeemed", err)
	}
	if _, err := dst.RedeemAuthCode(t.Context(), vault.SecretKey("code-open")); err != nil {
		t.Fatalf("the open code, after two moves: %v", err)
	}
	again := copyAll(t, mid, dst)
	for k, w := range want {
		if again[k] != [2]int{0, w} {
			t.Errorf("second copy, %s: added and skipped %v, want [0 %d]", k, again[k], w)
		}
	}
	vaulttest.MovedIdPSessionShut(t, vaulttest.Exported(t, src)[transfer.KindIdPSession], dst, dst)
}

// TestImportRefusals: an import the target cannot serve stores nothing
// of its batch and says why.
func TestImportRefusals(t *testing.T) {
	srv := pgtest.Shared(t)
	kr, other := newKeyring(t), newKeyring(t)
	src := open(t, srv.Schema(t), kr)
	vaulttest.FillEveryKind(t, src)
	all := vaulttest.Exported(t, src)
	dst := open(t, srv.Schema(t), other)
	tests := []struct {
		name string
		rs   transfer.Records
		want error
		say  string
	}{
		{"connection sealed with a key the target lacks", transfer.Records{Kind: transfer.KindConnection, Recs: all[transfer.KindConnection]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"retired connection too", transfer.Records{Kind: transfer.KindRetiredConnection, Recs: all[transfer.KindRetiredConnection]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"a delivery that is not one", transfer.Records{Kind: transfer.KindDelivery, Recs: append(all[transfer.KindDelivery], []byte(`{"v":1}`))}, vault.ErrMalformed, "delivery needs an id"},
		{"a spent assertion that is not one", transfer.Records{Kind: transfer.KindSpentAssertion,
			Recs: append(all[transfer.KindSpentAssertion], []byte(`{"v":2,"key":"jti-1"}`))}, vault.ErrMalformed, "spent assertion record version 2"},
		{"upstream client secret sealed with a key the target lacks", transfer.Records{Kind: transfer.KindUpstreamClient, Recs: all[transfer.KindUpstreamClient]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"an upstream client without client id", transfer.Records{Kind: transfer.KindUpstreamClient,
			Recs: [][]byte{[]byte(`{"v":1,"key":"https://as.example https://broker.example/cb"}`)}}, vault.ErrMalformed, "without client id"},
		{"IdP session sealed with a key the target lacks", transfer.Records{Kind: transfer.KindIdPSession, Recs: all[transfer.KindIdPSession]}, vault.ErrUnknownKey, "which the key ring lacks"},
		{"an IdP session without a person", transfer.Records{Kind: transfer.KindIdPSession,
			Recs: [][]byte{[]byte(`{"v":1,"iss":"https://idp.example","sub":"","tokens":""}`)}}, nil, "IdP session record without a person"},
		{"a record of no kind", transfer.Records{Kind: 99, Recs: all[transfer.KindGrant]}, nil, "unknown record kind 99"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			added, skipped, err := dst.ImportRecords(t.Context(), tt.rs)
			if err == nil || (tt.want != nil && !errors.Is(err, tt.want)) || !strings.Contains(err.Error(), tt.say) {
				t.Fatalf("import: %v; want %v saying %q", err, tt.want, tt.say)
			}
			if added != 0 || skipped != 0 {
				t.Fatalf("a refused import reports %d added, %d skipped", added, skipped)
			}
		})
	}
	got := vaulttest.Exported(t, dst)
	for k, recs := range got {
		if k != transfer.KindKeyCanary && len(recs) > 0 {
			t.Fatalf("refused imports stored %d %s", len(recs), k)
		}
	}
}
