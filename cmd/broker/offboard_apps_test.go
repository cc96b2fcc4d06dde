package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"credbroker/apps"
	"credbroker/binding"
	"credbroker/connections"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/webhook"
)

// TestOffboardRemovesAppGrants: offboarding a person removes every app
// they allowed at the broker's authorization server (another person's
// stays), writes app.removed for each with its removal and audits each
// (app_removed, naming the operator), and a second run finds nothing.
func TestOffboardRemovesAppGrants(t *testing.T) {
	ctx := context.Background()
	kr, _ := vault.ParseKeys(vault.GenerateKey())
	secret := "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	ep, err := webhook.NewEndpoint("apps", "https://hooks.example.test/in", secret, []string{webhook.AppRemoved})
	if err != nil {
		t.Fatal(err)
	}
	events := webhook.NewPublisher(&webhook.Config{Endpoints: []webhook.Endpoint{ep}}, nil)
	store := memstore.NewWith(kr, memstore.Options{Changes: events.Hook(), AppChanges: events.AppHook()})
	alice := vault.Principal{Issuer: "https://idp.test", Subject: "alice"}
	bob := vault.Principal{Issuer: "https://idp.test", Subject: "bob"}
	now := time.Now()
	for _, a := range []vault.AppAccess{
		{ID: "app-a1", Principal: alice, ClientID: "https://claude.example/client", ClientName: "Claude", Created: now, Updated: now},
		{ID: "app-a2", Principal: alice, ClientID: "urn:credbroker:reg:x", ClientName: "Cursor", Created: now, Updated: now},
		{ID: "app-b1", Principal: bob, ClientID: "https://claude.example/client", ClientName: "Claude", Created: now, Updated: now},
	} {
		if _, err := store.CreateAppAccess(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	reg, err := provider.ParseProviders("t", []byte("providers:\n  demo:\n    type: oauth2\n    authorization_url: http://127.0.0.1:1/a\n    token_url: http://127.0.0.1:1/t\n    client_id: c\n    client_secret: ${S}\n    account: {url: http://127.0.0.1:1/u, id_field: id}\n"),
		func(string) string { return "s" })
	if err != nil {
		t.Fatal(err)
	}
	client, _ := provider.New(provider.Options{Store: store, Providers: reg})
	logs, audit := &logbuf.Buffer{}, &logbuf.Buffer{}
	log := newLogger(logs, "json", 0)
	rec := telemetry.New(telemetry.Options{Audit: newLogger(audit, "json", 0)})
	appSvc, err := appsCore(store, soleWriter(store), apps.Policy{}, rec, log)
	if err != nil {
		t.Fatal(err)
	}
	conns, err := connections.New(connections.Options{Store: store, Grants: binding.New(store, binding.Options{}), Client: client,
		PublicURL: "https://broker.test", Logger: log, Telemetry: rec, Offboard: offboardApps(appSvc)})
	if err != nil {
		t.Fatal(err)
	}
	admin := connections.Admin{Principal: vault.Principal{Issuer: "local", Subject: "root"}, Via: "cli"}
	rep, err := conns.Offboard(ctx, admin, alice)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(rep)
	if !strings.Contains(string(raw), `"app grants"`) || !strings.Contains(string(raw), `"Removed":2`) {
		t.Fatalf("report: %s", raw)
	}
	if left, _ := store.ListAppAccess(ctx, alice); len(left) != 0 {
		t.Fatalf("alice still has %d apps", len(left))
	}
	if left, _ := store.ListAppAccess(ctx, bob); len(left) != 1 {
		t.Fatalf("bob has %d apps, want his one untouched", len(left))
	}
	ds, err := store.ClaimDeliveries(ctx, time.Now().Add(time.Minute), 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var clients []string
	for _, d := range ds {
		var body struct {
			Type string          `json:"type"`
			Data webhook.AppData `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &body); err != nil || body.Type != webhook.AppRemoved || body.Data.Principal.Subject != "alice" {
			t.Fatalf("delivery %s: %v", d.Payload, err)
		}
		clients = append(clients, body.Data.ClientID)
	}
	if len(clients) != 2 {
		t.Fatalf("app.removed events for %v, want both of alice's apps", clients)
	}
	for _, client := range []string{"https://claude.example/client", "urn:credbroker:reg:x"} {
		want := `"event":"app_removed","principal":{"iss":"https://idp.test","sub":"alice"},"admin":{"iss":"local","sub":"root"},"client":"` + client + `","via":"cli"`
		if !strings.Contains(audit.String(), want) {
			t.Errorf("no audit event %s in:\n%s", want, audit)
		}
	}
	again, err := conns.Offboard(ctx, admin, alice)
	if raw, _ := json.Marshal(again); err != nil || strings.Contains(string(raw), `"Removed":2`) {
		t.Fatalf("second run: %s %v", raw, err)
	}
}
