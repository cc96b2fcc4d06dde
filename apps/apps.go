package apps

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/vault"
)

// Options configures a Service.
type Options struct {
	// Store keeps the app access records. Give it the store's
	// ChangeHook[AppAccess] (webhook.Publisher.AppHook) so app.authorized and
	// app.removed are written with the change.
	Store  vault.AuthStore
	Policy Policy
	// SoleWriter says this process is the only one writing Store (a bolt
	// file, a memory store): the liveness cache then trusts its own
	// invalidations. Watch, for a store processes share, reports the
	// others' changes (Follow reads it). Neither: every check reads the
	// store.
	SoleWriter bool
	Watch      vault.AppWatch
	// CacheSize bounds the liveness cache (default 50000 families).
	CacheSize int

	Telemetry *telemetry.Recorder
	Logger    *slog.Logger
	Now       func() time.Time
}

// Service is every decision about the apps people allowed at the broker's
// authorization server. See the package doc.
type Service struct {
	store  vault.AuthStore
	policy Policy
	rec    *telemetry.Recorder
	log    *slog.Logger
	now    func() time.Time
	live   *liveness
	watch  vault.AppWatch
}

// New validates opts and builds the service. It performs no I/O.
func New(opts Options) (*Service, error) {
	if opts.Store == nil {
		return nil, errors.New("apps: Store is required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Service{store: opts.Store, policy: opts.Policy.withDefaults(), rec: opts.Telemetry, log: opts.Logger,
		now: opts.Now, watch: opts.Watch}
	if opts.SoleWriter || opts.Watch != nil {
		s.live = newLiveness(opts.CacheSize, opts.SoleWriter)
	}
	return s, nil
}

// Policy returns the lifetimes the service applies.
func (s *Service) Policy() Policy { return s.policy }

// Actor is who removes an app: the person on their page (Via "browser"),
// or an operator (Admin, Via "admin-api" or "cli").
type Actor struct {
	Admin vault.Principal
	Via   string
}

// Errors of the service.
var (
	// ErrNoSuchApp: the person has no app with that id (it does not
	// exist, or it is someone else's: the two look the same).
	ErrNoSuchApp = errors.New("apps: no such app")
	// ErrRemoved: the app's access was removed (or replaced) while a
	// token was being issued for it.
	ErrRemoved = errors.New("apps: the app's access was removed")
)

// newID returns a fresh record id: 128 random bits, base64url.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// errNoWrite aborts an update that found nothing to change.
var errNoWrite = errors.New("apps: nothing to write")

// Remembered returns the person's record for r's client when the consent
// it remembers covers r (Covers).
func (s *Service) Remembered(ctx context.Context, r Request) (vault.AppAccess, bool, error) {
	a, err := s.store.FindAppAccess(ctx, r.Principal, r.ClientID)
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return vault.AppAccess{}, false, nil
	case err != nil:
		return vault.AppAccess{}, false, fmt.Errorf("apps: find app access: %w", err)
	}
	return a, Covers(a, r), nil
}

// Approve records that the person approved r just now: their record for
// the client is created, or its consent (redirect URI, scopes, name, time)
// replaced. The store writes app.authorized in the same transaction; the
// approval is audited (app_authorized, via the browser).
func (s *Service) Approve(ctx context.Context, r Request) (vault.AppAccess, error) {
	now := s.now()
	name := untrusted.Clip(r.ClientName, 200)
	for range 3 {
		a, err := s.store.FindAppAccess(ctx, r.Principal, r.ClientID)
		if errors.Is(err, vault.ErrNotFound) {
			a, err = s.store.CreateAppAccess(ctx, vault.AppAccess{
				ID: newID(), Principal: r.Principal, ClientID: r.ClientID, ClientName: name,
				RedirectURI: r.RedirectURI, Scopes: r.Scopes, Resources: withResource(vault.AppAccess{}, Request{Resource: r.Resource}),
				Created: now, Updated: now,
			})
			if errors.Is(err, vault.ErrExists) {
				continue // a concurrent first approval won: update its record
			}
		} else if err == nil {
			a, err = s.store.UpdateAppAccess(ctx, a.ID, func(x vault.AppAccess) (vault.AppAccess, error) {
				if x.RedirectURI != "" {
					x.Resources = withResource(x, r) // the consent so far, and this one
				} else {
					x.Resources = withResource(vault.AppAccess{}, Request{Resource: r.Resource})
				}
				x.RedirectURI, x.Scopes, x.Updated, x.ClientName = r.RedirectURI, r.Scopes, now, name
				return x, nil
			})
			if errors.Is(err, vault.ErrNotFound) {
				continue // removed meanwhile: create afresh
			}
		}
		if err != nil {
			return vault.AppAccess{}, fmt.Errorf("apps: record consent: %w", err)
		}
		s.rec.Audit(ctx, telemetry.Event{Kind: telemetry.EventAppAuthorized, Principal: r.Principal, Client: r.ClientID, Via: "browser"})
		return a, nil
	}
	return vault.AppAccess{}, fmt.Errorf("apps: app access for %s keeps changing", r.ClientID)
}

