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
use std::ptr::null_mut;

use pgrx::pg_sys::{self, Node, NodeTag, Oid};
use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::{catalog, settings};

/// PostgreSQL's functions, called directly rather than through pgrx's
/// wrappers: pgrx turns an error raised inside a call into a Rust panic and
/// raises a copy of it later, without its CONTEXT, position or field names.
/// Called this way, an error (the next planner's, or stack depth, cancel or
/// out of memory in the walk below) leaves by `longjmp` straight to
/// PostgreSQL's own handler, exactly as from core code. That is sound
/// because every Rust frame it passes over is a plain old frame: the hook,
/// the walker and their helpers hold no value with a destructor.
mod raw {
    use super::*;

    pub type Walker = Option<unsafe extern "C-unwind" fn(*mut Node, *mut c_void) -> bool>;

    unsafe extern "C-unwind" {
        pub fn standard_planner(
            parse: *mut pg_sys::Query,
            query_string: *const c_char,
            cursor_options: c_int,
            bound_params: pg_sys::ParamListInfo,
        ) -> *mut pg_sys::PlannedStmt;
        pub fn check_stack_depth();
        #[cfg_attr(not(feature = "pg15"), link_name = "expression_tree_walker_impl")]
        pub fn expression_tree_walker(node: *mut Node, walker: Walker, context: *mut c_void) -> bool;
        #[cfg_attr(not(feature = "pg15"), link_name = "query_tree_walker_impl")]
        pub fn query_tree_walker(query: *mut pg_sys::Query, walker: Walker, context: *mut c_void, flags: c_int) -> bool;
        pub fn contain_volatile_functions(clause: *mut Node) -> bool;
        pub fn copyObjectImpl(from: *const c_void) -> *mut c_void;
        pub fn lappend(list: *mut pg_sys::List, datum: *mut c_void) -> *mut pg_sys::List;
        pub fn makeFuncExpr(
            funcid: Oid,
            rettype: Oid,
            args: *mut pg_sys::List,
            funccollid: Oid,
            inputcollid: Oid,
            fformat: pg_sys::CoercionForm::Type,
        ) -> *mut pg_sys::FuncExpr;
        pub fn make_opclause(
            opno: Oid,
            opresulttype: Oid,
            opretset: bool,
            leftop: *mut pg_sys::Expr,
            rightop: *mut pg_sys::Expr,
            opcollid: Oid,
            inputcollid: Oid,
        ) -> *mut pg_sys::Expr;
        pub fn makeBoolExpr(boolop: pg_sys::BoolExprType::Type, args: *mut pg_sys::List, location: c_int) -> *mut pg_sys::Expr;
    }
}

