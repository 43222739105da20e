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
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::{null, null_mut};

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
        pub fn ProcessInterrupts();
        pub fn palloc0(size: usize) -> *mut c_void;
        #[cfg(feature = "pg18")]
        pub fn get_attgenerated(relid: Oid, attnum: pg_sys::AttrNumber) -> c_char;
        #[cfg_attr(not(feature = "pg15"), link_name = "expression_tree_walker_impl")]
        pub fn expression_tree_walker(node: *mut Node, walker: Walker, context: *mut c_void) -> bool;
        #[cfg_attr(not(feature = "pg15"), link_name = "query_tree_walker_impl")]
        pub fn query_tree_walker(query: *mut pg_sys::Query, walker: Walker, context: *mut c_void, flags: c_int) -> bool;
        pub fn copyObjectImpl(from: *const c_void) -> *mut c_void;
        pub fn lappend(list: *mut pg_sys::List, datum: *mut c_void) -> *mut pg_sys::List;
        pub fn equal(a: *const c_void, b: *const c_void) -> bool;
        pub fn eval_const_expressions(root: *mut c_void, node: *mut Node) -> *mut Node;
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

/// Built-in operators and functions (fixed OIDs of `pg_operator.dat` and
/// `pg_proc.dat`, checked by a test).
pub mod ops {
    use pgrx::pg_sys::Oid;
    pub const TSTZ_EQ: Oid = Oid::from_u32(1320);
    pub const TSTZ_LT: Oid = Oid::from_u32(1322);
    pub const TSTZ_LE: Oid = Oid::from_u32(1323);
    pub const TSTZ_GT: Oid = Oid::from_u32(1324);
    pub const TSTZ_GE: Oid = Oid::from_u32(1325);
    pub const TSTZ_PL_INTERVAL: Oid = Oid::from_u32(1327);
    pub const TSTZ_MI_INTERVAL: Oid = Oid::from_u32(1329);
    pub const INT8_LE: Oid = Oid::from_u32(414);
    pub const INT8_GE: Oid = Oid::from_u32(415);
    pub const UUID_LE: Oid = Oid::from_u32(2976);
    pub const UUID_GE: Oid = Oid::from_u32(2977);
    /// `now()`, `transaction_timestamp()`, `statement_timestamp()`.
    pub const NOW: [Oid; 3] = [Oid::from_u32(1299), Oid::from_u32(2647), Oid::from_u32(2648)];
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
    /// This family's first slot in `Walk::rights` (its lower bound; its upper is the next).
    slot: usize,
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
            slot: 0,
        },
        uuid: Family {
            decode: f(c"uuid_v7_ts", &[pg_sys::UUIDOID])?,
            key_type: pg_sys::UUIDOID,
            ge: ops::UUID_GE,
            le: ops::UUID_LE,
            lower: f(c"uuid_v7_lower_bound_clamped", &tstz)?,
            upper: f(c"uuid_v7_upper_bound_clamped", &tstz)?,
            slot: 2,
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

/// One planner call's walk: our OIDs, whether the current user may execute
/// what each range adds (asked once, when first needed), and whether a range
/// was added. Lives in the hook's frame; nothing in it has a destructor.
struct Walk {
    oids: Oids,
    /// Per family and direction (see `Family::slot`): unknown, allowed, refused.
    rights: [Cell<Right>; 4],
    added: Cell<bool>,
}

#[derive(Clone, Copy, Default)]
enum Right {
    #[default]
    Unknown,
    Allowed,
    Refused,
}

/// A query level of the walk, the level around it (what a Var's
/// `varlevelsup` counts up through; NULL at the top) and the walk. Lives in
/// `walk_query`'s frame while that level is walked.
struct Level {
    query: *mut pg_sys::Query,
    up: *const Level,
    walk: *const Walk,
}

/// CHECK_FOR_INTERRUPTS(), in every loop over clauses: a cancel or a
/// termination leaves from here by `longjmp` (see `raw`).
unsafe fn check_for_interrupts() {
    // SAFETY: reads the flag the signal handlers set; ProcessInterrupts may
    // raise, leaving over plain frames only.
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::InterruptPending) != 0 {
            raw::ProcessInterrupts();
        }
    }
}

