//! The time comparisons among the AND-ed conditions of a clause, and the
//! key ranges they fold into.

use std::ptr::null_mut;

use pgrx::pg_sys::{self, Node, NodeTag, Oid};
use pgrx::prelude::*;

use crate::catalog;

use super::error_free::error_free;
use super::functions::{Family, Oids};
use super::ops;
use super::raw::{self, check_for_interrupts, length, nth};
use super::state::{Level, Right};

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
pub(super) unsafe fn with_ranges(quals: *mut Node, level: &Level) -> *mut Node {
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
