package main

import (
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"credbroker/internal/telemetry"
	"credbroker/internal/tracing"
	"credbroker/vault"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/vault/vaulttest"
)

// TestObserveStoreEveryFeature: the store the broker runs on
// (observeStore over PostgreSQL as serve opens it, the backend with every
// feature) times and traces every operation of every feature:
// connections, grants, the one-transaction connect, the authorization
// server's records, the outbox, admin actions, the assertion ledger,
// locks, re-sealing and the feed of app changes. The
// operations are enumerated by reflection on vault.Store
// (vaulttest.EveryOperation), so a feature added to the store is checked
// here without this test changing, and fails it until it is observed.
func TestObserveStoreEveryFeature(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	backend, err := openStore(pgtest.StartT(t).Schema(t), kr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	rec := telemetry.New(telemetry.Options{})
	mem := tracetest.NewInMemoryExporter()
	s := observeStore(backend, rec, tracing.NewSyncProvider(mem))
	timed := map[string]uint64{}
	ops := vaulttest.EveryOperation(t, s)
	if len(ops) < 40 {
		t.Fatalf("%d operations found: the enumeration misses features", len(ops))
	}
	for _, op := range ops {
		what := op.Feature + "." + op.Method
		mem.Reset()
		op.Call(t.Context())
		spans := mem.GetSpans()
		if len(spans) != 1 {
			t.Errorf("%s: %d spans, want one vault.<operation> span", what, len(spans))
			continue
		}
		name, ok := strings.CutPrefix(spans[0].Name, "vault.")
		if !ok || !vaulttest.IsOpName(name, op.Method) {
			t.Errorf("%s: span %q, want vault. and the method's name in snake case", what, spans[0].Name)
			continue
		}
		if len(spans[0].Attributes) != 1 || spans[0].Attributes[0].Key != "vault.operation" || spans[0].Attributes[0].Value.AsString() != name {
			t.Errorf("%s: span attributes %v, want vault.operation=%s alone", what, spans[0].Attributes, name)
		}
		before := timed[name]
		timed = vaultOpCounts(t, rec)
		if timed[name] != before+1 {
			t.Errorf("%s: credbroker_vault_operation_duration_seconds{op=%q} counted %d, want %d", what, name, timed[name], before+1)
		}
	}
}

// vaultOpCounts returns credbroker_vault_operation_duration_seconds's
// observation count by op, over every outcome.
func vaultOpCounts(t *testing.T, rec *telemetry.Recorder) map[string]uint64 {
	t.Helper()
	mfs, err := rec.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]uint64{}
	for _, mf := range mfs {
		if mf.GetName() != "credbroker_vault_operation_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" {
					n[l.GetValue()] += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}
