// Package vault is credbroker's persistent storage: connections (a principal's
// link to a provider account, with its encrypted token set) and grants (pending
// connect requests).
//
// The Store interface is the contract every backend implements; vaulttest.Run
// is the conformance suite each backend runs. A Store's features beyond
// connections and grants are sub-stores it names (Auth, Outbox, Admin,
// Assertions, Connector, Locker, Resealer, AppWatch, UpstreamClients), each
// with a suite of its own, and Observe is the one place every operation of
// every feature is reported to observers (metrics, traces). Backends never
// see plaintext tokens at rest: a connection's token set is sealed with the
// Keyring (AEAD, random nonce, key-id prefix, AAD bound to the record's
// identity) before it is written, and opened after it is read, by the
// record codecs the backends share (vault/internal/record: the stored
// formats are not public API); so is the client secret of each of the
// broker's registrations at upstream authorization servers. Metadata
// (principal, provider, account, scopes, times, status) stays in the clear
// so it can be indexed and listed.
//
// Mutation goes through Update-style compare-and-swap closures; the Version
// field of each record increases by one on every successful write.
package vault
