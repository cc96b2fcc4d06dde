package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"credbroker/vault"
	"credbroker/vault/boltstore"
)

// openStore opens the bolt database at path with kr, creating its directory
// (mode 0700) when missing. Errors are one line naming the cause (locked by
// another broker, corrupt file, wrong key).
func openStore(path string, kr *vault.Keyring) (vault.Store, error) {
	return openBolt(path, kr)
}

func openBolt(path string, kr *vault.Keyring) (*boltstore.Store, error) {
	if kr == nil {
		return nil, errNoKeys
	}
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create store directory: %w", err)
		}
	}
	return boltstore.Open(path, kr, boltstore.Options{})
}

// rekeyBatch is how many records one rotation transaction re-seals.
const rekeyBatch = 500

// startBackgroundRekey re-seals, in the background, every record not yet
// sealed with kr's primary key (after `broker keys rotate` ran while this
// broker held the database, or after a new primary was put in the key
// file). It skips the scan when the store records that a rotation to this
// primary already finished. The returned channel closes when it is done;
// cancelling ctx stops it, and the next start resumes.
func startBackgroundRekey(ctx context.Context, store vault.Store, kr *vault.Keyring, log *slog.Logger) <-chan struct{} {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	done := make(chan struct{})
	bs, _ := store.(*boltstore.Store)
	if bs != nil && bs.FullySealed() {
		close(done)
		return done
	}
	go func() {
		defer close(done)
		start := time.Now()
		n, err := vault.Rekey(ctx, store, kr, rekeyBatch)
		switch {
		case err != nil && ctx.Err() != nil:
			log.Info("key rotation paused; it resumes on the next start", "rewritten", n, "key_id", kr.Primary())
		case err != nil:
			log.Error("key rotation failed", "rewritten", n, "key_id", kr.Primary(), "err", err)
		default:
			if bs != nil {
				if err := bs.MarkFullySealed(); err != nil {
					log.Warn("key rotation finished but could not be recorded", "err", err)
				}
			}
			if n > 0 {
				log.Info("key rotation finished", "rewritten", n, "key_id", kr.Primary(), "took", time.Since(start).Round(time.Millisecond))
			}
		}
	}()
	return done
}