// AddFamily records fam, the family an authorization code of app appID
// starts, for person p and client clientID (whom the code names).
// ErrRemoved when the app's access is gone or is no longer theirs.
func (s *Service) AddFamily(ctx context.Context, appID string, p vault.Principal, clientID string, fam vault.TokenFamily) (vault.AppAccess, error) {
	now := s.now()
	a, err := s.store.UpdateAppAccess(ctx, appID, func(a vault.AppAccess) (vault.AppAccess, error) {
		if a.Principal != p || a.ClientID != clientID {
			return a, ErrRemoved
		}
		return s.policy.WithFamily(a, fam, now), nil
	})
	if errors.Is(err, vault.ErrNotFound) {
		err = ErrRemoved
	}
	if err == nil {
		s.ended(appID) // the oldest family may have made room for this one
	}
	return a, err
}

// AddFamilyWithoutConsent records fam for person p and client clientID,
// creating their record without a consent when there is none: a family
// the organisation's IdP vouched for (an ID-JAG), or broker dev's
// built-in host. The browser's consent is still asked for later.
func (s *Service) AddFamilyWithoutConsent(ctx context.Context, p vault.Principal, clientID, clientName string, fam vault.TokenFamily) (vault.AppAccess, error) {
	now := s.now()
	for range 3 {
		a, err := s.store.FindAppAccess(ctx, p, clientID)
		if errors.Is(err, vault.ErrNotFound) {
			a, err = s.store.CreateAppAccess(ctx, vault.AppAccess{ID: newID(), Principal: p, ClientID: clientID,
				ClientName: untrusted.Clip(clientName, 200), Created: now, Updated: now})
			if errors.Is(err, vault.ErrExists) {
				continue // a concurrent first grant won: use its record
			}
		}
		if err != nil {
			return vault.AppAccess{}, fmt.Errorf("apps: record app access: %w", err)
		}
		a, err = s.AddFamily(ctx, a.ID, p, clientID, fam)
		if errors.Is(err, ErrRemoved) {
			continue
		}
		return a, err
	}
	return vault.AppAccess{}, fmt.Errorf("apps: app access for %s keeps changing", clientID)
}

// Rotate applies Policy.Rotate to app appID in one compare-and-swap, so a
// refresh token is spent once across every replica sharing the store. It
// returns the record after the rotation and the rotated family; a
// replayed token is audited (token_replay). Unknown: no such app, family
// or token (nothing changed).
func (s *Service) Rotate(ctx context.Context, appID string, r Refresh) (vault.AppAccess, vault.TokenFamily, Outcome, error) {
	now := s.now()
	var out Outcome
	a, err := s.store.UpdateAppAccess(ctx, appID, func(a vault.AppAccess) (vault.AppAccess, error) {
		var na vault.AppAccess
		na, out = s.policy.Rotate(a, r, now)
		if out == Unknown {
			return a, errNoWrite
		}
		return na, nil
	})
	switch {
	case errors.Is(err, vault.ErrNotFound), errors.Is(err, errNoWrite):
		return vault.AppAccess{}, vault.TokenFamily{}, Unknown, nil
	case err != nil:
		return vault.AppAccess{}, vault.TokenFamily{}, Unknown, fmt.Errorf("apps: rotate: %w", err)
	}
	if out != Rotated {
		s.ended(appID)
	}
	if out == Replayed {
		s.rec.Audit(ctx, telemetry.Event{Kind: telemetry.EventTokenReplay, Principal: a.Principal, Client: a.ClientID, Outcome: "refresh_replayed"})
	}
	f, _ := a.Family(r.FamilyID)
	return a, f, out, nil
}

// Revoke applies Revoke to app appID in one compare-and-swap.
func (s *Service) Revoke(ctx context.Context, appID string, r Revocation) (RevokeOutcome, error) {
	var out RevokeOutcome
	_, err := s.store.UpdateAppAccess(ctx, appID, func(a vault.AppAccess) (vault.AppAccess, error) {
		var na vault.AppAccess
		na, out = Revoke(a, r)
		if out != Revoked {
			return a, errNoWrite
		}
		return na, nil
	})
	switch {
	case errors.Is(err, vault.ErrNotFound):
		return NotRevoked, nil
	case errors.Is(err, errNoWrite):
		return out, nil
	case err != nil:
		return NotRevoked, fmt.Errorf("apps: revoke: %w", err)
	}
	s.ended(appID)
	return Revoked, nil
}

