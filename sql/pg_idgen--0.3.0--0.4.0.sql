-- pg_idgen 0.3.0 -> 0.4.0 (ALTER EXTENSION pg_idgen UPDATE).
-- id_generator_server_status() also says how far ahead of the clock minting
-- in this database must stay (after a promotion onto a clock behind: the
-- whole distance) and, while that is past pg_idgen.max_clock_lead_ms, when
-- minting resumes. Its earlier columns are unchanged.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.4.0'" to load this file. \quit

DROP FUNCTION id_generator_server_status();
CREATE FUNCTION id_generator_server_status() RETURNS TABLE (
	"epoch" timestamp with time zone,
	"range_end" timestamp with time zone,
	"years_left" double precision,
	"persisted_mark" timestamp with time zone,
	"reserved_until" timestamp with time zone,
	"uuid_minted" bigint,
	"uuid_clock_regressions" bigint,
	"uuid_lead_ms" bigint,
	"mark_lead_ms" bigint,
	"minting_resumes_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'id_generator_server_status_wrapper';
COMMENT ON FUNCTION id_generator_server_status() IS
    'pg_idgen: the epoch, the range left, this database''s high-water mark, the UUIDv7 generator, and how far ahead of the clock minting must stay';
