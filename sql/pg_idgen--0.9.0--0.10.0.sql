-- pg_idgen 0.9.0 -> 0.10.0 (ALTER EXTENSION pg_idgen UPDATE).
-- The ID span of an interval, for range partitions of IDs by time.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.10.0'" to load this file. \quit

CREATE FUNCTION "id_interval"(
	"span" interval
) RETURNS bigint
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_interval_wrapper';
COMMENT ON FUNCTION id_interval(interval) IS
    'pg_idgen: how far apart IDs lie whose times are an interval apart (the width of a range partition of IDs by time)';
