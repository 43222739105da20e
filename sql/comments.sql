-- A description of every function, so that \df+ and \dx+ explain the
-- extension (tables, views, the sequence and the trigger functions carry
-- theirs where they are created).
COMMENT ON FUNCTION next_shard_id(int) IS
    'pg_idgen: the next 64-bit ID of a logical shard (0 to 8191): ms since the epoch, shard, sequence; never repeated, increasing per shard';
COMMENT ON FUNCTION next_schema_id(text) IS
    'pg_idgen: the next 64-bit ID of the logical shard registered for a schema (see shard_schema_register)';
COMMENT ON FUNCTION id_ts(bigint) IS 'pg_idgen: the time an ID was minted, to the millisecond';
COMMENT ON FUNCTION id_shard(bigint) IS 'pg_idgen: the logical shard of an ID';
COMMENT ON FUNCTION id_seq(bigint) IS 'pg_idgen: the sequence number of an ID within its millisecond and shard';
COMMENT ON FUNCTION id_from_parts(timestamptz, int, int) IS
    'pg_idgen: the ID carrying a time (rounded down to the millisecond), a shard and a sequence number';
COMMENT ON FUNCTION id_lower_bound(timestamptz) IS 'pg_idgen: the smallest ID that can carry the millisecond of a time';
COMMENT ON FUNCTION id_upper_bound(timestamptz) IS 'pg_idgen: the largest ID that can carry the millisecond of a time';
COMMENT ON FUNCTION id_interval(interval) IS
    'pg_idgen: how far apart IDs lie whose times are an interval apart (the width of a range partition of IDs by time)';
COMMENT ON FUNCTION id_lower_bound_clamped(timestamptz) IS
    'pg_idgen: id_lower_bound for any time (0 before the epoch, the largest ID past the range)';
COMMENT ON FUNCTION id_upper_bound_clamped(timestamptz) IS
    'pg_idgen: id_upper_bound for any time (-1 before the epoch, the largest ID past the range)';
COMMENT ON FUNCTION id_epoch() IS 'pg_idgen: the epoch this database''s IDs count milliseconds from';
COMMENT ON FUNCTION id_lower_bound(timestamptz, text) IS
    'pg_idgen: the smallest ID of a named layout (pg_idgen, instagram, twitter, discord, sonyflake) in the time unit of a time';
COMMENT ON FUNCTION id_upper_bound(timestamptz, text) IS
    'pg_idgen: the largest ID of a named layout in the time unit of a time';
COMMENT ON FUNCTION id_layout_ts(bigint, text) IS 'pg_idgen: the time of an ID of a named layout';
COMMENT ON FUNCTION id_layout_node(bigint, text) IS 'pg_idgen: the node (shard, machine, worker and process) of an ID of a named layout';
COMMENT ON FUNCTION id_layout_seq(bigint, text) IS 'pg_idgen: the sequence number of an ID of a named layout';
COMMENT ON FUNCTION ulid_to_uuid(text) IS 'pg_idgen: a ULID in its 16-byte uuid form';
COMMENT ON FUNCTION uuid_to_ulid(uuid) IS 'pg_idgen: a uuid as ULID text (Crockford base32)';
COMMENT ON FUNCTION ulid_ts(text) IS 'pg_idgen: the time of a ULID';
COMMENT ON FUNCTION ksuid_ts(text) IS 'pg_idgen: the time of a KSUID';
COMMENT ON FUNCTION objectid_ts(text) IS 'pg_idgen: the time of a MongoDB ObjectID';
COMMENT ON FUNCTION id_to_base62(bigint) IS 'pg_idgen: an ID as base62 text';
COMMENT ON FUNCTION id_from_base62(text) IS 'pg_idgen: the ID of base62 text';
COMMENT ON FUNCTION id_to_base32(bigint) IS 'pg_idgen: an ID as Crockford base32 text';
COMMENT ON FUNCTION id_from_base32(text) IS 'pg_idgen: the ID of Crockford base32 text';
COMMENT ON FUNCTION id_public(bigint) IS
    'pg_idgen: an ID encrypted with pg_idgen.public_id_key (Speck64/128), as text that reveals neither time nor order';
COMMENT ON FUNCTION id_from_public(text) IS 'pg_idgen: the ID of a public ID made by id_public';
COMMENT ON FUNCTION uuid_v7() IS
    'pg_idgen: a new RFC 9562 version-7 UUID, larger than every earlier one of the server';
COMMENT ON FUNCTION uuid_v7(timestamptz) IS 'pg_idgen: a version-7 UUID carrying a given time (backfill)';
COMMENT ON FUNCTION uuid_v7_ts(uuid) IS 'pg_idgen: the time a version-7 UUID carries, to the millisecond; NULL for other versions';
COMMENT ON FUNCTION uuid_v7_lower_bound(timestamptz) IS 'pg_idgen: the smallest version-7 UUID of the millisecond of a time';
COMMENT ON FUNCTION uuid_v7_upper_bound(timestamptz) IS 'pg_idgen: the largest version-7 UUID of the millisecond of a time';
COMMENT ON FUNCTION uuid_v7_lower_bound_clamped(timestamptz) IS
    'pg_idgen: uuid_v7_lower_bound for any time (the nil UUID before 1970, the max UUID past the range)';
