// The body of `planner::tests` (a #[pg_schema] module, so the schema its
// #[pg_test] functions are created in is `tests`): mod.rs includes it.

use crate::testing::{explain, one};
use pgrx::prelude::*;

const T: &str = "2026-03-04 05:06:07.089+00";

/// A table of IDs at the milliseconds around T, at both ends of shard and sequence,
/// and one of UUIDs carrying the same times.
fn setup() {
    Spi::run(&format!(
        "CREATE TABLE ev (id bigint PRIMARY KEY, n int);
         INSERT INTO ev SELECT id_from_parts(ts, shard, seq), 0
           FROM (SELECT '{T}'::timestamptz + d * interval '1 millisecond' AS ts FROM generate_series(-3, 3) d) t,
                (VALUES (0, 0), (0, 1023), (8191, 0), (8191, 1023), (17, 512)) p(shard, seq);
         INSERT INTO ev SELECT id_from_parts('{T}'::timestamptz + g * interval '1 second', 1, 0), g FROM generate_series(1, 20000) g;
         CREATE TABLE uv (id uuid PRIMARY KEY, n int);
         INSERT INTO uv SELECT uuid_v7(ts), 0
           FROM (SELECT '{T}'::timestamptz + d * interval '250 microseconds' AS ts FROM generate_series(-12, 12) d) t,
                generate_series(1, 3);
         INSERT INTO uv SELECT uuid_v7('{T}'::timestamptz + g * interval '1 second'), g FROM generate_series(1, 20000) g;
         ANALYZE ev; ANALYZE uv;"
    ))
    .unwrap();
}

const FILTERS: &[&str] = &["{f} >= {t}", "{f} > {t}", "{f} <= {t}", "{f} < {t}", "{f} = {t}", "{t} <= {f}", "{t} > {f}", "{f} BETWEEN {t} AND {t}::timestamptz + interval '1 ms'"];

#[pg_test]
fn every_comparison_becomes_an_index_condition() {
    setup();
    Spi::run("SET enable_seqscan = off").unwrap();
    for (table, f) in [("ev", "id_ts(id)"), ("uv", "uuid_v7_ts(id)")] {
        for filter in FILTERS {
            let cond = filter.replace("{f}", f).replace("{t}", &format!("'{T}'::timestamptz"));
            let plan = explain(&format!("SELECT * FROM {table} WHERE {cond}"));
            assert!(plan.contains("Index Cond: (id ") || plan.contains("Index Cond: ((id "), "{cond}:\n{plan}");
            assert!(plan.contains(&format!("{table}_pkey")), "{cond}:\n{plan}");
        }
    }
    // A stable expression and a parameter-like one, inside a subquery.
    let plan = explain("SELECT * FROM (SELECT * FROM ev WHERE id_ts(id) > now() - interval '1 day') s");
    assert!(plan.contains("Index Cond: (id >= id_lower_bound_clamped((now() - '1 day'::interval)))"), "{plan}");
    assert!(!plan.contains("'0'::bigint") && !plan.contains("BitmapOr"), "a plain index condition:\n{plan}");
}

#[pg_test]
fn results_equal_the_unrewritten_filter_at_millisecond_edges() {
    setup();
    let times = [
        format!("'{T}'::timestamptz"),
        format!("'{T}'::timestamptz + interval '500 microseconds'"),
        format!("'{T}'::timestamptz - interval '1 microsecond'"),
        "NULL::timestamptz".into(),
        "'infinity'::timestamptz".into(),
        "'-infinity'::timestamptz".into(),
        "'2020-01-01+00'::timestamptz".into(),
    ];
    Spi::run("SET enable_seqscan = off").unwrap();
    for (table, f) in [("ev", "id_ts(id)"), ("uv", "uuid_v7_ts(id)")] {
        for t in &times {
            for filter in FILTERS {
                let t = format!("({t})");
                let cond = filter.replace("{f}", f).replace("{t}", &t);
                // The same filter on a materialized decoded column is never rewritten.
                let truth: i64 = one(&format!(
                    "WITH d AS MATERIALIZED (SELECT {f} AS ts FROM {table}) SELECT count(*) FROM d WHERE {}",
                    filter.replace("{f}", "ts").replace("{t}", &t)
                ));
                let got: i64 = one(&format!("SELECT count(*) FROM {table} WHERE {cond}"));
                assert_eq!(got, truth, "{table}: {cond}");
            }
        }
    }
}

