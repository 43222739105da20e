-- pg_idgen 0.5.0 -> 0.6.0 (ALTER EXTENSION pg_idgen UPDATE).
-- On Citus, the node holding a distributed schema's data mints its shard;
-- these two functions hand a shard over when that data moves. Nothing else
-- changes; on a single server they are never called.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.6.0'" to load this file. \quit

CREATE FUNCTION "citus_shard_release"(
	"shard" INT
) RETURNS bigint
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_shard_release_wrapper';

CREATE FUNCTION "citus_shard_take"(
	"schema_name" TEXT
) RETURNS TABLE (
	"shard" INT,
	"after" bigint,
	"holder_group" INT
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_shard_take_wrapper';

COMMENT ON FUNCTION citus_shard_take(text) IS
    'pg_idgen on Citus: hands the shard of a distributed schema to the node holding its data (run on the coordinator by that node)';
COMMENT ON FUNCTION citus_shard_release(int) IS
    'pg_idgen on Citus: stops a worker minting a shard whose schema''s data moved away, returning an ID above all it minted (run by the coordinator)';
