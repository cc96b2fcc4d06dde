package authserver

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"credbroker/vault"
)

// handleRevoke is POST /revoke (RFC 7009). Revoking either token of a
// family revokes the family: its refresh token and every access token
// issued from it. A token the broker does not know, or one already
// revoked, is answered 200 as the RFC asks.
func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request) {
	form, e := readForm(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	c, e := s.authenticateClient(r, form)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	tok := form.Get("token")
	if tok == "" {
		s.writeError(w, r, oerr(http.StatusBadRequest, "invalid_request", "token is required"))
		return
	}
	appID, famID, refresh := parseRefresh(tok)
	if !refresh {
		claims, err := s.keys.parse(tok)
		if err != nil || claims.Issuer != s.opts.PublicURL {
			revoked(w)
			return
		}
		if claims.ClientID != c.ID {
			s.writeError(w, r, oerr(http.StatusBadRequest, "unauthorized_client", "the token was not issued to this client"))
			return
		}
		var ok bool
		if appID, famID, ok = strings.Cut(claims.Session, "."); !ok {
			revoked(w)
			return
		}
	}
	presented := vault.SecretKey(tok)
	foreign := false
	_, err := s.store.UpdateAppAccess(r.Context(), appID, func(a vault.AppAccess) (vault.AppAccess, error) {
		foreign = false
		i := slices.IndexFunc(a.Families, func(f vault.TokenFamily) bool { return f.ID == famID })
		if i < 0 {
			return a, errNoWrite
		}
		if refresh {
			// Only a token the family really issued revokes it.
			f := a.Families[i]
			if f.RefreshHash != presented && !slices.Contains(f.Spent, presented) {
				return a, errNoWrite
			}
		}
		if a.ClientID != c.ID {
			foreign = true
			return a, errNoWrite
		}
		a.Families = slices.Delete(a.Families, i, i+1)
		return a, nil
	})
	switch {
	case foreign:
		s.writeError(w, r, oerr(http.StatusBadRequest, "unauthorized_client", "the token was not issued to this client"))
	case err == nil:
		s.log.Info("authserver: token family revoked by its client", "client_id", c.ID, "app", appID)
		revoked(w)
	case errors.Is(err, errNoWrite), errors.Is(err, vault.ErrNotFound):
		revoked(w)
	default:
		s.writeError(w, r, &oauthError{Status: http.StatusServiceUnavailable, Code: "temporarily_unavailable", Desc: "the token could not be revoked; try again", Err: err})
	}
}

func revoked(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(http.StatusOK)
}