#[pg_test]
fn join_conditions_are_rewritten_and_the_setting_turns_it_off() {
    setup();
    Spi::run("SET enable_seqscan = off").unwrap();
    let plan = explain(&format!(
        "SELECT * FROM (VALUES ('{T}'::timestamptz)) v(t) JOIN ev ON id_ts(ev.id) >= v.t AND id_ts(ev.id) < v.t + interval '1 s'"
    ));
    assert!(plan.contains("ev_pkey"), "{plan}");
    Spi::run("SET pg_idgen.rewrite_time_filters = off").unwrap();
    let plan = explain(&format!("SELECT * FROM ev WHERE id_ts(id) >= '{T}'"));
    assert!(!plan.contains("Index Cond"), "{plan}");
}

#[pg_test]
fn builtin_operator_oids_are_the_catalog_ones() {
    use super::ops::*;
    for (oid, sig) in [
        (TSTZ_EQ, "=(timestamptz,timestamptz)"),
        (TSTZ_LT, "<(timestamptz,timestamptz)"),
        (TSTZ_LE, "<=(timestamptz,timestamptz)"),
        (TSTZ_GT, ">(timestamptz,timestamptz)"),
        (TSTZ_GE, ">=(timestamptz,timestamptz)"),
        (TSTZ_PL_INTERVAL, "+(timestamptz,interval)"),
        (TSTZ_MI_INTERVAL, "-(timestamptz,interval)"),
        (INT8_LE, "<=(bigint,bigint)"),
        (INT8_GE, ">=(bigint,bigint)"),
        (UUID_LE, "<=(uuid,uuid)"),
        (UUID_GE, ">=(uuid,uuid)"),
    ] {
        assert_eq!(one::<pg_sys::Oid>(&format!("SELECT 'pg_catalog.{sig}'::regoperator::oid")), oid, "{sig}");
    }
    for (oid, sig) in NOW.iter().zip(["now()", "transaction_timestamp()", "statement_timestamp()"]) {
        assert_eq!(one::<pg_sys::Oid>(&format!("SELECT 'pg_catalog.{sig}'::regprocedure::oid")), *oid, "{sig}");
    }
}

#[pg_test]
fn volatile_keys_are_evaluated_once() {
    setup();
    let plan = explain("SELECT * FROM ev WHERE id_ts((random() * 2 ^ 62)::bigint) >= '2035-01-01'");
    assert!(!plan.contains("bound_clamped"), "{plan}");
    Spi::run("SELECT next_shard_id(4077)").unwrap();
    let before: i64 = one("SELECT minted FROM id_generator_status() WHERE shard = 4077");
    let rows: i64 = one("SELECT count(*) FROM generate_series(1, 100) g WHERE id_ts(next_shard_id(4077)) >= '2020-01-01'");
    assert_eq!(rows, 100);
    let after: i64 = one("SELECT minted FROM id_generator_status() WHERE shard = 4077");
    assert_eq!(after - before, 100, "one ID per row, not two");
}