/// Visits a query level, its subqueries and CTEs, and its WHERE and ON
/// clauses. Only those can hold what the rewrite changes, so a query without
/// sublinks (most of them) costs a few pointer checks: its expressions are
/// not walked. A query with sublinks gets the full walk below.
unsafe fn walk_query(q: *mut pg_sys::Query, up: *const Level, walk: *const Walk) {
    let level = Level { query: q, up, walk };
    // SAFETY: `q` is a valid Query; lists are PostgreSQL lists of the node types named.
    unsafe {
        raw::check_stack_depth();
        if (*q).hasSubLinks {
            raw::query_tree_walker(q, Some(walker), (&level as *const Level).cast_mut().cast(), 0);
            return;
        }
        for i in 0..length((*q).cteList) {
            check_for_interrupts();
            let cte = nth((*q).cteList, i) as *mut pg_sys::CommonTableExpr;
            let sub = (*cte).ctequery;
            if !sub.is_null() && (*sub).type_ == NodeTag::T_Query {
                walk_query(sub.cast(), &level, walk);
            }
        }
        for i in 0..length((*q).rtable) {
            check_for_interrupts();
            let rte = nth((*q).rtable, i) as *mut pg_sys::RangeTblEntry;
            if (*rte).rtekind == pg_sys::RTEKind::RTE_SUBQUERY && !(*rte).subquery.is_null() {
                walk_query((*rte).subquery, &level, walk);
            }
        }
        walk_jointree((*q).jointree.cast(), &level);
    }
}

