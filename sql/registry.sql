-- The logical-shard registry: one row per schema registered as a shard.
-- Keyed by the schema's name, which survives pg_dump/pg_restore and
-- pg_upgrade (OIDs do not); the schema's OID is kept beside it by the
-- triggers below, so that renames follow the schema and drops forget it.
CREATE TABLE shard_schema_registry (
    schema_name name PRIMARY KEY,
    shard int NOT NULL UNIQUE CHECK (shard BETWEEN 0 AND 8191),
    schema_oid oid
);
COMMENT ON TABLE shard_schema_registry IS
    'pg_idgen: schemas registered as logical shards (use shard_schema_register() to change it)';

CREATE VIEW shard_schemas AS
    SELECT r.schema_name::text AS schema_name, r.shard
      FROM shard_schema_registry r JOIN pg_catalog.pg_namespace n ON n.nspname = r.schema_name;
COMMENT ON VIEW shard_schemas IS 'pg_idgen: each schema registered as a logical shard, with its shard';

GRANT SELECT ON shard_schema_registry, shard_schemas TO PUBLIC;

CREATE TRIGGER shard_schema_registry_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_schema_registry
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();

-- Every row written (a registration, a rename, or a row restored by
-- pg_restore) takes the OID of the schema of its name in this database; the
-- OID only serves to follow a rename, and is taken again from the name
-- before each ALTER SCHEMA (after pg_upgrade, or a restore with triggers
-- disabled, it may be stale). A registration also removes rows whose schema
-- no longer exists that hold its name or shard: such a row holds nothing.
-- It runs with its owner's rights, since registering needs INSERT only.
CREATE FUNCTION shard_schema_registry_keyed() RETURNS trigger
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
REVOKE ALL ON FUNCTION shard_schema_registry_keyed() FROM PUBLIC;
COMMENT ON FUNCTION shard_schema_registry_keyed() IS
    'pg_idgen: trigger of shard_schema_registry (keeps each row''s schema OID; makes way for a registration)';

CREATE TRIGGER shard_schema_registry_keyed
    BEFORE INSERT OR UPDATE ON shard_schema_registry
    FOR EACH ROW EXECUTE FUNCTION shard_schema_registry_keyed();

SELECT pg_catalog.pg_extension_config_dump('shard_schema_registry', '');

-- The registry follows the schemas: a dropped schema leaves it (matched by
-- name, which the registry keeps current), so that its shard is free again;
-- a renamed schema keeps its shard under its new name; a new schema never
-- inherits a row of a name that a schema no longer holds. The triggers fire
-- for every role's DDL, so they run with their owner's rights (a role needs
-- no privilege on the registry to create, drop or rename its own schemas)
-- and a pinned search_path, with every name qualified.
CREATE FUNCTION shard_schemas_forget_dropped() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM @extschema@.shard_schema_registry r
     USING pg_catalog.pg_event_trigger_dropped_objects() d
     WHERE d.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_name OPERATOR(pg_catalog.=) d.object_name;
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_forget_dropped() FROM PUBLIC;
COMMENT ON FUNCTION shard_schemas_forget_dropped() IS
    'pg_idgen: event trigger function (a dropped schema leaves the registry)';

CREATE EVENT TRIGGER pg_idgen_forget_dropped_schemas ON sql_drop
    EXECUTE FUNCTION shard_schemas_forget_dropped();

CREATE FUNCTION shard_schemas_key_by_name() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE @extschema@.shard_schema_registry r SET schema_oid = n.oid
      FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) r.schema_name
       AND (r.schema_oid IS NULL OR r.schema_oid OPERATOR(pg_catalog.<>) n.oid);
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_key_by_name() FROM PUBLIC;
COMMENT ON FUNCTION shard_schemas_key_by_name() IS
    'pg_idgen: event trigger function (before ALTER SCHEMA, each registry row takes the OID of the schema of its name)';

CREATE EVENT TRIGGER pg_idgen_key_schemas ON ddl_command_start
    WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION shard_schemas_key_by_name();

CREATE FUNCTION shard_schemas_follow_renamed() RETURNS event_trigger
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
REVOKE ALL ON FUNCTION shard_schemas_follow_renamed() FROM PUBLIC;
COMMENT ON FUNCTION shard_schemas_follow_renamed() IS
    'pg_idgen: event trigger function (a renamed schema keeps its shard; a new schema inherits none)';

CREATE EVENT TRIGGER pg_idgen_follow_renamed_schemas ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA', 'CREATE SCHEMA')
    EXECUTE FUNCTION shard_schemas_follow_renamed();
