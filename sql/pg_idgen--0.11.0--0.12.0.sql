-- pg_idgen 0.11.0 -> 0.12.0 (ALTER EXTENSION pg_idgen UPDATE).
-- id_generator_copies(): what the server primary_conninfo names answered
-- after this server's last start or promotion (another primary of this
-- data, a standby, another system, unreachable).
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.12.0'" to load this file. \quit

CREATE FUNCTION "id_generator_copies"() RETURNS TABLE (
	"checked_at" timestamp with time zone,
	"origin" TEXT,
	"state" TEXT,
	"detail" TEXT
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_generator_copies_wrapper';
COMMENT ON FUNCTION id_generator_copies() IS
    'pg_idgen: after this primary''s last start or promotion, what the server primary_conninfo names answered: another primary of this data (both mint the same shards), a standby, another system, or unreachable';
REVOKE EXECUTE ON FUNCTION id_generator_copies() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION id_generator_copies() TO pg_monitor;