#[pg_test]
fn a_callers_search_path_changes_nothing() {
    setup();
    Spi::run(
        "CREATE SCHEMA evil;
         CREATE FUNCTION evil.to_regprocedure(text) RETURNS regprocedure LANGUAGE sql AS 'SELECT NULL::regprocedure';
         CREATE FUNCTION evil.id_ts(bigint) RETURNS timestamptz LANGUAGE sql AS 'SELECT now()';
         SET search_path = evil, pg_catalog, public; SET enable_seqscan = off",
    )
    .unwrap();
    let plan = explain(&format!("SELECT * FROM ev WHERE public.id_ts(id) >= '{T}'"));
    assert!(plan.contains("ev_pkey"), "{plan}");
    let plan = explain(&format!("SELECT * FROM ev WHERE evil.id_ts(id) >= '{T}'"));
    assert!(!plan.contains("bound_clamped"), "another schema's id_ts is not ours:\n{plan}");
}

#[pg_test]
fn a_range_the_query_already_carries_is_not_added_again() {
    setup();
    Spi::run("SET enable_seqscan = off").unwrap();
    let lo: i64 = one(&format!("SELECT id_lower_bound_clamped('{T}')"));
    let hi: i64 = one(&format!("SELECT id_upper_bound_clamped('{T}')"));
    // The shard query Citus sends a worker for a filter the coordinator
    // rewrote: the ranges already there, as constants, in nested ANDs.
    let plan = explain(&format!(
        "SELECT * FROM ev WHERE (id_ts(id) >= '{T}' AND id_ts(id) <= '{T}')
           AND ((id >= '{lo}'::bigint) AND (id <= '{hi}'::bigint))"
    ));
    let conds: String = plan
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("Index Cond:") || l.starts_with("Filter:"))
        .collect();
    assert_eq!(conds.matches(&format!("'{lo}'::bigint")).count(), 1, "{plan}");
    assert_eq!(conds.matches(&format!("'{hi}'::bigint")).count(), 1, "{plan}");
    assert_eq!(one::<i64>(&format!("SELECT count(*) FROM ev WHERE id_ts(id) = '{T}'")), 5);
}

#[pg_test]
fn volatile_times_are_left_alone() {
    setup();
    let plan = explain("SELECT * FROM ev WHERE id_ts(id) >= clock_timestamp() - random() * interval '1 day'");
    assert!(!plan.contains("Index Cond"), "{plan}");
}

/// The review's tables: `ref` (k = 0..3, t 30 s ago), `ev` (3,000 IDs
/// minted now), `neg` (the same IDs and -1, whose `id_ts` raises 22003),
/// an empty `ev0`, `far` (one row at 294276 AD) and `uv`.
fn review_tables() {
    Spi::run(
        "CREATE TABLE ref (k int, t timestamptz);
         INSERT INTO ref SELECT k, now() - interval '30 s' FROM generate_series(0, 3) k;
         CREATE TABLE ev (id bigint PRIMARY KEY DEFAULT next_shard_id(3));
         INSERT INTO ev SELECT next_shard_id(3) FROM generate_series(1, 3000);
         CREATE TABLE neg (id bigint PRIMARY KEY);
         INSERT INTO neg SELECT id FROM ev UNION ALL SELECT -1;
         CREATE TABLE ev0 (id bigint PRIMARY KEY);
         CREATE TABLE far (t timestamptz);
         INSERT INTO far VALUES ('294276-12-01 00:00:00+00');
         CREATE TABLE uv (id uuid PRIMARY KEY);
         INSERT INTO uv SELECT uuid_v7() FROM generate_series(1, 3000);
         ANALYZE ref; ANALYZE ev; ANALYZE neg; ANALYZE ev0; ANALYZE far; ANALYZE uv;",
    )
    .unwrap();
}

/// What a one-row query gives, its row as text or its SQLSTATE, with the
/// rewrite on; asserted equal to what it gives with the rewrite off.
fn outcome(query: &str) -> String {
    let (on, off) = outcomes(query);
    assert_eq!(on, off, "rewrite on vs off: {query}");
    on
}

