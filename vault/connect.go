package vault

import "context"

// ConnectionWrite is the connection half of GrantConnector.Connect: either
// Create, a new connection (as CreateConnection), or Update applied to
// connection UpdateID (as UpdateConnection).
type ConnectionWrite struct {
	Create   *Connection
	UpdateID string
	Update   func(Connection) (Connection, error)
	// Known, when set, is the grant as the caller last read it. A store
	// may apply the grant function to it and swap on its version first,
	// reading the grant only when that swap finds it changed; a Known of
	// another id is ignored. Either way the function's result lands only
	// on the version it was applied to.
	Known *Grant
}

// GrantConnector is the Store feature (Store.Connector, which may be nil)
// that stores the connection a connect request produced and closes the
// request in one transaction (one durable commit where there were two,
// and no window in which a connection exists for a grant that could not
// be completed).
//
// Connect performs w, then applies grant to grant grantID (with the rules
// of UpdateGrant), atomically: when either fails nothing is stored, and the
// error is returned as is. The connection's id is known before the call
// (Create.ID or UpdateID), so grant can record it. Both functions may run
// more than once and must be free of side effects. The result carries the
// stored connection (with its Token, as CreateConnection and
// UpdateConnection return it) and grant.
type GrantConnector interface {
	Connect(ctx context.Context, w ConnectionWrite, grantID string, grant func(Grant) (Grant, error)) (Connection, Grant, error)
}
