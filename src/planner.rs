//! Time filters on decoded IDs become primary-key ranges.
//!
//! `WHERE id_ts(id) >= $t` compares a `timestamptz`, so PostgreSQL's index
//! machinery never looks at `id`: a planner support function of `id_ts`
//! (SupportRequestIndexCondition) is consulted only when the indexed column
//! itself is an operand, or when the function is the whole clause. So a
//! planner hook adds, for every such comparison among the AND-ed conditions
//! of a WHERE or JOIN ... ON clause, the primary-key range it implies:
//!
//! ```text
//! id_ts(x) >= t, > t   adds   x >= id_lower_bound_clamped(t)
//! id_ts(x) <= t, < t   adds   x <= id_upper_bound_clamped(t)
//! id_ts(x) = t         adds   both
//! ```
//! and the same with `uuid_v7_ts` and the `uuid_v7_*_bound_clamped`
//! functions. Each added condition is implied by the original, which stays
//! as the exact recheck, so results never change. `t` must be free of
//! volatile functions and subqueries (constants, parameters, `now()`, other
//! columns). `pg_idgen.rewrite_time_filters = off` turns it off.

use std::ffi::{c_char, c_int, c_void};

use pgrx::pg_sys::{self, Node, NodeTag, Oid};
use pgrx::prelude::*;
use pgrx::PgList;

use crate::backend::BackendLocal;
use crate::{catalog, settings};

/// The catalog objects the rewrite uses, per database.
#[derive(Clone, Copy)]
struct Oids {
    tstz_lt: Oid,
    tstz_le: Oid,
    tstz_eq: Oid,
    tstz_ge: Oid,
    tstz_gt: Oid,
    id: Family,
    uuid: Family,
}

/// A decode function, its key type's `>=` and `<=`, and its clamped bounds.
#[derive(Clone, Copy)]
struct Family {
    decode: Oid,
    key_type: Oid,
    ge: Oid,
    le: Oid,
    lower: Oid,
    upper: Oid,
}

#[derive(Clone, Copy)]
enum Cache {
    Unknown,
    /// The extension is not installed in this database.
    Absent,
    Present(Oids),
}

static CACHE: BackendLocal<Cache> = BackendLocal::new(Cache::Unknown);
static LOOKING_UP: BackendLocal<bool> = BackendLocal::new(false);

static mut PREV_PLANNER: pg_sys::planner_hook_type = None;
static mut CALLBACK_REGISTERED: bool = false;

