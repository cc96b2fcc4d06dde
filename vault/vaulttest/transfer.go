package vaulttest

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/internal/envelope"
)

// FillEveryKind stores records of every transfer.RecordKind in s through its
// API, for tests that move a store's contents (broker migrate): OAuth and
// API-key connections of two people (one with bytes some databases
// mangle) in both statuses, one of them retired; grants in three states;
// a confidential and a public registered client; a redeemed and an
// unredeemed authorization code; app authorizations with token families;
// webhook deliveries, one of them retried; spent assertions (StillSpent
// checks them); upstream registrations, one with a client secret
// (UpstreamClientsKept checks them); the IdP sessions of both people, one
// refreshed since its sign-in, one without a refresh token
// (IdPSessionsKept checks them). Key canaries are the store's own. It
// returns how many records of each kind it stored.
func FillEveryKind(t *testing.T, s vault.Store) map[transfer.RecordKind]int {
	t.Helper()
	ctx := t.Context()
	auth, out, adm := s.Auth(), s.Outbox(), s.Admin()
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("fill: %s: %v", what, err)
		}
	}

	for _, c := range []vault.Connection{
		Conn("conn-a1", alice, "github", "1"),
		Conn("conn-a2", alice, "google", "alice@example.com"),
		KeyConn("conn-a3", alice, "jira", "a3"),
		Conn("conn-o1", odd, "github", "2"),
		Conn("conn-o2", odd, "github", "3"),
	} {
		_, err := s.CreateConnection(ctx, c)
		check("create "+c.ID, err)
	}
	_, err := s.UpdateConnectionMeta(ctx, "conn-a2", func(c vault.Connection) (vault.Connection, error) {
		c.Status, c.LastUsed = vault.StatusNeedsReconnect, base.Add(time.Minute)
		return c, nil
	})
	check("needs reconnect", err)
	_, err = s.UpdateConnection(ctx, "conn-o1", func(c vault.Connection) (vault.Connection, error) {
		c.Token.AccessToken, c.LastRefreshed, c.RefreshExpires = "at-conn-o1-refreshed", base.Add(time.Hour), base.AddDate(0, 6, 0)
		return c, nil
	})
	check("refresh", err)
	check("retire", adm.RetireConnection(ctx, "conn-o2"))

	for i, g := range []vault.Grant{
		grant("grant-1", alice, base, base.Add(10*time.Minute)),
		grant("grant-2", odd, base.Add(time.Second), base.Add(10*time.Minute)),
		grant("grant-3", alice, base.Add(-time.Hour), base.Add(-50*time.Minute)),
	} {
		_, err := s.CreateGrant(ctx, g)
		check("create "+g.ID, err)
		if i == 1 {
			_, err = s.UpdateGrant(ctx, g.ID, func(g vault.Grant) (vault.Grant, error) {
				g.State, g.ConnectionID, g.Rounds, g.Attempts = vault.GrantCompleted, "conn-o1", 2, 1
				return g, nil
			})
			check("complete "+g.ID, err)
		}
	}

	public := oauthClient("client-public", base)
	public.SecretHash, public.AuthMethod = nil, "none"
	for _, c := range []vault.OAuthClient{oauthClient("client-confidential", base), public} {
		_, err := auth.CreateOAuthClient(ctx, c, 0)
		check("create "+c.ID, err)
	}
	_, err = auth.UpdateOAuthClient(ctx, "client-public", func(c vault.OAuthClient) (vault.OAuthClient, error) {
		c.Used = base.Add(time.Minute)
		return c, nil
	})
	check("use client", err)

	for _, c := range []vault.AuthCode{authCode("code-redeemed", odd, base.Add(time.Minute)), authCode("code-open", alice, base.Add(time.Minute))} {
		check("create code", auth.CreateAuthCode(ctx, c))
	}
	_, err = auth.RedeemAuthCode(ctx, vault.SecretKey("code-redeemed"))
	check("redeem code", err)

	a := appAccess("app-1", alice, "client-public")
	a.Families = []vault.TokenFamily{
		{ID: "fam-1", Scopes: []string{"mcp"}, Resource: "https://broker.example/mcp", Created: base, Expires: base.AddDate(0, 1, 0),
			RefreshHash: vault.SecretKey("rt-2"), Refreshed: base.Add(time.Hour), Spent: []string{vault.SecretKey("rt-1")}},
		{ID: "fam-2", Resource: "https://broker.example/mcp", Created: base, Expires: base.AddDate(0, 1, 0)},
	}
	for _, a := range []vault.AppAccess{a, appAccess("app-2", odd, "https://claude.example/client.json")} {
		_, err := auth.CreateAppAccess(ctx, a)
		check("create "+a.ID, err)
	}

	ds := []vault.Delivery{
		{ID: "evt-1", Endpoint: "audit", Type: "connection.created", Created: base, Payload: []byte(`{"type":"connection.created"}`), Due: base},
		{ID: "evt-1", Endpoint: "crm", Type: "connection.created", Created: base, Payload: []byte(`{"type":"connection.created"}`), Due: base},
		{ID: "evt-2", Endpoint: "audit", Type: "app.removed", Created: base.Add(time.Second), Payload: []byte(`{}`), Due: base},
	}
	check("enqueue", out.EnqueueDeliveries(ctx, ds))
	ds[2].Attempts, ds[2].Due, ds[2].LastError = 3, base.Add(time.Hour), "502 from the endpoint"
	check("retry", out.RetryDelivery(ctx, ds[2]))

	for _, jti := range spentJTIs {
		check("spend "+jti, s.Assertions().SpendAssertion(ctx, vault.AssertionKey(alice.Issuer, jti), base.Add(5*time.Minute)))
	}

	for _, c := range filledUpstream {
		_, err := s.UpstreamClients().PutUpstreamClient(ctx, c)
		check("put upstream client "+c.ClientID, err)
	}

	for _, ss := range filledSessions {
		signedIn := ss
		signedIn.RefreshToken, signedIn.IDToken, signedIn.Updated = "", "idt-sign-in", ss.Created
		_, err := s.IdPSessions().PutIdPSession(ctx, signedIn)
		check("put IdP session of "+ss.Principal.Subject, err)
		if ss.Version > 1 {
			_, err = s.IdPSessions().UpdateIdPSession(ctx, ss.Principal, func(old vault.IdPSession) (vault.IdPSession, error) {
				old.RefreshToken, old.IDToken, old.IDTokenExpires, old.Updated = ss.RefreshToken, ss.IDToken, ss.IDTokenExpires, ss.Updated
				return old, nil
			})
			check("refresh IdP session of "+ss.Principal.Subject, err)
		}
	}

	return map[transfer.RecordKind]int{
		transfer.KindConnection: 4, transfer.KindRetiredConnection: 1, transfer.KindGrant: 3,
		transfer.KindOAuthClient: 2, transfer.KindAuthCode: 2, transfer.KindAppAccess: 2, transfer.KindDelivery: 3,
		transfer.KindSpentAssertion: len(spentJTIs), transfer.KindUpstreamClient: len(filledUpstream),
		transfer.KindIdPSession: len(filledSessions),
	}
}

