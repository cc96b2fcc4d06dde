package binding_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/vault"
	"credbroker/vault/boltstore"
	"credbroker/vault/memstore"
	"credbroker/vault/pgstore"
	"credbroker/vault/pgstore/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestConcurrentCreateLimits: 100 concurrent Create calls for one person
// (as 100 concurrent connect_account calls make them) issue exactly the
// limit, for the open-grants limit and for the per-hour limit, on every
// store. On PostgreSQL the calls are split across two replicas: two
// independent stores and services on one database.
func TestConcurrentCreateLimits(t *testing.T) {
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	backends := []struct {
		name string
		open func(t *testing.T) []vault.Store // one store per replica
	}{
		{"memory", func(t *testing.T) []vault.Store { return []vault.Store{memstore.New(kr)} }},
		{"bolt", func(t *testing.T) []vault.Store {
			s, err := boltstore.Open(filepath.Join(t.TempDir(), "vault.db"), kr, boltstore.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return []vault.Store{s}
		}},
		{"postgres two replicas", func(t *testing.T) []vault.Store {
			url := pgtest.Shared(t).Schema(t)
			var stores []vault.Store
			for range 2 {
				s, err := pgstore.Open(t.Context(), url, kr, pgstore.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				stores = append(stores, s)
			}
			return stores
		}},
	}
	limits := []struct {
		name    string
		opts    binding.Options
		want    int
		refusal error
	}{
		{"open grants", binding.Options{MaxPending: 10, MaxPerHour: -1}, 10, binding.ErrTooManyPending},
		{"per hour", binding.Options{MaxPending: -1, MaxPerHour: 30}, 30, binding.ErrRateLimited},
		{"defaults", binding.Options{}, 10, binding.ErrTooManyPending},
	}
	for _, b := range backends {
		for _, l := range limits {
			t.Run(b.name+"/"+l.name, func(t *testing.T) {
				ctx := t.Context()
				c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
				opts := l.opts
				opts.Now = c.Now
				var services []*binding.Service
				for _, s := range b.open(t) {
					services = append(services, binding.New(s, opts))
				}
				const calls = 100
				var (
					wg    sync.WaitGroup
					start = make(chan struct{})
					mu    sync.Mutex
					ok    int
				)
				errs := make(chan error, calls)
				for i := range calls {
					svc := services[i%len(services)]
					wg.Go(func() {
						<-start
						_, err := svc.Create(ctx, alice, "github", []string{"repo"}, "agent")
						switch {
						case err == nil:
							mu.Lock()
							ok++
							mu.Unlock()
						case !errors.Is(err, l.refusal):
							errs <- fmt.Errorf("call %d: %w", i, err)
						}
					})
				}
				close(start)
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatalf("unexpected error: %v", err)
				}
				if ok != l.want {
					t.Fatalf("%d of %d concurrent creates succeeded, want exactly %d", ok, calls, l.want)
				}
				// Every replica refuses the next one, and bob is not limited by alice.
				for i, svc := range services {
					if _, err := svc.Create(ctx, alice, "github", nil, ""); !errors.Is(err, l.refusal) {
						t.Errorf("replica %d, one more for alice: %v, want %v", i, err, l.refusal)
					}
					if _, err := svc.Create(ctx, bob, "github", nil, ""); err != nil {
						t.Errorf("replica %d, bob: %v", i, err)
					}
				}
			})
		}
	}
}
