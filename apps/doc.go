// Package apps is every decision about the apps (OAuth clients: MCP
// hosts) people allow at the broker's authorization server: the
// counterpart, for hosts, of package connections. It knows no HTTP;
// authserver, oauthflow ("Apps with access") and adminapi translate from
// it, and offboarding runs its Offboard step.
//
// It holds:
//
//   - consent memory: Remembered and Covers (the same redirect URI, a
//     loopback one in any port, and no new scope), Approve;
//   - token families: NewFamily, AddFamily (an authorization code's
//     redemption), AddFamilyWithoutConsent (an ID-JAG, broker dev's host),
//     at most MaxFamilies per app, the oldest first out;
//   - refresh-token rotation as a pure function, Policy.Rotate: (record,
//     presented token, now) → (new record, Outcome); Service.Rotate only
//     applies it in the store's compare-and-swap, so a token is spent once
//     across replicas. Revocation likewise (Revoke);
//   - token-family liveness (Alive), with a per-process cache;
//   - removing an app (Remove) and offboarding's app step (Offboard): one
//     removal, whoever asks, with its audit event (app_removed, naming the
//     door and the operator) and its webhook (app.removed);
//   - the "Apps with access" listing (List).
//
// # Events in the change's transaction
//
// app.authorized and app.removed are not queued by this package: the
// store's vault.ChangeHook[vault.AppAccess] (webhook.Publisher.AppChanges,
// wired by cmd/broker) turns the change of the record into its deliveries inside
// the transaction that writes it, as connection events are. A change
// whose deliveries cannot be written is not applied.
//
// # Liveness and its cache
//
// Every use of an access token checks that its token family still
// exists. The check reads only what it needs of the app's record
// (vault.AuthStore.GetAppLiveness: person, client, family ids and ends;
// never the spent refresh token hashes). A per-process cache, keyed by
// family id (never by a token or anything derived from one), answers
// instead of the store where it can be trusted:
//
//   - Options.SoleWriter (a bolt file, a memory store: one process writes
//     the store): every change goes through this Service, which forgets
//     the app's cached families before it returns. An end is seen at once.
//   - Options.Watch (PostgreSQL, several replicas): the store reports
//     every committed change of an app record (LISTEN/NOTIFY) and when it
//     has reported everything committed before a time (Fresh). The cache
//     is trusted only while that time is less than Bound (one second) old,
//     so an end is refused on every replica once acknowledged plus Bound.
//     When the feed breaks the cache is emptied; after a reconnection it
//     is filled again from the store.
//
// The per-call store check stays where the cache cannot be trusted: with
// neither option (a store of unknown sharing), while Follow does not run
// or its feed has not been fresh within Bound (start-up, a lost
// connection, an overloaded replica), and for every family a process has
// not read since its record last changed. The refresh, revocation and
// code grants always go to the store.
package apps
