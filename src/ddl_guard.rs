//! No role queues for a lock on pg_idgen's relations unless it may run the
//! statement that asks for it.
//!
//! Some statements ask for a strong lock on a relation they name before
//! PostgreSQL checks that the role may run them: `CREATE RULE`
//! (AccessExclusiveLock), `CREATE TRIGGER` (ShareRowExclusiveLock), `ALTER
//! INDEX ... DEPENDS ON EXTENSION`, `ALTER TABLE`/`ALTER INDEX ... ATTACH` or
//! `DETACH PARTITION` of the named partition, `CREATE TABLE ... INHERITS` or
//! `PARTITION OF`, `ALTER TABLE ... INHERIT`, a foreign key's referenced
//! table (`CREATE TABLE`, `ALTER TABLE ... ADD`), `CREATE STATISTICS`, and
//! the tables of `CREATE`/`ALTER PUBLICATION` (each held while the next is
//! waited for). Behind a transaction that holds any lock on the
//! relation (a role's own open read of the registry), such a request waits,
//! and every later reader and writer waits behind it: minting (which reads
//! the registry and the ownership tables and writes the mark sequence)
//! would stop in that database for as long as the transaction stays open,
//! though the statement fails once it is granted the lock.
//!
//! A utility hook checks those statements first, when a name in them may
//! find one of pg_idgen's relations (an extension table or sequence, or an
//! index on one): ownership, or the privilege PostgreSQL checks later
//! (TRIGGER, REFERENCES). An unqualified name is checked in every schema of
//! the caller's `search_path`, since PostgreSQL looks it up again after a
//! lock wait. A role that may not is refused at once (42501). The same
//! statements on `pg_extension` and its indexes, which every session of a
//! database with pg_idgen reads, are refused at once too, as PostgreSQL
//! refuses them on a system catalog after the lock. Superusers, and every
//! other statement, go on untouched.

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
#[derive(Clone, Copy)]
enum Needs {
    Ownership,
    Privilege(u32, &'static str),
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
            pg_sys::NodeTag::T_CreateTrigStmt => named.push((
                (*stmt.cast::<pg_sys::CreateTrigStmt>()).relation,
                Needs::Privilege(pg_sys::ACL_TRIGGER, "TRIGGER"),
            )),
            pg_sys::NodeTag::T_AlterObjectDependsStmt => {
                // An index or materialized view is locked itself; a
                // trigger's or function's table is not locked strongly.
                let s = &*stmt.cast::<pg_sys::AlterObjectDependsStmt>();
                if matches!(s.objectType, pg_sys::ObjectType::OBJECT_INDEX | pg_sys::ObjectType::OBJECT_MATVIEW) {
                    named.push((s.relation, Needs::Ownership));
                }
            }
            pg_sys::NodeTag::T_CreateStmt | pg_sys::NodeTag::T_CreateForeignTableStmt => {
                let create = &*stmt.cast::<pg_sys::CreateStmt>();
                for parent in list(create.inhRelations) {
                    named.push((parent.cast(), Needs::Ownership));
                }
                for element in list(create.tableElts).into_iter().chain(list(create.constraints)) {
                    referenced(element.cast(), &mut named);
                }
            }
            pg_sys::NodeTag::T_AlterTableStmt => {
                for cmd in list((*stmt.cast::<pg_sys::AlterTableStmt>()).cmds) {
                    let cmd = &*cmd.cast::<pg_sys::AlterTableCmd>();
                    match cmd.subtype {
                        // The partition (a table or an index) is locked before it is checked.
                        pg_sys::AlterTableType::AT_AttachPartition
                        | pg_sys::AlterTableType::AT_DetachPartition
                        | pg_sys::AlterTableType::AT_DetachPartitionFinalize
                            if !cmd.def.is_null() && (*cmd.def).type_ == pg_sys::NodeTag::T_PartitionCmd =>
                        {
                            named.push(((*cmd.def.cast::<pg_sys::PartitionCmd>()).name, Needs::Ownership));
                        }
                        pg_sys::AlterTableType::AT_AddConstraint | pg_sys::AlterTableType::AT_AddColumn => referenced(cmd.def, &mut named),
                        pg_sys::AlterTableType::AT_AddInherit => named.push((cmd.def.cast(), Needs::Ownership)),
                        _ => {}
                    }
                }
            }
            // Each table is locked (ShareUpdateExclusiveLock) and held while
            // the next is waited for, then checked.
            pg_sys::NodeTag::T_CreatePublicationStmt | pg_sys::NodeTag::T_AlterPublicationStmt => {
                let objects = match (*stmt).type_ {
                    pg_sys::NodeTag::T_CreatePublicationStmt => (*stmt.cast::<pg_sys::CreatePublicationStmt>()).pubobjects,
                    _ => (*stmt.cast::<pg_sys::AlterPublicationStmt>()).pubobjects,
                };
                for object in list(objects) {
                    let table = (*object.cast::<pg_sys::PublicationObjSpec>()).pubtable;
                    if !table.is_null() {
                        named.push(((*table).relation, Needs::Ownership));
                    }
                }
            }
            pg_sys::NodeTag::T_CreateStatsStmt => {
                for rel in list((*stmt.cast::<pg_sys::CreateStatsStmt>()).relations) {
                    if (*rel.cast::<pg_sys::Node>()).type_ == pg_sys::NodeTag::T_RangeVar {
                        named.push((rel.cast(), Needs::Ownership));
                    }
                }
            }
            _ => {}
        }
        for (rv, needs) in named {
            if rv.is_null() {
                continue;
            }
            for relid in catalog::relations_a_name_may_find(rv) {
                // pg_extension, which every session of a database with
                // pg_idgen reads: no role but a superuser changes a system
                // catalog, and PostgreSQL says so only after the lock.
                if let Some(name) = catalog::extension_catalog(relid) {
                    IdError::SystemCatalog(name).raise()
                }
                let Some((kind, name)) = catalog::ours(relid) else { continue };
                let (allowed, privilege) = match needs {
                    Needs::Ownership => (catalog::owns(relid), ""),
                    Needs::Privilege(acl, privilege) => (catalog::has_privilege(relid, acl), privilege),
                };
                if !allowed {
                    IdError::NotOwnerOfOurs { kind, name, privilege }.raise()
                }
            }
        }
    }
}

/// The table a foreign key in `node` (a table constraint, or a column
/// definition's constraints) references: locked (ShareRowExclusiveLock)
/// before the REFERENCES privilege is checked.
///
/// # Safety
/// `node` is NULL or a parse tree node.
unsafe fn referenced(node: *mut pg_sys::Node, named: &mut Vec<(*mut pg_sys::RangeVar, Needs)>) {
    // SAFETY: each node is read as the type its tag says.
    unsafe {
        if node.is_null() {
            return;
        }
        let constraints = match (*node).type_ {
            pg_sys::NodeTag::T_Constraint => vec![node.cast::<std::ffi::c_void>()],
            pg_sys::NodeTag::T_ColumnDef => list((*node.cast::<pg_sys::ColumnDef>()).constraints),
            _ => return,
        };
        for c in constraints {
            let c = &*c.cast::<pg_sys::Constraint>();
            if c.type_ == pg_sys::NodeTag::T_Constraint && c.contype == pg_sys::ConstrType::CONSTR_FOREIGN {
                named.push((c.pktable, Needs::Privilege(pg_sys::ACL_REFERENCES, "REFERENCES")));
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
