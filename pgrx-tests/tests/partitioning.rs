//! Tables partitioned by time through their keys (docs/partitioning.md):
//! - IDs in daily range partitions made by pg_partman (Debian's
//!   postgresql-15-partman, so on PostgreSQL 15; scripts/test names the test
//!   as skipped elsewhere): `id_interval('1 day')` as the partition width,
//!   partitions made ahead by maintenance, old ones dropped by retention;
//! - UUIDv7 keys in native daily partitions bounded by `uuid_v7_lower_bound`;
//! - in both, a filter on the key's time (`id_ts(id) >= now() - interval
//!   '1 day'`) prunes the partitions it cannot match (EXPLAIN ANALYZE shows
//!   the subplans removed) and finds exactly the rows it names.

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{sqlstate, Server};

/// The plan of a query, as text.
fn explain(c: &mut Client, sql: &str) -> String {
    c.query(&format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

/// How many subplans a plan's (runtime or initial) pruning removed.
fn removed(plan: &str) -> i64 {
    plan.lines()
        .filter_map(|l| l.trim().strip_prefix("Subplans Removed: "))
        .map(|n| n.trim().parse::<i64>().unwrap())
        .sum()
}

fn count(c: &mut Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).unwrap().get(0)
}

/// Each partition of `events` holds the rows of one UTC day of `time` (the
/// key's time, `id_ts(id)` or `uuid_v7_ts(id)`); a filter on the last day
/// prunes the six partitions of two to seven days ago, and finds exactly
/// the 100 rows minted now, as a filter the rewrite does not see finds them.
fn one_day_each_and_pruned(c: &mut Client, time: &str) {
    let spread = count(
        c,
        &format!(
            "SELECT max(days) FROM (SELECT tableoid, count(DISTINCT date_trunc('day', {time}, 'UTC')) AS days
                                     FROM events GROUP BY tableoid) p"
        ),
    );
    assert_eq!(spread, 1, "a partition holds rows of more than one day");
    // (Yesterday's, today's, those made ahead and a default one may hold matching rows.)
    let filter = format!("SELECT count(*) FROM events WHERE {time} >= now() - interval '1 day'");
    let plan = explain(c, &filter);
    assert_eq!(removed(&plan), 6, "not the six old partitions pruned:\n{plan}");
    let found = count(c, &filter);
    let unpruned = count(c, &format!("SELECT count(*) FROM events WHERE ({time} + interval '0 s') >= now() - interval '1 day'"));
    assert_eq!(found, unpruned, "the pruned query found other rows than a full scan");
    assert_eq!(found, 100, "today's 100 rows expected");
}