/// What a one-row query gives, its row as text or its SQLSTATE, with the
/// rewrite on and with it off.
fn outcomes(query: &str) -> (String, String) {
    // Made once, by whichever role comes first (another may not replace it).
    if one::<bool>("SELECT to_regprocedure('pg_temp.outcome_of(text)') IS NULL") {
        Spi::run(
            "CREATE FUNCTION pg_temp.outcome_of(q text) RETURNS text LANGUAGE plpgsql AS $f$
             DECLARE r record;
             BEGIN EXECUTE q INTO r; RETURN r::text;
             EXCEPTION WHEN OTHERS THEN RETURN 'SQLSTATE ' || SQLSTATE; END $f$",
        )
        .unwrap();
    }
    let get = || one::<String>(&format!("SELECT pg_temp.outcome_of($q${query}$q$)"));
    Spi::run("SET pg_idgen.rewrite_time_filters = on").unwrap();
    let on = get();
    Spi::run("SET pg_idgen.rewrite_time_filters = off").unwrap();
    let off = get();
    Spi::run("RESET pg_idgen.rewrite_time_filters").unwrap();
    (on, off)
}

const SETTINGS: &[&str] = &["SET enable_seqscan = off", "RESET enable_seqscan"];

/// An ordinary role, `tenant`, owning schema `tenant` and its table `t`
/// of 1,000 IDs an hour apart, with a view over the last ten and a half
/// hours made while the role could still use the extension's schema
/// `ext` (the stored view names `id_ts` by OID). Then runs as `tenant`.
fn tenant(ext: &str) {
    Spi::run(&format!(
        "CREATE ROLE tenant NOLOGIN;
         CREATE SCHEMA tenant AUTHORIZATION tenant;
         CREATE TABLE tenant.t (id bigint PRIMARY KEY);
         INSERT INTO tenant.t SELECT {ext}.id_from_parts(now() - g * interval '1 hour', 1, 0) FROM generate_series(0, 999) g;
         ANALYZE tenant.t;
         CREATE VIEW tenant.recent AS SELECT id FROM tenant.t WHERE {ext}.id_ts(id) >= now() - interval '10 hours 30 minutes';
         ALTER TABLE tenant.t OWNER TO tenant; ALTER VIEW tenant.recent OWNER TO tenant;
         SET ROLE tenant"
    ))
    .unwrap();
}

/// The ten newest IDs of `tenant.t`, as `outcome` shows a row, read
/// without the time filter.
fn tenants_recent_ids() -> String {
    one("SELECT '(\"' || array_agg(id ORDER BY id)::text || '\")' FROM (SELECT id FROM tenant.t ORDER BY id DESC LIMIT 11) s")
}

/// Runs the checks of a role without USAGE on the extension's schema.
fn runs_without_usage() {
    assert_eq!(crate::testing::sqlstate("1"), "ok");
    let want = tenants_recent_ids();
    assert_eq!(outcome("SELECT array_agg(id ORDER BY id) FROM tenant.recent"), want);
    // The rewrite needs EXECUTE on what it adds, not USAGE on its schema.
    Spi::run("SET enable_seqscan = off").unwrap();
    let plan = explain("SELECT * FROM tenant.recent");
    assert!(plan.contains("Index Cond: (id >= ") && plan.contains("id_lower_bound_clamped((now() - "), "{plan}");
    assert_eq!(outcome("SELECT array_agg(id ORDER BY id) FROM tenant.recent"), want);
}

// The extension in a schema of its own without USAGE for the role: an
// end-to-end test (hostile.rs), as moving the extension here would take locks
// every concurrent #[pg_test] needs.

#[pg_test]
fn a_role_without_usage_on_public_runs_its_queries() {
    tenant("public");
    Spi::run("RESET ROLE; REVOKE ALL ON SCHEMA public FROM PUBLIC; SET ROLE tenant").unwrap();
    assert_eq!(crate::testing::sqlstate("public.id_epoch()"), "42501", "the role may not use the schema");
    runs_without_usage();
}

