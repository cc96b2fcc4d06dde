package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"credbroker/internal/transfer"
	"credbroker/vault"
	"credbroker/vault/boltstore"
)

const migrateUsage = `usage: broker migrate --from STORE --to STORE [--keys-file F] [--batch N]

Copies every record of one store into another: connections (and those
offboarding keeps to retry their revocation), grants, the authorization
server's registered clients, authorization codes and app authorizations
(consents and token families), the webhook outbox, spent ID-JAG ids, the
gateway's registrations at upstream authorization servers, people's IdP
sessions, and the key canaries, reporting each kind's count. One store is
bolt (bolt:PATH), the other PostgreSQL (postgres://…): bolt into
PostgreSQL to scale out, PostgreSQL into bolt to come back. Records are
copied as stored: token sets, client secrets and IdP sessions stay sealed
and are never decrypted on the way. Records already present in the
target are skipped, so an interrupted migration is finished by running it
again. Stop every broker using either store first (a bolt file is locked
while one runs). The keys (BROKER_KEYS or --keys-file) must be the ones
the source was written with; they are checked against both stores'
canaries.
`

// migrationEnd is a store a migration copies from or into (boltstore and
// pgstore).
type migrationEnd interface {
	ExportRecords(ctx context.Context, batch int, put func(transfer.Records) error) error
	ImportRecords(ctx context.Context, rs transfer.Records) (added, skipped int, err error)
	Close() error
}

// migrateCounts is what one migration did: records added and already
// present, by kind.
type migrateCounts map[transfer.RecordKind][2]int

func runMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, migrateUsage) }
	from := fs.String("from", "", "source store: bolt:PATH (or a plain path) or postgres://…")
	to := fs.String("to", "", "target store: postgres://… (or postgres:KEY=VALUE…) or bolt:PATH")
	keysFile := fs.String("keys-file", os.Getenv("BROKER_KEYS_FILE"), "file with the encryption keys (or env BROKER_KEYS)")
	batch := fs.Int("batch", 1000, "records per transaction")
	if err := fs.Parse(args); err != nil {
		return usageError{err.Error()}
	}
	var problems []error
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	src, srcOK := storeFlag("--from", *from, "the source store: bolt:PATH or postgres://…", &problems)
	dst, dstOK := storeFlag("--to", *to, "the target store: postgres://… or bolt:PATH", &problems)
	if srcOK && dstOK {
		switch {
		case src.BoltPath != "" && dst.BoltPath != "":
			problems = append(problems, errors.New("--to must be a PostgreSQL store (postgres://…) when --from is a bolt store: one end of a migration is bolt, the other PostgreSQL"))
		case src.Postgres != "" && dst.Postgres != "":
			problems = append(problems, errors.New("--from must be a bolt store (bolt:PATH) when --to is a PostgreSQL store: one end of a migration is bolt, the other PostgreSQL"))
		}
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
	if src.BoltPath != "" {
		if _, err := os.Stat(src.BoltPath); err != nil {
			return fmt.Errorf("--from: no bolt store at %s: %w", src.BoltPath, err)
		}
	}
	source, err := openMigrationEnd(src, kr)
	if err != nil {
		return err
	}
	defer source.Close()
	target, err := openMigrationEnd(dst, kr)
	if err != nil {
		return err
	}
	defer target.Close()
	start := time.Now()
	n, err := migrate(ctx, source, target, *batch)
	for k := transfer.KindKeyCanary; k <= transfer.LastKind; k++ {
		if k == transfer.KindKeyCanary {
			fmt.Fprintf(stdout, "%s: %d added\n", k, n[k][0])
			continue
		}
		fmt.Fprintf(stdout, "%s: %d copied, %d already present\n", k, n[k][0], n[k][1])
	}
	if err != nil {
		return fmt.Errorf("migration stopped: %w (run it again to finish; records already copied are skipped)", err)
	}
	fmt.Fprintf(stdout, "done in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// storeFlag parses value, the store the flag name gives (need says what
// it should be), adding to problems why it is missing or wrong; ok says
// it names a store.
func storeFlag(name, value, need string, problems *[]error) (ss storeSpec, ok bool) {
	ss, err := parseStore(value)
	switch {
	case value == "":
		*problems = append(*problems, fmt.Errorf("%s is required (%s)", name, need))
	case err != nil:
		*problems = append(*problems, fmt.Errorf("%s: %w", name, err))
	}
	return ss, value != "" && err == nil
}

// openMigrationEnd opens the store ss names with kr, checking kr against
// its key canaries.
func openMigrationEnd(ss storeSpec, kr *vault.Keyring) (migrationEnd, error) {
	if ss.Postgres != "" {
		pg, err := openPostgres(ss.Postgres, kr)
		if err != nil {
			return nil, err
		}
		return pg, nil
	}
	bs, err := openBolt(ss.BoltPath, kr)
	if errors.Is(err, boltstore.ErrLocked) {
		return nil, fmt.Errorf("%w: stop the broker using %s before migrating it", err, ss.BoltPath)
	}
	if err != nil {
		return nil, err
	}
	return bs, nil
}

// migrate copies every record of src into dst, kind by kind, batch
// records per transaction. Nothing is decrypted: the stores hand over
// records as stored.
func migrate(ctx context.Context, src, dst migrationEnd, batch int) (migrateCounts, error) {
	n := migrateCounts{}
	err := src.ExportRecords(ctx, batch, func(rs transfer.Records) error {
		added, skipped, err := dst.ImportRecords(ctx, rs)
		c := n[rs.Kind]
		n[rs.Kind] = [2]int{c[0] + added, c[1] + skipped}
		if err != nil {
			return fmt.Errorf("%s: %w", rs.Kind, err)
		}
		return nil
	})
	return n, err
}
