//! Helpers for the `#[pg_test]` functions.

use pgrx::prelude::*;

/// The single non-NULL value of a query.
pub fn one<T: FromDatum + IntoDatum>(sql: &str) -> T {
    Spi::get_one::<T>(sql).unwrap_or_else(|e| panic!("{sql}: {e}")).unwrap_or_else(|| panic!("{sql}: NULL"))
}

/// The SQLSTATE that evaluating the SQL expression `expr` fails with, or "ok".
pub fn sqlstate(expr: &str) -> String {
    if one::<bool>("SELECT to_regprocedure('pg_temp.sqlstate_of(text)') IS NULL") {
        create_sqlstate_of();
    }
    one(&format!("SELECT pg_temp.sqlstate_of($q${expr}$q$)"))
}

fn create_sqlstate_of() {
    Spi::run(
        "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS $f$
         BEGIN EXECUTE 'SELECT ' || q; RETURN 'ok';
         EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $f$",
    )
    .unwrap();
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
