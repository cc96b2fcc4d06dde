package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"credbroker/vault"
)

// countingStore counts the durable commits (successful writes: with bbolt
// each is one fsync'd transaction, possibly shared with concurrent
// writers) made through it. It sits under the telemetry wrapper, as the
// bolt store does in serve.
type countingStore struct {
	vault.Store
	commits  atomic.Int64
	twoSteps bool // hide vault.GrantConnector: the callback writes twice, as before
}

func (c *countingStore) count(err error) error {
	if err == nil {
		c.commits.Add(1)
	}
	return err
}

func (c *countingStore) CreateConnection(ctx context.Context, x vault.Connection) (vault.Connection, error) {
	out, err := c.Store.CreateConnection(ctx, x)
	return out, c.count(err)
}

func (c *countingStore) UpdateConnection(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	out, err := c.Store.UpdateConnection(ctx, id, fn)
	return out, c.count(err)
}

func (c *countingStore) UpdateConnectionMeta(ctx context.Context, id string, fn func(vault.Connection) (vault.Connection, error)) (vault.Connection, error) {
	out, err := c.Store.UpdateConnectionMeta(ctx, id, fn)
	return out, c.count(err)
}

func (c *countingStore) DeleteConnection(ctx context.Context, id string) error {
	return c.count(c.Store.DeleteConnection(ctx, id))
}

func (c *countingStore) CreateGrant(ctx context.Context, g vault.Grant) (vault.Grant, error) {
	out, err := c.Store.CreateGrant(ctx, g)
	return out, c.count(err)
}

func (c *countingStore) CreateGrantLimited(ctx context.Context, g vault.Grant, lim vault.GrantLimits) (vault.Grant, error) {
	out, err := c.Store.CreateGrantLimited(ctx, g, lim)
	return out, c.count(err)
}

func (c *countingStore) UpdateGrant(ctx context.Context, id string, fn func(vault.Grant) (vault.Grant, error)) (vault.Grant, error) {
	out, err := c.Store.UpdateGrant(ctx, id, fn)
	return out, c.count(err)
}

func (c *countingStore) DeleteExpiredGrants(ctx context.Context, now time.Time) (int, error) {
	n, err := c.Store.DeleteExpiredGrants(ctx, now)
	return n, c.count(err)
}

func (c *countingStore) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, fn func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	gc, ok := c.Store.(vault.GrantConnector)
	if !ok || c.twoSteps {
		return vault.Connection{}, vault.Grant{}, errors.ErrUnsupported
	}
	conn, g, err := gc.Connect(ctx, w, grantID, fn)
	return conn, g, c.count(err)
}
