//! PostgreSQL's functions, called directly rather than through pgrx's
//! wrappers: pgrx turns an error raised inside a call into a Rust panic and
//! raises a copy of it later, without its CONTEXT, position or field names.
//! Called this way, an error (the next planner's, or stack depth, cancel or
//! out of memory in the walk below) leaves by `longjmp` straight to
//! PostgreSQL's own handler, exactly as from core code. That is sound
//! because every Rust frame it passes over is a plain old frame: the hook,
//! the walker and their helpers hold no value with a destructor.
//!
//! Also here, as Rust functions: what C code gets from PostgreSQL's headers
//! as inline functions and macros (list access, CHECK_FOR_INTERRUPTS()).

use std::ffi::{c_char, c_int, c_void};

use pgrx::pg_sys::{self, Node, Oid};

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

/// The `i`th pointer of a PostgreSQL list.
pub(super) unsafe fn nth(list: *mut pg_sys::List, i: usize) -> *mut Node {
    // SAFETY: the caller checked `i` against the list's length.
    unsafe { (*(*list).elements.add(i)).ptr_value.cast() }
}

pub(super) unsafe fn length(list: *mut pg_sys::List) -> usize {
    // SAFETY: NIL is the empty list.
    if list.is_null() { 0 } else { unsafe { (*list).length as usize } }
}

/// CHECK_FOR_INTERRUPTS(), in every loop over clauses: a cancel or a
/// termination leaves from here by `longjmp` (see this module's documentation).
pub(super) unsafe fn check_for_interrupts() {
    // SAFETY: reads the flag the signal handlers set; ProcessInterrupts may
    // raise, leaving over plain frames only.
    unsafe {
        if std::ptr::read_volatile(&raw const pg_sys::InterruptPending) != 0 {
            ProcessInterrupts();
        }
    }
}
