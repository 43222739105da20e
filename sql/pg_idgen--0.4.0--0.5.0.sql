-- pg_idgen 0.4.0 -> 0.5.0 (ALTER EXTENSION pg_idgen UPDATE).
-- Trigger and event trigger functions are no longer executable by PUBLIC:
-- a role could attach them to a table of its own and hold the lock that
-- shard_claim and the others queue on. The triggers themselves fire as before.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.5.0'" to load this file. \quit

REVOKE EXECUTE ON FUNCTION
    pg_idgen_ownership_changed(), pg_idgen_table_changed(), pg_idgen_epoch_replaced(),
    shard_schema_registry_keyed(), shard_schemas_forget_dropped(), shard_schemas_key_by_name(),
    shard_schemas_follow_renamed()
    FROM PUBLIC;

-- The status functions bind the C symbols of their result shapes (the same
-- columns as before): an update run while an older library is still loaded
-- fails with "could not find function" instead of reading past the end of
-- what that library returns. Grants and views on them are kept.
CREATE OR REPLACE FUNCTION id_generator_status() RETURNS TABLE (
	"shard" INT,
	"last_ts" timestamp with time zone,
	"last_seq" INT,
	"minted" bigint,
	"full_ms_waits" bigint,
	"borrowed_ms" bigint,
	"clock_regressions" bigint,
	"lead_ms" bigint,
	"released" bool
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_generator_status_0_2_wrapper';
CREATE OR REPLACE FUNCTION id_generator_server_status() RETURNS TABLE (
	"epoch" timestamp with time zone,
	"range_end" timestamp with time zone,
	"years_left" double precision,
	"persisted_mark" timestamp with time zone,
	"reserved_until" timestamp with time zone,
	"uuid_minted" bigint,
	"uuid_clock_regressions" bigint,
	"uuid_lead_ms" bigint,
	"mark_lead_ms" bigint,
	"minting_resumes_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_generator_server_status_0_4_wrapper';

-- A schema renamed onto the name of a row whose schema is gone (restored
-- with triggers disabled) failed with 23505: such a row now makes way, as it
-- does for a new schema of that name. (CREATE OR REPLACE keeps the grants.)
CREATE OR REPLACE FUNCTION shard_schemas_follow_renamed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- The name a schema takes (a new one's, or a renamed one's) was free a
    -- moment ago: a row holding it is left from a schema that is gone, and
    -- must neither pass its shard on nor stand in the rename's way. (Before
    -- ALTER SCHEMA every row of an existing schema took its OID.)
    DELETE FROM @extschema@.shard_schema_registry r
     USING pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.objid
     WHERE c.command_tag OPERATOR(pg_catalog.=) ANY (ARRAY['CREATE SCHEMA', 'ALTER SCHEMA'])
       AND c.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_name OPERATOR(pg_catalog.=) n.nspname
       AND (r.schema_oid IS NULL OR r.schema_oid OPERATOR(pg_catalog.<>) c.objid);
    UPDATE @extschema@.shard_schema_registry r SET schema_name = n.nspname
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.objid
     WHERE c.command_tag OPERATOR(pg_catalog.=) 'ALTER SCHEMA'
       AND c.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_oid OPERATOR(pg_catalog.=) c.objid
       AND r.schema_name OPERATOR(pg_catalog.<>) n.nspname;
END
$$;
