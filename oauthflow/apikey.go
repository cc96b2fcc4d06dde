package oauthflow

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"credbroker/connections"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
)

// API-key entry pages. A connect link for a type: api_key provider lands,
// after the same sign-in and initiator check as OAuth, on a page asking
// for the key (instead of the consent page and the provider's redirect);
// its form posts to /connect/{grant}/key. "Replace key" on the connections
// page shows the same form for one existing connection. On every post the
// broker checks the CSRF token and re-checks the signed-in person, then
// provider.Client.VerifyKey checks the values (nothing is sent on a
// mismatch) and asks the provider who the key belongs to; only then is
// anything stored. No page and no log line ever shows what was entered.

// noticeKeyDeleted is the connections page's notice after an API key was
// disconnected.
const noticeKeyDeleted = "key_deleted"

// keyEntryPage is the key entry form.
type keyEntryPage struct {
	Chrome       web.Chrome
	Provider     string
	Instructions string
	// InstructionsURL is where the person creates (and revokes) keys.
	InstructionsURL string
	// requester: who asked, as on the consent page (empty when replacing).
	requester
	Identity string
	Action   string
	// Replace: replacing the key of connection Account.
	Replace bool
	Account string
	// Rejected: the person's stored key for this provider was refused.
	Rejected bool
	// Error says why the last submission was refused, never with a value.
	Error  string
	Fields []keyInput
	// page names the form step's template.
	page string
}

type keyInput struct {
	Name, Label string
	Secret      bool
	MaxLength   int
}

// newKeyPage fills the parts of the entry page every use shares.
func newKeyPage(s *session, p *provider.Provider, form provider.Form, action string) keyEntryPage {
	page := keyEntryPage{Chrome: s.chrome(), Provider: p.DisplayName, Instructions: form.Instructions,
		InstructionsURL: form.InstructionsURL, Identity: s.Display, Action: action, page: form.Page}
	for _, fd := range form.Fields {
		page.Fields = append(page.Fields, keyInput{Name: fd.Name, Label: fd.Label, Secret: fd.Secret, MaxLength: fd.MaxLength})
	}
	return page
}

// grantKeyPage is the entry page of connect request g: who asked.
func grantKeyPage(s *session, p *provider.Provider, form provider.Form, g vault.Grant) keyEntryPage {
	page := newKeyPage(s, p, form, "/connect/"+g.ID+"/key")
	page.requester = requesterOf(g)
	return page
}

func (f *Flow) renderKeyEntry(w http.ResponseWriter, status int, p keyEntryPage) {
	f.render(w, status, p.page, p)
}

// formLanding is GET /connect/{grant} for a form step: the entry page
// (the grant is the signed-in person's, open, at a configured provider:
// Open checked).
func (f *Flow) formLanding(w http.ResponseWriter, r *http.Request, s *session, cr connections.ConnectRequest, step provider.FormStep) {
	page := grantKeyPage(s, cr.Provider, step.Form(), cr.Grant)
	page.Rejected = f.keyRejected(r, s, cr.Provider)
	f.renderKeyEntry(w, http.StatusOK, page)
}

// keyRejected reports whether one of the person's connections to p
// needs a new key.
func (f *Flow) keyRejected(r *http.Request, s *session, p *provider.Provider) bool {
	conns, err := f.opts.Connections.List(r.Context(), s.principal())
	if err != nil {
		return false
	}
	return slices.ContainsFunc(conns, func(c vault.Connection) bool {
		return c.Provider == p.Name && c.Status == vault.StatusNeedsReconnect
	})
}

// keyValues collects the posted field values of form: each field at most
// once, else page says so and ok is false.
func (f *Flow) keyValues(w http.ResponseWriter, r *http.Request, form provider.Form, page keyEntryPage) (map[string]string, bool) {
	out := map[string]string{}
	for _, fd := range form.Fields {
		vs := r.PostForm["field."+fd.Name]
		if len(vs) > 1 {
			page.Error = "The form gave a field twice. Nothing was sent or stored."
			f.renderKeyEntry(w, http.StatusBadRequest, page)
			return nil, false
		}
		if len(vs) == 1 {
			out[fd.Name] = vs[0]
		}
	}
	return out, true
}

