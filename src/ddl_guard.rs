//! No role queues for a lock on pg_idgen's relations unless it may run the
//! statement that asks for it.
//!
//! Some statements ask for a strong lock on the relation they name before
//! PostgreSQL checks that the role may run them: `CREATE RULE` and `DROP
//! RULE`/`TRIGGER`/`POLICY ... ON` (AccessExclusiveLock), `ALTER INDEX` or
//! `ALTER TRIGGER ... DEPENDS ON EXTENSION` (AccessExclusiveLock), `CREATE
//! TRIGGER` (ShareRowExclusiveLock), `CREATE TABLE ... INHERITS` or
//! `PARTITION OF`. Behind a transaction that holds any lock on the relation
//! (a role's own open read of the registry), such a request waits, and every
//! later reader and writer waits behind it: minting (which reads the
//! registry and the ownership tables and writes the mark sequence) would
//! stop in that database for as long as the transaction stays open, though
//! the statement fails once it is granted the lock.
//!
//! A utility hook checks those statements first, when they name one of
//! pg_idgen's relations (an extension table or sequence, or an index on
//! one): ownership (or TRIGGER for `CREATE TRIGGER`), as PostgreSQL checks
//! it later, finding the relation as PostgreSQL will (the caller's
//! `search_path` and rights) but with no lock. A role that may not is
//! refused at once (42501). Superusers, and every other statement, go on
//! untouched.

use std::ffi::c_char;

use pgrx::prelude::*;

use crate::catalog;
use crate::errors::IdError;

static mut PREV: pg_sys::ProcessUtility_hook_type = None;

/// Installs the hook (while preloading).
pub fn init() {
    // SAFETY: hooks are chained in the postmaster while preloading.
    unsafe {
        PREV = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(utility);
    }
}

/// The hook. Not `#[pg_guard]`, and it holds nothing with a destructor: the
/// statement is run from here by PostgreSQL's own function (not pgrx's
/// wrapper, which would raise a copy of its errors without their CONTEXT,
/// position or fields), so that its errors reach PostgreSQL untouched, as
/// in the planner hook. The check is a `#[pg_guard]` function of its own.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: the statement PostgreSQL passes, read before it runs; then
    // the previous hook or PostgreSQL's own, called as PostgreSQL would.
    unsafe {
        check((*pstmt).utilityStmt);
        match PREV {
            Some(prev) => prev(pstmt, query, read_only_tree, context, params, env, dest, qc),
            None => standard_ProcessUtility(pstmt, query, read_only_tree, context, params, env, dest, qc),
        }
    }
}

unsafe extern "C-unwind" {
    #[allow(clippy::too_many_arguments)]
    fn standard_ProcessUtility(
        pstmt: *mut pg_sys::PlannedStmt,
        query: *const c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

/// What a statement needs on each relation it names before it locks it.
enum Needs {
    Ownership,
    Trigger,
}

/// Refuses `stmt` if it names one of pg_idgen's relations that the role
/// may not run it on (superusers may run anything).
///
/// # Safety
/// `stmt` is a parse tree node of a utility statement.
#[pg_guard]
unsafe extern "C-unwind" fn check(stmt: *mut pg_sys::Node) {
    // SAFETY: each node is read as the type its tag says.
    unsafe {
        if pg_sys::superuser() {
            return;
        }
        let mut named: Vec<(*mut pg_sys::RangeVar, Needs)> = Vec::new();
        match (*stmt).type_ {
            pg_sys::NodeTag::T_RuleStmt => named.push(((*stmt.cast::<pg_sys::RuleStmt>()).relation, Needs::Ownership)),
            pg_sys::NodeTag::T_CreateTrigStmt => named.push(((*stmt.cast::<pg_sys::CreateTrigStmt>()).relation, Needs::Trigger)),
            pg_sys::NodeTag::T_AlterObjectDependsStmt => {
                named.push(((*stmt.cast::<pg_sys::AlterObjectDependsStmt>()).relation, Needs::Ownership))
            }
            pg_sys::NodeTag::T_DropStmt => {
                let drop = &*stmt.cast::<pg_sys::DropStmt>();
                if matches!(drop.removeType, pg_sys::ObjectType::OBJECT_TRIGGER | pg_sys::ObjectType::OBJECT_RULE | pg_sys::ObjectType::OBJECT_POLICY) {
                    for object in list(drop.objects) {
                        // The relation: every name but the last (the trigger's, rule's or policy's).
                        let names = pg_sys::list_copy_head(object.cast(), pg_sys::list_length(object.cast()) - 1);
                        named.push((pg_sys::makeRangeVarFromNameList(names), Needs::Ownership));
                    }
                }
            }
            pg_sys::NodeTag::T_CreateStmt | pg_sys::NodeTag::T_CreateForeignTableStmt => {
                for parent in list((*stmt.cast::<pg_sys::CreateStmt>()).inhRelations) {
                    named.push((parent.cast(), Needs::Ownership));
                }
            }
            _ => {}
        }
        for (rv, needs) in named {
            if rv.is_null() {
                continue;
            }
            let Some(relid) = catalog::relation_named_unlocked(rv) else { continue };
            let Some((kind, name)) = catalog::ours(relid) else { continue };
            let (allowed, privilege) = match needs {
                Needs::Ownership => (catalog::owns(relid), ""),
                Needs::Trigger => (catalog::may_trigger(relid), "TRIGGER"),
            };
            if !allowed {
                IdError::NotOwnerOfOurs { kind, name, privilege }.raise()
            }
        }
    }
}

/// The elements of a PostgreSQL `List` of pointers (none for NIL).
///
/// # Safety
/// `l` is NIL or a live pointer list.
unsafe fn list(l: *mut pg_sys::List) -> Vec<*mut std::ffi::c_void> {
    // SAFETY: the caller's.
    unsafe { (0..pg_sys::list_length(l)).map(|i| pg_sys::list_nth(l, i)).collect() }
}
