//! Helpers for the `#[pg_test]` functions.

use pgrx::prelude::*;

/// The single non-NULL value of a query.
pub fn one<T: FromDatum + IntoDatum>(sql: &str) -> T {
    Spi::get_one::<T>(sql).unwrap_or_else(|e| panic!("{sql}: {e}")).unwrap_or_else(|| panic!("{sql}: NULL"))
}

/// The SQLSTATE that evaluating the SQL expression `expr` fails with, or "ok".
pub fn sqlstate(expr: &str) -> String {
    let error = error_of(expr);
    error.split(':').next().unwrap_or_default().to_string()
}

/// `SQLSTATE: message / detail` of the error that evaluating `expr` raises, or "ok".
pub fn error_of(expr: &str) -> String {
    if one::<bool>("SELECT to_regprocedure('pg_temp.error_of(text)') IS NULL") {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.error_of(q text) RETURNS text LANGUAGE plpgsql AS $f$
             DECLARE m text; d text;
             BEGIN EXECUTE 'SELECT ' || q; RETURN 'ok';
             EXCEPTION WHEN OTHERS THEN
                 GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL;
                 RETURN SQLSTATE || ': ' || m || ' / ' || coalesce(d, ''); END $f$",
        )
        .unwrap();
    }
    one(&format!("SELECT pg_temp.error_of($q${expr}$q$)"))
}

/// `SQLSTATE: message / detail / hint` of the error that running statement
/// `sql` raises, or "ok".
pub fn statement_error(sql: &str) -> String {
    if one::<bool>("SELECT to_regprocedure('pg_temp.statement_error(text)') IS NULL") {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.statement_error(q text) RETURNS text LANGUAGE plpgsql AS $f$
             DECLARE m text; d text; h text;
             BEGIN EXECUTE q; RETURN 'ok';
             EXCEPTION WHEN OTHERS THEN
                 GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
                 RETURN SQLSTATE || ': ' || m || ' / ' || coalesce(d, '') || ' / ' || coalesce(h, ''); END $f$",
        )
        .unwrap();
    }
    one(&format!("SELECT pg_temp.statement_error($q${sql}$q$)"))
}

/// Sets the public-ID key as the configuration file would (the only place
/// it is taken from), for this transaction.
pub fn key_from_file(key: &str) {
    let value = std::ffi::CString::new(key).unwrap();
    // SAFETY: PostgreSQL's own call, with a setting pg_idgen defines.
    unsafe {
        pg_sys::set_config_option(
            c"pg_idgen.public_id_key".as_ptr(),
            value.as_ptr(),
            pg_sys::GucContext::PGC_SIGHUP,
            pg_sys::GucSource::PGC_S_FILE,
            pg_sys::GucAction::GUC_ACTION_SET,
            true,
            pgrx::PgLogLevel::ERROR as i32,
            false,
        );
    }
}