#[test]
fn ids_in_daily_partitions_by_pg_partman_are_made_ahead_dropped_by_age_and_pruned_by_time() {
    let server = Server::start("partman", &[]);
    let mut c = server.client();
    let pg_config = std::env::var("PG_CONFIG").expect("PG_CONFIG names the PostgreSQL under test");
    let share = std::process::Command::new(&pg_config).arg("--sharedir").output().expect("pg_config runs").stdout;
    let control = std::path::Path::new(String::from_utf8_lossy(&share).trim()).join("extension/pg_partman.control");
    assert!(control.exists(), "pg_partman is not installed in this PostgreSQL ({}): scripts/setup installs Debian's for 15", control.display());
    c.batch_execute(
        "CREATE SCHEMA partman; CREATE EXTENSION pg_partman SCHEMA partman;
         CREATE TABLE events (id bigint NOT NULL DEFAULT next_shard_id(1), note text, PRIMARY KEY (id))
             PARTITION BY RANGE (id);
         -- From a week ago (for the backfill below) up to two days ahead; then two days ahead of the newest row.
         SELECT partman.create_parent('public.events', 'id', 'native', id_interval('1 day')::text,
                p_premake := 9,
                p_start_partition := id_lower_bound(date_trunc('day', now() - interval '7 days', 'UTC'))::text);
         UPDATE partman.part_config SET premake = 2 WHERE parent_table = 'public.events';",
    )
    .unwrap();
    // A week of rows: 100 a day for six days back (backfilled with their
    // times), and 100 minted now.
    c.batch_execute(
        "INSERT INTO events (id, note)
             SELECT id_from_parts(now() - k * interval '1 day' - s * interval '1 ms', 1, 0), 'old'
               FROM generate_series(1, 6) k, generate_series(1, 100) s;
         INSERT INTO events (note) SELECT 'new' FROM generate_series(1, 100);
         SELECT partman.run_maintenance('public.events');",
    )
    .unwrap();
    // Made ahead: partitions for days after today, empty.
    let ahead = count(
        &mut c,
        "SELECT count(*) FROM partman.show_partitions('public.events') p,
                LATERAL partman.show_partition_info(p.partition_schemaname || '.' || p.partition_tablename) i
          WHERE i.child_start_id::bigint > id_lower_bound(now())",
    );
    assert!(ahead >= 2, "only {ahead} partitions were made ahead");

    one_day_each_and_pruned(&mut c, "id_ts(id)");

    // Retention by age: partitions entirely older than three days are dropped with their rows.
    c.batch_execute(
        "UPDATE partman.part_config SET retention = id_interval('3 days')::text, retention_keep_table = false
          WHERE parent_table = 'public.events';
         SELECT partman.run_maintenance('public.events');",
    )
    .unwrap();
    let oldest = count(&mut c, "SELECT (extract(epoch FROM now() - min(id_ts(id))) / 86400)::bigint FROM events");
    assert!(oldest <= 4, "rows {oldest} days old remain after retention of 3 days");
    let kept_new = count(&mut c, "SELECT count(*) FROM events WHERE note = 'new'");
    assert_eq!(kept_new, 100, "retention dropped today's rows");
    let dropped = count(&mut c, "SELECT 600 - count(*) FROM events WHERE note = 'old'");
    assert!(dropped >= 200, "retention dropped only {dropped} old rows");
    // New rows still go to today's partition, and a time before the epoch is an error, not a partition.
    c.batch_execute("INSERT INTO events (note) VALUES ('after')").unwrap();
    assert_eq!(sqlstate(c.batch_execute("SELECT id_interval('1 month')")), "22023");
    assert_eq!(sqlstate(c.batch_execute("SELECT id_interval('-1 day')")), "22023");
}

#[test]
fn uuid_v7_keys_in_native_daily_partitions_are_pruned_by_time() {
    let server = Server::start("uuid-partitions", &[]);
    let mut c = server.client();
    c.batch_execute(
        "SET TIME ZONE 'UTC';
         CREATE TABLE events (id uuid NOT NULL DEFAULT uuid_v7(), note text, PRIMARY KEY (id)) PARTITION BY RANGE (id);
         DO $$
         DECLARE d date;
         BEGIN
             FOR d IN SELECT generate_series(current_date - 7, current_date + 2, interval '1 day')::date LOOP
                 EXECUTE format('CREATE TABLE %I PARTITION OF events FOR VALUES FROM (%L) TO (%L)',
                                'events_' || to_char(d, 'YYYYMMDD'),
                                uuid_v7_lower_bound(d::timestamp AT TIME ZONE 'UTC'),
                                uuid_v7_lower_bound((d + 1)::timestamp AT TIME ZONE 'UTC'));
             END LOOP;
         END $$;
         INSERT INTO events (id, note)
             SELECT uuid_v7(now() - k * interval '1 day' - s * interval '1 ms'), 'old'
               FROM generate_series(1, 6) k, generate_series(1, 100) s;
         INSERT INTO events (note) SELECT 'new' FROM generate_series(1, 100);",
    )
    .unwrap();
    one_day_each_and_pruned(&mut c, "uuid_v7_ts(id)");
}