#[pg_test]
fn a_role_that_may_not_execute_a_bound_gets_no_range_and_the_same_rows() {
    tenant("public");
    Spi::run("RESET ROLE; REVOKE EXECUTE ON FUNCTION id_lower_bound_clamped(timestamptz) FROM PUBLIC").unwrap();
    let want = tenants_recent_ids();
    let query = "SELECT array_agg(id ORDER BY id) FROM tenant.t WHERE id_ts(id) >= now() - interval '10 hours 30 minutes'";
    let between = "SELECT array_agg(id ORDER BY id) FROM tenant.t WHERE id_ts(id) BETWEEN now() - interval '10 hours 30 minutes' AND now()";
    // A cached plan made for a role that may, then run by one that may not.
    Spi::run(&format!(
        "SET plan_cache_mode = force_generic_plan; PREPARE cached AS {query}; SET enable_seqscan = off"
    ))
    .unwrap();
    assert!(explain("EXECUTE cached").contains("id_lower_bound_clamped"), "{}", explain("EXECUTE cached"));
    assert_eq!(outcome("EXECUTE cached"), want);
    Spi::run("SET ROLE tenant").unwrap();
    assert_eq!(crate::testing::sqlstate("id_lower_bound_clamped(now())"), "42501");
    assert_eq!(outcome(query), want);
    assert_eq!(outcome(between), want);
    assert_eq!(outcome("EXECUTE cached"), want);
    let plan = explain(query);
    assert!(!plan.contains("bound_clamped") && !plan.contains("Index Cond"), "no range:\n{plan}");
    let plan = explain("EXECUTE cached");
    assert!(!plan.contains("bound_clamped"), "planned again for this role:\n{plan}");
    let plan = explain(between);
    assert!(plan.contains("id_upper_bound_clamped") && !plan.contains("id_lower_bound_clamped"), "the upper bound only:\n{plan}");
    Spi::run("DEALLOCATE cached").unwrap();
}

/// Paging a time window in key order reads a few index pages: the lower
/// bound is a plain index condition that the ordered scan starts at.
#[pg_test]
fn an_ordered_time_window_starts_the_index_scan_at_the_window() {
    Spi::run(
        "CREATE TABLE tf (id bigint PRIMARY KEY);
         INSERT INTO tf SELECT id_from_parts(now() - g * interval '12960 ms', 1, 0) FROM generate_series(1, 200000) g;
         ANALYZE tf;
         CREATE FUNCTION pg_temp.analyzed(q text) RETURNS json LANGUAGE plpgsql AS $f$
         DECLARE j json;
         BEGIN EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || q INTO j; RETURN j->0->'Plan'; END $f$",
    )
    .unwrap();
    let query = "SELECT id FROM tf WHERE id_ts(id) >= now() - interval '20 days' ORDER BY id LIMIT 20";
    let plan = format!("pg_temp.analyzed($q${query}$q$)");
    let scan: String = one(&format!("SELECT p->'Plans'->0->>'Node Type' || ': ' || (p->'Plans'->0->>'Index Cond') FROM {plan} p"));
    assert!(scan.starts_with("Index") && scan.contains("(id >= id_lower_bound_clamped((now() - '20 days'::interval)))"), "{scan}");
    let buffers: i64 = one(&format!("SELECT (p->>'Shared Hit Blocks')::bigint + (p->>'Shared Read Blocks')::bigint FROM {plan} p"));
    assert!(buffers < 50, "{buffers} buffers");
    let want: String = one(
        "SELECT '(\"' || array_agg(id ORDER BY id)::text || '\")' FROM
           (SELECT id FROM tf WHERE id >= id_lower_bound(now() - interval '20 days') ORDER BY id LIMIT 20) s",
    );
    assert_eq!(outcome(&format!("SELECT array_agg(id ORDER BY id) FROM ({query}) s")), want);
}

