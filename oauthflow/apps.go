package oauthflow

import (
	"context"
	"errors"
	"net/http"

	"credbroker/apps"
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

// Apps lists and removes the apps a person allowed at the broker's
// authorization server: the apps core (*apps.Service), wired by
// cmd/broker.
type Apps interface {
	List(ctx context.Context, p vault.Principal) ([]apps.App, error)
	// Remove revokes everything the app holds for p. It returns
	// apps.ErrNoSuchApp when p has no such app.
	Remove(ctx context.Context, p vault.Principal, id string, by apps.Actor) error
}

type appRow struct {
	ID, Name, ClientID, Verified, Authorized, LastUsed string
	Active, ByOrganisation                             bool
}

func (f *Flow) appRows(ctx context.Context, p vault.Principal) ([]appRow, error) {
	if f.opts.Apps == nil {
		return nil, nil
	}
	list, err := f.opts.Apps.List(ctx, p)
	if err != nil {
		return nil, err
	}
	rows := make([]appRow, 0, len(list))
	for _, a := range list {
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
	err := f.opts.Apps.Remove(r.Context(), s.principal(), r.PathValue("id"), apps.Actor{Via: "browser"})
	switch {
	case errors.Is(err, apps.ErrNoSuchApp):
		f.redirectNotice(w, r, "app_not_found")
	case err != nil:
		f.fail(w, r, s, http.StatusInternalServerError, "remove app", err)
	default:
		f.redirectNotice(w, r, "app_removed")
	}
}
