//! Time filters on decoded IDs become primary-key ranges.
//!
//! `WHERE id_ts(id) >= $t` compares a `timestamptz`, so PostgreSQL's index
//! machinery never looks at `id`: a planner support function of `id_ts`
//! (SupportRequestIndexCondition) is consulted only when the indexed column
//! itself is an operand, or when the function is the whole clause. So a
//! planner hook adds, for the comparisons among the AND-ed conditions of a
//! WHERE or JOIN ... ON clause, the key range they imply:
//!
//! ```text
//! id_ts(x) >= t, > t          adds   x >= id_lower_bound_clamped(t)
//! id_ts(x) <= t, < t          adds   x <= id_upper_bound_clamped(t)
//! id_ts(x) = t                adds   both
//! uuid_v7_ts(x) >= t, > t     adds   x >= uuid_v7_lower_bound_clamped(t)
//! uuid_v7_ts(x) <= t, < t     adds   x <= uuid_v7_upper_bound_clamped(t)
//! uuid_v7_ts(x) = t           adds   both
//! ```
//! (either way round; `BETWEEN` is two of these). On a btree key the range
//! is an index condition, so `ORDER BY x LIMIT n` over a time window starts
//! the ordered scan at the window.
//!
//! Many comparisons of one key fold into one range per direction: constant
//! times into the tightest of them, other times that read no column into
//! their `GREATEST` (lower) or `LEAST` (upper) together with it; a time
//! that reads a column gets a range of its own (one over several columns
//! would tie their relations into one join clause). Past 8 keys per clause,
//! or 8 columns per key and direction, a comparison gets no range. So the
//! work is linear in the number of clauses, and every loop over clauses
//! checks for interrupts.
//!
//! Only when both `x` and `t` are *error-free*: expressions whose evaluation
//! cannot raise, here or after the planner's own substitutions:
//! - a constant or a parameter (`$1`), possibly relabeled (a binary coercion);
//! - a column of a table; a column of a subquery or view (including a
//!   `VALUES` list), of a join alias or of a non-recursive `WITH` query whose
//!   expression (each row's, for `VALUES`) is itself error-free, because the
//!   planner may pull the subquery up and put that expression in its place;
//! - `now()`, `transaction_timestamp()`, `statement_timestamp()`,
//!   `CURRENT_TIMESTAMP`;
//! - one of those, or a constant between about the years 1000 and 100000, plus or
//!   minus a constant interval of at most 5,000 years (a month counted as 31
//!   days): the result stays far inside `timestamptz`'s range (4714 BC to
//!   294276 AD), so `+` cannot overflow (this assumes a clock set between
//!   the years 1000 and 100000).
//!
//! Anything else is left alone: another operator or function call (`1/k`,
//! a cast that can fail), a column plus an interval (which overflows near
//! 294276 AD), volatile functions, subqueries. Error-free expressions are
//! stable at worst, so a copy gives the value of the original.
//!
//! Rights. The hook finds its own functions by catalog lookups in the
//! extension's schema, without the caller's `search_path` and without the
//! caller's rights on that schema, so it never raises for a role without
//! USAGE on it. It adds a range only when the current user may EXECUTE the
//! bound function and the operator's function (asked without raising);
//! otherwise the query stays as written. (Executing a function the planner
//! added checks EXECUTE only, not USAGE on its schema.) A plan with an
//! added range is planned again when a cached plan runs as another role.
//!
//! Why the answer cannot change for an error-free input. The original
//! comparisons stay, as the exact recheck, so the added range only matters
//! for the rows it rejects and for where it is evaluated:
//! - It never raises: `x` and `t` are error-free, the clamped bound
//!   functions are total (every non-NULL time maps to a key; NULL gives
//!   NULL), `GREATEST`/`LEAST` of timestamps and `>=`, `<=` of `bigint` and
//!   `uuid` do not raise. So evaluating it anywhere, on any row or once at
//!   the start of an index scan, as a join's inner index condition before
//!   the join filter that guards the original, adds no error.
//! - It rejects only rows on which one of the AND-ed comparisons is false or
//!   NULL: a key above every lower bound is above their greatest.
//!
//! What it does not promise: PostgreSQL does not define the evaluation order
//! of the conditions of a query, and the added range can change the plan
//! (an index scan instead of a sequential one, another join order). A
//! condition that raises on some rows may then be reached or skipped
//! differently, as after creating any index: an index condition skips rows
//! whose other conditions would raise. That includes the comparison itself:
//! `id_ts(x)` raises (22003) for `x < 0`, and the lower bound rejects such
//! keys, so a query that raises with the rewrite off may answer with it on
//! (as if the negative keys were absent); the upper bound keeps them (its
//! bound is at least -1). `uuid_v7_ts` never raises (NULL for other versions).
//!
//! `pg_idgen.rewrite_time_filters = off` turns the rewrite off.

use std::cell::Cell;
use std::ffi::{c_char, c_int};
use std::ptr::null;

use pgrx::pg_sys;

use crate::settings;

mod error_free;
mod functions;
pub mod ops;
mod ranges;
mod raw;
mod state;
mod walk;

use functions::{look_up, Found};
use state::Walk;
use walk::walk_query;

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;

/// Installs the planner hook (while the library is preloaded).
pub fn init() {
    // SAFETY: chains the previous hook, in the postmaster before any backend starts.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
    }
}

/// The hook. Not `#[pg_guard]`, and it holds nothing with a destructor: the
/// next planner is called from here so that its errors reach PostgreSQL
/// untouched (see `raw`). Nothing in it can panic; the fallible Rust parts,
/// the catalog lookup and the EXECUTE check, are `#[pg_guard]` functions of
/// their own.
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: `parse` is the planner's own copy of the query, which it may
    // scribble on; the walk only adds implied conditions to it. The result
    // is the next planner's fresh PlannedStmt.
    unsafe {
        let mut added = false;
        if settings::rewrite_time_filters() {
            let mut found = Found { present: false, oids: std::mem::zeroed() };
            look_up(&mut found);
            if found.present {
                let walk = Walk { oids: found.oids, rights: Default::default(), added: Cell::new(false) };
                walk_query(parse, null(), &walk);
                added = walk.added.get();
            }
        }
        let result = match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => raw::standard_planner(parse, query_string, cursor_options, bound_params),
        };
        if added && !result.is_null() {
            // A range is added only for a role that may execute it: a cached
            // plan is planned again for another role (as for row security).
            (*result).dependsOnRole = true;
        }
        result
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pgrx::pg_schema]
mod tests {
    // The tests are in tests.rs: `#[pg_schema]` takes only an inline module,
    // and its name is the schema its #[pg_test] functions are created in.
    include!("tests.rs");
}
