package vault_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/memstore"
	"credbroker/vault/vaulttest"
)

// event is one call an observer saw.
type event struct {
	begin bool
	op    string
	// mark is what the context held: Begin's mark at End.
	mark string
	err  error
}

// recorder is an Observer that records what it sees, each Begin marking
// the context it returns with name.
type recorder struct {
	name   string
	events *[]event
}

type markKey struct{ name string }

func (r recorder) Begin(ctx context.Context, op string) context.Context {
	*r.events = append(*r.events, event{begin: true, op: op})
	return context.WithValue(ctx, markKey{r.name}, r.name+":"+op)
}

func (r recorder) End(ctx context.Context, op string, took time.Duration, err error) {
	mark, _ := ctx.Value(markKey{r.name}).(string)
	*r.events = append(*r.events, event{op: op, mark: mark, err: err})
	if took < 0 {
		panic("negative duration")
	}
}

// TestObserveEveryOperation: every operation of every feature of the
// store (enumerated by reflection on vault.Store, so a new feature is in
// the list by itself) reaches the observers once, Begin before End, in
// nesting order, under its method's name in snake case, with the context
// Begin returned and the operation's error; no two operations share a
// name.
func TestObserveEveryOperation(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	backend, err := boltstore.Open(filepath.Join(t.TempDir(), "v.db"), kr, boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { backend.Close() })
	var events []event
	s := vault.Observe(everyFeature{backend}, recorder{"outer", &events}, nil, recorder{"inner", &events})
	ops := vaulttest.EveryOperation(t, s)
	if len(ops) < 40 {
		t.Fatalf("%d operations found: the enumeration misses features", len(ops))
	}
	seen := map[string]string{}
	for _, op := range ops {
		events = events[:0]
		op.Call(t.Context())
		what := op.Feature + "." + op.Method
		if len(events) != 4 {
			t.Errorf("%s: the observers saw %d calls, want Begin and End of each: %+v", what, len(events), events)
			continue
		}
		name := events[0].op
		if !vaulttest.IsOpName(name, op.Method) {
			t.Errorf("%s observed as %q, not its name in snake case", what, name)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("%s and %s are both %q", other, what, name)
		}
		seen[name] = what
		want := []event{{begin: true, op: name}, {begin: true, op: name},
			{op: name, mark: "inner:" + name, err: events[2].err}, {op: name, mark: "outer:" + name, err: events[3].err}}
		if !slices.EqualFunc(events, want, func(a, b event) bool { return a.begin == b.begin && a.op == b.op && a.mark == b.mark }) {
			t.Errorf("%s: observers saw %+v, want %+v", what, events, want)
		}
	}
}

// everyFeature is a bolt store with the one feature bolt has not, a feed
// of app changes (a hand-written one), so that every feature is there to
// observe.
type everyFeature struct{ *boltstore.Store }

func (everyFeature) AppWatch() vault.AppWatch { return lostFeed{} }

// lostFeed is a feed that reports itself lost and follows nothing until
// its context ends.
type lostFeed struct{}

func (lostFeed) WatchApps(ctx context.Context, w vault.AppWatcher) error {
	w.Lost()
	<-ctx.Done()
	return nil
}

func (f lostFeed) WatchConnections(ctx context.Context, w vault.AppWatcher) error {
	return f.WatchApps(ctx, w)
}

// TestObserveErrors: End gets the operation's own error, and the caller
// gets what the store answered.
func TestObserveErrors(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	var events []event
	s := vault.Observe(memstore.New(kr), recorder{"r", &events})
	if _, err := s.GetConnection(t.Context(), "missing"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("get: %v", err)
	}
	if err := s.Auth().DeleteAppAccess(t.Context(), "missing"); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("delete app: %v", err)
	}
	if len(events) != 4 || !errors.Is(events[1].err, vault.ErrNotFound) || !errors.Is(events[3].err, vault.ErrNotFound) ||
		events[1].op != "get_connection" || events[3].op != "delete_app_access" {
		t.Fatalf("events %+v", events)
	}
}

// TestObserveNothing: without observers the store is returned as is, and
// a feature the store lacks stays absent.
func TestObserveNothing(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	m := memstore.New(kr)
	if vault.Observe(m) != vault.Store(m) || vault.Observe(m, nil) != vault.Store(m) {
		t.Fatal("Observe without observers wrapped the store")
	}
	var events []event
	observed := vault.Observe(m, recorder{"r", &events})
	if r := observed.Resealer(); r != nil {
		t.Fatalf("the memory store has no Resealer, the observed one has %T", r)
	}
	if w := observed.AppWatch(); w != nil {
		t.Fatalf("the memory store has no AppWatch, the observed one has %T", w)
	}
}
