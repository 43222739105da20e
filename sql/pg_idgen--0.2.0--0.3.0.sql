-- pg_idgen 0.2.0 -> 0.3.0 (ALTER EXTENSION pg_idgen UPDATE).
-- The registry follows schemas by name: drops match names, each ALTER SCHEMA
-- first re-keys rows by name (their OIDs may be stale after pg_upgrade or a
-- restore with triggers disabled), a new schema inherits no row, and a
-- registration makes way past rows whose schema is gone.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.3.0'" to load this file. \quit

CREATE OR REPLACE FUNCTION shard_schema_registry_keyed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
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

CREATE OR REPLACE FUNCTION shard_schemas_forget_dropped() RETURNS event_trigger
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

DROP EVENT TRIGGER pg_idgen_follow_renamed_schemas;
CREATE OR REPLACE FUNCTION shard_schemas_follow_renamed() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    UPDATE @extschema@.shard_schema_registry r SET schema_name = n.nspname
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.objid
     WHERE c.command_tag OPERATOR(pg_catalog.=) 'ALTER SCHEMA'
       AND c.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_oid OPERATOR(pg_catalog.=) c.objid
       AND r.schema_name OPERATOR(pg_catalog.<>) n.nspname;
    -- A new schema's name was free a moment ago: a row holding it is left
    -- from a schema that is gone and must not pass its shard on.
    DELETE FROM @extschema@.shard_schema_registry r
     USING pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.objid
     WHERE c.command_tag OPERATOR(pg_catalog.=) 'CREATE SCHEMA'
       AND c.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_name OPERATOR(pg_catalog.=) n.nspname;
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_follow_renamed() FROM PUBLIC;
COMMENT ON FUNCTION shard_schemas_follow_renamed() IS
    'pg_idgen: event trigger function (a renamed schema keeps its shard; a new schema inherits none)';

CREATE EVENT TRIGGER pg_idgen_follow_renamed_schemas ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA', 'CREATE SCHEMA')
    EXECUTE FUNCTION shard_schemas_follow_renamed();