COMMENT ON FUNCTION uuid_v7_upper_bound_clamped(timestamptz) IS
    'pg_idgen: uuid_v7_upper_bound for any time (the nil UUID before 1970, the max UUID past the range)';
COMMENT ON FUNCTION shard_schema_register(text, int) IS 'pg_idgen: registers an existing schema as a logical shard';
COMMENT ON FUNCTION shard_schema_create(text, int) IS 'pg_idgen: creates a schema and registers it as a logical shard, all or nothing';
COMMENT ON FUNCTION shard_claim(int, int) IS 'pg_idgen: this server mints for these shards (in the fleet database)';
COMMENT ON FUNCTION shard_release(int) IS
    'pg_idgen: stops minting a shard on this server and returns an ID above every ID handed out for it';
COMMENT ON FUNCTION shard_adopt(int, bigint) IS
    'pg_idgen: claims a shard released elsewhere, never minting at or below the given ID';
COMMENT ON FUNCTION shard_own_all() IS 'pg_idgen: mints for every shard again, as before the first claim';
COMMENT ON FUNCTION id_generator_status() IS
    'pg_idgen: one row per logical shard minted or released since the server started';
COMMENT ON FUNCTION id_generator_server_status() IS
    'pg_idgen: the epoch, the range left, this database''s high-water mark, the UUIDv7 generator, and how far ahead of the clock minting must stay';
COMMENT ON FUNCTION shard_leases() IS
    'pg_idgen: the shards this server leases from its lease store (pg_idgen.lease_store), their state, validity and mark';
COMMENT ON FUNCTION id_generator_copies() IS
    'pg_idgen: after this primary''s last start or promotion, what the server primary_conninfo names answered: another primary of this data (both mint the same shards), a standby, another system, or unreachable';
-- The origin's address is the server's configuration: monitoring reads it.
REVOKE EXECUTE ON FUNCTION id_generator_copies() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION id_generator_copies() TO pg_monitor;
COMMENT ON FUNCTION pg_idgen_follow_ids() IS
    'pg_idgen: trigger function for a logical-replication subscriber: raises the generators above each replicated ID (acts only in replica mode)';
COMMENT ON FUNCTION pg_idgen_table_changed() IS 'pg_idgen: trigger function (a table of the extension changed)';
COMMENT ON FUNCTION pg_idgen_ownership_changed() IS 'pg_idgen: trigger function (shard ownership changed)';
COMMENT ON FUNCTION pg_idgen_epoch_replaced() IS 'pg_idgen: trigger function (one recorded epoch per database)';
COMMENT ON EVENT TRIGGER pg_idgen_forget_dropped_schemas IS 'pg_idgen: a dropped schema leaves the shard registry';
COMMENT ON EVENT TRIGGER pg_idgen_key_schemas IS 'pg_idgen: before ALTER SCHEMA, registry rows take the OIDs of their schemas';
COMMENT ON EVENT TRIGGER pg_idgen_follow_renamed_schemas IS
    'pg_idgen: a renamed schema keeps its shard; a new schema inherits none';

-- Trigger and event trigger functions run only as the triggers the extension
-- creates (PostgreSQL checks EXECUTE when a trigger is created, not when it
-- fires): no other role may call them or attach them to a table of its own.
REVOKE EXECUTE ON FUNCTION
    pg_idgen_ownership_changed(), pg_idgen_table_changed(), pg_idgen_epoch_replaced(),
    shard_schema_registry_keyed(), shard_schemas_forget_dropped(), shard_schemas_key_by_name(),
    shard_schemas_follow_renamed()
    FROM PUBLIC;
-- The replica trigger raises server-wide generators: its triggers are
-- created by a superuser, or by a role granted EXECUTE on it.
REVOKE EXECUTE ON FUNCTION pg_idgen_follow_ids() FROM PUBLIC;
COMMENT ON FUNCTION citus_shard_take(text, bigint) IS
    'pg_idgen on Citus: hands the shard of a distributed schema to the node holding its data (run on the coordinator, as the extension''s owner)';
COMMENT ON FUNCTION citus_shard_take_back(int, bool) IS
    'pg_idgen on Citus: hands a shard back to the coordinator, or to the node holding its schema''s data (run by the coordinator in a session of its own)';
COMMENT ON FUNCTION citus_shard_release(int, bigint) IS
    'pg_idgen on Citus: stops a worker minting a shard whose schema''s data moved away, returning an ID above all it minted (run by the coordinator)';
-- Only the extension's owner (the role pg_idgen connects as between nodes
-- for a hand-over) runs the hand-over functions.
REVOKE EXECUTE ON FUNCTION citus_shard_take(text, bigint), citus_shard_take_back(int, bool), citus_shard_release(int, bigint) FROM PUBLIC;
COMMENT ON FUNCTION next_node_id() IS
    'pg_idgen: on a Citus node, the next 64-bit ID of its node group''s own logical shard (group 0: 8191, group 1: 8190, ...), minted there with no call to another node';
COMMENT ON FUNCTION citus_registry_sync() IS
    'pg_idgen on Citus: sends the coordinator''s registry of schema shards to every worker (each registration does; run after adding a worker)';
COMMENT ON FUNCTION citus_registry_note(text[], int[]) IS
    'pg_idgen on Citus: replaces a worker''s copy of the registry with the coordinator''s (run by the coordinator)';
REVOKE EXECUTE ON FUNCTION citus_registry_sync(), citus_registry_note(text[], int[]) FROM PUBLIC;