// filledSessions are the IdP sessions FillEveryKind leaves: alice's,
// refreshed once since she signed in (version 2), and odd's, whose IdP
// issued no refresh token.
var filledSessions = []vault.IdPSession{
	{Principal: alice, RefreshToken: "idp-rt-alice-refreshed", IDToken: "idp-idt-alice-refreshed",
		IDTokenExpires: base.Add(2 * time.Hour), Created: base, Updated: base.Add(time.Hour), Version: 2},
	{Principal: odd, IDToken: "idt-sign-in", IDTokenExpires: base.Add(time.Hour), Created: base, Updated: base, Version: 1},
}

// IdPSessionsKept fails unless s holds the IdP sessions FillEveryKind
// left, each opening as its own person with its tokens, times and
// version: people whose store was copied need not sign in again.
func IdPSessionsKept(t *testing.T, s vault.Store) {
	t.Helper()
	for _, want := range filledSessions {
		got, err := s.IdPSessions().GetIdPSession(t.Context(), want.Principal)
		if err != nil || got.Principal != want.Principal || got.RefreshToken.Reveal() != want.RefreshToken.Reveal() ||
			got.IDToken.Reveal() != want.IDToken.Reveal() || !got.IDTokenExpires.Equal(want.IDTokenExpires) ||
			!got.Created.Equal(want.Created) || !got.Updated.Equal(want.Updated) || got.Version != want.Version {
			t.Errorf("IdP session of %q after the copy: %+v, %v; want %+v", want.Principal.Subject, got, err, want)
		}
	}
}

