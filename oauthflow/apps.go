package oauthflow

import (
	"context"
	"errors"
	"net/http"
	"time"

	"credbroker/vault"
)

// Person is who is signed in to the broker in a browser.
type Person struct {
	Principal vault.Principal
	// Display is an email or name, for pages.
	Display string
	// CSRF is the session's anti-forgery token; forms on other pages of
	// the broker echo it.
	CSRF string
}

// SignedIn reports who is signed in to the broker in r's browser. It is
// the hook through which another front door's pages (the authorization
// server's consent page) use the broker's session without knowing its
// cookie: cmd/broker wires it, front doors never import each other.
func (f *Flow) SignedIn(r *http.Request) (Person, bool) {
	s := f.jar.session(r)
	if s == nil {
		return Person{}, false
	}
	return Person{Principal: s.principal(), Display: s.Display, CSRF: s.CSRF}, true
}

// StartSignIn sends the browser through the broker's sign-in at the IdP
// and back to returnTo, a path on the broker (anything else becomes
// /connections).
func (f *Flow) StartSignIn(w http.ResponseWriter, r *http.Request, returnTo string) {
	f.startLogin(w, r, safeReturn(returnTo))
}

// App is an app (an OAuth client of the broker's authorization server)
// a person has allowed, as "My connections" lists it.
type App struct {
	ID             string
	Name           string // self-asserted by the app: untrusted text
	ClientID       string
	VerifiedDomain string // the metadata document's host; empty: registered dynamically
	Authorized     time.Time
	LastUsed       time.Time
	Active         bool
	// ByOrganisation: the organisation's IdP let the app in (an ID-JAG,
	// enterprise-managed authorization), not only the person's consent.
	ByOrganisation bool
}

// Apps lists and removes the apps a person allowed. The broker's
// authorization server provides it (wired by cmd/broker).
type Apps interface {
	ListApps(ctx context.Context, p vault.Principal) ([]App, error)
	// RemoveApp revokes everything the app holds for p. It returns
	// ErrNoSuchApp when p has no such app.
	RemoveApp(ctx context.Context, p vault.Principal, id string) error
}

// ErrNoSuchApp: the person has no app with that id.
var ErrNoSuchApp = errors.New("oauthflow: no such app")

type appRow struct {
	ID, Name, ClientID, Verified, Authorized, LastUsed string
	Active, ByOrganisation                             bool
}

func (f *Flow) appRows(ctx context.Context, p vault.Principal) ([]appRow, error) {
	if f.opts.Apps == nil {
		return nil, nil
	}
	apps, err := f.opts.Apps.ListApps(ctx, p)
	if err != nil {
		return nil, err
	}
	rows := make([]appRow, 0, len(apps))
	for _, a := range apps {
		row := appRow{ID: a.ID, Name: a.Name, ClientID: a.ClientID, Verified: a.VerifiedDomain, Active: a.Active, ByOrganisation: a.ByOrganisation,
			Authorized: a.Authorized.UTC().Format("2006-01-02 15:04 UTC"), LastUsed: "never"}
		if !a.LastUsed.IsZero() {
			row.LastUsed = a.LastUsed.UTC().Format("2006-01-02 15:04 UTC")
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// handleRemoveApp is POST /connections/apps/{id}/remove.
func (f *Flow) handleRemoveApp(w http.ResponseWriter, r *http.Request) {
	s, ok := f.postedForm(w, r, plainForm)
	if !ok {
		return
	}
	if f.opts.Apps == nil {
		f.redirectNotice(w, r, "app_not_found")
		return
	}
	err := f.opts.Apps.RemoveApp(r.Context(), s.principal(), r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNoSuchApp):
		f.redirectNotice(w, r, "app_not_found")
	case err != nil:
		f.fail(w, r, s, http.StatusInternalServerError, "remove app", err)
	default:
		f.redirectNotice(w, r, "app_removed")
	}
}
