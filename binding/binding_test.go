package binding_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"credbroker/binding"
	"credbroker/vault"
	"credbroker/vault/memstore"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

var (
	alice = vault.Principal{Issuer: "https://idp.example", Subject: "alice"}
	bob   = vault.Principal{Issuer: "https://idp.example", Subject: "bob"}
	// Same subject at another issuer is another person.
	aliceElsewhere = vault.Principal{Issuer: "https://other.example", Subject: "alice"}
)

func newService(t *testing.T, opts binding.Options) (*binding.Service, *clock) {
	t.Helper()
	kr, err := vault.ParseKeys(vault.GenerateKey())
	if err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	opts.Now = c.Now
	return binding.New(memstore.New(kr), opts), c
}

func TestIDs(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		id := binding.NewID()
		if !binding.ValidID(id) || seen[id] {
			t.Fatalf("id %q invalid or repeated", id)
		}
		seen[id] = true
	}
	for _, bad := range []string{"", "short", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAA/A", "AAAAAAAAAAAAAAAAAAAA+A", "../../../../etc/passwd!", "AAAAAAAAAAAAAAAAAAAAA\x00"} {
		if binding.ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
}

func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{})
	g, err := s.Create(ctx, alice, "github", []string{"repo"}, "Agent <x>")
	if err != nil {
		t.Fatal(err)
	}
	if g.State != vault.GrantPending || !binding.ValidID(g.ID) || g.Expires.Sub(g.Created) != 10*time.Minute || g.ClientName != "Agent <x>" {
		t.Fatalf("created %+v", g)
	}
	if _, err := s.Complete(ctx, g.ID, alice, "conn-1"); !errors.Is(err, binding.ErrBadState) {
		t.Fatalf("complete before approve: %v, want ErrBadState", err)
	}
	if g, err = s.Approve(ctx, g.ID, alice); err != nil || g.State != vault.GrantApproved {
		t.Fatalf("approve: %+v %v", g, err)
	}
	if g, err = s.Approve(ctx, g.ID, alice); err != nil || g.State != vault.GrantApproved {
		t.Fatalf("approve again (provider step restarted): %+v %v", g, err)
	}
	if g, err = s.Complete(ctx, g.ID, alice, "conn-1"); err != nil || g.State != vault.GrantCompleted || g.ConnectionID != "conn-1" {
		t.Fatalf("complete: %+v %v", g, err)
	}
	// Single use: every further transition is refused and nothing changes.
	for name, f := range map[string]func() (vault.Grant, error){
		"complete again": func() (vault.Grant, error) { return s.Complete(ctx, g.ID, alice, "conn-2") },
		"approve":        func() (vault.Grant, error) { return s.Approve(ctx, g.ID, alice) },
		"deny":           func() (vault.Grant, error) { return s.Deny(ctx, g.ID, alice) },
	} {
		if _, err := f(); !errors.Is(err, binding.ErrClosed) {
			t.Errorf("%s after completion: %v, want ErrClosed", name, err)
		}
	}
	if got, err := s.Lookup(ctx, g.ID); err != nil || got.ConnectionID != "conn-1" || got.Version != g.Version {
		t.Fatalf("after refused transitions: %+v %v", got, err)
	}
	// A completed grant answers Round unchanged, so MRTR retries read the outcome.
	if got, err := s.Round(ctx, g.ID, alice); err != nil || got.State != vault.GrantCompleted {
		t.Fatalf("round on completed: %+v %v", got, err)
	}
}

func TestDeny(t *testing.T) {
	ctx := context.Background()
	for _, approveFirst := range []bool{false, true} {
		s, _ := newService(t, binding.Options{})
		g, _ := s.Create(ctx, alice, "github", nil, "")
		if approveFirst {
			s.Approve(ctx, g.ID, alice)
		}
		if g, err := s.Deny(ctx, g.ID, alice); err != nil || g.State != vault.GrantDenied {
			t.Fatalf("deny (approved first %v): %+v %v", approveFirst, g, err)
		}
		if _, err := s.Complete(ctx, g.ID, alice, "c"); !errors.Is(err, binding.ErrClosed) {
			t.Fatalf("complete after deny: %v", err)
		}
	}
}