/// Many comparisons of one key fold into one range per direction, so
/// planning them costs about what it costs without the rewrite.
#[pg_test]
fn many_filters_on_one_key_fold_into_one_range() {
    setup();
    // The IDs around T only: without the rewrite, each row is decoded thousands of times.
    Spi::run("CREATE TABLE few (id bigint PRIMARY KEY); INSERT INTO few SELECT id FROM ev WHERE n = 0; ANALYZE few").unwrap();
    let filters = (1..=2000).map(|i| format!("id_ts(id) >= '{T}'::timestamptz - interval '{i} ms'")).collect::<Vec<_>>();
    let uppers = (1..=2000).map(|i| format!("'{T}'::timestamptz + interval '{i} s' > id_ts(id)")).collect::<Vec<_>>();
    let query = format!("SELECT count(*) FROM few WHERE {} AND {} AND id_ts(id) <= '2040-01-01'", filters.join(" AND "), uppers.join(" AND "));
    let plan = explain(&query);
    let start = &plan[..plan.len().min(1000)];
    assert_eq!(plan.matches("id_lower_bound_clamped").count(), 1, "one lower bound: {start}");
    assert!(plan.contains("id_lower_bound_clamped(GREATEST(("), "GREATEST: {start}");
    assert_eq!(plan.matches("id_upper_bound_clamped").count(), 1, "one upper bound: {start}");
    assert!(plan.contains("id_upper_bound_clamped(LEAST(("), "LEAST: {start}");
    // T - 1 ms <= id_ts(id) < T + 1 s: the IDs of 5 milliseconds.
    assert_eq!(outcome(&query), "(25)");
    // Planning time, the least of five tries each way.
    let planning = |setting: &str| -> f64 {
        Spi::run(&format!("SET pg_idgen.rewrite_time_filters = {setting}")).unwrap();
        one::<f64>(&format!(
            "SELECT (j->0->>'Planning Time')::float8 FROM pg_temp.summary($q${query}$q$) j"
        ))
    };
    Spi::run(
        "CREATE FUNCTION pg_temp.summary(q text) RETURNS json LANGUAGE plpgsql AS $f$
         DECLARE j json;
         BEGIN EXECUTE 'EXPLAIN (SUMMARY, FORMAT JSON) ' || q INTO j; RETURN j; END $f$",
    )
    .unwrap();
    let (mut on, mut off) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        on = on.min(planning("on"));
        off = off.min(planning("off"));
    }
    assert!(on < 5.0 * off, "planning {on} ms with the rewrite, {off} ms without");
}


/// PostgreSQL 18's virtual generated columns are expressions in disguise.
#[cfg(feature = "pg18")]
#[pg_test]
fn a_virtual_generated_column_that_can_raise_is_left_alone() {
    review_tables();
    Spi::run(
        "CREATE TABLE vg (k int, t timestamptz GENERATED ALWAYS AS (to_timestamp(1772323200 / k)) VIRTUAL);
         INSERT INTO vg (k) VALUES (0), (1), (2); ANALYZE vg;",
    )
    .unwrap();
    let guarded = "SELECT count(*), count(e.id) FROM vg r LEFT JOIN ev e ON r.k <> 0 AND id_ts(e.id) >= r.t";
    for setting in SETTINGS {
        Spi::run(setting).unwrap();
        assert!(outcome(guarded).starts_with('('), "{setting}");
        assert!(!explain(guarded).contains("bound_clamped"), "{setting}:\n{}", explain(guarded));
    }
}

