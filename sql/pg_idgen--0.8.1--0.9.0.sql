-- pg_idgen 0.8.1 -> 0.9.0 (ALTER EXTENSION pg_idgen UPDATE).
-- Shard leases from a lease store (etcd): the function that shows them.
-- Without pg_idgen.lease_store set it returns no rows and nothing changes.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.9.0'" to load this file. \quit

CREATE FUNCTION "shard_leases"() RETURNS TABLE (
	"shard" INT,
	"state" TEXT,
	"valid_for_ms" bigint,
	"mark" timestamp with time zone
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'shard_leases_wrapper';
COMMENT ON FUNCTION shard_leases() IS
    'pg_idgen: the shards this server leases from its lease store (pg_idgen.lease_store), their state, validity and mark';
