-- Planning inside planning and execution: SPI in PL/pgSQL, SQL functions,
-- cursors, triggers, plan cache invalidation, catalog changes between
-- statements, and new backends whose first statement plans nested queries.
\set VERBOSITY verbose
\set SHOW_CONTEXT always

CREATE TABLE nest (id int PRIMARY KEY, at timestamptz, v text);
INSERT INTO nest SELECT g, '2026-01-01'::timestamptz + g * interval '1 minute', 'v' || g FROM generate_series(1, 500) g;
ANALYZE nest;

-- A PL/pgSQL function that plans queries while the outer query is being planned.
CREATE FUNCTION count_since(t timestamptz) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
DECLARE n bigint;
BEGIN
    SELECT count(*) INTO n FROM nest WHERE at >= t;
    RETURN n;
END $$;
CREATE FUNCTION folded_count() RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (SELECT count(*) FROM nest WHERE at >= '2026-01-01 05:00:00+00'::timestamptz);
END $$;
SELECT count_since('2026-01-01 08:00:00+00');
SELECT folded_count();
EXPLAIN (COSTS OFF) SELECT * FROM nest WHERE id = folded_count();
SELECT id FROM nest WHERE id <= folded_count() - 200 AND at >= '2026-01-01 04:58:00+00' ORDER BY id;

-- Loops of dynamic and static SQL, each statement planned.
DO $$
DECLARE total bigint := 0; r record;
BEGIN
    FOR i IN 1..200 LOOP
        EXECUTE format('SELECT count(*) FROM nest WHERE at >= %L::timestamptz AND id %% 7 = %s',
                       '2026-01-01'::timestamptz + i * interval '1 minute', i % 7) INTO r;
        total := total + r.count;
    END LOOP;
    RAISE NOTICE 'total %', total;
END $$;

-- Cursors, scrollable and not, with and without hold.
BEGIN;
DECLARE c1 SCROLL CURSOR FOR SELECT id, at FROM nest WHERE at > '2026-01-01 08:00:00+00' ORDER BY at;
FETCH 2 FROM c1;
FETCH PRIOR FROM c1;
FETCH LAST FROM c1;
DECLARE c2 CURSOR WITH HOLD FOR SELECT id FROM nest WHERE id > 495 ORDER BY id;
COMMIT;
FETCH ALL FROM c2;
CLOSE c2;

-- Triggers whose bodies run queries.
CREATE TABLE nest_log (id int, note text);
CREATE FUNCTION nest_trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO nest_log SELECT NEW.id, 'seen ' || count(*) FROM nest WHERE at <= NEW.at;
    RETURN NEW;
END $$;
CREATE TRIGGER nest_trg BEFORE INSERT OR UPDATE ON nest FOR EACH ROW EXECUTE FUNCTION nest_trg();
INSERT INTO nest VALUES (1001, '2026-01-01 00:30:30+00', 'x'), (1002, '2026-01-02', 'y');
UPDATE nest SET at = at + interval '1 s' WHERE id = 1001;
SELECT * FROM nest_log ORDER BY id, note;

-- Plan cache invalidation by DDL, then errors in the replanned statement.
PREPARE pc AS SELECT count(*) FROM nest WHERE at >= '2026-01-01 08:00:00+00';
EXECUTE pc;
CREATE INDEX nest_at ON nest (at);
EXECUTE pc;
EXPLAIN (COSTS OFF) EXECUTE pc;
ALTER TABLE nest ALTER COLUMN v TYPE varchar(20);
EXECUTE pc;
DEALLOCATE pc;
CREATE FUNCTION f_then_fail() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 1/0';
SELECT f_then_fail();
DROP FUNCTION f_then_fail();
CREATE FUNCTION f_then_fail() RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 41 + 1';
SELECT f_then_fail();

-- Many catalog changes between queries (each invalidates cached lookups).
DO $$
BEGIN
    FOR i IN 1..50 LOOP
        EXECUTE format('CREATE FUNCTION tmp_f%s(int) RETURNS int LANGUAGE sql IMMUTABLE AS %L', i, 'SELECT $1 + ' || i);
        EXECUTE format('SELECT tmp_f%s(1)', i);
        EXECUTE format('DROP FUNCTION tmp_f%s(int)', i);
    END LOOP;
END $$;

-- SQL functions returning sets, inlined and not.
CREATE FUNCTION recent(t timestamptz) RETURNS SETOF nest LANGUAGE sql STABLE AS 'SELECT * FROM nest WHERE at >= t';
SELECT count(*) FROM recent('2026-01-01 08:00:00+00');
EXPLAIN (COSTS OFF) SELECT * FROM recent('2026-01-01 08:00:00+00') WHERE id > 490;

-- New backends whose first statements plan nested queries or fail in them.
\c
SELECT folded_count();
\c
SELECT count_since(now() + (1/0) * interval '1 s');
SELECT count_since('2026-01-01 08:00:00+00');
\c
EXPLAIN (COSTS OFF) SELECT * FROM nest WHERE id = folded_count();
