-- On a Citus coordinator: which node group mints each logical shard handed
-- over to the node holding a distributed schema's data, above which ID, and
-- the hand-over's number (each hand-over of a shard counts one up). Written
-- by citus_shard_take only; a shard without a row is minted by the
-- coordinator. (On workers, and on a single server, it stays empty.)
CREATE TABLE citus_shard_holders (
    shard int PRIMARY KEY CHECK (shard BETWEEN 0 AND 8191),
    holder_group int NOT NULL,
    holder_host text NOT NULL,
    holder_port int NOT NULL,
    after bigint NOT NULL,
    handover bigint NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE citus_shard_holders IS
    'pg_idgen on Citus: the node group that mints each shard handed over, above which ID (written by citus_shard_take)';
REVOKE ALL ON citus_shard_holders FROM PUBLIC;
GRANT SELECT ON citus_shard_holders TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('citus_shard_holders', '');
-- Every backend drops its cached copy when it changes.
CREATE TRIGGER citus_shard_holders_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON citus_shard_holders
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();
