package sidecar_test

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"credbroker/internal/tracing"
	"credbroker/sidecar/client"
	"credbroker/sidecar/sidecartest"
)

// TestTraceSidecarProxy: with tracing on, a /v1/proxy call is one
// "sidecar.request" server span (the route's fixed name, the configured
// server, the status) under which the provider call runs; a refused call
// is a span too; no attribute, event or status carries the sidecar
// secret, the user's token, the principal or a provider token.
func TestTraceSidecarProxy(t *testing.T) {
	mem := tracetest.NewInMemoryExporter()
	st := sidecartest.Start(t, sidecartest.Options{Tracing: tracing.NewSyncProvider(mem)})
	ctx := context.Background()
	sc, err := client.New(st.URL, st.Secret, nil)
	if err != nil {
		t.Fatal(err)
	}
	alice := st.UserToken("alice", "")
	rr, err := sc.Require(ctx, alice, client.RequireRequest{Provider: "demo"})
	if err != nil || rr.Status != "input_required" {
		t.Fatalf("require: %+v %v", rr, err)
	}
	st.CompleteConnect(rr.InputRequest.Params.URL, "alice", "1001")
	mem.Reset()
	resp, err := sc.Do(ctx, alice, "demo", client.Request{Path: "/repos?page=2"})
	if err != nil || resp.Status != 200 {
		t.Fatalf("proxy: %+v %v", resp, err)
	}
	spans := mem.GetSpans()
	var root *tracetest.SpanStub
	for i := range spans {
		if spans[i].Name == "sidecar.request" {
			root = &spans[i]
		}
	}
	if root == nil {
		t.Fatalf("no sidecar.request span among %d", len(spans))
	}
	attrs := map[string]string{}
	for _, a := range root.Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["sidecar.route"] != "proxy" || attrs["http.response.status_code"] != "200" || attrs["sidecar.server"] == "" {
		t.Errorf("sidecar.request attributes %v", attrs)
	}
	children := map[string]bool{}
	for _, sp := range spans {
		if sp.Parent.SpanID() == root.SpanContext.SpanID() {
			children[sp.Name] = true
		}
	}
	if !children["provider.request"] {
		t.Errorf("provider.request is not a child of sidecar.request (children %v)", children)
	}

	// A refused call (wrong secret) is traced too, as a 401.
	mem.Reset()
	bad, err := client.New(st.URL, "not-the-secret-0123456789", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Do(ctx, alice, "demo", client.Request{Path: "/repos"}); err == nil {
		t.Fatal("a wrong sidecar secret was accepted")
	}
	if sp := mem.GetSpans(); len(sp) != 1 || sp[0].Name != "sidecar.request" {
		t.Fatalf("refused call: spans %v", sp)
	}

	secrets := append([]string{st.Secret, alice, st.Principal("alice").Subject, "page=2"}, st.ProviderTokens()...)
	for _, sp := range append(spans, mem.GetSpans()...) {
		var all []string
		for _, a := range sp.Attributes {
			all = append(all, a.Value.Emit())
		}
		for _, e := range sp.Events {
			all = append(all, e.Name)
			for _, a := range e.Attributes {
				all = append(all, a.Value.Emit())
			}
		}
		all = append(all, sp.Status.Description)
		text := strings.Join(all, "\n")
		for _, s := range secrets {
			if s != "" && strings.Contains(text, s) {
				t.Errorf("span %s carries a secret (%s…)", sp.Name, clip(s))
			}
		}
	}
}

func clip(s string) string {
	if len(s) > 6 {
		return s[:6]
	}
	return s
}
