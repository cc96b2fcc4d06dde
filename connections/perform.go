package connections

import (
	"context"
	"errors"
	"slices"

	"credbroker/provider"
	"credbroker/vault"
)

// Continuation is what a retry of a provider call continues: the connect
// request an earlier answer opened (from a sealed state the front door
// opened and bound to the person and the call), or the person's choice of
// account after an Ambiguous answer.
type Continuation struct {
	// Grant is the connect request the earlier answer opened ("" for none).
	Grant string
	// Answer is the person's answer to the earlier question, as the
	// client reported it.
	Answer Answer
	// Choosing: the earlier answer asked which account to use; Chosen is
	// the account the person named.
	Choosing bool
	Chosen   string
}

// Response is the provider's answer to a call made as the person.
type Response struct {
	Conn     vault.Connection
	Provider *provider.Provider
	Resp     provider.APIResponse
}

func (Response) outcome() {}

// Perform calls the provider's API as req's person, deciding everything on
// the way: which account (Pick, or the person's choice), whether the
// person must connect first (Resume of an open connect request), and, when
// the provider refuses the stored access for good, a new connect request
// (Reconnect). It answers Response, NeedsUser, Ambiguous, Declined or
// Cancelled; errors are Call's and Pick's, and a *ChoiceError for an
// account choice that names no usable account.
//
// Pick answers from the listing cache, which sees a change made on another
// replica within ListBound: a connection picked there that was deleted
// meanwhile (Call: vault.ErrNotFound) is picked again, once, from the
// store. One marked needs_reconnect meanwhile is read as such by Call
// (provider.ErrNeedsReconnect) and leads to Reconnect, as one marked by
// the call itself does.
func (s *Service) Perform(ctx context.Context, req Request, api provider.APIRequest, cont Continuation) (Outcome, error) {
	for again := cont == (Continuation{}); ; again = false {
		o, err := s.continued(ctx, req, cont)
		if err != nil {
			return nil, err
		}
		c, ok := o.(Connected)
		if !ok {
			return o, nil
		}
		resp, err := s.Call(ctx, c.Conn, api)
		switch {
		case again && errors.Is(err, vault.ErrNotFound):
			s.changed(req.Principal) // the listing was behind: read the store
			continue
		case errors.Is(err, provider.ErrNeedsReconnect):
			s.log.Info("connections: connection needs reconnecting; asking the person", "provider", c.Provider.Name, "connection", c.Conn.ID, "via", req.Via)
			anyAccount := req
			anyAccount.Account = ""
			return s.Reconnect(ctx, anyAccount)
		case err != nil:
			return nil, err
		}
		return Response{Conn: c.Conn, Provider: c.Provider, Resp: resp}, nil
	}
}

// continued is the connection a call runs as: Pick's, or the outcome of
// the continuation cont.
func (s *Service) continued(ctx context.Context, req Request, cont Continuation) (Outcome, error) {
	switch {
	case cont.Choosing:
		return s.chosen(ctx, req, cont)
	case cont.Grant != "":
		return s.Resume(ctx, req, cont.Grant, cont.Answer)
	}
	return s.Pick(ctx, req)
}

// chosen continues after the person was asked which account to use.
func (s *Service) chosen(ctx context.Context, req Request, cont Continuation) (Outcome, error) {
	p, err := s.provider(req.Provider)
	if err != nil {
		return nil, err
	}
	base := req
	base.Account, base.CanAsk = "", false
	o, err := s.Pick(ctx, base)
	if err != nil {
		return nil, err
	}
	var active []string
	switch o := o.(type) {
	case Ambiguous:
		active = o.Accounts
	case Connected:
		active = []string{AccountName(o.Conn)}
	}
	switch cont.Answer {
	case NoAnswer:
		if len(active) > 1 {
			return Ambiguous{Provider: p, Accounts: active}, nil // not answered yet: ask again
		}
		return nil, &ChoiceError{Provider: p, Answer: NoAnswer}
	case Decline, Cancel:
		return nil, &ChoiceError{Provider: p, Answer: cont.Answer}
	}
	if cont.Chosen != "" && slices.Contains(active, cont.Chosen) {
		named := base
		named.Account = cont.Chosen
		if o, err := s.Pick(ctx, named); err == nil {
			if c, ok := o.(Connected); ok {
				return c, nil
			}
		}
	}
	return nil, &ChoiceError{Provider: p, Answer: cont.Answer, Chosen: cont.Chosen}
}
