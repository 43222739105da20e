-- The logical-shard registry: one row per schema registered as a shard.
CREATE TABLE shard_schema_registry (
    schema_oid oid PRIMARY KEY,
    shard int NOT NULL UNIQUE CHECK (shard BETWEEN 0 AND 8191)
);
COMMENT ON TABLE shard_schema_registry IS
    'pg_idgen: schemas registered as logical shards (use shard_schema_register() to change it)';

CREATE VIEW shard_schemas AS
    SELECT n.nspname::text AS schema_name, r.shard
      FROM shard_schema_registry r JOIN pg_namespace n ON n.oid = r.schema_oid;
COMMENT ON VIEW shard_schemas IS 'pg_idgen: each schema registered as a logical shard, with its shard';

GRANT SELECT ON shard_schema_registry, shard_schemas TO PUBLIC;

CREATE TRIGGER shard_schema_registry_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_schema_registry
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();

-- A dropped schema leaves the registry with it, so that its shard is free
-- again and a new schema of the same name does not inherit it. The trigger
-- fires for every role's DROP, so it runs with its owner's rights (a role
-- needs no privilege on the registry to drop its own objects) and a pinned
-- search_path, with every name qualified.
CREATE FUNCTION shard_schemas_forget_dropped() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM @extschema@.shard_schema_registry r
     USING pg_catalog.pg_event_trigger_dropped_objects() d
     WHERE d.object_type OPERATOR(pg_catalog.=) 'schema'
       AND r.schema_oid OPERATOR(pg_catalog.=) d.objid;
END
$$;
REVOKE ALL ON FUNCTION shard_schemas_forget_dropped() FROM PUBLIC;

CREATE EVENT TRIGGER pg_idgen_forget_dropped_schemas ON sql_drop
    EXECUTE FUNCTION shard_schemas_forget_dropped();
