-- Errors raised while planning (constant folding evaluates immutable
-- functions at plan time), with their SQLSTATE, CONTEXT and source location.
\set VERBOSITY verbose
\set SHOW_CONTEXT always

SELECT log(-12.34);
SELECT log(-1);
SELECT 1/0;
SELECT 1/0 AS x FROM generate_series(1, 3);
SELECT sqrt(-1::float8);
SELECT int4 '2147483647' + 1;
SELECT (SELECT 1/0);
SELECT x FROM generate_series(1, 3) x WHERE x > 1/0;
SELECT * FROM generate_series(1, 3) a JOIN generate_series(1, 3) b ON a = b + 1/0;
SELECT now() > now() - 1/0 * interval '1 day';
SELECT x FROM generate_series(1, 3) x WHERE now() >= '2020-01-01'::timestamptz + (1/0) * interval '1 s';

-- An inlined SQL function whose body fails when folded.
CREATE FUNCTION inl_div(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 10 / $1';
SELECT inl_div(0);
SELECT inl_div(x) FROM (VALUES (0)) v(x);
SELECT inl_div(inl_div(0));

-- Not inlined (two statements): the error names the statement.
CREATE FUNCTION two_stmts(int) RETURNS int LANGUAGE sql AS 'SELECT 1; SELECT 10 / $1';
SELECT two_stmts(0);

-- A body that does not parse, found at call time: position, LINE and caret
-- inside the function body, and the internal query.
SET check_function_bodies = off;
CREATE FUNCTION bad_body() RETURNS int LANGUAGE sql AS 'SELECT 1 +* 2';
CREATE FUNCTION bad_ref() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT no_such_column FROM (SELECT 1) s';
RESET check_function_bodies;
SELECT bad_body();
SELECT bad_ref();
SELECT 1 + bad_ref();

-- Immutable PL/pgSQL evaluated during constant folding.
CREATE FUNCTION pl_div(a int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN 10 / a;
END $$;
SELECT pl_div(0);
SELECT pl_div(2), pl_div(5);
EXPLAIN (COSTS OFF) SELECT pl_div(0);
EXPLAIN (COSTS OFF) SELECT pl_div(5) + x FROM generate_series(1, 2) x;

-- Internal query with its own position: EXECUTE of a statement that does
-- not parse, and a query whose planning fails, both during constant folding.
CREATE FUNCTION pl_exec() RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE r int;
BEGIN
    EXECUTE 'SELECT 1 +* 2' INTO r;
    RETURN r;
END $$;
SELECT pl_exec();
CREATE FUNCTION pl_query(a int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE r int;
BEGIN
    SELECT 10 / a INTO r;
    RETURN r;
END $$;
SELECT pl_query(0);
CREATE FUNCTION pl_nested(a int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN pl_query(a) + inl_div(a);
END $$;
SELECT pl_nested(0);
SELECT pl_nested(1);

-- Parse and analysis errors (before planning) keep their position.
SELECT 1 + 'x'::int;
SELECT no_such_column FROM (SELECT 1) s;
SELECT *
  FROM generate_series(1, 3) g
 WHERE g = 'not a number';

-- Prepared statements: custom and generic plans.
PREPARE p(int) AS SELECT 10 / $1;
EXECUTE p(0);
EXECUTE p(5);
SET plan_cache_mode = force_generic_plan;
EXECUTE p(0);
PREPARE q(int) AS SELECT pl_div($1);
EXECUTE q(0);
RESET plan_cache_mode;
DEALLOCATE p;
DEALLOCATE q;

-- Caught in PL/pgSQL: what the handler sees.
DO $$
BEGIN
    PERFORM 1/0;
EXCEPTION WHEN division_by_zero THEN
    RAISE NOTICE 'caught: % / %', SQLSTATE, SQLERRM;
END $$;
DO $$
DECLARE ctx text; detail text; hint text;
BEGIN
    PERFORM log(-1);
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS ctx = PG_EXCEPTION_CONTEXT, detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'state % message % detail [%] hint [%]', SQLSTATE, SQLERRM, detail, hint;
    RAISE NOTICE 'context: %', ctx;
END $$;
DO $$
DECLARE ctx text;
BEGIN
    EXECUTE 'SELECT pl_nested(0)';
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS ctx = PG_EXCEPTION_CONTEXT;
    RAISE NOTICE 'state % message %', SQLSTATE, SQLERRM;
    RAISE NOTICE 'context: %', ctx;
END $$;

-- Errors inside transactions and savepoints, then the session goes on.
BEGIN;
SELECT 1 AS before_error;
SELECT 1/0;
SELECT 1 AS in_aborted_transaction;
ROLLBACK;
BEGIN;
SAVEPOINT s1;
SELECT log(-1);
ROLLBACK TO SAVEPOINT s1;
SELECT pl_div(5) AS after_savepoint;
COMMIT;

-- The first statement of a new backend fails while planning.
\c
SELECT pl_div(0);
\c
SELECT log(-2);
SELECT 1 AS still_alive;
