package main

import (
	"context"
	"sync/atomic"
	"time"

	"credbroker/vault"
)

// commitCounter is a vault.Observer that counts the durable commits made
// through the broker's store: the successful writes of connections and
// grants (with bbolt each is one fsync'd transaction, possibly shared with
// concurrent writers).
type commitCounter struct{ commits atomic.Int64 }

// commitOps are the operations commitCounter counts.
var commitOps = map[string]bool{
	"create_connection": true, "update_connection": true, "update_connection_meta": true, "delete_connection": true,
	"create_grant": true, "create_grant_limited": true, "update_grant": true, "delete_expired_grants": true,
	"connect": true,
}

func (*commitCounter) Begin(ctx context.Context, _ string) context.Context { return ctx }

func (c *commitCounter) End(_ context.Context, op string, _ time.Duration, err error) {
	if err == nil && commitOps[op] {
		c.commits.Add(1)
	}
}

// twoStepStore hides the store's one-transaction connect: the callback
// writes the connection and the grant apart, as before it existed.
type twoStepStore struct{ vault.Store }

func (twoStepStore) Connector() vault.GrantConnector { return nil }
