package oauthflow

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"credbroker/connections"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
	"credbroker/web"
)

// callbackParams is the provider's answer at the redirect URI, as parsed
// from the untrusted query string.
type callbackParams struct {
	Code, State, Error, ErrorDescription string
	// Iss is RFC 9207's issuer identifier of the authorization response.
	Iss string
}

// parseCallback validates the callback query: each parameter at most once,
// bounded length, and either a code or an error.
func parseCallback(rawQuery string) (callbackParams, error) {
	if len(rawQuery) > 8192 {
		return callbackParams{}, errors.New("query too long")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return callbackParams{}, fmt.Errorf("malformed query: %w", err)
	}
	var p callbackParams
	for k, dst := range map[string]*string{"code": &p.Code, "state": &p.State, "error": &p.Error, "error_description": &p.ErrorDescription, "iss": &p.Iss} {
		v := q[k]
		if len(v) > 1 {
			return callbackParams{}, fmt.Errorf("parameter %s repeated", k)
		}
		if len(v) == 1 {
			*dst = v[0]
		}
	}
	if len(p.Code) > 2048 || len(p.State) > 512 || len(p.Error) > 128 || len(p.Iss) > 512 {
		return callbackParams{}, errors.New("parameter too long")
	}
	if p.State == "" {
		return callbackParams{}, errors.New("no state")
	}
	if p.Error == "" && p.Code == "" {
		return callbackParams{}, errors.New("neither code nor error")
	}
	for _, r := range p.Error {
		if r < 0x20 || r > 0x7e {
			return callbackParams{}, errors.New("error code has invalid characters")
		}
	}
	p.ErrorDescription = untrusted.Clip(p.ErrorDescription, 300)
	return p, nil
}

// handleProviderCallback is GET /oauth/{provider}/callback.
func (f *Flow) handleProviderCallback(w http.ResponseWriter, r *http.Request) {
	pname := r.PathValue("provider")
	s := f.jar.session(r)
	fs, haveFlow := f.jar.flow(r)
	if !haveFlow {
		f.securityEvent(r, "callback_without_flow", s, "provider", pname)
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Connection attempt not recognised",
			Message: "This browser has no connection in progress that matches this answer from the provider (it may have expired, finished already, or been started in another browser). Nothing was connected.",
			Next:    restart})
		return
	}
	cp, err := parseCallback(r.URL.RawQuery)
	if err != nil || fs.Provider != pname || !web.EqualToken(cp.State, fs.State) {
		f.securityEvent(r, "callback_state_mismatch", s, "provider", pname, "grant_ref", connections.Ref(fs.Grant))
		f.renderError(w, web.ErrorPage{Chrome: s.chrome(), Status: http.StatusBadRequest, Heading: "Connection attempt not recognised",
			Message: "The answer from the provider does not match the connection this browser started. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more."})
		return
	}
	// The state matched: this flow cookie is spent whatever happens next.
	f.jar.clear(w, "flow")
	if s == nil {
		f.renderError(w, web.ErrorPage{Status: http.StatusUnauthorized, Heading: "You are signed out",
			Message: "Your broker sign-in expired while you were at the provider, so the connection could not be checked and nothing was connected.",
			Next:    "Open the link from your app again; you will sign in and approve once more."})
		return
	}
	conn, p, err := f.opts.Connections.Complete(r.Context(), connections.Callback{
		Principal: s.principal(), Grant: fs.Grant, Consent: vault.Principal{Issuer: fs.Iss, Subject: fs.Sub},
		Provider: pname, RedirectURL: f.opts.PublicURL + "/oauth/" + pname + "/callback",
		Request: provider.AuthRequest{State: fs.State, Verifier: fs.Verifier, Nonce: fs.Nonce, Scopes: fs.Scopes},
		Code:    cp.Code, Error: cp.Error, ErrorDescription: cp.ErrorDescription, Iss: cp.Iss,
	})
	if err != nil {
		f.callbackFailed(w, r, s, fs.Grant, p, err)
		return
	}
	f.renderDone(w, donePage{Chrome: s.chrome(), Provider: p.DisplayName, Account: conn.AccountLogin, Scopes: conn.Scopes,
		NoRefresh: connections.MissingRefreshToken(p, conn)})
}