// Importer is a store that imports what an Exporter exported (boltstore,
// pgstore).
type Importer interface {
	ImportRecords(ctx context.Context, rs transfer.Records) (added, skipped int, err error)
}

// MovedIdPSessionShut imports into dst, whose IdP sessions s serves, a
// copy of alice's exported session (among recs) with the person in the
// clear changed to another, and fails unless the copy is filed under that
// person and does not open there while alice's still does: an import
// opens nothing, and a session stays bound to the person it was sealed
// for on the way.
func MovedIdPSessionShut(t *testing.T, recs [][]byte, dst Importer, s vault.Store) {
	t.Helper()
	mlice := vault.Principal{Issuer: alice.Issuer, Subject: "mlice"}
	var moved []byte
	for _, rec := range recs {
		if m := bytes.Replace(rec, []byte(`"sub":"alice"`), []byte(`"sub":"mlice"`), 1); !bytes.Equal(m, rec) {
			moved = m
		}
	}
	if moved == nil {
		t.Fatalf("no exported IdP session of alice among %d", len(recs))
	}
	if added, skipped, err := dst.ImportRecords(t.Context(), transfer.Records{Kind: transfer.KindIdPSession, Recs: [][]byte{moved}}); err != nil || added != 1 || skipped != 0 {
		t.Fatalf("import of a session moved to another person: %d added, %d skipped, %v", added, skipped, err)
	}
	if got, err := s.IdPSessions().GetIdPSession(t.Context(), mlice); !errors.Is(err, vault.ErrDecrypt) {
		t.Errorf("alice's session moved to another person opens for them: %+v, %v; want ErrDecrypt", got, err)
	}
	if got, err := s.IdPSessions().GetIdPSession(t.Context(), alice); err != nil || got.RefreshToken.Reveal() != filledSessions[0].RefreshToken.Reveal() {
		t.Errorf("alice's session after the moved copy: %+v, %v", got, err)
	}
}

// filledUpstream are the upstream registrations FillEveryKind puts: a
// confidential and a public client.
var filledUpstream = []vault.UpstreamClient{
	upstreamClient("https://as.example", "dcr-fill-1", "dcr-fill-secret-1"),
	upstreamClient("https://public.example", "dcr-fill-2", ""),
}

// UpstreamClientsKept fails unless s holds the upstream registrations
// FillEveryKind put, their secrets opening: a store its records were
// copied into registers nowhere again.
func UpstreamClientsKept(t *testing.T, s vault.Store) {
	t.Helper()
	for _, want := range filledUpstream {
		got, err := s.UpstreamClients().GetUpstreamClient(t.Context(), want.Key)
		if err != nil || got.ClientID != want.ClientID || got.ClientSecret.Reveal() != want.ClientSecret.Reveal() {
			t.Errorf("upstream registration %s after the copy: %+v, %v", want.ClientID, got, err)
		}
	}
}

