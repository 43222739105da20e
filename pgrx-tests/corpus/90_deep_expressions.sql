-- Very deep expressions and recursion: stock PostgreSQL computes them or
-- stops with "stack depth limit exceeded" (54001); nothing may crash.
-- Last of the corpus, so that a crash would not hide other differences.
-- The statements are generated with \gexec.
\set VERBOSITY verbose

-- SELECT 1+1+...+1, 800 and 5000 terms (left-deep).
SELECT 'SELECT ' || string_agg('1', '+') AS sum_800 FROM generate_series(1, 800) \gexec
SELECT 'SELECT ' || string_agg('1', '+') AS sum_5000 FROM generate_series(1, 5000) \gexec
-- 1+(1+(...)), 800 deep (right-deep).
SELECT 'SELECT ' || repeat('1+(', 799) || '1' || repeat(')', 799) AS nested_800 \gexec
-- 'a'||'a'||..., 1000 terms.
SELECT 'SELECT length(' || string_agg('''a''', '||') || ')' AS concat_1000 FROM generate_series(1, 1000) \gexec
-- The same depths in WHERE and JOIN clauses, which a planner hook walks.
SELECT 'SELECT count(*) FROM generate_series(1, 3) g WHERE g + ' || string_agg('1', '+') || ' > 800'
  FROM generate_series(1, 800) \gexec
SELECT 'SELECT count(*) FROM generate_series(1, 3) g WHERE g + ' || string_agg('1', '+') || ' > 800'
  FROM generate_series(1, 5000) \gexec
SELECT 'SELECT count(*) FROM generate_series(1, 3) a JOIN generate_series(1, 3) b ON a = b - 800 + ' || repeat('1+(', 799) || '1' || repeat(')', 799)
  \gexec
-- 2000 AND-ed and 1000 OR-ed timestamptz comparisons.
SELECT 'SELECT count(*) FROM generate_series(''2026-01-01''::timestamptz, ''2026-01-02'', interval ''1 hour'') t WHERE '
       || string_agg(format('t >= %L::timestamptz', '2026-01-01'::timestamptz + (i % 10) * interval '1 hour'), ' AND ')
  FROM generate_series(1, 2000) i \gexec
SELECT 'SELECT count(*) FROM generate_series(''2026-01-01''::timestamptz, ''2026-01-02'', interval ''1 hour'') t WHERE '
       || string_agg(format('t = %L::timestamptz', '2026-01-01'::timestamptz + i * interval '1 minute'), ' OR ')
  FROM generate_series(1, 1000) i \gexec
-- AND nested 500 deep: (c AND (c AND (...))).
SELECT 'SELECT count(*) FROM generate_series(1, 5) g WHERE ' || repeat('(g > 1 AND ', 500) || 'g < 5' || repeat(')', 500) \gexec
-- Scalar subqueries nested 100 deep, and CASE nested 300 deep.
SELECT 'SELECT ' || repeat('(SELECT 1 + ', 100) || '1' || repeat(')', 100) AS subqueries_100 \gexec
SELECT 'SELECT ' || repeat('CASE WHEN random() >= 0 THEN 1 + ', 300) || '0' || repeat(' END', 300) AS case_300 \gexec
-- Plans of a deep expression (folded to a constant).
SELECT 'EXPLAIN (COSTS OFF, VERBOSE) SELECT ' || string_agg('1', '+') FROM generate_series(1, 800) \gexec

-- A recursive SQL function: each level plans its body again.
CREATE FUNCTION r() RETURNS int AS 'SELECT r()' LANGUAGE sql;
SELECT r();
-- A recursive PL/pgSQL function, caught at the top.
CREATE FUNCTION pr(n int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    RETURN pr(n + 1) + 1;
END $$;
DO $$
BEGIN
    PERFORM pr(0);
EXCEPTION WHEN statement_too_complex THEN
    RAISE NOTICE 'caught % (%)', SQLSTATE, SQLERRM;
END $$;
-- Recursion whose every level fails while planning, caught at each level.
CREATE FUNCTION rc(n int) RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    IF n = 0 THEN
        RETURN 0;
    END IF;
    BEGIN
        EXECUTE 'SELECT 1/0';
    EXCEPTION WHEN division_by_zero THEN
        NULL;
    END;
    RETURN rc(n - 1) + 1;
END $$;
SELECT rc(200);
SELECT 1 AS still_alive;
