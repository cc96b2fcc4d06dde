package telemetry

import (
	"context"
	"time"

	"credbroker/vault"
)

// StoreObserver returns the vault.Observer that times every store
// operation, of every feature, into
// credbroker_vault_operation_duration_seconds{op,outcome}: give it to
// vault.Observe. A nil Recorder returns nil (nothing is observed).
func (r *Recorder) StoreObserver() vault.Observer {
	if r == nil {
		return nil
	}
	return storeObserver{r}
}

type storeObserver struct{ r *Recorder }

func (storeObserver) Begin(ctx context.Context, _ string) context.Context { return ctx }

func (o storeObserver) End(_ context.Context, op string, took time.Duration, err error) {
	o.r.vaultOp(op, err, took)
}