// NothingInTheClear fails when a record s holds (as ExportRecords hands
// it out: byte for byte as stored) contains a token, an API key, an
// upstream client secret or an IdP session's token FillEveryKind stored.
func NothingInTheClear(t *testing.T, s Exporter) {
	t.Helper()
	var secrets []string
	for _, id := range []string{"conn-a1", "conn-a2", "conn-o1", "conn-o2"} {
		c := Conn(id, alice, "", "")
		secrets = append(secrets, c.Token.AccessToken.Reveal(), c.Token.RefreshToken.Reveal(), c.Token.IDToken.Reveal())
	}
	secrets = append(secrets, "at-conn-o1-refreshed", KeyConn("conn-a3", alice, "", "").Token.Fields["api_token"].Reveal())
	for _, c := range filledUpstream {
		if c.ClientSecret != "" {
			secrets = append(secrets, c.ClientSecret.Reveal())
		}
	}
	for _, ss := range filledSessions {
		if ss.RefreshToken != "" {
			secrets = append(secrets, ss.RefreshToken.Reveal())
		}
		secrets = append(secrets, ss.IDToken.Reveal())
	}
	found := 0
	for kind, recs := range Exported(t, s) {
		for _, rec := range recs {
			found++
			for _, secret := range secrets {
				if bytes.Contains(rec, []byte(secret)) {
					t.Errorf("a stored record of %s holds %q in the clear", kind, secret)
				}
			}
		}
	}
	if found == 0 {
		t.Fatal("the store exported no records: fill it first")
	}
}

// spentJTIs are the ids of the assertions FillEveryKind spends.
var spentJTIs = []string{"jti-1", "jti-2"}

// StillSpent fails unless s refuses every assertion FillEveryKind spent:
// a store its records were copied into keeps replay protection.
func StillSpent(t *testing.T, s vault.Store) {
	t.Helper()
	for _, jti := range spentJTIs {
		err := s.Assertions().SpendAssertion(t.Context(), vault.AssertionKey(alice.Issuer, jti), base.Add(5*time.Minute))
		if !errors.Is(err, vault.ErrAssertionSpent) {
			t.Errorf("assertion %s after the copy: %v, want ErrAssertionSpent", jti, err)
		}
	}
}

// Exporter is a store that exports its records (boltstore, pgstore).
type Exporter interface {
	ExportRecords(ctx context.Context, batch int, put func(transfer.Records) error) error
}

// Exported returns every record s exports, by kind, in export order.
func Exported(t *testing.T, s Exporter) map[transfer.RecordKind][][]byte {
	t.Helper()
	all := map[transfer.RecordKind][][]byte{}
	err := s.ExportRecords(t.Context(), 3, func(rs transfer.Records) error {
		all[rs.Kind] = append(all[rs.Kind], rs.Recs...)
		return nil
	})
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	return all
}

// SameRecords fails unless a and b hold the same records, byte for byte,
// in the same order; key canaries, which each store seals itself (with a
// random nonce), by the key ids they name; IdP sessions, which each
// backend keys its own way (bolt by a hash of the person, PostgreSQL by
// the person), in any order.
func SameRecords(t *testing.T, a, b Exporter) {
	t.Helper()
	ra, rb := Exported(t, a), Exported(t, b)
	keyIDs := func(canaries [][]byte) []string {
		var ids []string
		for _, c := range canaries {
			id, err := envelope.KeyID(c)
			if err != nil {
				t.Fatalf("a key canary: %v", err)
			}
			ids = append(ids, id)
		}
		return ids
	}
	if ia, ib := keyIDs(ra[transfer.KindKeyCanary]), keyIDs(rb[transfer.KindKeyCanary]); !slices.Equal(ia, ib) {
		t.Errorf("key canaries for %q and %q", ia, ib)
	}
	delete(ra, transfer.KindKeyCanary)
	delete(rb, transfer.KindKeyCanary)
	for _, r := range []map[transfer.RecordKind][][]byte{ra, rb} {
		slices.SortFunc(r[transfer.KindIdPSession], bytes.Compare)
	}
	for k := range rb {
		if _, ok := ra[k]; !ok {
			t.Errorf("%s: %d records, and none in the other store", k, len(rb[k]))
		}
	}
	for k, recs := range ra {
		if !slices.EqualFunc(recs, rb[k], bytes.Equal) {
			t.Errorf("%s differ:\n%q\n%q", k, recs, rb[k])
		}
	}
}
