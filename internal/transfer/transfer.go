// Package transfer names the kinds of records the persistent vault
// backends (bbolt, PostgreSQL) export and import as stored: what `broker
// migrate` moves between them. Only the backends, vaulttest and the
// broker's migrate command use it; it is not part of vault's API.
package transfer

import "strconv"

// RecordKind is a kind of stored record. The persistent backends export
// every record they hold, kind by kind in the order of these constants,
// and import what another backend exported: that is how `broker migrate`
// moves a deployment between bbolt and PostgreSQL.
type RecordKind int

const (
	// KindKeyCanary: a fixed text sealed with one key of the ring (its
	// envelope names the key), by which a store tells the keys it was
	// written with. Exported first, so a wrong key stops an import
	// before anything else is copied.
	KindKeyCanary RecordKind = iota + 1
	// KindConnection: a connection, its token set sealed.
	KindConnection
	// KindRetiredConnection: a connection offboarding deleted before its
	// tokens were revoked (vault.AdminStore's RetireConnection), kept to retry.
	KindRetiredConnection
	// KindGrant: a connect request.
	KindGrant
	// KindOAuthClient: a client registered at the authorization server.
	KindOAuthClient
	// KindAuthCode: an authorization code, under its vault.SecretKey.
	KindAuthCode
	// KindAppAccess: a person's consent to an app, with its token families.
	KindAppAccess
	// KindDelivery: a webhook delivery in the outbox.
	KindDelivery
	// KindSpentAssertion: a spent one-time assertion (an ID-JAG's jti,
	// as a vault.AssertionKey) and when it expires: without it the target of
	// a migration would accept the assertion again.
	KindSpentAssertion
	// KindUpstreamClient: the broker's registration at an upstream MCP
	// server's authorization server, its secret sealed: without it the
	// target of a migration would register again.
	KindUpstreamClient
	// KindIdPSession: a person's session at the organisation's IdP (its
	// refresh token and latest ID token sealed to the person): without
	// it everyone would sign in at the target of a migration again
	// before an enterprise-managed connection works for them.
	KindIdPSession

	// LastKind is the last RecordKind: kinds run from KindKeyCanary to it.
	LastKind = KindIdPSession
)

var recordKindNames = [...]string{
	KindKeyCanary:         "key canaries",
	KindConnection:        "connections",
	KindRetiredConnection: "retired connections",
	KindGrant:             "grants",
	KindOAuthClient:       "registered clients",
	KindAuthCode:          "authorization codes",
	KindAppAccess:         "app authorizations",
	KindDelivery:          "webhook deliveries",
	KindSpentAssertion:    "spent assertions",
	KindUpstreamClient:    "upstream registrations",
	KindIdPSession:        "IdP sessions",
}

// String names the kind's records, as a report counts them.
func (k RecordKind) String() string {
	if k > 0 && int(k) < len(recordKindNames) {
		return recordKindNames[k]
	}
	return "RecordKind(" + strconv.Itoa(int(k)) + ")"
}

// Records are stored records of one kind, each in the form the backends
// store it: a connection's token set stays sealed, so nothing is
// decrypted on the way from one backend to another. A record holds its
// own key (a connection's id, a canary's key id, …).
type Records struct {
	Kind RecordKind
	Recs [][]byte
}