/// The WHERE and ON clauses of a join tree without sublinks.
unsafe fn walk_jointree(node: *mut Node, level: &Level) {
    if node.is_null() {
        return;
    }
    // SAFETY: a valid join tree node: FromExpr, JoinExpr or RangeTblRef.
    unsafe {
        raw::check_stack_depth();
        match (*node).type_ {
            NodeTag::T_FromExpr => {
                let f = node as *mut pg_sys::FromExpr;
                (*f).quals = with_ranges((*f).quals, level);
                for i in 0..length((*f).fromlist) {
                    check_for_interrupts();
                    walk_jointree(nth((*f).fromlist, i), level);
                }
            }
            NodeTag::T_JoinExpr => {
                let j = node as *mut pg_sys::JoinExpr;
                (*j).quals = with_ranges((*j).quals, level);
                walk_jointree((*j).larg, level);
                walk_jointree((*j).rarg, level);
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
    // SAFETY: `ctx` is the `Level` of the query being walked; `node` a valid parse node.
    unsafe {
        raw::check_stack_depth();
        check_for_interrupts();
        let level = &*(ctx as *const Level);
        match (*node).type_ {
            NodeTag::T_Query => {
                walk_query(node.cast(), level, level.walk);
                return false;
            }
            NodeTag::T_FromExpr => {
                let f = node as *mut pg_sys::FromExpr;
                (*f).quals = with_ranges((*f).quals, level);
            }
            NodeTag::T_JoinExpr => {
                let j = node as *mut pg_sys::JoinExpr;
                (*j).quals = with_ranges((*j).quals, level);
            }
            _ => {}
        }
        raw::expression_tree_walker(node, Some(walker), ctx)
    }
}

/// Ranges for at most this many decoded keys in one clause, and for at most
/// this many columns (as times) per key and direction: a comparison past
/// these keeps no range (it stays as written), so the work stays linear in
/// the number of clauses.
const MAX_KEYS: usize = 8;
const MAX_COLUMN_TIMES: usize = 8;

/// The times one decoded key is compared with in one direction (`>=` for a
/// lower bound, `<=` for an upper) among the AND-ed conditions of a clause.
/// They fold into as few ranges as possible: the key is above every lower
/// bound, so above their greatest (and below the least upper bound).
#[repr(C)]
struct Times {
    /// The tightest non-NULL constant (the latest for a lower bound, the
    /// earliest for an upper), or NULL. A NULL constant compares NULL: it
    /// rejects every row by itself and needs no range.
    constant: *mut pg_sys::Const,
    /// Other times that read no column (`now()`, a parameter, a shifted
    /// time): one range with the constant, on their GREATEST (LEAST).
    others: *mut pg_sys::List,
    /// Times that read a column, each column once: a range each, since one
    /// over several columns would tie their relations into one join clause.
    columns: *mut pg_sys::List,
}

/// A decoded key of a clause and the times it is compared with.
#[repr(C)]
struct Key {
    family: Family,
    key: *mut Node,
    lower: Times,
    upper: Times,
}

/// The clause with the key ranges its time comparisons imply AND-ed on.
unsafe fn with_ranges(quals: *mut Node, level: &Level) -> *mut Node {
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
        let mut keys: *mut pg_sys::List = null_mut();
        if and.is_null() {
            keys = collect(quals, level, keys);
        } else {
            let args = (*and).args;
            for i in 0..length(args) {
                check_for_interrupts();
                keys = collect(nth(args, i), level, keys);
            }
        }
        if keys.is_null() {
            return quals;
        }
        let mut args = if and.is_null() { raw::lappend(null_mut(), quals.cast()) } else { (*and).args };
        let before = length(args);
        for i in 0..length(keys) {
            let key = &*(nth(keys, i) as *mut Key);
            args = add_ranges(key, true, args, level);
            args = add_ranges(key, false, args, level);
        }
        if length(args) == before {
            return quals;
        }
        if and.is_null() {
            raw::makeBoolExpr(pg_sys::BoolExprType::AND_EXPR, args, -1).cast()
        } else {
            (*and).args = args;
            quals
        }
    }
}

/// Notes in `keys` (a list of `Key`) the time `clause` compares a decoded
/// key with, when it is `decode(x) OP t` (either way round) with `x` and `t`
/// error-free (so each copy gives the value of the original, and no copy
/// can raise).
unsafe fn collect(clause: *mut Node, level: &Level, mut keys: *mut pg_sys::List) -> *mut pg_sys::List {
    // SAFETY: reads nodes of a valid expression tree; `keys` holds `Key`s
    // allocated here in the current memory context.
    unsafe {
        let Some((family, key, t, lower, upper)) = comparison(clause, level) else { return keys };
        let mut found: *mut Key = null_mut();
        for i in 0..length(keys) {
            let k = nth(keys, i) as *mut Key;
            if (*k).family.decode == family.decode && raw::equal((*k).key.cast(), key.cast()) {
                found = k;
                break;
            }
        }
        if found.is_null() {
            if length(keys) >= MAX_KEYS {
                return keys;
            }
            found = raw::palloc0(std::mem::size_of::<Key>()).cast();
            (*found).family = family;
            (*found).key = key;
            keys = raw::lappend(keys, found.cast());
        }
        if lower {
            note(&mut (*found).lower, t, true);
        }
        if upper {
            note(&mut (*found).upper, t, false);
        }
        keys
    }
}

/// `decode(x) OP t` (either way round) with `x` and `t` error-free: the
/// family, `x`, `t`, and whether it implies a lower bound, an upper bound.
unsafe fn comparison(clause: *mut Node, level: &Level) -> Option<(Family, *mut Node, *mut Node, bool, bool)> {
    // SAFETY: reads nodes of a valid expression tree.
    unsafe {
        if (*clause).type_ != NodeTag::T_OpExpr {
            return None;
        }
        let op = &*(clause as *mut pg_sys::OpExpr);
        if length(op.args) != 2 {
            return None;
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
            let Some((family, key)) = decoded_key(decoded, &(*level.walk).oids) else { continue };
            if error_free(t, level) && error_free(key, level) {
                return Some((family, key, t, lower, upper));
            }
        }
        None
    }
}

/// Adds the error-free time `t` to the times of one direction.
unsafe fn note(times: &mut Times, t: *mut Node, lower: bool) {
    // SAFETY: reads nodes of a valid expression tree; a timestamptz Const
    // that is not NULL holds its value in the Datum itself.
    unsafe {
        if (*t).type_ == NodeTag::T_Const && (*(t as *mut pg_sys::Const)).consttype == pg_sys::TIMESTAMPTZOID {
            let c = t as *mut pg_sys::Const;
            if (*c).constisnull {
                return;
            }
            let value = |c: *mut pg_sys::Const| (*c).constvalue.value() as i64;
            let tighter = times.constant.is_null()
                || if lower { value(c) > value(times.constant) } else { value(c) < value(times.constant) };
            if tighter {
                times.constant = c;
            }
            return;
        }
        let column = strip_relabel(t);
        if (*column).type_ != NodeTag::T_Var {
            times.others = raw::lappend(times.others, t.cast());
            return;
        }
        for i in 0..length(times.columns) {
            check_for_interrupts();
            if raw::equal(strip_relabel(nth(times.columns, i)).cast(), column.cast()) {
                return;
            }
        }
        if length(times.columns) < MAX_COLUMN_TIMES {
            times.columns = raw::lappend(times.columns, t.cast());
        }
    }
}

unsafe fn strip_relabel(mut node: *mut Node) -> *mut Node {
    // SAFETY: reads nodes of a valid expression tree.
    unsafe {
        while (*node).type_ == NodeTag::T_RelabelType {
            node = (*(node as *mut pg_sys::RelabelType)).arg.cast();
        }
    }
    node
}

/// Appends to `args` the ranges of one direction of `key`: one for the
/// times that read no column, one for each column.
unsafe fn add_ranges(key: &Key, lower: bool, mut args: *mut pg_sys::List, level: &Level) -> *mut pg_sys::List {
    // SAFETY: `key`'s lists hold valid expression nodes; the GREATEST or
    // LEAST is a new node in the current memory context.
    unsafe {
        let times = if lower { &key.lower } else { &key.upper };
        let mut free = times.others;
        if !times.constant.is_null() {
            free = raw::lappend(free, times.constant.cast());
        }
        if length(free) == 1 {
            args = add_range(key, lower, nth(free, 0), args, level);
        } else if length(free) > 1 {
            // Error-free as its arguments are: comparing two timestamptz never raises.
            let m: *mut pg_sys::MinMaxExpr = raw::palloc0(std::mem::size_of::<pg_sys::MinMaxExpr>()).cast();
            (*m).xpr.type_ = NodeTag::T_MinMaxExpr;
            (*m).minmaxtype = pg_sys::TIMESTAMPTZOID;
            (*m).op = if lower { pg_sys::MinMaxOp::IS_GREATEST } else { pg_sys::MinMaxOp::IS_LEAST };
            (*m).args = free;
            (*m).location = -1;
            args = add_range(key, lower, m.cast(), args, level);
        }
        for i in 0..length(times.columns) {
            check_for_interrupts();
            args = add_range(key, lower, nth(times.columns, i), args, level);
        }
        args
    }
}

/// Appends `key >= lower_bound_clamped(t)` (or `key <= upper_bound_clamped(t)`)
/// to `args`, unless the current user may not execute what it adds, or
/// `args` already holds it.
unsafe fn add_range(key: &Key, lower: bool, t: *mut Node, args: *mut pg_sys::List, level: &Level) -> *mut pg_sys::List {
    // SAFETY: copies valid expression nodes and builds new ones in the
    // current memory context; `level.walk` outlives the walk.
    unsafe {
        let walk = &*level.walk;
        let family = key.family;
        let (op, func) = if lower { (family.ge, family.lower) } else { (family.le, family.upper) };
        let right = &walk.rights[family.slot + usize::from(!lower)];
        if let Right::Unknown = right.get() {
            right.set(if may_execute(func, op) { Right::Allowed } else { Right::Refused });
        }
        if let Right::Refused = right.get() {
            return args;
        }
        let copy = |node: *mut Node| -> *mut pg_sys::Expr { raw::copyObjectImpl(node.cast()).cast() };
        let arg = raw::lappend(null_mut(), copy(t).cast());
        let f = raw::makeFuncExpr(func, family.key_type, arg, pg_sys::InvalidOid, pg_sys::InvalidOid, pg_sys::CoercionForm::COERCE_EXPLICIT_CALL);
        // Folded now, as the planner would later, so that a range a query
        // already carries as a constant (Citus sends workers the
        // coordinator's) is recognized below. Cannot raise: the clamped
        // bounds take any time, and `t` is error-free.
        let f = raw::eval_const_expressions(null_mut(), f.cast());
        let range: *mut Node = raw::make_opclause(op, pg_sys::BOOLOID, false, copy(key.key), f.cast(), pg_sys::InvalidOid, pg_sys::InvalidOid).cast();
        // Each range once: a query that already carries it (such as the
        // shard query Citus sends a worker after rewriting it on the
        // coordinator) gets no second copy.
        for j in 0..length(args) {
            check_for_interrupts();
            if holds(nth(args, j), range) {
                return args;
            }
        }
        walk.added.set(true);
        raw::lappend(args, range.cast())
    }
}

/// Whether the current user may execute `func` and the function of `op`:
/// asked without raising, so that a role without the right gets its query
/// as written.
#[pg_guard]
unsafe extern "C-unwind" fn may_execute(func: Oid, op: Oid) -> bool {
    catalog::may_execute(func) && catalog::may_execute(catalog::operator_function(op))
}

/// Whether `clause`, or one of the clauses it ANDs, equals `range`.
unsafe fn holds(clause: *mut Node, range: *mut Node) -> bool {
    // SAFETY: reads nodes of valid expression trees.
    unsafe {
        if (*clause).type_ == NodeTag::T_BoolExpr && (*(clause as *mut pg_sys::BoolExpr)).boolop == pg_sys::BoolExprType::AND_EXPR {
            let args = (*(clause as *mut pg_sys::BoolExpr)).args;
            for j in 0..length(args) {
                check_for_interrupts();
                if holds(nth(args, j), range) {
                    return true;
                }
            }
            return false;
        }
        raw::equal(clause.cast(), range.cast())
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

/// Whether evaluating `node`, an expression of query level `level`, can
/// never raise, nor anything the planner may put in its place (see the
/// module documentation). Reads the parse tree only.
unsafe fn error_free(node: *mut Node, level: &Level) -> bool {
    if node.is_null() {
        return false;
    }
    // SAFETY: reads a valid expression node of `level`'s query.
    unsafe {
        raw::check_stack_depth();
        match (*node).type_ {
            NodeTag::T_Const | NodeTag::T_Param => true,
            NodeTag::T_RelabelType => error_free((*(node as *mut pg_sys::RelabelType)).arg.cast(), level),
            NodeTag::T_Var => column_is_error_free(&*(node as *mut pg_sys::Var), level),
            NodeTag::T_OpExpr => shifted_time(&*(node as *mut pg_sys::OpExpr)),
            _ => is_now(node),
        }
    }
}

/// `now()`, `transaction_timestamp()`, `statement_timestamp()` or `CURRENT_TIMESTAMP`.
unsafe fn is_now(node: *mut Node) -> bool {
    // SAFETY: reads a valid expression node.
    unsafe {
        match (*node).type_ {
            NodeTag::T_FuncExpr => {
                let f = &*(node as *mut pg_sys::FuncExpr);
                length(f.args) == 0 && ops::NOW.contains(&f.funcid)
            }
            NodeTag::T_SQLValueFunction => matches!(
                (*(node as *mut pg_sys::SQLValueFunction)).op,
                pg_sys::SQLValueFunctionOp::SVFOP_CURRENT_TIMESTAMP | pg_sys::SQLValueFunctionOp::SVFOP_CURRENT_TIMESTAMP_N
            ),
            _ => false,
        }
    }
}

/// `base ± span`, `timestamptz ± interval`, that cannot overflow: `base` is
/// the now-family or a constant between about the years 1000 and 100000, `span` a
/// constant of at most 5,000 years, counting a month as 31 days and a year
/// as 12 such months, so that no step of the addition (months, then days,
/// then time) goes further than that: about 5,100 years, which keeps the
/// result between 4100 BC and 105400 AD, inside `timestamptz`'s range.
unsafe fn shifted_time(op: &pg_sys::OpExpr) -> bool {
    const DAY_US: i128 = 86_400_000_000;
    // SAFETY: reads a valid OpExpr and its Const arguments (an interval Const
    // that is not NULL points at its 16-byte Interval).
    unsafe {
        if !(op.opno == ops::TSTZ_PL_INTERVAL || op.opno == ops::TSTZ_MI_INTERVAL) || length(op.args) != 2 {
            return false;
        }
        let (base, span) = (nth(op.args, 0), nth(op.args, 1));
        let base_ok = is_now(base)
            || ((*base).type_ == NodeTag::T_Const && {
                let c = &*(base as *mut pg_sys::Const);
                // Microseconds since 2000-01-01, from 1,000 to 98,000 years of 366 days.
                let years = -1_000 * 366 * DAY_US..=98_000 * 366 * DAY_US;
                c.consttype == pg_sys::TIMESTAMPTZOID && (c.constisnull || years.contains(&(c.constvalue.value() as i64 as i128)))
            });
        let span_ok = (*span).type_ == NodeTag::T_Const && {
            let c = &*(span as *mut pg_sys::Const);
            c.consttype == pg_sys::INTERVALOID
                && (c.constisnull || {
                    let i = &*(c.constvalue.cast_mut_ptr::<pg_sys::Interval>());
                    let magnitude = (i.month as i128).abs() * 31 * DAY_US + (i.day as i128).abs() * DAY_US + (i.time as i128).abs();
                    magnitude <= 5_000 * 12 * 31 * DAY_US
                })
        };
        base_ok && span_ok
    }
}

/// A column (a Var `varlevelsup` levels up from `level`) whose value is read,
/// not computed: a table's, or one standing for an error-free expression
/// that the planner may substitute (a subquery's or view's output, a join
/// alias, a `VALUES` column, a non-recursive `WITH` query's output).
unsafe fn column_is_error_free(var: &pg_sys::Var, level: &Level) -> bool {
    // SAFETY: walks the levels the walk is inside of, and reads their range
    // tables, which the Var's indexes point into.
    unsafe {
        let Some(at) = levels_up(level, var.varlevelsup) else { return false };
        let (varno, attno) = (var.varno as i64, var.varattno as i64);
        if varno < 1 || varno as usize > length((*at.query).rtable) || attno < 1 {
            return false;
        }
        let attno = attno as usize;
        let rte = &*(nth((*at.query).rtable, varno as usize - 1) as *mut pg_sys::RangeTblEntry);
        match rte.rtekind {
            // A virtual generated column (PostgreSQL 18) is expanded into
            // its expression later in planning; that expression may raise.
            #[cfg(feature = "pg18")]
            pg_sys::RTEKind::RTE_RELATION => raw::get_attgenerated(rte.relid, attno as pg_sys::AttrNumber) != b'v' as c_char,
            #[cfg(not(feature = "pg18"))]
            pg_sys::RTEKind::RTE_RELATION => true,
            pg_sys::RTEKind::RTE_JOIN => {
                attno <= length(rte.joinaliasvars) && error_free(nth(rte.joinaliasvars, attno - 1), at)
            }
            pg_sys::RTEKind::RTE_SUBQUERY => output_is_error_free(rte.subquery, attno, at),
            pg_sys::RTEKind::RTE_VALUES => {
                for i in 0..length(rte.values_lists) {
                    check_for_interrupts();
                    let row = nth(rte.values_lists, i) as *mut pg_sys::List;
                    if attno > length(row) || !error_free(nth(row, attno - 1), at) {
                        return false;
                    }
                }
                true
            }
            pg_sys::RTEKind::RTE_CTE if !rte.self_reference && !rte.ctename.is_null() => {
                let Some(owner) = levels_up(at, rte.ctelevelsup) else { return false };
                let ctes = (*owner.query).cteList;
                for i in 0..length(ctes) {
                    check_for_interrupts();
                    let cte = &*(nth(ctes, i) as *mut pg_sys::CommonTableExpr);
                    if !cte.ctename.is_null() && CStr::from_ptr(cte.ctename) == CStr::from_ptr(rte.ctename) {
                        let sub = cte.ctequery;
                        return !cte.cterecursive
                            && !sub.is_null()
                            && (*sub).type_ == NodeTag::T_Query
                            && output_is_error_free(sub.cast(), attno, owner);
                    }
                }
                false
            }
            _ => false,
        }
    }
}

/// The query level `n` levels around `level` (what `varlevelsup` and
/// `ctelevelsup` count), if the walk is that deep.
fn levels_up(level: &Level, n: pg_sys::Index) -> Option<&Level> {
    let mut at = level;
    for _ in 0..n {
        // SAFETY: `up` is NULL or the enclosing level, whose frame outlives this one's.
        at = unsafe { at.up.as_ref()? };
    }
    Some(at)
}

/// Output column `attno` of a plain SELECT `sub` (a query level inside
/// `up`) is an error-free expression.
unsafe fn output_is_error_free(sub: *mut pg_sys::Query, attno: usize, up: &Level) -> bool {
    // SAFETY: reads a valid Query and its target list.
    unsafe {
        if sub.is_null() || (*sub).commandType != pg_sys::CmdType::CMD_SELECT || !(*sub).setOperations.is_null() {
            return false;
        }
        let inner = Level { query: sub, up, walk: up.walk };
        let targets = (*sub).targetList;
        for i in 0..length(targets) {
            check_for_interrupts();
            let target = &*(nth(targets, i) as *mut pg_sys::TargetEntry);
            if target.resno as usize == attno && !target.resjunk {
                return error_free(target.expr.cast(), &inner);
            }
        }
        false
    }
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

    #[pg_test]
    fn a_role_without_usage_on_the_extensions_own_schema_runs_its_queries() {
        Spi::run(
            "DROP EXTENSION pg_idgen; CREATE SCHEMA idgen; CREATE EXTENSION pg_idgen SCHEMA idgen;
             REVOKE ALL ON SCHEMA idgen FROM PUBLIC",
        )
        .unwrap();
        tenant("idgen");
        assert_eq!(crate::testing::sqlstate("idgen.id_epoch()"), "42501", "the role may not use the schema");
        runs_without_usage();
    }

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
}
