-- pg_idgen 0.8.1 -> 0.9.0 (ALTER EXTENSION pg_idgen UPDATE).
-- Shard leases from a lease store (etcd): the function that shows them; the
-- replica trigger function that makes the mark travel with logical replication.
-- Neither changes anything until used.
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

-- The mark travels with logical replication: the replica trigger function
-- of a subscriber's tables.
CREATE FUNCTION "pg_idgen_follow_ids"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'pg_idgen_follow_ids_wrapper';
COMMENT ON FUNCTION pg_idgen_follow_ids() IS
    'pg_idgen: trigger function for a logical-replication subscriber: raises the generators above each replicated ID (acts only in replica mode)';
REVOKE EXECUTE ON FUNCTION pg_idgen_follow_ids() FROM PUBLIC;
