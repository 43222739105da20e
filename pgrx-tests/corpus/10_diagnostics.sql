-- Error fields (constraint, schema, table, column, datatype) of errors
-- raised while planning, read back with GET STACKED DIAGNOSTICS.
\set VERBOSITY verbose
\set SHOW_CONTEXT always

CREATE SCHEMA diag;
CREATE DOMAIN diag.positive AS int CONSTRAINT positive_check CHECK (VALUE > 0);
CREATE DOMAIN diag.nn_text AS text CONSTRAINT nn_text_not_null NOT NULL;
CREATE FUNCTION diag.to_positive(int) RETURNS diag.positive LANGUAGE sql IMMUTABLE AS 'SELECT $1::diag.positive';
CREATE FUNCTION diag.to_nn(text) RETURNS diag.nn_text LANGUAGE sql IMMUTABLE AS 'SELECT $1::diag.nn_text';
CREATE TABLE diag.t (
    id int PRIMARY KEY,
    p diag.positive,
    q int CONSTRAINT q_small CHECK (q < 10),
    r int NOT NULL DEFAULT 0,
    u int CONSTRAINT t_u_unique UNIQUE
);

-- The domain check fails inside an immutable SQL function folded at plan time.
SELECT diag.to_positive(-1);
SELECT diag.to_positive(3);
SELECT diag.to_nn(NULL);
INSERT INTO diag.t (id, p) VALUES (1, diag.to_positive(-5));
EXPLAIN (COSTS OFF) SELECT * FROM diag.t WHERE p = diag.to_positive(0);

CREATE FUNCTION diag.show(stmt text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; det text; hnt text; con text; sch text; tab text; col text; typ text; ctx text;
BEGIN
    EXECUTE stmt;
    RAISE NOTICE 'no error: %', stmt;
EXCEPTION WHEN others THEN
    GET STACKED DIAGNOSTICS
        st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL, hnt = PG_EXCEPTION_HINT,
        con = CONSTRAINT_NAME, sch = SCHEMA_NAME, tab = TABLE_NAME, col = COLUMN_NAME,
        typ = PG_DATATYPE_NAME, ctx = PG_EXCEPTION_CONTEXT;
    RAISE NOTICE 'statement: %', stmt;
    RAISE NOTICE '  sqlstate=% message=[%] detail=[%] hint=[%]', st, msg, det, hnt;
    RAISE NOTICE '  constraint_name=[%] schema_name=[%] table_name=[%] column_name=[%] pg_datatype_name=[%]', con, sch, tab, col, typ;
    RAISE NOTICE '  context=[%]', ctx;
END $$;

-- Planning-time failures (constant folding of the immutable functions).
SELECT diag.show('SELECT diag.to_positive(-1)');
SELECT diag.show('SELECT diag.to_nn(NULL)');
SELECT diag.show('SELECT 1 FROM diag.t WHERE p = diag.to_positive(-7)');
SELECT diag.show('INSERT INTO diag.t (id, p) VALUES (2, diag.to_positive(-2))');
SELECT diag.show('SELECT 1/0');
SELECT diag.show('SELECT log(-1)');
-- Execution-time failures, for comparison.
SELECT diag.show('INSERT INTO diag.t (id, p) VALUES (3, -3)');
SELECT diag.show('INSERT INTO diag.t (id, q) VALUES (4, 40)');
SELECT diag.show('INSERT INTO diag.t (id, r) VALUES (5, NULL)');
SELECT diag.show('INSERT INTO diag.t (id, u) VALUES (6, 1), (7, 1)');
SELECT diag.show('INSERT INTO diag.t (id) VALUES (8), (8)');
SELECT diag.show('SELECT ''abc''::diag.positive');

-- The same, caught directly in a DO block (PERFORM plans at run time).
DO $$
DECLARE con text; sch text; typ text; col text; tab text; ctx text;
BEGIN
    PERFORM diag.to_positive(-1);
EXCEPTION WHEN check_violation THEN
    GET STACKED DIAGNOSTICS con = CONSTRAINT_NAME, sch = SCHEMA_NAME, typ = PG_DATATYPE_NAME,
                            col = COLUMN_NAME, tab = TABLE_NAME, ctx = PG_EXCEPTION_CONTEXT;
    RAISE NOTICE 'constraint_name=% schema_name=% pg_datatype_name=% column_name=[%] table_name=[%]', con, sch, typ, col, tab;
    RAISE NOTICE 'context=%', ctx;
END $$;

-- RAISE with every field set, from a function evaluated at plan time.
CREATE FUNCTION diag.raiser(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF $1 < 0 THEN
        RAISE EXCEPTION USING MESSAGE = 'custom failure ' || $1, DETAIL = 'the detail', HINT = 'the hint',
            ERRCODE = 'P0042', COLUMN = 'c1', CONSTRAINT = 'k1', DATATYPE = 'd1', TABLE = 't1', SCHEMA = 's1';
    END IF;
    RETURN $1;
END $$;
SELECT diag.raiser(-1);
SELECT diag.show('SELECT diag.raiser(-2)');
SELECT diag.raiser(1);
-- Warnings and notices raised while planning reach the client too.
CREATE FUNCTION diag.warner(int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE WARNING 'warning while folding %', $1 USING DETAIL = 'warn detail';
    RAISE NOTICE 'notice while folding %', $1;
    RETURN $1;
END $$;
SELECT diag.warner(7);
EXPLAIN (COSTS OFF) SELECT diag.warner(8);
