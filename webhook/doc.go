// Package webhook tells applications what happened to connections,
// without polling: events sent as Standard Webhooks (standardwebhooks.com)
// to configured endpoints, from a durable outbox in the store.
//
// # Events
//
//	connection.created          a person connected a provider account
//	connection.needs_reconnect  the provider refused the stored grant
//	connection.reconnected      a connection that needed reconnecting works again
//	connection.deleted          disconnected, offboarded or disabled by an admin
//	connection.refresh_failed   a refresh failed without ending the connection
//	app.authorized, app.removed a person allowed an app at the broker's authorization
//	                           server, or it was removed (page or offboarding)
//
// The body is {"type", "timestamp", "data"}; data carries ids, the
// provider, the account and the person's iss and sub, never a token.
//
// # Delivery
//
// Publisher.Changes is the store's vault.ChangeHook[vault.Connection]: the
// deliveries of a change (one per event and interested endpoint) are written in the
// change's own transaction, so a crash between the commit and the send
// loses nothing. Events no change carries (refresh_failed) are enqueued
// with Publisher.Publish. The Dispatcher claims due deliveries (replicas
// sharing PostgreSQL take disjoint ones), POSTs each with webhook-id (the
// event's stable id: deduplicate on it), webhook-timestamp (the attempt's
// time) and webhook-signature ("v1," and the base64 HMAC-SHA256 of
// "id.timestamp.body" under each configured whsec_ secret), and retries
// failures with exponential backoff and jitter until the event is a day
// old. 2xx is success; 410 Gone gives the delivery up; redirects are not
// followed; Retry-After is honoured. Delivery is at least once.
package webhook