/// The text of `EXPLAIN (COSTS OFF) sql`, one line per plan line.
pub fn explain(sql: &str) -> String {
    Spi::connect(|c| {
        c.select(&format!("EXPLAIN (COSTS OFF) {sql}"), None, &[])
            .unwrap()
            .map(|row| row.get::<String>(1).unwrap().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    })
}

#[pg_schema]
mod tests {
    use super::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn every_object_of_the_extension_has_a_description() {
        let missing: Option<String> = Spi::get_one(
            "SELECT string_agg(pg_describe_object(d.classid, d.objid, 0), ', ')
               FROM pg_depend d
              WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
                AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idgen')
                AND pg_describe_object(d.classid, d.objid, 0) !~ '^(schema tests|function tests[.])' -- these tests
                -- the row types of our tables and views (members too on PostgreSQL 18), described by them
                AND NOT EXISTS (SELECT FROM pg_type t WHERE d.classid = 'pg_type'::regclass AND t.oid = d.objid
                                  AND (t.typrelid <> 0 OR t.typelem IN (SELECT oid FROM pg_type WHERE typrelid <> 0)))
                AND NOT EXISTS (SELECT FROM pg_description c
                                 WHERE c.objoid = d.objid AND c.classoid = d.classid AND c.objsubid = 0)",
        )
        .unwrap();
        assert_eq!(missing, None, "objects without a COMMENT");
    }

    /// Values of each argument type: NULL, extremes and junk.
    fn values(ty: &str) -> &'static [&'static str] {
        match ty {
            "bigint" => &["NULL", "-9223372036854775808", "9223372036854775807", "0", "-1", "1026"],
            "integer" => &["NULL", "-2147483648", "2147483647", "0", "-1", "8191", "8192", "1023"],
            "timestamp with time zone" => &[
                "NULL",
                "'infinity'",
                "'-infinity'",
                "'4713-01-01 00:00:00+00 BC'",
                "'294276-12-31 23:59:59.999999+00'",
                "'1970-01-01 00:00:00+00'",
                "'2026-01-01 00:00:00+00'",
            ],
            "text" => &[
                "NULL",
                "''",
                "repeat('Z', 100000)",
                "'é€😀'",
                "E'\\x01\\x02\\x7f'",
                "'00000000000'",
                "'zzzzzzzzzzzzz'",
                "'\\000'",
            ],
            "boolean" => &["NULL", "true", "false"],
            "interval" => &[
                "NULL",
                "'1 day'",
                "'1 month'",
                "'0'",
                "'-1 day'",
                "'1 microsecond'",
                "'2147483647 days 2562047788:00:54.775807'",
                "'-2147483648 days'",
                "'-178000000 years'",
                "'178000000 years'",
            ],
            "uuid" => &[
                "NULL",
                "'00000000-0000-0000-0000-000000000000'",
                "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
                "'0179e584-b4eb-7000-8000-000000000000'",
                "gen_random_uuid()",
            ],
            "text[]" => &["NULL", "'{}'", "ARRAY['a', NULL]", "ARRAY[repeat('Z', 100)]", "ARRAY['']"],
            "integer[]" => &["NULL", "'{}'", "'{8192}'", "'{-1,NULL}'", "'{1,2}'"],
            other => panic!("no test values for argument type {other}"),
        }
    }

    /// Every SQLSTATE a function of ours documents for bad input.
    const DOCUMENTED: &[&str] =
        &["ok", "22003", "22008", "22P02", "22023", "55000", "23505", "3F000", "42704", "42P06", "42601", "42602", "42622", "25006"];

    /// Every function of the extension, fed every combination of NULLs,
    /// extremes and malformed text: never an internal error (XX000), never
    /// a crash, always a documented SQLSTATE. Functions that change shard
    /// ownership get their own short list (they change shared memory).
    #[pg_test]
    fn every_function_takes_extremes_and_junk_without_internal_errors() {
        let functions: Vec<(String, Vec<String>)> = Spi::connect(|c| {
            c.select(
                "SELECT p.oid::regproc::text, coalesce(array_agg(format_type(a.t, NULL) ORDER BY a.n) FILTER (WHERE a.t IS NOT NULL), '{}')
                   FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                   LEFT JOIN LATERAL unnest(p.proargtypes) WITH ORDINALITY a(t, n) ON true
                  WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'
                    AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idgen')
                    AND p.prorettype NOT IN ('trigger'::regtype, 'event_trigger'::regtype)
                    AND p.proname NOT IN ('shard_claim', 'shard_release', 'shard_adopt')
                    AND p.pronamespace <> 'tests'::regnamespace
                  GROUP BY p.oid",
                None,
                &[],
            )
            .unwrap()
            .map(|r| (r.get::<String>(1).unwrap().unwrap(), r.get::<Vec<String>>(2).unwrap().unwrap()))
            .collect()
        });
        assert!(functions.len() >= 25, "{functions:?}");
        let mut calls = 0;
        for (name, args) in &functions {
            let mut combos: Vec<Vec<&str>> = vec![vec![]];
            for ty in args {
                combos = combos.iter().flat_map(|c| values(ty).iter().map(move |v| [c.clone(), vec![*v]].concat())).collect();
            }
            for combo in combos {
                let call = format!("{name}({})", combo.join(", "));
                let state = sqlstate(&call);
                assert!(DOCUMENTED.contains(&state.as_str()), "{call}: SQLSTATE {state}");
                calls += 1;
            }
        }
        for call in [
            "shard_claim(-1, 5)", "shard_claim(0, 8192)", "shard_claim(NULL, 1)", "shard_claim(2147483647, -2147483648)",
            "shard_release(-1)", "shard_release(8192)", "shard_release(NULL)", "shard_release(4000)",
            "shard_adopt(1, -9223372036854775808)", "shard_adopt(1, 9223372036854775807)", "shard_adopt(8192, 0)", "shard_adopt(NULL, 1)",
        ] {
            let state = sqlstate(call);
            assert!(DOCUMENTED.contains(&state.as_str()), "{call}: SQLSTATE {state}");
            calls += 1;
        }
        assert!(calls > 500, "{calls} calls");
        assert_eq!(one::<i32>("SELECT 1"), 1, "the backend is alive");
    }
}
