package connections

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"credbroker/internal/telemetry"
	"credbroker/provider"
	"credbroker/vault"
)

// Admin is the operator on whose behalf an admin action runs: the person
// the admin API verified, or the local user of a `broker admin` command.
type Admin struct {
	Principal vault.Principal
	// Via names the door: "admin-api" or "cli".
	Via string
}

// OffboardStep removes one more kind of a person's data when they are
// offboarded: the extension point for what other parts of the broker keep
// per person (the authorization server's app grants: a step that deletes
// every AppAccess of the person and reports app.removed). Remove must be
// idempotent: offboarding runs again until everything is gone.
type OffboardStep struct {
	// Name is shown in the report ("app grants").
	Name string
	// Remove deletes what p holds and returns how many records it removed.
	Remove func(ctx context.Context, p vault.Principal, admin Admin) (int, error)
}

// OffboardedConnection is what became of one connection.
type OffboardedConnection struct {
	ID       string
	Provider string
	Account  string
	// Revocation is what revoking at the provider came to.
	Revocation provider.Revocation
	// Retry: the connection was deleted by an earlier run whose
	// revocation was not confirmed, and this run tried again.
	Retry bool
	// Pending: revocation is still not confirmed; the connection is
	// deleted but its sealed tokens are kept so the next run retries.
	Pending bool
	// Error says why revocation was not confirmed (no token material).
	Error string
}

// StepReport is what an OffboardStep did.
type StepReport struct {
	Name    string
	Removed int
	Error   string
}

// OffboardReport is what offboarding did.
type OffboardReport struct {
	Principal   vault.Principal
	Connections []OffboardedConnection
	// Grants is how many connect requests were deleted.
	Grants int
	Steps  []StepReport
}

// Complete reports whether nothing is left to retry: every revocation
// confirmed (or not possible) and every step done.
func (r OffboardReport) Complete() bool {
	for _, c := range r.Connections {
		if c.Pending {
			return false
		}
	}
	for _, st := range r.Steps {
		if st.Error != "" {
			return false
		}
	}
	return true
}

// pending counts the connections still waiting for revocation.
func (r OffboardReport) pending() int {
	n := 0
	for _, c := range r.Connections {
		if c.Pending {
			n++
		}
	}
	return n
}

// confirmed reports whether a revocation outcome needs no retry: the
// provider confirmed it, cannot revoke, or another connection shares the
// account (revoking would end it).
func confirmed(r provider.Revocation) bool { return r != provider.NotConfirmed }

// AdminList returns person's connections (metadata only) for an admin,
// and audits that the admin looked.
func (s *Service) AdminList(ctx context.Context, admin Admin, person vault.Principal) ([]vault.Connection, error) {
	conns, err := s.List(ctx, person)
	if err != nil {
		return nil, err
	}
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventAdminList, Admin: admin.Principal, Principal: person,
		Via: admin.Via, Outcome: fmt.Sprintf("connections=%d", len(conns))})
	return conns, nil
}

// Offboard removes everything the broker holds for person: each
// connection is revoked at its provider and deleted, every connect request
// deleted, and every OffboardStep run. It is idempotent and resumable: a
// connection whose revocation is not confirmed is deleted all the same,
// but its sealed record is kept apart (vault.AdminStore.RetireConnection)
// and the next run tries the revocation again, forgetting the record once
// the provider confirms. Every action is audited with the admin's name;
// the deletions are connection.deleted events.
func (s *Service) Offboard(ctx context.Context, admin Admin, person vault.Principal) (OffboardReport, error) {
	adm := s.opts.Store.Admin()
	defer s.changed(person)
	rep := OffboardReport{Principal: person}
	log := s.log.With("via", admin.Via)
	// Revocations earlier runs could not confirm.
	retired, err := adm.RetiredConnections(ctx, person)
	if err != nil {
		return rep, fmt.Errorf("connections: offboard: retired connections: %w", err)
	}
	for _, c := range retired {
		// The connection is gone from the store: revoke with the kept
		// tokens as they are (an empty id keeps the provider client from
		// refreshing through the store first).
		rc := c
		rc.ID = ""
		rev, rerr := s.revoke(ctx, rc)
		oc := OffboardedConnection{ID: c.ID, Provider: c.Provider, Account: AccountName(c), Revocation: rev, Retry: true}
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventRevoke, Principal: person, Admin: admin.Principal,
			Provider: c.Provider, Account: oc.Account, Connection: c.ID, Via: admin.Via, Outcome: string(rev), Err: rerr})
		if confirmed(rev) {
			if err := adm.ForgetRetired(context.WithoutCancel(ctx), c.ID); err != nil && !errors.Is(err, vault.ErrNotFound) {
				return rep, fmt.Errorf("connections: offboard: forget %s: %w", c.ID, err)
			}
		} else {
			oc.Pending = true
			oc.Error = errText(rerr)
		}
		rep.Connections = append(rep.Connections, oc)
	}
	conns, err := s.List(ctx, person)
	if err != nil {
		return rep, err
	}
	for _, m := range conns {
		full, err := s.opts.Store.GetConnection(ctx, m.ID)
		if errors.Is(err, vault.ErrNotFound) {
			continue // deleted meanwhile
		}
		oc := OffboardedConnection{ID: m.ID, Provider: m.Provider, Account: AccountName(m)}
		var rerr error
		if err != nil {
			// A record that does not open (a missing key) cannot be
			// revoked; it is deleted all the same, and says why.
			oc.Revocation, rerr = provider.NotSupported, err
		} else {
			oc.Revocation, rerr = s.revoke(ctx, full)
		}
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventRevoke, Principal: person, Admin: admin.Principal,
			Provider: m.Provider, Account: oc.Account, Connection: m.ID, Via: admin.Via, Outcome: string(oc.Revocation), Err: rerr})
		wctx := context.WithoutCancel(ctx)
		if confirmed(oc.Revocation) || err != nil {
			err = s.opts.Store.DeleteConnection(wctx, m.ID)
		} else {
			oc.Pending, oc.Error = true, errText(rerr)
			err = adm.RetireConnection(wctx, m.ID)
		}
		if err != nil && !errors.Is(err, vault.ErrNotFound) {
			return rep, fmt.Errorf("connections: offboard: delete %s: %w", m.ID, err)
		}
		if rerr != nil {
			log.Warn("connections: offboarding: revocation not confirmed; deleted, retried on the next run", "provider", m.Provider, "connection", m.ID, "err", rerr)
		}
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventDisconnect, Principal: person, Admin: admin.Principal,
			Provider: m.Provider, Account: oc.Account, Connection: m.ID, Via: admin.Via})
		rep.Connections = append(rep.Connections, oc)
	}
	if rep.Grants, err = adm.DeleteGrants(context.WithoutCancel(ctx), person); err != nil {
		return rep, fmt.Errorf("connections: offboard: delete connect requests: %w", err)
	}
	for _, st := range s.opts.Offboard {
		n, err := st.Remove(ctx, person, admin)
		rep.Steps = append(rep.Steps, StepReport{Name: st.Name, Removed: n, Error: errText(err)})
	}
	outcome := fmt.Sprintf("connections=%d grants=%d revocation_pending=%d", len(rep.Connections), rep.Grants, rep.pending())
	for _, st := range rep.Steps {
		outcome += fmt.Sprintf(" %s=%d", strings.ReplaceAll(st.Name, " ", "_"), st.Removed)
	}
	var incomplete error
	if !rep.Complete() {
		incomplete = errors.New("incomplete: run offboarding again to retry")
	}
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventOffboard, Principal: person, Admin: admin.Principal,
		Via: admin.Via, Outcome: outcome, Err: incomplete})
	log.Info("connections: person offboarded", "complete", rep.Complete(), "outcome", outcome)
	return rep, nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// DisableReport is what disabling a provider did.
