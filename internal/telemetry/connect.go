package telemetry

import (
	"context"
	"errors"
	"time"

	"credbroker/vault"
)

// Connect passes vault.GrantConnector through the timing wrapper; a store
// without it (a test double) answers errors.ErrUnsupported, and callers
// then write twice.
func (t *timedStore) Connect(ctx context.Context, w vault.ConnectionWrite, grantID string, fn func(vault.Grant) (vault.Grant, error)) (vault.Connection, vault.Grant, error) {
	gc, ok := t.next.(vault.GrantConnector)
	if !ok {
		return vault.Connection{}, vault.Grant{}, errors.ErrUnsupported
	}
	start := time.Now()
	c, g, err := gc.Connect(ctx, w, grantID, fn)
	t.done("connect", start, err)
	return c, g, err
}

var _ vault.GrantConnector = (*timedStore)(nil)
