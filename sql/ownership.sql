-- The shard ownership of this server, recorded in its fleet database
-- (pg_idgen.fleet_database) and followed by every database of the server:
-- claimed ranges, and shards adopted from another server after the ID that
-- server released. (In other databases these tables are not read.)
CREATE TABLE shard_ownership (
    first_shard int NOT NULL,
    last_shard int NOT NULL,
    adopted_after bigint,
    since timestamptz NOT NULL DEFAULT now(),
    CHECK (0 <= first_shard AND first_shard <= last_shard AND last_shard <= 8191),
    CHECK (adopted_after IS NULL OR first_shard = last_shard)
);
COMMENT ON TABLE shard_ownership IS
    'pg_idgen: the shards this server mints for (change it with shard_claim, shard_release, shard_adopt)';

-- Shards this server released, with the ID above which their new owner mints.
CREATE TABLE shard_releases (
    shard int PRIMARY KEY CHECK (shard BETWEEN 0 AND 8191),
    high_water bigint NOT NULL,
    released_at timestamptz NOT NULL DEFAULT now()
);
COMMENT ON TABLE shard_releases IS 'pg_idgen: shards released from this server to another';

-- Once a server has claimed or released a shard, it mints only what it
-- claims until shard_own_all() says otherwise.
CREATE TABLE shard_fleet_mode (
    claims_only boolean NOT NULL,
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
COMMENT ON TABLE shard_fleet_mode IS 'pg_idgen: whether this server mints only the shards it claims';

CREATE VIEW shard_claims AS
    SELECT first_shard, last_shard, adopted_after, since FROM shard_ownership ORDER BY first_shard;
COMMENT ON VIEW shard_claims IS 'pg_idgen: the shards this server mints for (in its fleet database)';

GRANT SELECT ON shard_ownership, shard_releases, shard_fleet_mode, shard_claims TO PUBLIC;

CREATE TRIGGER shard_ownership_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_ownership
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();
CREATE TRIGGER shard_releases_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_releases
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();
CREATE TRIGGER shard_fleet_mode_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON shard_fleet_mode
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed();

SELECT pg_catalog.pg_extension_config_dump('shard_ownership', '');
SELECT pg_catalog.pg_extension_config_dump('shard_releases', '');
SELECT pg_catalog.pg_extension_config_dump('shard_fleet_mode', '');