// keyRefused renders page again with why what was posted was refused
// (never a value), or the generic failure. ref names the attempt in logs.
func (f *Flow) keyRefused(w http.ResponseWriter, r *http.Request, s *session, p *provider.Provider, page keyEntryPage, ref string, err error) {
	var fe *provider.KeyFormatError
	var ke *provider.KeyRefusedError
	var ae *connections.KeyAccountError
	status := http.StatusBadRequest
	switch {
	case page.Replace && (errors.As(err, &ke) || errors.As(err, &ae)):
		// A replacement never tells a refused key from another account's
		// (whose it is is none of the page's business): one answer.
		f.log.Info("key entry: replacement key not accepted; nothing stored", "provider", p.Name, "ref", ref)
		page.Error = (&connections.KeyAccountError{Provider: p, Connected: page.Account}).Error()
	case errors.Is(err, connections.ErrTooManyKeys), errors.Is(err, connections.ErrRateLimited):
		f.log.Warn("key entry: too many keys tried", "provider", p.Name, "ref", ref)
		status = http.StatusTooManyRequests
		page.Error = connections.Describe(err, p)
	case errors.As(err, &fe):
		var fields []string
		for _, pr := range fe.Problems {
			fields = append(fields, pr.Field)
		}
		f.log.Info("key entry: values failed the checks; nothing sent", "provider", p.Name, "fields", strings.Join(fields, ","), "ref", ref)
		page.Error = fe.Error() + ". Nothing was sent to " + p.DisplayName + " and nothing was stored."
	case errors.As(err, &ke):
		f.log.Info("key entry: the provider refused the key", "provider", p.Name, "status", ke.Status, "ref", ref)
		page.Error = fmt.Sprintf("The key was refused by %s (%d). Nothing was stored. Check that you copied the whole key, or create a new one.", p.DisplayName, ke.Status)
	case errors.Is(err, provider.ErrAccountUnknown):
		f.log.Warn("key entry: the verify answer named no account", "provider", p.Name, "err", err.Error(), "ref", ref)
		status = http.StatusBadGateway
		page.Error = p.DisplayName + " accepted the key, but the broker could not confirm which account it belongs to, so nothing was stored."
	case errors.Is(err, provider.ErrProviderUnavailable):
		f.log.Warn("key entry: provider unavailable", "provider", p.Name, "err", err.Error(), "ref", ref)
		status = http.StatusBadGateway
		page.Error = "The broker could not reach " + p.DisplayName + " to check the key. Nothing was stored; try again in a few minutes."
	default:
		f.fail(w, r, s, http.StatusInternalServerError, "key entry", err)
		return
	}
	f.renderKeyEntry(w, status, page)
}

// handleKeySubmit is POST /connect/{grant}/key: the entry form of a
// connect link. decision=deny declines the request; decision=approve
// verifies and stores the key, which completes the request.
func (f *Flow) handleKeySubmit(w http.ResponseWriter, r *http.Request) {
	s, cr, ok := f.postedLink(w, r, keyForm, "key_submit")
	if !ok {
		return
	}
	p, g := cr.Provider, cr.Grant
	step, form := p.Kind.(provider.FormStep)
	if !form {
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Not a key form",
			Message: p.DisplayName + " is connected through its own sign-in, not with a key. Nothing was stored.",
			Next:    "Open the link from your app again."})
		return
	}
	if !f.approved(w, r, s, "Connect or Deny", "Nothing was sent or stored.", "Open the link again and choose.", func() { f.decline(w, r, s, cr) }) {
		return
	}
	page := grantKeyPage(s, p, step.Form(), g)
	values, ok := f.keyValues(w, r, step.Form(), page)
	if !ok {
		return
	}
	conn, err := f.opts.Connections.EnterKey(r.Context(), s.principal(), cr, values)
	clear(values)
	var le *connections.LinkError
	switch {
	case errors.As(err, &le):
		f.linkFailed(w, r, s, g.ID, "key_submit", err)
		return
	case errors.Is(err, connections.ErrRequestExpired):
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusGone, Heading: "This connect link can no longer be used",
			Message: "The link expired or was used meanwhile. Nothing new was stored.", Next: restart})
		return
	case err != nil:
		f.keyRefused(w, r, s, p, page, connections.Ref(g.ID), err)
		return
	}
	f.log.Info("key entry: connection stored", "provider", p.Name, "connection", conn.ID, "grant_ref", connections.Ref(g.ID))
	f.renderDone(w, donePage{Chrome: s.chrome(), Provider: p.DisplayName, Account: conn.AccountLogin})
}

