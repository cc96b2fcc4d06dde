package authserver

import (
	"net/http"
	"strings"

	"credbroker/apps"
	"credbroker/vault"
)

// handleRevoke is POST /revoke (RFC 7009). Revoking either token of a
// family revokes the family: its refresh token and every access token
// issued from it. A token the broker does not know, or one already
// revoked, is answered 200 as the RFC asks.
func (s *Server) handleRevoke(w http.ResponseWriter, r *http.Request) {
	form, c, e := s.clientRequest(w, r)
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
	out, err := s.apps.Revoke(r.Context(), appID, apps.Revocation{FamilyID: famID, Refresh: refresh, Presented: vault.SecretKey(tok), ClientID: c.ID})
	switch {
	case err != nil:
		s.writeError(w, r, &oauthError{Status: http.StatusServiceUnavailable, Code: "temporarily_unavailable", Desc: "the token could not be revoked; try again", Err: err})
	case out == apps.Foreign:
		s.writeError(w, r, oerr(http.StatusBadRequest, "unauthorized_client", "the token was not issued to this client"))
	case out == apps.Revoked:
		s.log.Info("authserver: token family revoked by its client", "client_id", c.ID, "app", appID)
		revoked(w)
	default:
		revoked(w)
	}
}

func revoked(w http.ResponseWriter) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	w.WriteHeader(http.StatusOK)
}