type DisableReport struct {
	Provider string
	// Marked: connections newly marked needs_reconnect.
	Marked int
	// Deleted: connections deleted (with --delete), and how their
	// revocation went.
	Deleted     int
	Revocations map[provider.Revocation]int
}

// DisableProvider acts on every connection to a provider, e.g. after its
// client secret leaked: it marks each needs_reconnect (people connect
// again once the provider is fixed), or with del revokes and deletes
// each. Each change is a connection event; the whole is audited with the
// admin's name. Running it again continues where it stopped.
func (s *Service) DisableProvider(ctx context.Context, admin Admin, name string, del bool) (DisableReport, error) {
	rep := DisableReport{Provider: name, Revocations: map[provider.Revocation]int{}}
	now := s.opts.Now()
	for m, err := range s.everyConnectionTo(ctx, name) {
		if err != nil {
			return rep, fmt.Errorf("connections: disable %s: %w", name, err)
		}
		if del {
			rev := provider.NotSupported
			var rerr error
			if full, err := s.opts.Store.GetConnection(ctx, m.ID); err == nil {
				rev, rerr = s.revoke(ctx, full)
			}
			s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventRevoke, Principal: m.Principal, Admin: admin.Principal,
				Provider: name, Account: AccountName(m), Connection: m.ID, Via: admin.Via, Outcome: string(rev), Err: rerr})
			err := s.opts.Store.DeleteConnection(context.WithoutCancel(ctx), m.ID)
			s.changed(m.Principal)
			if err != nil && !errors.Is(err, vault.ErrNotFound) {
				return rep, fmt.Errorf("connections: disable %s: delete %s: %w", name, m.ID, err)
			}
			s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventDisconnect, Principal: m.Principal, Admin: admin.Principal,
				Provider: name, Account: AccountName(m), Connection: m.ID, Via: admin.Via})
			rep.Deleted++
			rep.Revocations[rev]++
			continue
		}
		if m.Status == vault.StatusNeedsReconnect {
			continue
		}
		_, err := s.opts.Store.UpdateConnectionMeta(ctx, m.ID, func(c vault.Connection) (vault.Connection, error) {
			if c.Status == vault.StatusNeedsReconnect {
				return c, errUnchanged
			}
			c.Status, c.Updated = vault.StatusNeedsReconnect, now
			return c, nil
		})
		s.changed(m.Principal)
		switch {
		case errors.Is(err, errUnchanged), errors.Is(err, vault.ErrNotFound):
			continue
		case err != nil:
			return rep, fmt.Errorf("connections: disable %s: mark %s: %w", name, m.ID, err)
		}
		s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventNeedsReconnect, Principal: m.Principal, Admin: admin.Principal,
			Provider: name, Account: AccountName(m), Connection: m.ID, Via: admin.Via, Outcome: "disabled by an admin"})
		rep.Marked++
	}
	outcome := fmt.Sprintf("needs_reconnect=%d", rep.Marked)
	if del {
		outcome = fmt.Sprintf("deleted=%d", rep.Deleted)
	}
	s.opts.Telemetry.Audit(ctx, telemetry.Event{Kind: telemetry.EventProviderDisable, Admin: admin.Principal, Provider: name,
		Via: admin.Via, Outcome: outcome})
	return rep, nil
}