// EndFamily ends family famID of app appID whoever holds it (a code
// presented twice revokes what its first redemption issued); it reports
// whether the family existed.
func (s *Service) EndFamily(ctx context.Context, appID, famID string) (bool, error) {
	_, err := s.store.UpdateAppAccess(ctx, appID, func(a vault.AppAccess) (vault.AppAccess, error) {
		i := familyIndex(a, famID)
		if i < 0 {
			return a, errNoWrite
		}
		return withoutFamily(a, i), nil
	})
	switch {
	case errors.Is(err, errNoWrite), errors.Is(err, vault.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("apps: end token family: %w", err)
	}
	s.ended(appID)
	return true, nil
}

// App is one app a person allowed, as "Apps with access" and the admin
// API list it.
type App struct {
	// ID names the record for Remove.
	ID       string
	ClientID string
	// Name is the app's self-asserted name: untrusted text.
	Name string
	// VerifiedDomain is, for an app identified by a metadata document,
	// the host serving it; empty for a dynamically registered app.
	VerifiedDomain string
	Authorized     time.Time
	LastUsed       time.Time
	// Active reports whether the app holds a token that still works.
	Active bool
	// ByOrganisation reports that the organisation's IdP let the app in
	// (an ID-JAG redeemed for it: a family whose Via is ViaIDJAG), rather
	// than only the person's consent.
	ByOrganisation bool
}

// ViaIDJAG is vault.TokenFamily.Via for a family granted by redeeming an
// ID-JAG the organisation's IdP issued (enterprise-managed
// authorization): such an app is listed as let in by the organisation.
const ViaIDJAG = "id-jag"

// builtIn prefixes the client ids of clients built into the broker
// (broker dev's token client).
const builtIn = "urn:credbroker:"

// VerifiedDomain is what vouches for a client id: the host serving its
// metadata document (an https client id), "built into this broker", or
// nothing (a client that registered itself).
func VerifiedDomain(clientID string) string {
	switch {
	case strings.HasPrefix(clientID, builtIn):
		return "built into this broker"
	case strings.HasPrefix(clientID, "https://"):
		if u, err := url.Parse(clientID); err == nil {
			return u.Host
		}
	}
	return ""
}

// List returns the apps p allowed, ordered by id.
func (s *Service) List(ctx context.Context, p vault.Principal) ([]App, error) {
	list, err := s.store.ListAppAccess(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("apps: list: %w", err)
	}
	now := s.now()
	out := make([]App, 0, len(list))
	for _, a := range list {
		out = append(out, App{ID: a.ID, ClientID: a.ClientID, Name: a.ClientName, VerifiedDomain: VerifiedDomain(a.ClientID),
			Authorized: a.Updated, LastUsed: a.LastUsed,
			Active:         slices.ContainsFunc(a.Families, func(f vault.TokenFamily) bool { return s.policy.Live(f, now) }),
			ByOrganisation: slices.ContainsFunc(a.Families, func(f vault.TokenFamily) bool { return f.Via == ViaIDJAG })})
	}
	return out, nil
}

// Remove takes app id away from p: every token family it holds ends and
// its consent is forgotten, so it must ask again. The store writes
// app.removed in the same transaction; the removal is audited
// (app_removed) with by. ErrNoSuchApp when p has no such app.
func (s *Service) Remove(ctx context.Context, p vault.Principal, id string, by Actor) error {
	a, err := s.store.GetAppAccess(ctx, id)
	if errors.Is(err, vault.ErrNotFound) || (err == nil && !a.Principal.Same(p)) {
		return ErrNoSuchApp
	}
	if err != nil {
		return fmt.Errorf("apps: remove: %w", err)
	}
	err = s.remove(ctx, a, by)
	if errors.Is(err, vault.ErrNotFound) {
		return ErrNoSuchApp
	}
	return err
}

// Offboard removes every app p allowed, each as Remove does; it is
// offboarding's step for the authorization server, and returns how many
// it removed.
func (s *Service) Offboard(ctx context.Context, p vault.Principal, by Actor) (int, error) {
	list, err := s.store.ListAppAccess(ctx, p)
	if err != nil {
		return 0, fmt.Errorf("apps: offboard: %w", err)
	}
	n := 0
	for _, a := range list {
		if err := s.remove(ctx, a, by); err != nil && !errors.Is(err, vault.ErrNotFound) {
			return n, fmt.Errorf("apps: offboard: remove app %s: %w", a.ClientID, err)
		}
		n++
	}
	return n, nil
}

// remove is every removal of an app: the deletion (with its app.removed
// delivery, by the store's hook), the liveness cache, the audit event.
func (s *Service) remove(ctx context.Context, a vault.AppAccess, by Actor) error {
	if err := s.store.DeleteAppAccess(ctx, a.ID); err != nil {
		return err
	}
	s.ended(a.ID)
	s.log.Info("apps: app removed", "client_id", a.ClientID, "app", a.ID, "via", by.Via)
	s.rec.Audit(ctx, telemetry.Event{Kind: telemetry.EventAppRemoved, Principal: a.Principal, Admin: by.Admin, Client: a.ClientID, Via: by.Via})
	return nil
}
