-- pg_idgen 0.10.0 -> 0.11.0 (ALTER EXTENSION pg_idgen UPDATE).
-- next_node_id(): on a Citus node, an ID of its node group's own shard,
-- minted where the statement runs. Groups 0 to 1023 mint shards 8191 down
-- to 7168, so on a Citus cluster no schema may be registered there.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.11.0'" to load this file. \quit

DO $$
DECLARE
    taken text;
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        SELECT pg_catalog.string_agg(pg_catalog.format('%I (shard %s)', r.schema_name, r.shard), ', ')
          INTO taken
          FROM @extschema@.shard_schema_registry r
         WHERE r.shard OPERATOR(pg_catalog.>=) 7168;
        IF taken IS NOT NULL THEN
            RAISE EXCEPTION 'schemas registered at shards Citus node groups mint: %', taken
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = 'On a Citus cluster, pg_idgen 0.11.0 mints shards 7168 to 8191 with next_node_id() (node group 0: 8191, group 1: 8190, ...).',
                      HINT = 'As the extension''s owner, delete their rows from shard_schema_registry and register each again with shard_schema_register below shard 7168, then update.';
        END IF;
    END IF;
END
$$;

CREATE FUNCTION "next_node_id"() RETURNS bigint
VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'next_node_id_wrapper';
COMMENT ON FUNCTION next_node_id() IS
    'pg_idgen: on a Citus node, the next 64-bit ID of its node group''s own logical shard (group 0: 8191, group 1: 8190, ...), minted there with no call to another node';

-- A copy of the coordinator's registry on every worker, so that a worker
-- sends next_shard_id of a schema's shard straight to its holder.
CREATE FUNCTION "citus_registry_sync"() RETURNS bigint
VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_registry_sync_wrapper';
CREATE FUNCTION "citus_registry_note"(
	"schema_names" TEXT[],
	"shards" INT[]
) RETURNS void
VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'citus_registry_note_wrapper';
COMMENT ON FUNCTION citus_registry_sync() IS
    'pg_idgen on Citus: sends the coordinator''s registry of schema shards to every worker (each registration does; run after adding a worker)';
COMMENT ON FUNCTION citus_registry_note(text[], int[]) IS
    'pg_idgen on Citus: replaces a worker''s copy of the registry with the coordinator''s (run by the coordinator)';
REVOKE EXECUTE ON FUNCTION citus_registry_sync(), citus_registry_note(text[], int[]) FROM PUBLIC;

-- The registry's trigger refuses a node group's shard on a Citus cluster,
-- whichever way a row is written (a direct INSERT, a restore).
CREATE OR REPLACE FUNCTION shard_schema_registry_keyed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- On a Citus cluster shards 7168 to 8191 are the node groups' own
    -- (next_node_id): no schema is registered there, by any path.
    IF NEW.shard OPERATOR(pg_catalog.>=) 7168
       AND EXISTS (SELECT FROM pg_catalog.pg_extension WHERE extname OPERATOR(pg_catalog.=) 'citus') THEN
        RAISE EXCEPTION 'shard % is the own shard of Citus node group %', NEW.shard, 8191 OPERATOR(pg_catalog.-) NEW.shard
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Register the schema with a lower shard.';
    END IF;
    NEW.schema_oid := (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) NEW.schema_name);
    IF TG_OP OPERATOR(pg_catalog.=) 'INSERT' THEN
        DELETE FROM @extschema@.shard_schema_registry r
         WHERE (r.shard OPERATOR(pg_catalog.=) NEW.shard OR r.schema_name OPERATOR(pg_catalog.=) NEW.schema_name)
           AND NOT EXISTS (SELECT FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) r.schema_name);
    END IF;
    RETURN NEW;
END
$$;