// callbackFailed renders why a provider's answer stored nothing.
func (f *Flow) callbackFailed(w http.ResponseWriter, r *http.Request, s *session, grant string, p *provider.Provider, err error) {
	var (
		le *connections.LinkError
		ie *connections.IssuerError
		pe *connections.ProviderError
		wd *provider.WrongDomainError
		ue *provider.UpstreamError
	)
	ch := s.chrome()
	switch {
	case errors.As(err, &le):
		f.linkFailed(w, r, s, grant, "callback", err)
	case errors.As(err, &ie):
		f.securityEvent(r, "callback_issuer_mismatch", s, "provider", p.Name, "grant_ref", connections.Ref(grant), "iss_present", ie.Present)
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadRequest, Heading: "Connection attempt not recognised",
			Message: "The answer did not come from " + p.DisplayName + " as the broker expected (its issuer was missing or different), so it was not used. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more."})
	case errors.As(err, &pe):
		f.log.Info("provider returned an error", "provider", p.Name, "error", pe.Code, "grant_ref", connections.Ref(grant))
		if pe.Denied {
			f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusForbidden, Heading: "Not connected: access was refused at " + p.DisplayName,
				Message: p.DisplayName + " reported that access was not granted. Nothing was connected and the app has been told.",
				Detail:  pe.Description, Next: "If this was a mistake, ask your app to start the connection again."})
			return
		}
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadGateway, Heading: p.DisplayName + " reported an error",
			Message: p.DisplayName + " did not complete the connection (error " + strconv.Quote(pe.Code) + "). Nothing was connected.",
			Detail:  pe.Description, Next: "Open the link from your app again. If it keeps happening, tell your administrator."})
	case errors.Is(err, provider.ErrCodeRejected):
		f.log.Warn("provider code exchange refused", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadRequest, Heading: "The authorization was already used or has expired",
			Message: p.DisplayName + " did not accept the authorization code. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more."})
	case errors.As(err, &wd):
		f.log.Warn("provider account outside the hosted domain", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusForbidden, Heading: "This " + p.DisplayName + " account is not allowed here",
			Message: "This broker only connects " + p.DisplayName + " accounts of " + domainWords(wd.Want) + ". The account you chose is not one of them, so nothing was stored.",
			Next:    "Open the link from your app again and choose an account of that domain."})
	case errors.Is(err, provider.ErrAccountUnknown):
		f.log.Warn("provider account lookup failed", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadGateway, Heading: "Could not confirm your " + p.DisplayName + " account",
			Message: p.DisplayName + " signed you in, but the broker could not confirm which account it was, so nothing was stored.",
			Next:    "Open the link from your app again. If it keeps happening, tell your administrator."})
	case errors.Is(err, provider.ErrRegistrationDropped):
		f.log.Warn("upstream authorization server no longer knows the broker's registration", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadGateway, Heading: p.DisplayName + " no longer knows the broker's registration",
			Message: p.DisplayName + " answered that it does not know the client the broker registered there, so the connection could not be finished. The broker has forgotten that registration and registers anew. Nothing was connected.",
			Next:    "Open the link from your app again and approve once more: connect again."})
	case errors.As(err, &ue) && ue.Kind == provider.UpstreamClientRefused:
		f.log.Error("upstream authorization server refused the broker's configured client", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadGateway, Heading: p.DisplayName + " does not accept the broker's client",
			Message: p.DisplayName + " refused the client the broker is configured with there, so the connection could not be finished. Nothing was connected.",
			Next:    "Tell your administrator: the broker's configuration for " + p.DisplayName + " must be fixed before connecting can work."})
	case errors.Is(err, provider.ErrProviderUnavailable):
		f.log.Warn("provider code exchange failed", "provider", p.Name, "err", err.Error())
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusBadGateway, Heading: p.DisplayName + " did not answer properly",
			Message: "The broker could not finish the connection with " + p.DisplayName + ". Nothing was connected.",
			Next:    "Try again in a few minutes: go back to your app and ask it to connect again."})
	case errors.Is(err, connections.ErrRequestExpired):
		f.renderError(w, web.ErrorPage{Chrome: ch, Status: http.StatusGone, Heading: "This connect link can no longer be used",
			Message: "The link expired or was used while you were at " + p.DisplayName + ". Nothing new was stored.", Next: restart})
	default:
		f.fail(w, r, s, http.StatusInternalServerError, "store connection", err)
	}
}

// domainWords names a hosted_domain for people.
func domainWords(hd string) string {
	if hd == "*" {
		return "an organisation's Google Workspace"
	}
	return "the domain " + hd
}
