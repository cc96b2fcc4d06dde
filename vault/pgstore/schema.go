package pgstore

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migration is one step of the schema. Steps are applied in order, each in
// its own transaction together with its row in schema_migrations, and are
// never edited once released: a change is a new step.
type migration struct {
	version int
	name    string
	sql     string
}

// migrations is the schema history.
//
// Issuer and subject are bytea because a PostgreSQL text value cannot hold
// NUL, which the vault contract allows in a principal. Ids sort bytewise
// (COLLATE "C") as the contract's "ordered by id" requires. Grant times are
// Unix nanoseconds so expiry comparisons keep the nanosecond precision the
// other backends have (timestamptz stops at microseconds); the timestamptz
// columns of connections are for people querying the table.
var migrations = []migration{
	{1, "connections, grants, key canaries", `
CREATE TABLE connections (
	id             text COLLATE "C" PRIMARY KEY,
	iss            bytea NOT NULL,
	sub            bytea NOT NULL,
	provider       text NOT NULL,
	account_id     text NOT NULL,
	account_login  text NOT NULL,
	status         text NOT NULL,
	created        timestamptz NOT NULL,
	updated        timestamptz NOT NULL,
	last_used      timestamptz,
	last_refreshed timestamptz,
	sealed_with    text NOT NULL,
	version        bigint NOT NULL,
	record         bytea NOT NULL
);
COMMENT ON COLUMN connections.record IS 'vault.EncodeConnection output: metadata plus the sealed token set (AEAD, AAD bound to id, principal, provider, account); authoritative, the other columns are its queryable projection';
CREATE INDEX connections_by_principal ON connections (iss, sub, id);
CREATE INDEX connections_by_provider ON connections (provider, account_id);

CREATE TABLE grants (
	id          text COLLATE "C" PRIMARY KEY,
	iss         bytea NOT NULL,
	sub         bytea NOT NULL,
	provider    text NOT NULL,
	state       text NOT NULL,
	created_ns  bigint NOT NULL,
	expires_ns  bigint NOT NULL,
	version     bigint NOT NULL,
	record      bytea NOT NULL
);
CREATE INDEX grants_by_principal ON grants (iss, sub, created_ns);
CREATE INDEX grants_by_expiry ON grants (expires_ns);

CREATE TABLE key_canaries (
	key_id  text COLLATE "C" PRIMARY KEY,
	canary  bytea NOT NULL
);
`},
	{2, "authorization server: registered clients, authorization codes, app access", `
CREATE TABLE oauth_clients (
	id          text COLLATE "C" PRIMARY KEY,
	created_ns  bigint NOT NULL,
	used        boolean NOT NULL,
	version     bigint NOT NULL,
	record      bytea NOT NULL
);
COMMENT ON COLUMN oauth_clients.record IS 'vault.EncodeOAuthClient output; a client secret appears only as its SHA-256';

CREATE TABLE oauth_codes (
	key         text COLLATE "C" PRIMARY KEY,
	expires_ns  bigint NOT NULL,
	redeemed    boolean NOT NULL,
	record      bytea NOT NULL
);
COMMENT ON COLUMN oauth_codes.key IS 'vault.SecretKey of the code (base64url SHA-256); the code itself is never stored';
COMMENT ON COLUMN oauth_codes.redeemed IS 'authoritative; the record keeps the code as issued';
CREATE INDEX oauth_codes_by_expiry ON oauth_codes (expires_ns);

CREATE TABLE oauth_apps (
	id          text COLLATE "C" PRIMARY KEY,
	iss         bytea NOT NULL,
	sub         bytea NOT NULL,
	client_id   text COLLATE "C" NOT NULL,
	version     bigint NOT NULL,
	record      bytea NOT NULL,
	UNIQUE (iss, sub, client_id)
);
COMMENT ON COLUMN oauth_apps.record IS 'vault.EncodeAppAccess output: consent and token families; refresh tokens appear only as vault.SecretKey hashes';
`},
	{3, "webhook outbox, retired connections, connections by provider", `
CREATE TABLE outbox (
	id          text COLLATE "C" NOT NULL,
	endpoint    text COLLATE "C" NOT NULL,
	type        text NOT NULL,
	created_ns  bigint NOT NULL,
	due_ns      bigint NOT NULL,
	attempts    integer NOT NULL,
	last_error  text NOT NULL,
	payload     bytea NOT NULL,
	PRIMARY KEY (id, endpoint)
);
COMMENT ON TABLE outbox IS 'webhook deliveries, one row per event and endpoint; written in the transaction of the change they report; claimed with FOR UPDATE SKIP LOCKED';
CREATE INDEX outbox_by_due ON outbox (due_ns);

CREATE TABLE retired_connections (
	id       text COLLATE "C" PRIMARY KEY,
	iss      bytea NOT NULL,
	sub      bytea NOT NULL,
	retired  timestamptz NOT NULL DEFAULT now(),
	record   bytea NOT NULL
);
COMMENT ON TABLE retired_connections IS 'connections deleted by offboarding whose revocation at the provider was not confirmed; record is the sealed connection record, kept to retry the revocation';
CREATE INDEX retired_by_principal ON retired_connections (iss, sub, id);

CREATE INDEX connections_by_provider_id ON connections (provider, id);
`},
	{4, "spent assertions (ID-JAG jti replay ledger)", `
CREATE TABLE spent_assertions (
	key         text COLLATE "C" PRIMARY KEY,
	expires_ns  bigint NOT NULL
);
COMMENT ON TABLE spent_assertions IS 'vault.AssertionKey (base64url SHA-256 of issuer and jti) of each accepted one-time assertion, kept until it expires; the assertion itself is never stored';
CREATE INDEX spent_assertions_by_expiry ON spent_assertions (expires_ns);
`},
	{5, "app access changes announced (LISTEN/NOTIFY) for the replicas' liveness caches", `
CREATE FUNCTION credbroker_app_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	-- "<bytes of the schema>:<schema><app id>" on channel credbroker_apps,
	-- delivered when the change commits (an id too long for a payload
	-- names none: every replica then forgets every app).
	PERFORM pg_notify('credbroker_apps', octet_length(TG_TABLE_SCHEMA)::text || ':' || TG_TABLE_SCHEMA ||
		CASE WHEN octet_length(OLD.id) > 4000 THEN '' ELSE OLD.id END);
	RETURN NULL;
END $$;
CREATE TRIGGER oauth_apps_changed AFTER UPDATE OR DELETE ON oauth_apps
	FOR EACH ROW EXECUTE FUNCTION credbroker_app_changed();
`},
	{6, "the broker's registrations at upstream MCP servers' authorization servers", `
CREATE TABLE upstream_clients (
	key          text COLLATE "C" PRIMARY KEY,
	sealed_with  text NOT NULL,
	record       bytea NOT NULL
);
COMMENT ON TABLE upstream_clients IS 'vault.UpstreamClient: the broker''s dynamic registration at an upstream authorization server, keyed by its issuer and the broker''s redirect URI; record is record.EncodeUpstreamClient output, the client secret sealed';
COMMENT ON COLUMN upstream_clients.sealed_with IS 'id of the key that sealed the client secret; empty for a public client';
`},
	{7, "people's IdP sessions (enterprise-managed authorization upstream)", `
CREATE TABLE idp_sessions (
	iss          bytea NOT NULL,
	sub          bytea NOT NULL,
	version      bigint NOT NULL,
	updated      timestamptz NOT NULL,
	sealed_with  text NOT NULL,
	record       bytea NOT NULL,
	PRIMARY KEY (iss, sub)
);
COMMENT ON COLUMN idp_sessions.record IS 'record.EncodeIdPSession output: the IdP refresh token and latest ID token sealed (AEAD, AAD bound to the person)';
COMMENT ON COLUMN idp_sessions.sealed_with IS 'id of the key that sealed the tokens';
`},
}

// SchemaVersion is the schema version this build migrates to.
func SchemaVersion() int { return migrations[len(migrations)-1].version }

// migrateLockKey is the advisory lock that serialises migrations across
// replicas starting at the same time.
var migrateLockKey = lockKey("credbroker/pgstore/migrate")

// migrate brings the schema up to date on one dedicated connection holding
// the migration advisory lock, so concurrent replicas migrate once. It
// returns how many steps it applied.
func migrate(ctx context.Context, pool *pgxpool.Pool) (applied int, err error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return 0, fmt.Errorf("take the migration lock: %w", err)
	}
	defer func() {
		if _, uerr := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey); uerr != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // ending the session releases the lock
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version integer PRIMARY KEY,
		name    text NOT NULL,
		applied timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, fmt.Errorf("create schema_migrations: %w", err)
	}
	var current int
	if err := conn.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&current); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if current > SchemaVersion() {
		return 0, fmt.Errorf("the database schema is at version %d, newer than this broker understands (%d): upgrade the broker", current, SchemaVersion())
	}
	for _, m := range migrations {
		if m.version <= current {
			continue
		}
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return applied, fmt.Errorf("migration %d (%s): %w", m.version, m.name, err)
		}
		applied++
	}
	return applied, nil
}
