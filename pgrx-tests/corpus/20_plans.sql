-- Plans and results of queries that look like, but are not, what the
-- extension rewrites: timestamptz comparisons, a function named id_ts in
-- another schema, joins, subqueries, CTEs, prepared statements.
\set VERBOSITY verbose

CREATE SCHEMA mine;
SET search_path = mine, public;
CREATE FUNCTION mine.id_ts(bigint) RETURNS timestamptz LANGUAGE sql IMMUTABLE
    AS $$ SELECT '2026-01-01 00:00:00+00'::timestamptz + ($1 >> 23) * interval '1 ms' $$;
CREATE FUNCTION mine.uuid_v7_ts(uuid) RETURNS timestamptz LANGUAGE sql IMMUTABLE
    AS $$ SELECT '2026-01-01 00:00:00+00'::timestamptz $$;
CREATE TABLE mine.events (id bigint PRIMARY KEY, u uuid, at timestamptz NOT NULL, body text);
INSERT INTO mine.events
    SELECT g::bigint << 23, md5(g::text)::uuid, '2026-01-01 00:00:00+00'::timestamptz + g * interval '1 ms', 'e' || g
      FROM generate_series(1, 2000) g;
CREATE INDEX ON mine.events (at);
ANALYZE mine.events;

SELECT count(*) FROM mine.events WHERE id_ts(id) >= '2026-01-01 00:00:01+00';
SELECT count(*) FROM mine.events WHERE mine.id_ts(id) BETWEEN '2026-01-01 00:00:00.5+00' AND '2026-01-01 00:00:00.6+00';
SELECT count(*) FROM mine.events WHERE uuid_v7_ts(u) = '2026-01-01 00:00:00+00';
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE id_ts(id) >= '2026-01-01 00:00:01+00';
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE '2026-01-01 00:00:01+00' < id_ts(id) AND id_ts(id) < now();
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE at >= '2026-01-01 00:00:01.9+00';
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE at >= now() - interval '1 day' AND at < now();
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE at = '2026-01-01 00:00:01+00' OR id = 5;
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE id BETWEEN 8388608 AND 16777216;
EXPLAIN (COSTS OFF)
    SELECT a.id, b.id FROM mine.events a JOIN mine.events b ON a.at >= b.at AND b.id = a.id + 8388608
     WHERE a.at < '2026-01-01 00:00:00.01+00';
EXPLAIN (COSTS OFF)
    SELECT * FROM mine.events a LEFT JOIN LATERAL (SELECT max(at) m FROM mine.events b WHERE b.at < a.at) s ON true
     WHERE a.id < 100;
EXPLAIN (COSTS OFF)
    WITH recent AS MATERIALIZED (SELECT * FROM mine.events WHERE at >= '2026-01-01 00:00:01.99+00')
    SELECT count(*) FROM recent r WHERE EXISTS (SELECT 1 FROM mine.events e WHERE e.at = r.at AND id_ts(e.id) > r.at);
EXPLAIN (COSTS OFF)
    SELECT * FROM mine.events WHERE at IN (SELECT at FROM mine.events WHERE id_ts(id) >= now()) ORDER BY at LIMIT 3;
SELECT count(*), min(at), max(at) FROM mine.events a
 WHERE EXISTS (SELECT 1 FROM mine.events b WHERE b.id = a.id AND id_ts(b.id) <= a.at);

-- Prepared statements with timestamptz parameters, custom and generic.
PREPARE since(timestamptz) AS SELECT count(*) FROM mine.events WHERE at >= $1 AND id_ts(id) >= $1;
EXECUTE since('2026-01-01 00:00:01.5+00');
EXPLAIN (COSTS OFF) EXECUTE since('2026-01-01 00:00:01.5+00');
SET plan_cache_mode = force_generic_plan;
EXECUTE since('2026-01-01 00:00:01.5+00');
EXPLAIN (COSTS OFF) EXECUTE since('2026-01-01 00:00:01.5+00');
RESET plan_cache_mode;
DEALLOCATE since;

-- Partitions and pruning at plan and run time.
CREATE TABLE mine.parted (at timestamptz, v int) PARTITION BY RANGE (at);
CREATE TABLE mine.parted_1 PARTITION OF mine.parted FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE mine.parted_2 PARTITION OF mine.parted FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
INSERT INTO mine.parted SELECT '2026-01-01'::timestamptz + g * interval '1 hour', g FROM generate_series(0, 1400) g;
ANALYZE mine.parted;
EXPLAIN (COSTS OFF) SELECT count(*) FROM mine.parted WHERE at >= '2026-02-03';
EXPLAIN (COSTS OFF) SELECT count(*) FROM mine.parted WHERE at >= '2026-02-03'::timestamptz - interval '1 week' AND v > 3;
SELECT count(*), sum(v) FROM mine.parted WHERE at >= '2026-02-03';

-- Window functions, grouping sets, DISTINCT ON, set operations.
SELECT id >> 23 AS n, at, lag(at) OVER (ORDER BY at) AS prev FROM mine.events ORDER BY at LIMIT 3;
SELECT date_trunc('second', at) AS s, count(*) FROM mine.events GROUP BY ROLLUP (1) ORDER BY 1 NULLS LAST;
SELECT DISTINCT ON (date_trunc('second', at)) date_trunc('second', at), id >> 23 FROM mine.events ORDER BY 1, 2 DESC;
SELECT at FROM mine.events WHERE id < 3 * 8388608 UNION ALL SELECT at FROM mine.events WHERE id > 1998 * 8388608 ORDER BY 1;

-- Parallel plans.
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
EXPLAIN (COSTS OFF) SELECT count(*) FROM mine.events WHERE at >= '2026-01-01 00:00:01+00' AND id_ts(id) > at - interval '1 s';
SELECT count(*) FROM mine.events WHERE at >= '2026-01-01 00:00:01+00' AND id_ts(id) > at - interval '1 s';
RESET max_parallel_workers_per_gather;
RESET parallel_setup_cost;
RESET parallel_tuple_cost;
RESET min_parallel_table_scan_size;

-- DML with RETURNING, ON CONFLICT, MERGE.
INSERT INTO mine.events VALUES (1 << 23, NULL, '2030-01-01', 'dup')
    ON CONFLICT (id) DO UPDATE SET body = excluded.body WHERE mine.events.at < excluded.at RETURNING id, body;
UPDATE mine.events SET body = 'late' WHERE at > '2026-01-01 00:00:01.998+00' RETURNING id >> 23 AS n, body;
MERGE INTO mine.events e USING (VALUES (2::bigint << 23, 'merged')) v(id, body) ON e.id = v.id
    WHEN MATCHED AND e.at < now() THEN UPDATE SET body = v.body;
SELECT id >> 23 AS n, body FROM mine.events WHERE body IN ('dup', 'merged', 'late') ORDER BY 1;
DELETE FROM mine.events WHERE id_ts(id) > '2026-01-01 00:00:01.999+00' RETURNING id >> 23 AS n;

-- Search path without the extension's schema, and an empty one.
SET search_path = '';
SELECT count(*) FROM mine.events WHERE mine.id_ts(id) >= '2026-01-01 00:00:01+00'::pg_catalog.timestamptz;
RESET search_path;
-- Read-only transactions plan as usual.
BEGIN READ ONLY;
SELECT count(*) FROM mine.events WHERE at < '2026-01-01 00:00:00.1+00';
EXPLAIN (COSTS OFF) SELECT * FROM mine.events WHERE at < '2026-01-01 00:00:00.1+00';
COMMIT;
