package authserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"credbroker/internal/telemetry"
	"credbroker/vault"
)

// App is one app a person has allowed, for the "Apps with access" list.
type App struct {
	// ID names the record for RemoveApp.
	ID       string
	ClientID string
	// Name is the app's self-asserted name: untrusted text.
	Name string
	// VerifiedDomain is, for an app identified by a metadata document, the
	// host serving it; empty for a dynamically registered app.
	VerifiedDomain string
	Authorized     time.Time
	LastUsed       time.Time
	// Active reports whether the app holds a token that still works.
	Active bool
	// ByOrganisation reports that the organisation's IdP let the app in
	// (an ID-JAG redeemed for it), rather than only the person's consent.
	ByOrganisation bool
}

// Apps lists the apps p has allowed.
func (s *Server) Apps(ctx context.Context, p vault.Principal) ([]App, error) {
	list, err := s.store.ListAppAccess(ctx, p)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make([]App, 0, len(list))
	for _, a := range list {
		app := App{ID: a.ID, ClientID: a.ClientID, Name: a.ClientName, Authorized: a.Updated, LastUsed: a.LastUsed}
		if strings.HasPrefix(a.ClientID, "urn:credbroker:") {
			app.VerifiedDomain = "built into this broker"
		} else if isClientIDURL(a.ClientID) {
			if u, err := url.Parse(a.ClientID); err == nil {
				app.VerifiedDomain = u.Host
			}
		}
		app.Active = len(liveFamilies(a.Families, now, s.opts.RefreshIdleTTL)) > 0
		app.ByOrganisation = slices.ContainsFunc(a.Families, func(f vault.TokenFamily) bool { return f.Via == vault.FamilyViaIDJAG })
		out = append(out, app)
	}
	return out, nil
}

// ErrNoSuchApp: RemoveApp found no app with that id for that person (it
// does not exist, or it is someone else's: the two look the same).
var ErrNoSuchApp = errors.New("authserver: no such app")

// RemoveApp revokes everything app id holds for p (every token family)
// and forgets the consent, so the app must ask again.
func (s *Server) RemoveApp(ctx context.Context, p vault.Principal, id string) error {
	a, err := s.store.GetAppAccess(ctx, id)
	if errors.Is(err, vault.ErrNotFound) || (err == nil && !a.Principal.Same(p)) {
		return ErrNoSuchApp
	}
	if err != nil {
		return err
	}
	if err := s.store.DeleteAppAccess(ctx, id); err != nil {
		if errors.Is(err, vault.ErrNotFound) {
			return ErrNoSuchApp
		}
		return fmt.Errorf("authserver: remove app: %w", err)
	}
	s.log.Info("authserver: app removed by its person", "client_id", a.ClientID, "app", id)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventAppRemoved, Principal: p, Client: a.ClientID, Via: "browser"})
	s.appEvent(ctx, AppRemoved, p, a.ClientID, a.ClientName)
	return nil
}
