//! The walk over a query: each query level, its subqueries and CTEs, and
//! the WHERE and ON clauses of its join tree, which get their ranges.

use std::ffi::c_void;

use pgrx::pg_sys::{self, Node, NodeTag};

use super::ranges::with_ranges;
use super::raw::{self, check_for_interrupts, length, nth};
use super::state::{Level, Walk};

/// Visits a query level, its subqueries and CTEs, and its WHERE and ON
/// clauses. Only those can hold what the rewrite changes, so a query without
/// sublinks (most of them) costs a few pointer checks: its expressions are
/// not walked. A query with sublinks gets the full walk below.
pub(super) unsafe fn walk_query(q: *mut pg_sys::Query, up: *const Level, walk: *const Walk) {
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