// TestOtherPrincipalChangesNothing is DESIGN invariant 2 at the binding
// layer: a grant acted on by anyone but its initiator is refused and keeps
// its state and version.
func TestOtherPrincipalChangesNothing(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{})
	g, _ := s.Create(ctx, alice, "github", nil, "")
	for _, p := range []vault.Principal{bob, aliceElsewhere, {}} {
		for name, f := range map[string]func() (vault.Grant, error){
			"authorize": func() (vault.Grant, error) { return s.Authorize(ctx, g.ID, p) },
			"approve":   func() (vault.Grant, error) { return s.Approve(ctx, g.ID, p) },
			"deny":      func() (vault.Grant, error) { return s.Deny(ctx, g.ID, p) },
			"complete":  func() (vault.Grant, error) { return s.Complete(ctx, g.ID, p, "c") },
			"round":     func() (vault.Grant, error) { return s.Round(ctx, g.ID, p) },
		} {
			if _, err := f(); !errors.Is(err, binding.ErrWrongPrincipal) {
				t.Errorf("%s by %v: %v, want ErrWrongPrincipal", name, p, err)
			}
		}
	}
	got, err := s.Authorize(ctx, g.ID, alice)
	if err != nil || got.State != vault.GrantPending || got.Version != g.Version || got.Rounds != 0 {
		t.Fatalf("grant changed: %+v %v", got, err)
	}
}

func TestExpiry(t *testing.T) {
	ctx := context.Background()
	s, c := newService(t, binding.Options{TTL: 5 * time.Minute})
	g, _ := s.Create(ctx, alice, "github", nil, "")
	c.Advance(5 * time.Minute)
	if got, err := s.Lookup(ctx, g.ID); !errors.Is(err, binding.ErrExpired) || got.State != vault.GrantExpired {
		t.Fatalf("lookup at expiry: %+v %v", got, err)
	}
	if _, err := s.Approve(ctx, g.ID, alice); !errors.Is(err, binding.ErrExpired) {
		t.Fatalf("approve expired: %v", err)
	}
	// Another principal still learns only that it is not theirs.
	if _, err := s.Authorize(ctx, g.ID, bob); !errors.Is(err, binding.ErrWrongPrincipal) {
		t.Fatalf("authorize expired by bob: %v", err)
	}
	// GC keeps expired grants for the grace period, then removes them.
	if n, err := s.GC(ctx, time.Hour); err != nil || n != 0 {
		t.Fatalf("gc within grace: %d %v", n, err)
	}
	c.Advance(time.Hour + time.Second)
	if n, err := s.GC(ctx, time.Hour); err != nil || n != 1 {
		t.Fatalf("gc after grace: %d %v", n, err)
	}
	if _, err := s.Lookup(ctx, g.ID); !errors.Is(err, binding.ErrNotFound) {
		t.Fatalf("lookup after gc: %v", err)
	}
}

func TestMalformedIDsNeverReachTheStore(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{})
	for _, id := range []string{"", "x", "../AAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		if _, err := s.Lookup(ctx, id); !errors.Is(err, binding.ErrNotFound) {
			t.Errorf("lookup %q: %v", id, err)
		}
		if _, err := s.Approve(ctx, id, alice); !errors.Is(err, binding.ErrNotFound) {
			t.Errorf("approve %q: %v", id, err)
		}
	}
	// A well-formed id that was never issued.
	if _, err := s.Authorize(ctx, binding.NewID(), alice); !errors.Is(err, binding.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}

