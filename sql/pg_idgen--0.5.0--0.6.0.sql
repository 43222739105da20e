-- pg_idgen 0.5.0 -> 0.6.0 (ALTER EXTENSION pg_idgen UPDATE).
-- On Citus, the node holding a distributed schema's data mints its shard;
-- the coordinator hands a shard over when that data moves, with these three
-- functions (run as the extension's owner only) and its record of holders.
-- Nothing else changes; on a single server none of it is used.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.6.0'" to load this file. \quit

CREATE FUNCTION "citus_shard_release"(
	"shard" INT,
	"handover" bigint
) RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_shard_release_wrapper';

CREATE FUNCTION "citus_shard_take"(
	"schema_name" TEXT,
	"renew_from" bigint DEFAULT 0
) RETURNS TABLE (
	"shard" INT,
	"after" bigint,
	"holder_group" INT,
	"handover" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_shard_take_wrapper';

CREATE FUNCTION "citus_shard_take_back"(
	"logical_shard" INT,
	"renew" bool DEFAULT false
) RETURNS TABLE (
	"shard" INT,
	"after" bigint,
	"holder_group" INT,
	"handover" bigint
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_shard_take_back_wrapper';

-- On a Citus coordinator: which node group mints each logical shard handed
-- over to the node holding a distributed schema's data, above which ID, and
-- the hand-over's number (each hand-over of a shard counts one up). Written
-- by citus_shard_take only; a shard without a row is minted by the
-- coordinator. (On workers, and on a single server, it stays empty.)
CREATE TABLE citus_shard_holders (
    shard int PRIMARY KEY CHECK (shard BETWEEN 0 AND 8191),
    holder_group int NOT NULL,
    holder_host text NOT NULL,
    holder_port int NOT NULL,
    after bigint NOT NULL,
    handover bigint NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE citus_shard_holders IS
    'pg_idgen on Citus: the node group that mints each shard handed over, above which ID (written by citus_shard_take)';
REVOKE ALL ON citus_shard_holders FROM PUBLIC;
GRANT SELECT ON citus_shard_holders TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('citus_shard_holders', '');
-- Every backend drops its cached copy when it changes.
CREATE TRIGGER citus_shard_holders_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON citus_shard_holders
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();

COMMENT ON FUNCTION citus_shard_take(text, bigint) IS
    'pg_idgen on Citus: hands the shard of a distributed schema to the node holding its data (run on the coordinator, as the extension''s owner)';
COMMENT ON FUNCTION citus_shard_take_back(int, bool) IS
    'pg_idgen on Citus: hands a shard back to the coordinator, or to the node holding its schema''s data (run by the coordinator in a session of its own)';
COMMENT ON FUNCTION citus_shard_release(int, bigint) IS
    'pg_idgen on Citus: stops a worker minting a shard whose schema''s data moved away, returning an ID above all it minted (run by the coordinator)';
REVOKE EXECUTE ON FUNCTION citus_shard_take(text, bigint), citus_shard_take_back(int, bool), citus_shard_release(int, bigint) FROM PUBLIC;
