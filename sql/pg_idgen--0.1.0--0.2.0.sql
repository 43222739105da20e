-- pg_idgen 0.1.0 -> 0.2.0 (ALTER EXTENSION pg_idgen UPDATE).
-- Install the 0.2.0 library first and restart the server; until this script
-- runs in a database, registry functions there fail (the registry changes key).
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.2.0'" to load this file. \quit

-- The epoch each database records (src/epoch.rs): the server's, now.

CREATE TABLE pg_idgen_epoch (
    epoch_ms bigint NOT NULL,
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
COMMENT ON TABLE pg_idgen_epoch IS
    'pg_idgen: the epoch (Unix ms) this database''s IDs were minted with (do not change)';
GRANT SELECT ON pg_idgen_epoch TO PUBLIC;
CREATE TRIGGER pg_idgen_epoch_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pg_idgen_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();
SELECT pg_catalog.pg_extension_config_dump('pg_idgen_epoch', '');
CREATE FUNCTION pg_idgen_epoch_replaced() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM @extschema@.pg_idgen_epoch;
    RETURN NEW;
END
$$;
CREATE TRIGGER pg_idgen_epoch_replaced BEFORE INSERT ON pg_idgen_epoch
    FOR EACH ROW EXECUTE FUNCTION pg_idgen_epoch_replaced();
INSERT INTO pg_idgen_epoch (epoch_ms)
    VALUES (pg_catalog.floor(pg_catalog.date_part('epoch', @extschema@.id_epoch()) OPERATOR(pg_catalog.*) 1000)::bigint);

-- Released shards show as released: the result type changes.
DROP FUNCTION id_generator_status();

CREATE  FUNCTION "id_generator_status"() RETURNS TABLE (
	"shard" INT,  /* i32 */
	"last_ts" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"last_seq" INT,  /* Option < i32 > */
	"minted" bigint,  /* i64 */
	"full_ms_waits" bigint,  /* i64 */
	"borrowed_ms" bigint,  /* i64 */
	"clock_regressions" bigint,  /* i64 */
	"lead_ms" bigint,  /* Option < i64 > */
	"released" bool  /* bool */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_generator_status_wrapper';

-- id_decode names its functions with the extension's schema.
CREATE OR REPLACE FUNCTION id_decode(id bigint, OUT ts timestamptz, OUT shard int, OUT seq int)
RETURNS record
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT @extschema@.id_ts(id), @extschema@.id_shard(id), @extschema@.id_seq(id) $$;

-- Foreign ID schemes (src/schemes.rs).

CREATE  FUNCTION "id_layout_ts"(
	"id" bigint, /* i64 */
	"layout" TEXT /* & str */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_layout_ts_wrapper';

CREATE  FUNCTION "id_layout_node"(
	"id" bigint, /* i64 */
	"layout" TEXT /* & str */
) RETURNS INT /* i32 */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_layout_node_wrapper';

CREATE  FUNCTION "id_layout_seq"(
	"id" bigint, /* i64 */
	"layout" TEXT /* & str */
) RETURNS INT /* i32 */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_layout_seq_wrapper';

CREATE FUNCTION id_decode(id bigint, layout text, OUT ts timestamptz, OUT node int, OUT seq int)
RETURNS record
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT @extschema@.id_layout_ts(id, layout), @extschema@.id_layout_node(id, layout), @extschema@.id_layout_seq(id, layout) $$;
COMMENT ON FUNCTION id_decode(bigint, text) IS
    'The time, node and sequence number of a 64-bit ID in a named layout: pg_idgen, instagram, twitter, discord, sonyflake.';

CREATE  FUNCTION "id_lower_bound"(
	"ts" timestamp with time zone, /* TimestampWithTimeZone */
	"layout" TEXT /* & str */
) RETURNS bigint /* i64 */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_lower_bound_layout_wrapper';

CREATE  FUNCTION "id_upper_bound"(
	"ts" timestamp with time zone, /* TimestampWithTimeZone */
	"layout" TEXT /* & str */
) RETURNS bigint /* i64 */
IMMUTABLE STRICT PARALLEL SAFE 
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'id_upper_bound_layout_wrapper';

CREATE  FUNCTION "ulid_to_uuid"(
	"ulid" TEXT /* & str */
) RETURNS uuid /* pgrx :: Uuid */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ulid_to_uuid_wrapper';

CREATE  FUNCTION "uuid_to_ulid"(
	"u" uuid /* pgrx :: Uuid */
) RETURNS TEXT /* String */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'uuid_to_ulid_wrapper';

CREATE  FUNCTION "ulid_ts"(
	"ulid" TEXT /* & str */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ulid_ts_wrapper';

CREATE  FUNCTION "ksuid_ts"(
	"ksuid" TEXT /* & str */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'ksuid_ts_wrapper';

CREATE  FUNCTION "objectid_ts"(
	"objectid" TEXT /* & str */
) RETURNS timestamp with time zone /* TimestampWithTimeZone */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'objectid_ts_wrapper';

-- Server-wide shard ownership (src/fleet.rs, sql/ownership.sql). From 0.2.0
-- on, only the fleet database's claims and releases count: refuse to update
-- a database whose own claims or releases would silently stop counting.
DO $$
BEGIN
    IF current_database() OPERATOR(pg_catalog.<>)
           coalesce(pg_catalog.current_setting('pg_idgen.fleet_database', true), 'postgres')
       AND (EXISTS (SELECT FROM @extschema@.shard_ownership) OR EXISTS (SELECT FROM @extschema@.shard_releases)) THEN
        RAISE EXCEPTION 'database "%" records shard claims or releases, but pg_idgen 0.2.0 reads them only from the fleet database "%"',
            current_database(), coalesce(pg_catalog.current_setting('pg_idgen.fleet_database', true), 'postgres')
            USING ERRCODE = '55000',
                  HINT = 'Copy the rows of shard_ownership and shard_releases into the fleet database (pg_idgen.fleet_database), delete them here, then update.';
    END IF;
END
$$;

CREATE FUNCTION "pg_idgen_ownership_changed"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'pg_idgen_ownership_changed_wrapper';

CREATE  FUNCTION "shard_own_all"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'shard_own_all_wrapper';

-- Once a server has claimed or released a shard, it mints only what it
-- claims until shard_own_all() says otherwise.
CREATE TABLE shard_fleet_mode (
    claims_only boolean NOT NULL,
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
COMMENT ON TABLE shard_fleet_mode IS 'pg_idgen: whether this server mints only the shards it claims';

CREATE OR REPLACE VIEW shard_claims AS
    SELECT first_shard, last_shard, adopted_after, since FROM shard_ownership ORDER BY first_shard;
COMMENT ON VIEW shard_claims IS 'pg_idgen: the shards this server mints for (in its fleet database)';
GRANT SELECT ON shard_fleet_mode TO PUBLIC;
-- A database with claims or releases keeps minting only what it claims.
INSERT INTO shard_fleet_mode (claims_only)
    SELECT true WHERE EXISTS (SELECT FROM shard_ownership) OR EXISTS (SELECT FROM shard_releases);
DROP TRIGGER shard_ownership_changed ON shard_ownership;

CREATE TRIGGER shard_ownership_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_ownership
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();
CREATE TRIGGER shard_releases_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_releases
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();
CREATE TRIGGER shard_fleet_mode_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_fleet_mode
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();

SELECT pg_catalog.pg_extension_config_dump('shard_fleet_mode', '');
-- Publish the ownership recorded here to the server at commit (in the fleet database).
UPDATE shard_fleet_mode SET claims_only = claims_only;

-- The registry is keyed by schema name (which survives dumps and
-- pg_upgrade), is dumped with the database, and its event triggers run with
-- their owner's rights (sql/registry.sql).
ALTER TABLE shard_schema_registry ADD COLUMN schema_name name;
UPDATE shard_schema_registry r SET schema_name = n.nspname
  FROM pg_catalog.pg_namespace n WHERE n.oid OPERATOR(pg_catalog.=) r.schema_oid;
DELETE FROM shard_schema_registry WHERE schema_name IS NULL;
ALTER TABLE shard_schema_registry DROP CONSTRAINT shard_schema_registry_pkey;
ALTER TABLE shard_schema_registry ALTER COLUMN schema_oid DROP NOT NULL,
    ALTER COLUMN schema_name SET NOT NULL, ADD PRIMARY KEY (schema_name);

CREATE OR REPLACE VIEW shard_schemas AS
    SELECT r.schema_name::text AS schema_name, r.shard
      FROM shard_schema_registry r JOIN pg_catalog.pg_namespace n ON n.nspname = r.schema_name;

-- Every row written (a registration, or a row restored by pg_restore) takes
-- the OID of the schema of its name in this database.
CREATE FUNCTION shard_schema_registry_keyed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    NEW.schema_oid := (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) NEW.schema_name);
    RETURN NEW;
END
$$;

CREATE TRIGGER shard_schema_registry_keyed
    BEFORE INSERT OR UPDATE ON shard_schema_registry
    FOR EACH ROW EXECUTE FUNCTION shard_schema_registry_keyed();

SELECT pg_catalog.pg_extension_config_dump('shard_schema_registry', '');

CREATE OR REPLACE FUNCTION shard_schemas_forget_dropped() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM @extschema@.shard_schema_registry r
     USING pg_catalog.pg_event_trigger_dropped_objects() d
     WHERE d.object_type OPERATOR(pg_catalog.=) 'schema'
       AND (r.schema_oid OPERATOR(pg_catalog.=) d.objid OR r.schema_name OPERATOR(pg_catalog.=) d.object_name);
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_forget_dropped() FROM PUBLIC;


CREATE FUNCTION shard_schemas_follow_renamed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE @extschema@.shard_schema_registry r SET schema_name = n.nspname
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.objid
     WHERE c.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_oid OPERATOR(pg_catalog.=) c.objid
       AND r.schema_name OPERATOR(pg_catalog.<>) n.nspname;
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_follow_renamed() FROM PUBLIC;

CREATE EVENT TRIGGER pg_idgen_follow_renamed_schemas ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION shard_schemas_follow_renamed();
