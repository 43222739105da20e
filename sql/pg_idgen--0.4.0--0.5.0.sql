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