/// Installs the planner hook (while the library is preloaded).
pub fn init() {
    // SAFETY: chains the previous hook, in the postmaster before any backend starts.
    unsafe {
        PREV_PLANNER = pg_sys::planner_hook;
        pg_sys::planner_hook = Some(planner);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    if settings::rewrite_time_filters() {
        if let Some(oids) = oids() {
            // SAFETY: `parse` is the planner's own copy of the query, which it may scribble on.
            unsafe { walker(parse.cast(), (&oids as *const Oids).cast_mut().cast()) };
        }
    }
    // SAFETY: hands the query on unchanged in form to the next planner.
    unsafe {
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => pg_sys::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

unsafe extern "C-unwind" fn forget(_arg: pg_sys::Datum, _cacheid: c_int, _hash: u32) {
    CACHE.set(Cache::Unknown);
}

/// The objects of this database, looked up once (again after any change to
/// pg_proc, such as CREATE or DROP EXTENSION).
fn oids() -> Option<Oids> {
    if LOOKING_UP.get() {
        return None; // the lookup's own query
    }
    match CACHE.get() {
        Cache::Present(oids) => return Some(oids),
        Cache::Absent => return None,
        Cache::Unknown => {}
    }
    LOOKING_UP.set(true);
    let found = PgTryBuilder::new(look_up).finally(|| LOOKING_UP.set(false)).execute();
    // SAFETY: registers a callback that only resets this backend's cache; once per process.
    unsafe {
        if !CALLBACK_REGISTERED {
            CALLBACK_REGISTERED = true;
            pg_sys::CacheRegisterSyscacheCallback(pg_sys::SysCacheIdentifier::PROCOID as i32, Some(forget), 0.into());
        }
    }
    // While CREATE EXTENSION runs, some objects exist and some do not yet: look again next time.
    if let Some(found) = found {
        CACHE.set(found);
    }
    match found {
        Some(Cache::Present(oids)) => Some(oids),
        _ => None,
    }
}

/// Present, Absent (no extension here), or None while the extension is incomplete.
fn look_up() -> Option<Cache> {
    let sql = "
        WITH e AS (SELECT quote_ident(extnamespace::regnamespace::text) || '.' AS s FROM pg_extension WHERE extname = 'pg_idgen')
        SELECT ARRAY[
            'pg_catalog.<(timestamptz,timestamptz)'::regoperator::oid, 'pg_catalog.<=(timestamptz,timestamptz)'::regoperator::oid,
            'pg_catalog.=(timestamptz,timestamptz)'::regoperator::oid, 'pg_catalog.>=(timestamptz,timestamptz)'::regoperator::oid,
            'pg_catalog.>(timestamptz,timestamptz)'::regoperator::oid,
            to_regprocedure(s || 'id_ts(bigint)')::oid, 'pg_catalog.int8'::regtype::oid,
            'pg_catalog.>=(bigint,bigint)'::regoperator::oid, 'pg_catalog.<=(bigint,bigint)'::regoperator::oid,
            to_regprocedure(s || 'id_lower_bound_clamped(timestamptz)')::oid,
            to_regprocedure(s || 'id_upper_bound_clamped(timestamptz)')::oid,
            to_regprocedure(s || 'uuid_v7_ts(uuid)')::oid, 'pg_catalog.uuid'::regtype::oid,
            'pg_catalog.>=(uuid,uuid)'::regoperator::oid, 'pg_catalog.<=(uuid,uuid)'::regoperator::oid,
            to_regprocedure(s || 'uuid_v7_lower_bound_clamped(timestamptz)')::oid,
            to_regprocedure(s || 'uuid_v7_upper_bound_clamped(timestamptz)')::oid]
        FROM e";
    let Some(found) = catalog::query_one::<Vec<Option<Oid>>>(sql, &[]) else { return Some(Cache::Absent) };
    let o: Vec<Oid> = found.into_iter().collect::<Option<_>>()?;
    let family = |i: usize| Family { decode: o[i], key_type: o[i + 1], ge: o[i + 2], le: o[i + 3], lower: o[i + 4], upper: o[i + 5] };
    Some(Cache::Present(Oids {
        tstz_lt: o[0],
        tstz_le: o[1],
        tstz_eq: o[2],
        tstz_ge: o[3],
        tstz_gt: o[4],
        id: family(5),
        uuid: family(11),
    }))
}

/// Visits every query level (subqueries, CTEs, sublinks) and its WHERE and ON clauses.
unsafe extern "C-unwind" fn walker(node: *mut Node, ctx: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: `ctx` is the `Oids` passed by `planner`; `node` a valid parse node.
    unsafe {
        let oids = &*(ctx as *const Oids);
        match (*node).type_ {
            NodeTag::T_Query => return pg_sys::query_tree_walker(node.cast(), Some(walker), ctx, 0),
            NodeTag::T_FromExpr => {
                let f = node as *mut pg_sys::FromExpr;
                (*f).quals = with_ranges((*f).quals, oids);
            }
            NodeTag::T_JoinExpr => {
                let j = node as *mut pg_sys::JoinExpr;
                (*j).quals = with_ranges((*j).quals, oids);
            }
            _ => {}
        }
        pg_sys::expression_tree_walker(node, Some(walker), ctx)
    }
}

/// The clause with the key ranges its time comparisons imply AND-ed on.
unsafe fn with_ranges(quals: *mut Node, oids: &Oids) -> *mut Node {
    if quals.is_null() {
        return quals;
    }
    // SAFETY: `quals` is a valid expression; lists and nodes are built in the
    // current memory context, as the planner's own rewriting does.
    unsafe {
        let is_and = (*quals).type_ == NodeTag::T_BoolExpr
            && (*(quals as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR;
        let conjuncts: Vec<*mut Node> = if is_and {
            PgList::<Node>::from_pg((*(quals as *mut pg_sys::BoolExpr)).args).iter_ptr().collect()
        } else {
            vec![quals]
        };
        let added: Vec<*mut Node> = conjuncts.iter().flat_map(|&c| implied_ranges(c, oids)).collect();
        if added.is_empty() {
            return quals;
        }
        let mut args = if is_and { (*(quals as *mut pg_sys::BoolExpr)).args } else { pg_sys::lappend(std::ptr::null_mut(), quals.cast()) };
        for a in added {
            args = pg_sys::lappend(args, a.cast());
        }
        if is_and {
            (*(quals as *mut pg_sys::BoolExpr)).args = args;
            quals
        } else {
            pg_sys::makeBoolExpr(pg_sys::BoolExprType::AND_EXPR, args, -1).cast()
        }
    }
}

/// For `decode(x) OP t` (either way round), the conditions on `x` it implies.
unsafe fn implied_ranges(clause: *mut Node, oids: &Oids) -> Vec<*mut Node> {
    // SAFETY: reads nodes of a valid expression tree and builds new ones.
    unsafe {
        if (*clause).type_ != NodeTag::T_OpExpr {
            return vec![];
        }
        let op = &*(clause as *mut pg_sys::OpExpr);
        let args = PgList::<Node>::from_pg(op.args);
        let (2, Some(left), Some(right)) = (args.len(), args.get_ptr(0), args.get_ptr(1)) else {
            return vec![];
        };
        // (lower bound wanted, upper bound wanted) for `decode(x) OP t`.
        let wanted = |commuted: bool| -> Option<(bool, bool)> {
            let (lt, gt) = if commuted { (oids.tstz_gt, oids.tstz_lt) } else { (oids.tstz_lt, oids.tstz_gt) };
            let (le, ge) = if commuted { (oids.tstz_ge, oids.tstz_le) } else { (oids.tstz_le, oids.tstz_ge) };
            match op.opno {
                o if o == lt || o == le => Some((false, true)),
                o if o == gt || o == ge => Some((true, false)),
                o if o == oids.tstz_eq => Some((true, true)),
                _ => None,
            }
        };
        for (decoded, t, commuted) in [(left, right, false), (right, left, true)] {
            let Some((lower, upper)) = wanted(commuted) else { continue };
            let Some((family, key)) = decoded_key(decoded, oids) else { continue };
            if pg_sys::contain_volatile_functions(t) || has_sublink(t) {
                continue;
            }
            let bound = |op: Oid, func: Oid| -> *mut Node {
                let arg = pg_sys::lappend(std::ptr::null_mut(), pg_sys::copyObjectImpl(t.cast()));
                let f = pg_sys::makeFuncExpr(func, family.key_type, arg, pg_sys::InvalidOid, pg_sys::InvalidOid, pg_sys::CoercionForm::COERCE_EXPLICIT_CALL);
                pg_sys::make_opclause(op, pg_sys::BOOLOID, false, pg_sys::copyObjectImpl(key.cast()).cast(), f.cast(), pg_sys::InvalidOid, pg_sys::InvalidOid).cast()
            };
            let mut out = vec![];
            if lower {
                out.push(bound(family.ge, family.lower));
            }
            if upper {
                out.push(bound(family.le, family.upper));
            }
            return out;
        }
        vec![]
    }
}

/// `id_ts(x)` or `uuid_v7_ts(x)`: its family and `x`.
unsafe fn decoded_key(node: *mut Node, oids: &Oids) -> Option<(Family, *mut Node)> {
    // SAFETY: reads a valid expression node.
    unsafe {
        if (*node).type_ != NodeTag::T_FuncExpr {
            return None;
        }
        let f = &*(node as *mut pg_sys::FuncExpr);
        let family = [oids.id, oids.uuid].into_iter().find(|fam| fam.decode == f.funcid)?;
        let args = PgList::<Node>::from_pg(f.args);
        let (1, Some(arg)) = (args.len(), args.get_ptr(0)) else { return None };
        Some((family, arg))
    }
}

unsafe extern "C-unwind" fn find_sublink(node: *mut Node, ctx: *mut c_void) -> bool {
    // SAFETY: a valid expression node or NULL.
    unsafe { !node.is_null() && ((*node).type_ == NodeTag::T_SubLink || pg_sys::expression_tree_walker(node, Some(find_sublink), ctx)) }
}

unsafe fn has_sublink(node: *mut Node) -> bool {
    // SAFETY: walks a valid expression tree without changing it.
    unsafe { find_sublink(node, std::ptr::null_mut()) }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
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
    fn volatile_times_are_left_alone() {
        setup();
        let plan = explain("SELECT * FROM ev WHERE id_ts(id) >= clock_timestamp() - random() * interval '1 day'");
        assert!(!plan.contains("Index Cond"), "{plan}");
    }
}