/// Built-in operators (fixed OIDs of `pg_operator.dat`, checked by a test).
pub mod ops {
    use pgrx::pg_sys::Oid;
    pub const TSTZ_EQ: Oid = Oid::from_u32(1320);
    pub const TSTZ_LT: Oid = Oid::from_u32(1322);
    pub const TSTZ_LE: Oid = Oid::from_u32(1323);
    pub const TSTZ_GT: Oid = Oid::from_u32(1324);
    pub const TSTZ_GE: Oid = Oid::from_u32(1325);
    pub const INT8_LE: Oid = Oid::from_u32(414);
    pub const INT8_GE: Oid = Oid::from_u32(415);
    pub const UUID_LE: Oid = Oid::from_u32(2976);
    pub const UUID_GE: Oid = Oid::from_u32(2977);
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

/// What the walk needs: our functions in this database, if installed.
#[derive(Clone, Copy)]
struct Oids {
    id: Family,
    uuid: Family,
}

/// The backend's lookup, valid for one catalog generation.
#[derive(Clone, Copy)]
enum Cache {
    Unknown,
    /// The extension is not installed in this database (or not completely).
    Absent(u64),
    Present(u64, Oids),
}

static CACHE: BackendLocal<Cache> = BackendLocal::new(Cache::Unknown);

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
/// untouched (see `raw`). Nothing in it can panic; the one fallible Rust
/// part, the catalog lookup, is a `#[pg_guard]` function of its own.
unsafe extern "C-unwind" fn planner(
    parse: *mut pg_sys::Query,
    query_string: *const c_char,
    cursor_options: c_int,
    bound_params: pg_sys::ParamListInfo,
) -> *mut pg_sys::PlannedStmt {
    // SAFETY: `parse` is the planner's own copy of the query, which it may
    // scribble on; the walk only adds implied conditions to it.
    unsafe {
        if settings::rewrite_time_filters() {
            let mut found = Found { present: false, oids: std::mem::zeroed() };
            look_up(&mut found);
            if found.present {
                walk_query(parse, &mut found.oids);
            }
        }
        match PREV_PLANNER {
            Some(prev) => prev(parse, query_string, cursor_options, bound_params),
            None => raw::standard_planner(parse, query_string, cursor_options, bound_params),
        }
    }
}

#[repr(C)]
struct Found {
    present: bool,
    oids: Oids,
}

/// Our functions in this database, looked up once per catalog generation
/// (any change to pg_proc or to a relation starts a new one) by catalog
/// APIs: no SQL, no `search_path`.
#[pg_guard]
unsafe extern "C-unwind" fn look_up(out: *mut Found) {
    let generation = catalog::generation();
    let cache = match CACHE.get() {
        Cache::Absent(g) | Cache::Present(g, _) if g == generation => CACHE.get(),
        _ => {
            let c = match our_functions() {
                Some(oids) => Cache::Present(generation, oids),
                None => Cache::Absent(generation),
            };
            CACHE.set(c);
            c
        }
    };
    if let Cache::Present(_, oids) = cache {
        // SAFETY: `out` points at the caller's `Found`.
        unsafe { *out = Found { present: true, oids } };
    }
}

fn our_functions() -> Option<Oids> {
    let nsp = catalog::extension_schema()?;
    let tstz = [pg_sys::TIMESTAMPTZOID];
    let f = |name: &std::ffi::CStr, args: &[Oid]| catalog::function(nsp, name, args);
    Some(Oids {
        id: Family {
            decode: f(c"id_ts", &[pg_sys::INT8OID])?,
            key_type: pg_sys::INT8OID,
            ge: ops::INT8_GE,
            le: ops::INT8_LE,
            lower: f(c"id_lower_bound_clamped", &tstz)?,
            upper: f(c"id_upper_bound_clamped", &tstz)?,
        },
        uuid: Family {
            decode: f(c"uuid_v7_ts", &[pg_sys::UUIDOID])?,
            key_type: pg_sys::UUIDOID,
            ge: ops::UUID_GE,
            le: ops::UUID_LE,
            lower: f(c"uuid_v7_lower_bound_clamped", &tstz)?,
            upper: f(c"uuid_v7_upper_bound_clamped", &tstz)?,
        },
    })
}

/// The `i`th pointer of a PostgreSQL list.
unsafe fn nth(list: *mut pg_sys::List, i: usize) -> *mut Node {
    // SAFETY: the caller checked `i` against the list's length.
    unsafe { (*(*list).elements.add(i)).ptr_value.cast() }
}

unsafe fn length(list: *mut pg_sys::List) -> usize {
    // SAFETY: NIL is the empty list.
    if list.is_null() { 0 } else { unsafe { (*list).length as usize } }
}

/// Visits a query level, its subqueries and CTEs, and its WHERE and ON
/// clauses. Only those can hold what the rewrite changes, so a query without
/// sublinks (most of them) costs a few pointer checks: its expressions are
/// not walked. A query with sublinks gets the full walk below.
unsafe fn walk_query(q: *mut pg_sys::Query, oids: &mut Oids) {
    // SAFETY: `q` is a valid Query; lists are PostgreSQL lists of the node types named.
    unsafe {
        raw::check_stack_depth();
        if (*q).hasSubLinks {
            raw::query_tree_walker(q, Some(walker), (oids as *mut Oids).cast(), 0);
            return;
        }
        for i in 0..length((*q).cteList) {
            let cte = nth((*q).cteList, i) as *mut pg_sys::CommonTableExpr;
            let sub = (*cte).ctequery;
            if !sub.is_null() && (*sub).type_ == NodeTag::T_Query {
                walk_query(sub.cast(), oids);
            }
        }
        for i in 0..length((*q).rtable) {
            let rte = nth((*q).rtable, i) as *mut pg_sys::RangeTblEntry;
            if (*rte).rtekind == pg_sys::RTEKind::RTE_SUBQUERY && !(*rte).subquery.is_null() {
                walk_query((*rte).subquery, oids);
            }
        }
        walk_jointree((*q).jointree.cast(), oids);
    }
}

/// The WHERE and ON clauses of a join tree without sublinks.
unsafe fn walk_jointree(node: *mut Node, oids: &Oids) {
    if node.is_null() {
        return;
    }
    // SAFETY: a valid join tree node: FromExpr, JoinExpr or RangeTblRef.
    unsafe {
        raw::check_stack_depth();
        match (*node).type_ {
            NodeTag::T_FromExpr => {
                let f = node as *mut pg_sys::FromExpr;
                (*f).quals = with_ranges((*f).quals, oids);
                for i in 0..length((*f).fromlist) {
                    walk_jointree(nth((*f).fromlist, i), oids);
                }
            }
            NodeTag::T_JoinExpr => {
                let j = node as *mut pg_sys::JoinExpr;
                (*j).quals = with_ranges((*j).quals, oids);
                walk_jointree((*j).larg, oids);
                walk_jointree((*j).rarg, oids);
            }
            _ => {}
        }
    }
}

/// The full walk, for a query level with sublinks: every expression node,
/// checking the stack depth at each as core walkers do; each query level it
/// reaches goes back to `walk_query`.
unsafe extern "C-unwind" fn walker(node: *mut Node, ctx: *mut c_void) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: `ctx` is the `Oids` passed by `planner`; `node` a valid parse node.
    unsafe {
        raw::check_stack_depth();
        match (*node).type_ {
            NodeTag::T_Query => {
                walk_query(node.cast(), &mut *(ctx as *mut Oids));
                return false;
            }
            NodeTag::T_FromExpr => {
                let f = node as *mut pg_sys::FromExpr;
                (*f).quals = with_ranges((*f).quals, &*(ctx as *const Oids));
            }
            NodeTag::T_JoinExpr => {
                let j = node as *mut pg_sys::JoinExpr;
                (*j).quals = with_ranges((*j).quals, &*(ctx as *const Oids));
            }
            _ => {}
        }
        raw::expression_tree_walker(node, Some(walker), ctx)
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
        let and = if (*quals).type_ == NodeTag::T_BoolExpr
            && (*(quals as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR
        {
            quals as *mut pg_sys::BoolExpr
        } else {
            null_mut()
        };
        let mut added: *mut pg_sys::List = null_mut();
        if and.is_null() {
            added = implied_ranges(quals, oids, added);
        } else {
            let args = (*and).args;
            for i in 0..length(args) {
                added = implied_ranges(nth(args, i), oids, added);
            }
        }
        if added.is_null() {
            return quals;
        }
        let mut args = if and.is_null() { raw::lappend(null_mut(), quals.cast()) } else { (*and).args };
        for i in 0..length(added) {
            args = raw::lappend(args, nth(added, i).cast());
        }
        if and.is_null() {
            raw::makeBoolExpr(pg_sys::BoolExprType::AND_EXPR, args, -1).cast()
        } else {
            (*and).args = args;
            quals
        }
    }
}

/// Appends to `out` the conditions on `x` that `decode(x) OP t` (either way
/// round) implies, when both `x` and `t` are free of volatile functions and
/// subqueries (each is copied, so each must give the same value twice).
unsafe fn implied_ranges(clause: *mut Node, oids: &Oids, mut out: *mut pg_sys::List) -> *mut pg_sys::List {
    // SAFETY: reads nodes of a valid expression tree and builds new ones.
    unsafe {
        if (*clause).type_ != NodeTag::T_OpExpr {
            return out;
        }
        let op = &*(clause as *mut pg_sys::OpExpr);
        if length(op.args) != 2 {
            return out;
        }
        // (lower bound wanted, upper bound wanted) for `decode(x) OP t`.
        let wanted = |commuted: bool| -> Option<(bool, bool)> {
            let (lt, gt) = if commuted { (ops::TSTZ_GT, ops::TSTZ_LT) } else { (ops::TSTZ_LT, ops::TSTZ_GT) };
            let (le, ge) = if commuted { (ops::TSTZ_GE, ops::TSTZ_LE) } else { (ops::TSTZ_LE, ops::TSTZ_GE) };
            match op.opno {
                o if o == lt || o == le => Some((false, true)),
                o if o == gt || o == ge => Some((true, false)),
                o if o == ops::TSTZ_EQ => Some((true, true)),
                _ => None,
            }
        };
        let (left, right) = (nth(op.args, 0), nth(op.args, 1));
        // An index loop, not an array iterator: nothing here may have a destructor.
        for commuted in [false, true].iter().copied() {
            let (decoded, t) = if commuted { (right, left) } else { (left, right) };
            let Some((lower, upper)) = wanted(commuted) else { continue };
            let Some((family, key)) = decoded_key(decoded, oids) else { continue };
            if raw::contain_volatile_functions(t) || has_sublink(t) || raw::contain_volatile_functions(key) || has_sublink(key) {
                continue;
            }
            let bound = |op: Oid, func: Oid| -> *mut c_void {
                let arg = raw::lappend(null_mut(), raw::copyObjectImpl(t.cast()));
                let f = raw::makeFuncExpr(func, family.key_type, arg, pg_sys::InvalidOid, pg_sys::InvalidOid, pg_sys::CoercionForm::COERCE_EXPLICIT_CALL);
                raw::make_opclause(op, pg_sys::BOOLOID, false, raw::copyObjectImpl(key.cast()).cast(), f.cast(), pg_sys::InvalidOid, pg_sys::InvalidOid).cast()
            };
            if lower {
                out = raw::lappend(out, bound(family.ge, family.lower));
            }
            if upper {
                out = raw::lappend(out, bound(family.le, family.upper));
            }
            return out;
        }
        out
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
        let family = if f.funcid == oids.id.decode {
            oids.id
        } else if f.funcid == oids.uuid.decode {
            oids.uuid
        } else {
            return None;
        };
        (length(f.args) == 1).then(|| (family, nth(f.args, 0)))
    }
}

unsafe extern "C-unwind" fn find_sublink(node: *mut Node, ctx: *mut c_void) -> bool {
    // SAFETY: a valid expression node or NULL.
    unsafe {
        !node.is_null()
            && ((*node).type_ == NodeTag::T_SubLink || raw::expression_tree_walker(node, Some(find_sublink), ctx))
    }
}

unsafe fn has_sublink(node: *mut Node) -> bool {
    // SAFETY: walks a valid expression tree without changing it.
    unsafe { find_sublink(node, null_mut()) }
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
    fn builtin_operator_oids_are_the_catalog_ones() {
        use super::ops::*;
        for (oid, sig) in [
            (TSTZ_EQ, "=(timestamptz,timestamptz)"),
            (TSTZ_LT, "<(timestamptz,timestamptz)"),
            (TSTZ_LE, "<=(timestamptz,timestamptz)"),
            (TSTZ_GT, ">(timestamptz,timestamptz)"),
            (TSTZ_GE, ">=(timestamptz,timestamptz)"),
            (INT8_LE, "<=(bigint,bigint)"),
            (INT8_GE, ">=(bigint,bigint)"),
            (UUID_LE, "<=(uuid,uuid)"),
            (UUID_GE, ">=(uuid,uuid)"),
        ] {
            assert_eq!(one::<pg_sys::Oid>(&format!("SELECT 'pg_catalog.{sig}'::regoperator::oid")), oid, "{sig}");
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
    fn volatile_times_are_left_alone() {
        setup();
        let plan = explain("SELECT * FROM ev WHERE id_ts(id) >= clock_timestamp() - random() * interval '1 day'");
        assert!(!plan.contains("Index Cond"), "{plan}");
    }
}
