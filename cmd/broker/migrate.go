package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"credbroker/vault/boltstore"
	"credbroker/vault/pgstore"
)

const migrateUsage = `usage: broker migrate --from bolt:PATH --to postgres://… [--keys-file F] [--batch N]

Copies every connection, grant and key canary from a bolt store into a
PostgreSQL store. Records are copied as stored: token sets stay sealed and
are never decrypted on the way. Ids already present in PostgreSQL are
skipped, so an interrupted migration is finished by running it again.
Stop the broker that uses the bolt file first (the file is locked while it
runs). The keys (BROKER_KEYS or --keys-file) must be the ones the bolt
store was written with; they are checked against both stores' canaries.
`

// Layout of the bolt file (boltstore's package documentation).
var (
	boltConnections = []byte("connections")
	boltGrants      = []byte("grants")
	boltMeta        = []byte("meta")
	boltCanary      = []byte("canary/")
)

// migrateCounts is what one migration did.
type migrateCounts struct {
	Conns, ConnsSkipped, Grants, GrantsSkipped, Canaries int
}

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, migrateUsage) }
	from := fs.String("from", "", "source store: bolt:PATH (or a plain path)")
	to := fs.String("to", "", "target store: postgres://… or postgres:KEY=VALUE…")
	keysFile := fs.String("keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	batch := fs.Int("batch", 1000, "records per PostgreSQL transaction")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	var problems []error
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	src, err := parseStore(*from)
	switch {
	case *from == "":
		problems = append(problems, errors.New("--from is required (the bolt store: bolt:PATH)"))
	case err != nil:
		problems = append(problems, fmt.Errorf("--from: %w", err))
	case src.BoltPath == "":
		problems = append(problems, errors.New("--from must be a bolt store (bolt:PATH)"))
	}
	dst, err := parseStore(*to)
	switch {
	case *to == "":
		problems = append(problems, errors.New("--to is required (the PostgreSQL store: postgres://…)"))
	case err != nil:
		problems = append(problems, fmt.Errorf("--to: %w", err))
	case dst.Postgres == "":
		problems = append(problems, errors.New("--to must be a PostgreSQL store (postgres://…)"))
	}
	if *batch < 1 || *batch > 50_000 {
		problems = append(problems, fmt.Errorf("--batch %d: must be between 1 and 50000", *batch))
	}
	if len(problems) > 0 {
		fmt.Fprint(stderr, migrateUsage)
		return usageError{"migrate: " + errors.Join(problems...).Error()}
	}
	kr, err := loadKeys(*keysFile)
	if err != nil {
		return err
	}
	if _, err := os.Stat(src.BoltPath); err != nil {
		return fmt.Errorf("--from: no bolt store at %s: %w", src.BoltPath, err)
	}
	bs, err := boltstore.Open(src.BoltPath, kr, boltstore.Options{})
	if errors.Is(err, boltstore.ErrLocked) {
		return fmt.Errorf("%w: stop the broker using %s before migrating it", err, src.BoltPath)
	}
	if err != nil {
		return err
	}
	defer bs.Close()
	pg, err := openPostgres(dst.Postgres, kr)
	if err != nil {
		return err
	}
	defer pg.Close()
	start := time.Now()
	n, err := migrateBolt(ctx, bs.DB(), pg, *batch)
	fmt.Fprintf(stdout, "connections: %d copied, %d already present\ngrants: %d copied, %d already present\nkey canaries: %d added\n",
		n.Conns, n.ConnsSkipped, n.Grants, n.GrantsSkipped, n.Canaries)
	if err != nil {
		return fmt.Errorf("migration stopped: %w (run it again to finish; records already copied are skipped)", err)
	}
	fmt.Fprintf(stdout, "done in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// migrateBolt copies the raw records of db into pg, batch records per
// transaction. Nothing is decrypted.
func migrateBolt(ctx context.Context, db *bolt.DB, pg *pgstore.Store, batch int) (migrateCounts, error) {
	var n migrateCounts
	canaries := map[string][]byte{}
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(boltMeta)
		if meta == nil {
			return errors.New("the bolt file has no meta bucket: not a credbroker store")
		}
		c := meta.Cursor()
		for k, v := c.Seek(boltCanary); k != nil && bytes.HasPrefix(k, boltCanary); k, v = c.Next() {
			canaries[string(k[len(boltCanary):])] = bytes.Clone(v)
		}
		return nil
	})
	if err != nil {
		return n, err
	}
	if n.Canaries, err = pg.ImportKeyCanaries(ctx, canaries); err != nil {
		return n, err
	}
	n.Conns, n.ConnsSkipped, err = copyBucket(ctx, db, boltConnections, batch, pg.ImportConnectionRecords)
	if err != nil {
		return n, fmt.Errorf("connections: %w", err)
	}
	n.Grants, n.GrantsSkipped, err = copyBucket(ctx, db, boltGrants, batch, pg.ImportGrantRecords)
	if err != nil {
		return n, fmt.Errorf("grants: %w", err)
	}
	return n, nil
}

// copyBucket reads bucket in key order, batch values per read transaction,
// and hands each batch to put. No write happens inside a bolt transaction.
func copyBucket(ctx context.Context, db *bolt.DB, bucket []byte, batch int,
	put func(context.Context, [][]byte) (int, int, error)) (added, skipped int, err error) {
	var after []byte
	for {
		if err := ctx.Err(); err != nil {
			return added, skipped, err
		}
		var recs [][]byte
		err := db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket(bucket)
			if b == nil {
				return nil
			}
			c := b.Cursor()
			k, v := c.First()
			if after != nil {
				k, v = c.Seek(after)
				if k != nil && bytes.Equal(k, after) {
					k, v = c.Next()
				}
			}
			for ; k != nil && len(recs) < batch; k, v = c.Next() {
				recs = append(recs, bytes.Clone(v))
				after = bytes.Clone(k)
			}
			return nil
		})
		if err != nil {
			return added, skipped, err
		}
		if len(recs) == 0 {
			return added, skipped, nil
		}
		a, s, err := put(ctx, recs)
		added, skipped = added+a, skipped+s
		if err != nil {
			return added, skipped, err
		}
	}
}