func TestLimits(t *testing.T) {
	ctx := context.Background()
	t.Run("pending", func(t *testing.T) {
		s, _ := newService(t, binding.Options{MaxPending: 3, MaxPerHour: -1})
		for i := range 3 {
			if _, err := s.Create(ctx, alice, "github", nil, ""); err != nil {
				t.Fatalf("grant %d: %v", i, err)
			}
		}
		if _, err := s.Create(ctx, alice, "github", nil, ""); !errors.Is(err, binding.ErrTooManyPending) {
			t.Fatalf("4th open grant: %v", err)
		}
		if _, err := s.Create(ctx, bob, "github", nil, ""); err != nil {
			t.Fatalf("bob is not limited by alice's grants: %v", err)
		}
	})
	t.Run("closed grants do not count as open", func(t *testing.T) {
		s, _ := newService(t, binding.Options{MaxPending: 1, MaxPerHour: -1})
		g, _ := s.Create(ctx, alice, "github", nil, "")
		s.Deny(ctx, g.ID, alice)
		if _, err := s.Create(ctx, alice, "github", nil, ""); err != nil {
			t.Fatalf("after deny: %v", err)
		}
	})
	t.Run("per hour", func(t *testing.T) {
		s, c := newService(t, binding.Options{MaxPending: -1, MaxPerHour: 2})
		s.Create(ctx, alice, "github", nil, "")
		s.Create(ctx, alice, "github", nil, "")
		if _, err := s.Create(ctx, alice, "github", nil, ""); !errors.Is(err, binding.ErrRateLimited) {
			t.Fatalf("3rd in an hour: %v", err)
		}
		c.Advance(time.Hour + time.Second)
		if _, err := s.Create(ctx, alice, "github", nil, ""); err != nil {
			t.Fatalf("an hour later: %v", err)
		}
	})
	t.Run("rounds", func(t *testing.T) {
		s, _ := newService(t, binding.Options{MaxRounds: 2})
		g, _ := s.Create(ctx, alice, "github", nil, "")
		for i := 1; i <= 2; i++ {
			if got, err := s.Round(ctx, g.ID, alice); err != nil || got.Rounds != i {
				t.Fatalf("round %d: %+v %v", i, got, err)
			}
		}
		if _, err := s.Round(ctx, g.ID, alice); !errors.Is(err, binding.ErrTooManyRounds) {
			t.Fatalf("3rd round: %v", err)
		}
	})
	t.Run("empty principal", func(t *testing.T) {
		s, _ := newService(t, binding.Options{})
		if _, err := s.Create(ctx, vault.Principal{Issuer: "x"}, "github", nil, ""); err == nil {
			t.Fatal("grant for a principal without subject")
		}
	})
}

// TestConcurrentCompleteOnce: many callbacks racing to complete one grant;
// exactly one wins.
func TestConcurrentCompleteOnce(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{})
	g, _ := s.Create(ctx, alice, "github", nil, "")
	s.Approve(ctx, g.ID, alice)
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Complete(ctx, g.ID, alice, "conn"); err == nil {
				wins.Add(1)
			} else if !errors.Is(err, binding.ErrClosed) {
				t.Errorf("racer %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if wins.Load() != 1 {
		t.Fatalf("%d completions succeeded, want 1", wins.Load())
	}
}