#[pg_test]
fn a_range_is_never_evaluated_where_its_comparison_is_guarded() {
    review_tables();
    let guarded = "SELECT count(*), count(e.id) FROM ref r LEFT JOIN ev e ON r.k <> 0
                     AND id_ts(e.id) >= r.t + (1/r.k) * interval '1 s' AND id_ts(e.id) < r.t + interval '1 min'";
    // A column plus an interval can overflow: this join is evaluated only on pairs, never on an empty ev0.
    let overflow = "SELECT count(*), count(e.id) FROM far r LEFT JOIN ev0 e ON id_ts(e.id) < r.t + interval '1 month'";
    for setting in SETTINGS {
        Spi::run(setting).unwrap();
        assert_eq!(outcome(guarded), "(9001,9000)", "{setting}");
        assert!(!explain(guarded).contains("bound_clamped"), "{setting}:\n{}", explain(guarded));
        assert_eq!(outcome(overflow), "(1,0)", "{setting}");
        assert!(!explain(overflow).contains("bound_clamped"), "{setting}:\n{}", explain(overflow));
        // The same join with an error-free time is rewritten, with the same result.
        let safe = "SELECT count(*), count(e.id) FROM ref r LEFT JOIN ev e ON r.k <> 0 AND id_ts(e.id) >= r.t";
        assert_eq!(outcome(safe), "(9001,9000)", "{setting}");
    }
}

/// `id_ts` raises 22003 for a negative key. The lower bound, an index
/// condition, skips such keys as an index skips any row whose other
/// conditions would raise: with the rewrite on, a query over them
/// raises as before or answers as if they were absent, never otherwise.
#[pg_test]
fn keys_whose_decoding_raises_are_skipped_or_raise() {
    review_tables();
    let times = [format!("'{T}'::timestamptz"), "'2026-06-30'::timestamptz".into(), "now() - interval '1 day'".into(), "'infinity'::timestamptz".into()];
    for setting in SETTINGS {
        Spi::run(setting).unwrap();
        for t in &times {
            for filter in FILTERS {
                let cond = filter.replace("{f}", "id_ts(id)").replace("{t}", &format!("({t})"));
                let (on, off) = outcomes(&format!("SELECT count(*) FROM neg WHERE {cond}"));
                assert_eq!(off, "SQLSTATE 22003", "{setting}: {cond}");
                let without = outcome(&format!("SELECT count(*) FROM ev WHERE {cond}"));
                assert!(on == off || on == without, "{setting}: {cond}: {on}, not {off} or {without}");
                assert_eq!(outcome(&format!("SELECT count(*) FROM neg WHERE id > 0 AND {cond}")), without, "{setting}: {cond}");
            }
        }
        // A NULL time makes the comparison NULL before anything is decoded, with or without the rewrite.
        assert_eq!(outcome("SELECT count(*) FROM neg WHERE id_ts(id) > NULL::timestamptz"), "(0)", "{setting}");
        // An upper bound keeps negative keys: they reach the comparison and raise.
        assert_eq!(outcome("SELECT count(*) FROM neg WHERE id_ts(id) < now() + interval '1 hour'"), "SQLSTATE 22003", "{setting}");
    }
    Spi::run("SET enable_seqscan = off").unwrap();
    let plan = explain("SELECT count(*) FROM neg WHERE id_ts(id) > now() + interval '1 hour'");
    assert!(plan.contains("Index Cond: (id >= id_lower_bound_clamped((now() + '01:00:00'::interval)))"), "{plan}");
    assert!(!plan.contains("BitmapOr") && !plan.contains("'0'::bigint"), "{plan}");
}

