//! Which expressions are error-free: their evaluation cannot raise, here
//! or after the planner's own substitutions (see the `planner` module
//! documentation).

#[cfg(feature = "pg18")]
use std::ffi::c_char;
use std::ffi::CStr;

use pgrx::pg_sys::{self, Node, NodeTag};

use super::ops;
use super::raw::{self, check_for_interrupts, length, nth};
use super::state::{levels_up, Level};

/// Whether evaluating `node`, an expression of query level `level`, can
/// never raise, nor anything the planner may put in its place (see the
/// `planner` module documentation). Reads the parse tree only.
pub(super) unsafe fn error_free(node: *mut Node, level: &Level) -> bool {
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