// TestPending: the open request handed out again is the person's own,
// pending, for the same provider, scope set and client, with time left.
func TestPending(t *testing.T) {
	ctx := context.Background()
	s, clk := newService(t, binding.Options{})
	g, err := s.Create(ctx, alice, "github", []string{"repo", "read:user"}, "Agent")
	if err != nil {
		t.Fatal(err)
	}
	approved, _ := s.Create(ctx, alice, "google", []string{"email"}, "Agent")
	if _, err := s.Approve(ctx, approved.ID, alice); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name     string
		p        vault.Principal
		provider string
		scopes   []string
		client   string
		want     bool
	}{
		{"same request, scopes in another order", alice, "github", []string{"read:user", "repo"}, "Agent", true},
		{"another person", bob, "github", []string{"repo", "read:user"}, "Agent", false},
		{"same subject at another issuer", aliceElsewhere, "github", []string{"repo", "read:user"}, "Agent", false},
		{"other scopes", alice, "github", []string{"repo"}, "Agent", false},
		{"another client", alice, "github", []string{"repo", "read:user"}, "Other", false},
		{"another provider", alice, "gitlab", []string{"repo", "read:user"}, "Agent", false},
		{"approved by an earlier version", alice, "google", []string{"email"}, "Agent", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok, err := s.Pending(ctx, tt.p, tt.provider, tt.scopes, tt.client)
			if err != nil || ok != tt.want || ok && got.ID != g.ID {
				t.Fatalf("Pending = %s, %v, %v; want %v", got.ID, ok, err, tt.want)
			}
		})
	}
	// Near its expiry a request is not handed out again: a new link is better.
	clk.Advance(9 * time.Minute)
	if _, ok, _ := s.Pending(ctx, alice, "github", []string{"repo", "read:user"}, "Agent"); ok {
		t.Fatal("a request about to expire was handed out again")
	}
	if _, err := s.Deny(ctx, g.ID, alice); err != nil {
		t.Fatal(err)
	}
	clk.Advance(-9 * time.Minute)
	if _, ok, _ := s.Pending(ctx, alice, "github", []string{"repo", "read:user"}, "Agent"); ok {
		t.Fatal("a denied request was handed out again")
	}
}

// TestCreateForServer: a grant asked through the sidecar keeps the
// configured server's name next to the host's self-asserted one, and
// carries through approval.
func TestCreateForServer(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{})
	g, err := s.CreateForServer(ctx, alice, "github", []string{"repo"}, "demorepos", "Claude")
	if err != nil {
		t.Fatal(err)
	}
	if g.Server != "demorepos" || g.ClientName != "Claude" {
		t.Fatalf("created %+v", g)
	}
	if g, err = s.Approve(ctx, g.ID, alice); err != nil || g.Server != "demorepos" {
		t.Fatalf("approve: %+v %v", g, err)
	}
	if g, err := s.Create(ctx, alice, "github", nil, "Claude"); err != nil || g.Server != "" {
		t.Fatalf("an MCP client's grant names a server: %+v %v", g, err)
	}
	// A server's request is never handed out again to an MCP client that
	// happens to give the same name.
	if got, ok, err := s.Pending(ctx, alice, "github", []string{"repo"}, "Claude"); err != nil || ok {
		t.Fatalf("Pending handed out %s (%v, %v), a co-located server's request", got.ID, ok, err)
	}
	if _, err := s.CreateForServer(ctx, alice, "github", nil, "", "Claude"); err == nil {
		t.Fatal("a grant for an unnamed server was created")
	}
}

// TestAttempt: a grant counts key entries up to MaxAttempts; only its own
// person may count them; a final grant counts none.
func TestAttempt(t *testing.T) {
	ctx := context.Background()
	s, _ := newService(t, binding.Options{MaxAttempts: 2})
	g, _ := s.Create(ctx, alice, "keys", nil, "c")
	if _, err := s.Attempt(ctx, g.ID, bob); !errors.Is(err, binding.ErrWrongPrincipal) {
		t.Fatalf("bob counting alice's attempt: %v", err)
	}
	for i := range 2 {
		if got, err := s.Attempt(ctx, g.ID, alice); err != nil || got.Attempts != i+1 {
			t.Fatalf("attempt %d: %d, %v", i+1, got.Attempts, err)
		}
	}
	if _, err := s.Attempt(ctx, g.ID, alice); !errors.Is(err, binding.ErrTooManyAttempts) {
		t.Fatalf("third attempt: %v, want ErrTooManyAttempts", err)
	}
	if stored, _ := s.Lookup(ctx, g.ID); stored.Attempts != 2 {
		t.Fatalf("stored attempts %d, want 2", stored.Attempts)
	}
	d, _ := s.Create(ctx, alice, "keys", nil, "c")
	s.Deny(ctx, d.ID, alice)
	if _, err := s.Attempt(ctx, d.ID, alice); !errors.Is(err, binding.ErrClosed) {
		t.Fatalf("attempt on a denied grant: %v", err)
	}
}