#[pg_test]
fn common_forms_are_still_rewritten() {
    setup();
    Spi::run(
        "CREATE TABLE ref (k int, t timestamptz);
         INSERT INTO ref SELECT k, now() - interval '30 s' FROM generate_series(0, 3) k;
         ANALYZE ref; SET enable_seqscan = off",
    )
    .unwrap();
    let lower = |t: &str| format!("Index Cond: (id >= id_lower_bound_clamped({t}))");
    let shifted = format!("SELECT * FROM ev WHERE id_ts(id) >= '{T}'::timestamptz + interval '5 hours'");
    for (query, cond) in [
        ("SELECT * FROM ev WHERE id_ts(id) >= now() - interval '1 day'", lower("(now() - '1 day'::interval)")),
        ("SELECT * FROM ev WHERE id_ts(id) >= CURRENT_TIMESTAMP - interval '1 day'", lower("(CURRENT_TIMESTAMP - '1 day'::interval)")),
        ("SELECT * FROM ev WHERE id_ts(id) > statement_timestamp() + interval '1 minute'", lower("(statement_timestamp() + '00:01:00'::interval)")),
        ("SELECT * FROM ev WHERE id_ts(id) <= transaction_timestamp() - interval '4999 years'", "Index Cond: (id <= id_upper_bound_clamped((transaction_timestamp() - '4999 years'::interval)))".into()),
        (shifted.as_str(), "Index Cond: (id >= id_lower_bound_clamped(('".into()),
        // A constant bound is folded to a constant key.
        ("SELECT * FROM ev WHERE id_ts(id) >= '2026-03-04 10:06:07+00'", "Index Cond: (id >= '".into()),
        ("SELECT * FROM ref r JOIN ev e ON id_ts(e.id) >= r.t", lower("r.t")),
        ("SELECT * FROM ref r JOIN (SELECT id AS key FROM ev) e ON id_ts(e.key) >= r.t", lower("r.t")),
        ("WITH w AS (SELECT t AS since FROM ref) SELECT * FROM w JOIN ev ON id_ts(ev.id) >= w.since", lower("ref.t")),
        ("SELECT * FROM uv WHERE uuid_v7_ts(id) >= now() - interval '1 hour'", "Index Cond: (id >= uuid_v7_lower_bound_clamped((now() - '01:00:00'::interval)))".into()),
    ] {
        let plan = explain(query);
        assert!(plan.contains(&cond), "{query}: wanted {cond} in\n{plan}");
    }
    Spi::run(
        "PREPARE recent(timestamptz) AS SELECT * FROM ev WHERE id_ts(id) >= $1;
         SET plan_cache_mode = force_generic_plan",
    )
    .unwrap();
    let plan = explain(&format!("EXECUTE recent('{T}')"));
    Spi::run("DEALLOCATE recent; RESET plan_cache_mode").unwrap();
    assert!(plan.contains(&lower("$1")), "{plan}");
}

#[pg_test]
fn forms_that_can_raise_are_left_alone() {
    review_tables();
    Spi::run("SET enable_seqscan = off").unwrap();
    for query in [
        "SELECT * FROM ref r JOIN ev e ON id_ts(e.id) >= r.t + (1/r.k) * interval '1 s'",
        "SELECT * FROM ref r JOIN ev e ON id_ts(e.id) >= r.t + interval '1 min'",
        "SELECT * FROM ref r JOIN ev e ON id_ts(e.id) >= r.t::date::timestamptz",
        "SELECT * FROM (SELECT t + (1/k) * interval '1 s' AS t FROM ref) r JOIN ev e ON id_ts(e.id) >= r.t",
        "WITH w AS (SELECT t + (1/k) * interval '1 s' AS t FROM ref) SELECT * FROM w JOIN ev e ON id_ts(e.id) >= w.t",
        "SELECT * FROM (VALUES (now()), ('2026-01-01'::date::timestamptz)) v(t) JOIN ev e ON id_ts(e.id) >= v.t",
        "SELECT * FROM ev WHERE id_ts(id) >= now() + interval '250000 years'",
        "SELECT * FROM ev WHERE id_ts(id) >= '294000-01-01+00'::timestamptz - interval '1 day'",
        "SELECT * FROM ev WHERE id_ts(id / 2) >= now()",
    ] {
        let plan = explain(query);
        assert!(!plan.contains("bound_clamped"), "{query}:\n{plan}");
    }
    // Overflowing even when planned (its estimate evaluates it): the same error either way.
    assert_eq!(outcome("SELECT count(*) FROM ev WHERE id_ts(id) >= now() + interval '300000 years'"), "SQLSTATE 22008");
}
