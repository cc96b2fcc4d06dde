package apps_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"credbroker/apps"
	"credbroker/internal/logbuf"
	"credbroker/internal/telemetry"
	"credbroker/vault"
	"credbroker/vault/memstore"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
	"credbroker/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var (
	alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	bob   = vault.Principal{Issuer: "https://idp.example", Subject: "bob"}
	root  = vault.Principal{Issuer: "https://idp.example", Subject: "root"}
)

func keyring(t *testing.T) *vault.Keyring {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// publisher sends every event to one endpoint, as cmd/broker wires it.
func publisher(t *testing.T) *webhook.Publisher {
	t.Helper()
	ep, err := webhook.NewEndpoint("ops", "https://hooks.example.test/in", "whsec_"+base64.StdEncoding.EncodeToString(make([]byte, 32)), nil)
	if err != nil {
		t.Fatal(err)
	}
	return webhook.NewPublisher(&webhook.Config{Endpoints: []webhook.Endpoint{ep}}, nil)
}

// events returns the outbox's events as "type subject client", sorted.
func events(t *testing.T, o vault.Outbox) []string {
	t.Helper()
	ds, err := o.ClaimDeliveries(t.Context(), time.Now().Add(time.Hour), 0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range ds {
		var p struct {
			Data webhook.AppData `json:"data"`
		}
		if err := json.Unmarshal(d.Payload, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, d.Type+" "+p.Data.Principal.Subject+" "+p.Data.ClientID)
	}
	slices.Sort(out)
	return out
}

func request(p vault.Principal, client string) apps.Request {
	return apps.Request{Principal: p, ClientID: client, ClientName: "Claude", RedirectURI: "https://claude.example/cb", Scopes: []string{"mcp"}}
}

// approved has p approve client and gives the app a token family.
func approved(t *testing.T, svc *apps.Service, p vault.Principal, client string) (app vault.AppAccess, famID string) {
	t.Helper()
	a, err := svc.Approve(t.Context(), request(p, client))
	if err != nil {
		t.Fatal(err)
	}
	famID = "fam-" + p.Subject + "-" + client
	fam := svc.Policy().NewFamily(famID, []string{"mcp"}, "https://broker.example/mcp", "", time.Now())
	if a, err = svc.AddFamily(t.Context(), a.ID, p, client, fam); err != nil {
		t.Fatal(err)
	}
	return a, famID
}

// auditOf parses the audit log's app_removed events, leaving out the
// time, which differs.
func auditOf(t *testing.T, buf *logbuf.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		if m["event"] == telemetry.EventAppRemoved {
			delete(m, "time")
			out = append(out, m)
		}
	}
	return out
}

// TestRemovalIsOneWhoeverRemoves: "Remove" on the person's page and
// offboarding remove an app the same way: the same audit event (naming
// the door, and the operator for offboarding), the same app.removed
// webhook written with the removal, and the token family refused at once.
func TestRemovalIsOneWhoeverRemoves(t *testing.T) {
	store := memstore.NewWith(keyring(t), memstore.Options{AppChanges: publisher(t).AppHook()})
	audit := &logbuf.Buffer{}
	svc, err := apps.New(apps.Options{Store: store, SoleWriter: true,
		Telemetry: telemetry.New(telemetry.Options{Audit: slog.New(slog.NewJSONHandler(audit, nil))})})
	if err != nil {
		t.Fatal(err)
	}
	const client = "https://claude.example/client.json"
	aliceApp, aliceFam := approved(t, svc, alice, client)
	bobApp, bobFam := approved(t, svc, bob, client)
	for _, who := range []struct {
		p        vault.Principal
		app, fam string
	}{{alice, aliceApp.ID, aliceFam}, {bob, bobApp.ID, bobFam}} {
		if _, err := svc.Alive(t.Context(), who.p, who.app, who.fam); err != nil {
			t.Fatal(err)
		}
	}
	events(t, store) // the two app.authorized

	// Alice removes hers on her page; bob is offboarded by an operator.
	if err := svc.Remove(t.Context(), alice, aliceApp.ID, apps.Actor{Via: "browser"}); err != nil {
		t.Fatal(err)
	}
	if n, err := svc.Offboard(t.Context(), bob, apps.Actor{Admin: root, Via: "cli"}); err != nil || n != 1 {
		t.Fatalf("offboard: %d, %v", n, err)
	}

	got := auditOf(t, audit)
	if len(got) != 2 {
		t.Fatalf("%d app_removed audit events, want one per removal:\n%s", len(got), audit)
	}
	page, offboard := got[0], got[1]
	if page["via"] != "browser" || offboard["via"] != "cli" || page["admin"] != nil ||
		offboard["admin"].(map[string]any)["sub"] != "root" {
		t.Fatalf("the events do not name who removed:\n%v\n%v", page, offboard)
	}
	// Apart from whose app it was and who removed it, they are the same.
	for _, m := range got {
		delete(m, "via")
		delete(m, "admin")
		m["principal"].(map[string]any)["sub"] = "someone"
	}
	if a, b := mustJSON(t, page), mustJSON(t, offboard); a != b {
		t.Fatalf("the page's removal audits\n%s\noffboarding audits\n%s", a, b)
	}
	if got, want := events(t, store), []string{"app.removed alice " + client, "app.removed bob " + client}; !slices.Equal(got, want) {
		t.Fatalf("webhook events %q, want %q", got, want)
	}
	if _, err := svc.Alive(t.Context(), alice, aliceApp.ID, aliceFam); !errors.Is(err, apps.ErrAppGone) {
		t.Fatalf("alice's token after Remove: %v", err)
	}
	if _, err := svc.Alive(t.Context(), bob, bobApp.ID, bobFam); !errors.Is(err, apps.ErrAppGone) {
		t.Fatalf("bob's token after offboarding: %v", err)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestAppChangeNeedsItsEvent: on PostgreSQL, with the outbox refusing
// every insert (a trigger raising an error), neither an approval nor a
// removal is applied: the app keeps its consent and its token, and no
// event is lost. Once the outbox takes inserts again the removal goes
// through with its event.
func TestAppChangeNeedsItsEvent(t *testing.T) {
	srv := pgtest.Shared(t)
	url := srv.Schema(t)
	store, err := pgstore.Open(t.Context(), url, keyring(t), pgstore.Options{AppChanges: publisher(t).AppHook()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	svc, err := apps.New(apps.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	const client = "https://claude.example/client.json"
	app, fam := approved(t, svc, alice, client)
	if got := events(t, store); !slices.Equal(got, []string{"app.authorized alice " + client}) {
		t.Fatalf("after the approval the outbox holds %q", got)
	}

	db, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(context.Background()) })
	exec := func(sql string) {
		t.Helper()
		if _, err := db.Exec(t.Context(), sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE FUNCTION outbox_down() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'outbox unavailable'; END $$`)
	exec(`CREATE TRIGGER outbox_down BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION outbox_down()`)

	if err := svc.Remove(t.Context(), alice, app.ID, apps.Actor{Via: "browser"}); err == nil || errors.Is(err, apps.ErrNoSuchApp) {
		t.Fatalf("removal with the outbox down: %v, want an error", err)
	}
	later := request(alice, client)
	later.Scopes = []string{"mcp", "offline_access"}
	if _, err := svc.Approve(t.Context(), later); err == nil {
		t.Fatal("a new consent with the outbox down was recorded")
	}
	list, err := svc.List(t.Context(), alice)
	if err != nil || len(list) != 1 || list[0].ID != app.ID || !list[0].Active {
		t.Fatalf("after the refused changes alice's apps are %+v, %v; want hers, active", list, err)
	}
	if a, covered, err := svc.Remembered(t.Context(), later); err != nil || covered || a.ID != app.ID {
		t.Fatalf("the refused consent was stored: covered %v, %v", covered, err)
	}
	if _, err := svc.Alive(t.Context(), alice, app.ID, fam); err != nil {
		t.Fatalf("the token after the refused removal: %v", err)
	}

	exec(`DROP TRIGGER outbox_down ON outbox`)
	if got := events(t, store); len(got) != 0 {
		t.Fatalf("the refused changes left events %q", got)
	}
	if err := svc.Remove(t.Context(), alice, app.ID, apps.Actor{Via: "browser"}); err != nil {
		t.Fatal(err)
	}
	if got := events(t, store); !slices.Equal(got, []string{"app.removed alice " + client}) {
		t.Fatalf("after the removal the outbox holds %q", got)
	}
	if _, err := svc.Alive(t.Context(), alice, app.ID, fam); !errors.Is(err, apps.ErrAppGone) {
		t.Fatalf("the token after the removal: %v", err)
	}
}

// countingStore counts the liveness reads that reach the store.
type countingStore struct {
	vault.AuthStore
	reads atomic.Int64
}

func (c *countingStore) GetAppLiveness(ctx context.Context, id string) (vault.AppAccess, error) {
	c.reads.Add(1)
	return c.AuthStore.GetAppLiveness(ctx, id)
}

// TestAliveSoleWriter: with one process writing the store, a family read
// alive is answered from the cache, and every change this process makes
// (removal, revocation, replay, offboarding) is refused on the next call.
func TestAliveSoleWriter(t *testing.T) {
	ctx := t.Context()
	store := &countingStore{AuthStore: memstore.New(keyring(t))}
	svc, err := apps.New(apps.Options{Store: store, SoleWriter: true})
	if err != nil {
		t.Fatal(err)
	}
	const client = "c1"
	app, fam := approved(t, svc, alice, client)
	for range 5 {
		if _, err := svc.Alive(ctx, alice, app.ID, fam); err != nil {
			t.Fatal(err)
		}
	}
	if n := store.reads.Load(); n != 1 {
		t.Fatalf("5 checks read the store %d times, want 1", n)
	}
	if _, err := svc.Alive(ctx, bob, app.ID, fam); !errors.Is(err, apps.ErrNotTheirs) {
		t.Fatalf("alice's family for bob, from the cache: %v", err)
	}

	// Every way a family ends is seen by the next check.
	ends := []struct {
		name string
		end  func(app vault.AppAccess, fam string) error
		want error
	}{
		{"revoked", func(a vault.AppAccess, fam string) error {
			_, err := svc.Revoke(ctx, a.ID, apps.Revocation{FamilyID: fam, ClientID: client})
			return err
		}, apps.ErrFamilyEnded},
		{"code replayed", func(a vault.AppAccess, fam string) error { _, err := svc.EndFamily(ctx, a.ID, fam); return err }, apps.ErrFamilyEnded},
		{"refresh token replayed", func(a vault.AppAccess, fam string) error {
			if _, _, out, err := svc.Rotate(ctx, a.ID, apps.Refresh{FamilyID: fam, Presented: "r1", Next: "r2", ClientID: client}); err != nil || out != apps.Rotated {
				return errors.Join(err, errors.New("rotation: "+out.String()))
			}
			_, _, out, err := svc.Rotate(ctx, a.ID, apps.Refresh{FamilyID: fam, Presented: "r1", Next: "r3", ClientID: client})
			if out != apps.Replayed {
				return errors.Join(err, errors.New("replay: "+out.String()))
			}
			return err
		}, apps.ErrFamilyEnded},
		{"removed", func(a vault.AppAccess, _ string) error {
			return svc.Remove(ctx, alice, a.ID, apps.Actor{Via: "browser"})
		}, apps.ErrAppGone},
		{"offboarded", func(vault.AppAccess, string) error {
			_, err := svc.Offboard(ctx, alice, apps.Actor{Via: "cli"})
			return err
		}, apps.ErrAppGone},
		{"pushed out by newer sign-ins", func(a vault.AppAccess, _ string) error {
			for i := range apps.MaxFamilies {
				f := svc.Policy().NewFamily(fmt.Sprintf("newer-%d", i), nil, "r", "", time.Now())
				if _, err := svc.AddFamily(ctx, a.ID, alice, client, f); err != nil {
					return err
				}
			}
			return nil
		}, apps.ErrFamilyEnded},
	}
	for _, e := range ends {
		t.Run(e.name, func(t *testing.T) {
			a, err := svc.Approve(ctx, request(alice, client))
			if err != nil {
				t.Fatal(err)
			}
			fam := "f-" + strings.ReplaceAll(e.name, " ", "-")
			f := svc.Policy().NewFamily(fam, nil, "r", "r1", time.Now())
			if a, err = svc.AddFamily(ctx, a.ID, alice, client, f); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Alive(ctx, alice, a.ID, fam); err != nil { // now cached
				t.Fatal(err)
			}
			if err := e.end(a, fam); err != nil {
				t.Fatal(err)
			}
			if _, err := svc.Alive(ctx, alice, a.ID, fam); !errors.Is(err, e.want) {
				t.Fatalf("after the family ended: %v, want %v", err, e.want)
			}
		})
	}
}

// TestAliveEveryCall: without SoleWriter or Watch nothing is cached.
func TestAliveEveryCall(t *testing.T) {
	store := &countingStore{AuthStore: memstore.New(keyring(t))}
	svc, err := apps.New(apps.Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	app, fam := approved(t, svc, alice, "c1")
	for range 3 {
		if _, err := svc.Alive(t.Context(), alice, app.ID, fam); err != nil {
			t.Fatal(err)
		}
	}
	if n := store.reads.Load(); n != 3 {
		t.Fatalf("3 checks read the store %d times, want 3", n)
	}
}

// fakeWatch hands the watcher Follow gives it to the test.
type fakeWatch struct{ got chan vault.AppWatcher }

func (f *fakeWatch) WatchApps(ctx context.Context, w vault.AppWatcher) error {
	f.got <- w
	<-ctx.Done()
	return nil
}

// WatchConnections: the apps core follows no connections.
func (f *fakeWatch) WatchConnections(ctx context.Context, w vault.AppWatcher) error {
	<-ctx.Done()
	return nil
}

// TestAliveWatched: with a store other processes write, the cache is
// trusted only while the feed has been fresh within apps.Bound: before
// the first report, after the feed is lost, and when the last report is
// older than the bound, every check reads the store; a change reported
// by the feed is read afresh.
func TestAliveWatched(t *testing.T) {
	ctx := t.Context()
	store := &countingStore{AuthStore: memstore.New(keyring(t))}
	fw := &fakeWatch{got: make(chan vault.AppWatcher, 1)}
	svc, err := apps.New(apps.Options{Store: store, Watch: fw})
	if err != nil {
		t.Fatal(err)
	}
	go svc.Follow(ctx)
	w := <-fw.got
	app, fam := approved(t, svc, alice, "c1")
	check := func(what string, wantReads int64) {
		t.Helper()
		before := store.reads.Load()
		if _, err := svc.Alive(ctx, alice, app.ID, fam); err != nil {
			t.Fatal(err)
		}
		if n := store.reads.Load() - before; n != wantReads {
			t.Fatalf("%s: the check read the store %d times, want %d", what, n, wantReads)
		}
	}
	check("before the feed is fresh", 1)
	check("before the feed is fresh, again", 1)
	// Fresh as of an hour ahead: the checks that count on the feed being
	// current must not count on running within Bound (1 s) of it on a busy
	// machine.
	w.Fresh(time.Now().Add(time.Hour))
	check("first check with the feed fresh", 1)
	check("cached", 0)
	w.Changed(app.ID) // another replica changed the record
	check("after a reported change", 1)
	check("cached again", 0)
	w.Changed("another-app")
	check("another app's change", 0)
	w.Lost()
	check("feed lost", 1)
	check("feed lost, again", 1)
	w.Fresh(time.Now().Add(-apps.Bound - time.Millisecond)) // reported, but too long ago
	check("fresh longer ago than the bound", 1)
	w.Fresh(time.Now().Add(time.Hour))
	check("fresh again, refilled", 1)
	check("fresh again, cached", 0)
}

// TestAliveRacesRemoval: a check that read the store before a removal
// never leaves the family cached after it: once Remove returns, no check
// accepts the family (run with -race).
func TestAliveRacesRemoval(t *testing.T) {
	ctx := t.Context()
	svc, err := apps.New(apps.Options{Store: memstore.New(keyring(t)), SoleWriter: true})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		client := "c" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		app, fam := approved(t, svc, alice, client)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						svc.Alive(ctx, alice, app.ID, fam)
					}
				}
			})
		}
		if err := svc.Remove(ctx, alice, app.ID, apps.Actor{Via: "browser"}); err != nil {
			t.Fatal(err)
		}
		for range 20 {
			if _, err := svc.Alive(ctx, alice, app.ID, fam); !errors.Is(err, apps.ErrAppGone) {
				close(stop)
				wg.Wait()
				t.Fatalf("round %d: a check after the removal returned %v", i, err)
			}
		}
		close(stop)
		wg.Wait()
	}
}