// keyConnection loads connection id of the signed-in person for the
// replace pages, rendering the page for every outcome that stops.
func (f *Flow) keyConnection(w http.ResponseWriter, r *http.Request, s *session) (vault.Connection, *provider.Provider, bool) {
	c, p, err := f.opts.Connections.KeyConnection(r.Context(), connections.Request{Principal: s.principal(), Via: "browser"}, r.PathValue("id"))
	switch {
	case errors.Is(err, vault.ErrNotFound):
		// Absent, someone else's and not a key look the same.
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusNotFound, Heading: "No such key connection",
			Message: "You have no API-key connection with this address (it may have been disconnected).",
			Next:    "Go to My connections."})
		return c, nil, false
	case err != nil:
		f.fail(w, r, s, http.StatusInternalServerError, "load key connection", err)
		return c, nil, false
	}
	return c, p, true
}

func replacePage(s *session, c vault.Connection, p *provider.Provider) keyEntryPage {
	step, _ := p.Kind.(provider.FormStep) // KeyConnection: a form step's connection
	page := newKeyPage(s, p, step.Form(), "/connections/"+url.PathEscape(c.ID)+"/key")
	page.Replace, page.Account = true, connections.AccountName(c)
	page.Rejected = c.Status == vault.StatusNeedsReconnect
	return page
}

// handleReplaceKeyPage is GET /connections/{id}/key: "Replace key".
func (f *Flow) handleReplaceKeyPage(w http.ResponseWriter, r *http.Request) {
	s := f.jar.session(r)
	if s == nil {
		f.startLogin(w, r, "/connections")
		return
	}
	c, p, ok := f.keyConnection(w, r, s)
	if !ok {
		return
	}
	f.renderKeyEntry(w, http.StatusOK, replacePage(s, c, p))
}

// handleReplaceKey is POST /connections/{id}/key: verify the new key and
// store it in the same connection (same account only).
func (f *Flow) handleReplaceKey(w http.ResponseWriter, r *http.Request) {
	s, ok := f.postedForm(w, r, keyForm)
	if !ok {
		return
	}
	c, p, ok := f.keyConnection(w, r, s)
	if !ok {
		return
	}
	if !f.approved(w, r, s, "Replace key or Cancel", "Nothing was sent or stored.", "Go to My connections.", func() { f.redirectNotice(w, r, "") }) {
		return
	}
	page := replacePage(s, c, p)
	step, _ := p.Kind.(provider.FormStep)
	values, ok := f.keyValues(w, r, step.Form(), page)
	if !ok {
		return
	}
	_, err := f.opts.Connections.ReplaceKey(r.Context(), connections.Request{Principal: s.principal(), Via: "browser"}, c.ID, values)
	clear(values)
	switch {
	case errors.Is(err, vault.ErrNotFound):
		f.redirectNotice(w, r, "not_found")
		return
	case err != nil:
		f.keyRefused(w, r, s, p, page, c.ID, err)
		return
	}
	f.redirectNotice(w, r, "key_replaced")
}

// keyNotice adds the key notices to the connections page: after a
// disconnect, where to revoke the key at its provider.
func (f *Flow) keyNotice(page *connectionsPage, q url.Values) {
	switch q.Get("notice") {
	case "key_replaced":
		page.Notice = "Key replaced. The new key is stored encrypted and used from now on; revoke the old one at the provider if you no longer need it."
	case noticeKeyDeleted:
		page.Notice = "Disconnected. The key was deleted from the broker. The broker cannot revoke an API key: revoke it at the provider too."
		if p, ok := f.providers.Lookup(q.Get("provider")); ok {
			if step, form := p.Kind.(provider.FormStep); form {
				page.Notice = "Disconnected. The key was deleted from the broker. The broker cannot revoke an API key: revoke it at " + p.DisplayName + " too."
				page.NoticeLink, page.NoticeLinkText = step.Form().InstructionsURL, "Revoke it at "+p.DisplayName
			}
		}
	}
}
