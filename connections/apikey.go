package connections

import (
	"context"
	"errors"
	"fmt"

	"credbroker/internal/telemetry"
	"credbroker/internal/untrusted"
	"credbroker/provider"
	"credbroker/vault"
)

// API-key connections are connections like the others: Ensure, Resume,
// Pick, Call, List and Disconnect treat them alike, and Save stores a
// verified key for a connect request (one connection per account: a key
// for an account already connected replaces its key in place). What is
// particular to them is here: the words of the request, and replacing the
// key of one connection from the connections page.

// keyMessage is NeedsUser.Message for an API-key provider.
func keyMessage(n NeedsUser) string {
	name := n.Provider.DisplayName
	switch {
	case n.Why.Kind == Reconnect:
		return fmt.Sprintf("Your %s key was rejected; enter a new one: open the link, sign in to the broker and paste a new key there (never into this app).", name)
	case n.Why.Kind == Pending && n.Why.Accepted:
		return fmt.Sprintf("Finish entering your %s key in the browser, then retry.", name)
	case n.Why.Kind == Pending:
		return fmt.Sprintf("Connect %s to continue: open the link, sign in to the broker and enter your key there (never into this app).", name)
	}
	return fmt.Sprintf("Connect %s to continue: it is not connected yet. Open the link, sign in to the broker and enter your %s key there (never into this app).",
		name, name)
}

// KeyAccountError: a replacement key is not one of the connection's
// account: the provider took it for another account, which is never
// named (the person may not have that account; Replace key must not tell
// whose a key is). Nothing was changed.
type KeyAccountError struct {
	Provider *provider.Provider
	// Connected is the connection's account.
	Connected string
}

func (e *KeyAccountError) Error() string {
	return fmt.Sprintf("This key was not accepted as a %s key of %s. Nothing was changed: enter a key of %s; to connect another account, ask your app for a new connect link.",
		e.Provider.DisplayName, untrusted.Quote(e.Connected), untrusted.Quote(e.Connected))
}

// KeyConnection returns connection id of req's person (metadata only) and
// its provider, when it is an API-key connection of a configured
// provider. Absent, not theirs or not a key: vault.ErrNotFound.
func (s *Service) KeyConnection(ctx context.Context, req Request, id string) (vault.Connection, *provider.Provider, error) {
	conns, err := s.List(ctx, req.Principal)
	if err != nil {
		return vault.Connection{}, nil, err
	}
	for _, c := range conns {
		if c.ID != id {
			continue
		}
		if p, ok := s.providers.Lookup(c.Provider); ok {
			if _, form := p.Kind.(provider.FormStep); form {
				return c, p, nil
			}
		}
		break
	}
	return vault.Connection{}, nil, fmt.Errorf("connections: key connection %s: %w", id, vault.ErrNotFound)
}

// ReplaceKey verifies a key pr entered for API-key connection id of
// req's person ("Replace key" on the connections page) and stores it in
// that connection, active again. Each check sends the key to the
// provider, so it is limited as a connect link's key entry is
// (binding.ReplaceAttempt: ErrTooManyKeys for the connection,
// ErrRateLimited for the person; nothing is sent then). The key must be
// for the same provider account (*KeyAccountError otherwise, which names
// no other account); absent or not theirs is vault.ErrNotFound; the
// provider's refusals are VerifyKey's. The result is metadata only.
func (s *Service) ReplaceKey(ctx context.Context, req Request, id string, values map[string]string) (vault.Connection, error) {
	cur, p, err := s.KeyConnection(ctx, req, id)
	if err != nil {
		return vault.Connection{}, err
	}
	if err := s.opts.Grants.ReplaceAttempt(ctx, req.Principal, p.Name, cur.ID); err != nil {
		return vault.Connection{}, fmt.Errorf("connections: replace key of %s: %w", id, err)
	}
	ex, err := s.opts.Client.VerifyKey(ctx, p, values)
	if err != nil {
		return vault.Connection{}, err
	}
	if ex.Account.ID != cur.AccountID {
		s.log.Info("connections: replacement key is another account's; nothing stored", "provider", p.Name, "connection", id)
		return vault.Connection{}, &KeyAccountError{Provider: p, Connected: AccountName(cur)}
	}
	if len(ex.Token.Fields) == 0 {
		return vault.Connection{}, errors.New("connections: replace key: no key given")
	}
	now := s.opts.Now()
	conn, err := s.opts.Store.UpdateConnection(ctx, id, func(old vault.Connection) (vault.Connection, error) {
		if !old.Principal.Same(req.Principal) || old.AccountID != ex.Account.ID {
			return old, vault.ErrNotFound
		}
		old.Token = ex.Token.Clone()
		old.AccountLogin, old.Status, old.Updated = ex.Account.Login, vault.StatusActive, now
		return old, nil
	})
	s.changed(req.Principal)
	if err != nil {
		return vault.Connection{}, fmt.Errorf("connections: replace key of %s: %w", id, err)
	}
	s.log.Info("connections: key replaced", "provider", p.Name, "connection", id, "via", req.Via)
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventConnect, Principal: req.Principal, Provider: p.Name,
		Account: AccountName(conn), Connection: id, Via: req.Via, Outcome: "key_replaced"})
	conn.Token = vault.TokenSet{}
	return conn, nil
}
