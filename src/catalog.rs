//! The one door to the catalog: every lookup pg_idgen makes of its own
//! objects and of PostgreSQL's goes through here.
//!
//! Names are never resolved under the caller's `search_path`. Our own
//! objects are found by catalog C APIs (the extension's schema from
//! `pg_extension`, relations with `get_relname_relid`, functions by the
//! syscache, by name, argument types and schema OID); where SQL is needed, it names
//! every relation with its schema, every function and operator with
//! `pg_catalog`, and runs under `search_path = pg_catalog, pg_temp`, so a
//! caller's functions, operators and casts can never be picked up (nor
//! cached for a later caller).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::errors::{IdError, OrRaise};

const EXTENSION: &CStr = c"pg_idgen";

/// Runs `f` with `search_path` set to `pg_catalog, pg_temp`, as a function
/// with a `SET search_path` clause does; restored when `f` returns, and by
/// the (sub)transaction's abort when it raises.
fn pinned<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: the GUC nest-level protocol of fmgr_security_definer.
    let nest = unsafe {
        let nest = pg_sys::NewGUCNestLevel();
        pg_sys::set_config_option(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_USERSET,
            pg_sys::GucSource::PGC_S_SESSION,
            pg_sys::GucAction::GUC_ACTION_SAVE,
            true,
            0,
            false,
        );
        nest
    };
    let result = f();
    // SAFETY: pops exactly the level pushed above.
    unsafe { pg_sys::AtEOXact_GUC(true, nest) };
    result
}

/// The first column of the first row of a read-only query; None for no row
/// or NULL. Unlike `Spi::get_one`, it never assigns a transaction ID, so it
/// also runs on a hot standby.
pub fn query_one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid<'_>]) -> Option<T> {
    pinned(|| {
        Spi::connect(|c| match c.select(sql, Some(1), args).or_raise().next() {
            Some(row) => row.get::<T>(1).or_raise(),
            None => None,
        })
    })
}

/// Every row of a read-only query, as text, read under a snapshot taken now
/// rather than the transaction's or the statement's: it sees what other
/// sessions committed since those began. For state that decides where IDs
/// are minted (Citus's metadata, when a node joins), which must never be
/// read as it was. `args` are `$1`, `$2`... as text.
pub fn query_text_rows_now(sql: &str, args: &[&str]) -> Vec<Vec<Option<String>>> {
    // SQL text never holds a NUL byte.
    let sql = std::ffi::CString::new(sql).unwrap_or_default();
    pinned(|| {
        Spi::connect(|_| {
            let mut types = vec![pg_sys::TEXTOID; args.len()];
            let mut values: Vec<pg_sys::Datum> = args.iter().map(|a| a.into_datum().unwrap_or_else(|| pg_sys::Datum::from(0))).collect();
            // SAFETY: SPI is connected for this closure; the plan, the
            // snapshot and the result table live until SPI_finish, and every
            // value is copied out before then; `types` and `values` hold one
            // entry per argument and outlive the execution.
            unsafe {
                let plan = pg_sys::SPI_prepare(sql.as_ptr(), args.len() as i32, types.as_mut_ptr());
                if plan.is_null() {
                    let code = pg_sys::SPI_result;
                    IdError::Internal(format!("SPI_prepare failed: {code}")).raise()
                }
                let snapshot = pg_sys::GetLatestSnapshot();
                let rc = pg_sys::SPI_execute_snapshot(plan, values.as_mut_ptr(), std::ptr::null(), snapshot, std::ptr::null_mut(), true, false, 0);
                if rc != pg_sys::SPI_OK_SELECT as i32 {
                    IdError::Internal(format!("SPI_execute_snapshot returned {rc}")).raise()
                }
                let table = pg_sys::SPI_tuptable;
                let columns = (*(*table).tupdesc).natts;
                (0..pg_sys::SPI_processed as usize)
                    .map(|i| {
                        let tuple = *(*table).vals.add(i);
                        (1..=columns)
                            .map(|f| {
                                let v = pg_sys::SPI_getvalue(tuple, (*table).tupdesc, f);
                                (!v.is_null()).then(|| CStr::from_ptr(v).to_string_lossy().into_owned())
                            })
                            .collect()
                    })
                    .collect()
            }
        })
    })
}

/// Runs `f` under a snapshot taken now, pushed as the active one: it sees
/// every change committed before (and this transaction's own), and lets SPI
/// run where no statement's snapshot is active (at pre-commit).
pub fn with_latest_snapshot<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: a fresh snapshot, pushed here and popped below (an error in
    // between is cleaned up by the transaction's abort).
    unsafe { pg_sys::PushActiveSnapshot(pg_sys::GetLatestSnapshot()) };
    let result = f();
    // SAFETY: pops the snapshot pushed above.
    unsafe { pg_sys::PopActiveSnapshot() };
    result
}

/// Runs `f` with the bootstrap superuser's rights, for state of the
/// extension's that users who mint need no privileges on (nor may they
/// change it): the mark sequence, the Citus hand-over record. Only pinned,
/// fully qualified SQL runs inside (see above), so no object of the
/// caller's can run with these rights.
pub fn as_superuser<T>(f: impl FnOnce() -> T) -> T {
    let (mut user, mut context) = (pg_sys::InvalidOid, 0);
    // SAFETY: saves and switches the current user the way PostgreSQL's own
    // maintenance code does; an error on the way is undone by the
    // (sub)transaction abort, which restores the user saved at its start.
    unsafe {
        pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
        pg_sys::SetUserIdAndSecContext(
            pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID),
            context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32,
        );
    }
    let result = f();
    // SAFETY: restores exactly what was saved above.
    unsafe { pg_sys::SetUserIdAndSecContext(user, context) };
    result
}

/// Runs a statement that may write.
pub fn run(sql: &str, args: &[DatumWithOid<'_>]) {
    pinned(|| Spi::run_with_args(sql, args).or_raise())
}

/// An identifier quoted for SQL, as `quote_ident` would.
pub fn quote(ident: &str) -> String {
    let Ok(c) = CString::new(ident) else { return format!("\"{}\"", ident.replace('"', "\"\"")) };
    // SAFETY: quote_identifier returns its argument or a palloc'd copy, both NUL-terminated.
    unsafe { CStr::from_ptr(pg_sys::quote_identifier(c.as_ptr())) }.to_string_lossy().into_owned()
}

/// The schema of the extension in this database, if it is installed.
/// Cached until the next catalog change.
pub fn extension_schema() -> Option<pg_sys::Oid> {
    static CACHE: BackendLocal<(u64, Option<pg_sys::Oid>)> = BackendLocal::new((0, None));
    let generation = generation();
    let (seen, nsp) = CACHE.get();
    if seen == generation {
        return nsp;
    }
    let nsp = scan_extension().map(|(nsp, _)| nsp);
    CACHE.set((generation, nsp));
    nsp
}

/// The role that owns the extension in this database (the bootstrap
/// superuser if it is not installed).
pub fn extension_owner() -> pg_sys::Oid {
    scan_extension().map_or(pg_sys::Oid::from(pg_sys::BOOTSTRAP_SUPERUSERID), |(_, owner)| owner)
}

/// Whether an extension is installed in this database.
pub fn extension_installed(name: &CStr) -> bool {
    // SAFETY: a catalog lookup by name; missing_ok.
    unsafe { pg_sys::get_extension_oid(name.as_ptr(), true) != pg_sys::InvalidOid }
}

/// `pg_extension.extnamespace` and `extowner` of pg_idgen, by an index
/// scan (PostgreSQL 15 does not export `get_extension_schema`).
fn scan_extension() -> Option<(pg_sys::Oid, pg_sys::Oid)> {
    // SAFETY: the scan get_extension_oid makes, reading one column of the
    // tuple it returns while the scan (and so the tuple) is still open.
    unsafe {
        let rel = pg_sys::table_open(pg_sys::ExtensionRelationId, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        let mut key: pg_sys::ScanKeyData = std::mem::zeroed();
        pg_sys::ScanKeyInit(
            &mut key,
            pg_sys::Anum_pg_extension_extname as pg_sys::AttrNumber,
            pg_sys::BTEqualStrategyNumber as pg_sys::StrategyNumber,
            pg_sys::Oid::from(pg_sys::F_NAMEEQ),
            pg_sys::Datum::from(EXTENSION.as_ptr()),
        );
        let scan = pg_sys::systable_beginscan(rel, pg_sys::Oid::from(pg_sys::ExtensionNameIndexId), true, std::ptr::null_mut(), 1, &mut key);
        let tuple = pg_sys::systable_getnext(scan);
        let found = (!tuple.is_null()).then(|| {
            let e = &*pg_sys::heap_tuple_get_struct::<pg_sys::FormData_pg_extension>(tuple);
            (e.extnamespace, e.extowner)
        });
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE);
        found
    }
}

/// Refuses a name no schema can have (empty: 42602, too long: 42622), before PostgreSQL would truncate it.
pub fn check_schema_name(name: &str) {
    if name.is_empty() || name.len() >= pg_sys::NAMEDATALEN as usize {
        IdError::SchemaNameInvalid(name.into()).raise()
    }
}

/// Every relation a statement's name may find, without taking any lock: a
/// qualified name's one relation, and for an unqualified name the relation
/// of that name in each schema of the caller's `search_path` (PostgreSQL
/// looks again after waiting for a lock, and may then find a later one).
pub fn relations_a_name_may_find(rv: *mut pg_sys::RangeVar) -> Vec<pg_sys::Oid> {
    // SAFETY: name lookups with NoLock and missing_ok, which raise nothing
    // for an ordinary name; the search path is a fresh list of OIDs.
    unsafe {
        if !(*rv).schemaname.is_null() || !(*rv).catalogname.is_null() {
            let relid = pg_sys::RangeVarGetRelidExtended(rv, pg_sys::NoLock as pg_sys::LOCKMODE, pg_sys::RVROption::RVR_MISSING_OK, None, std::ptr::null_mut());
            return (relid != pg_sys::InvalidOid).then_some(relid).into_iter().collect();
        }
        let path = pg_sys::fetch_search_path(true);
        let n = if path.is_null() { 0 } else { (*path).length as usize };
        (0..n)
            .map(|i| pg_sys::get_relname_relid((*rv).relname, (*(*path).elements.add(i)).oid_value))
            .filter(|relid| *relid != pg_sys::InvalidOid)
            .collect()
    }
}

/// If `relid` is one of pg_idgen's relations in this database (a table or
/// sequence of the extension, or an index on one), what kind it is and its
/// name, for an error.
pub fn ours(relid: pg_sys::Oid) -> Option<(&'static str, String)> {
    // SAFETY: syscache and pg_depend lookups of an existing OID; each
    // returns InvalidOid or a NUL for a relation that is gone meanwhile.
    unsafe {
        let ext = pg_sys::get_extension_oid(EXTENSION.as_ptr(), true);
        if ext == pg_sys::InvalidOid {
            return None;
        }
        let kind = pg_sys::get_rel_relkind(relid) as u8;
        let member = match kind {
            pg_sys::RELKIND_INDEX | pg_sys::RELKIND_PARTITIONED_INDEX => pg_sys::IndexGetRelation(relid, true),
            _ => relid,
        };
        if member == pg_sys::InvalidOid || pg_sys::getExtensionOfObject(pg_sys::RelationRelationId, member) != ext {
            return None;
        }
        let name = pg_sys::get_rel_name(relid);
        let name = if name.is_null() { return None } else { CStr::from_ptr(name).to_string_lossy().into_owned() };
        let kind = match kind {
            pg_sys::RELKIND_SEQUENCE => "sequence",
            pg_sys::RELKIND_INDEX | pg_sys::RELKIND_PARTITIONED_INDEX => "index",
            _ => "table",
        };
        Some((kind, name))
    }
}

/// The name of `relid` if it is `pg_extension` or one of its indexes.
pub fn extension_catalog(relid: pg_sys::Oid) -> Option<String> {
    let ids = [pg_sys::ExtensionRelationId, pg_sys::Oid::from(pg_sys::ExtensionOidIndexId), pg_sys::Oid::from(pg_sys::ExtensionNameIndexId)];
    // SAFETY: a syscache lookup of an existing OID (NULL if gone).
    ids.contains(&relid).then(|| unsafe {
        let name = pg_sys::get_rel_name(relid);
        if name.is_null() { String::from("pg_extension") } else { CStr::from_ptr(name).to_string_lossy().into_owned() }
    })
}

/// Whether the current user owns relation `relid`.
pub fn owns(relid: pg_sys::Oid) -> bool {
    // SAFETY: an ownership check of an existing OID.
    unsafe {
        #[cfg(feature = "pg15")]
        return pg_sys::pg_class_ownercheck(relid, pg_sys::GetUserId());
        #[cfg(not(feature = "pg15"))]
        return pg_sys::object_ownercheck(pg_sys::RelationRelationId, relid, pg_sys::GetUserId());
    }
}

/// Whether the current user holds privilege `acl` (`pg_sys::ACL_TRIGGER`, ...) on relation `relid`.
pub fn has_privilege(relid: pg_sys::Oid, acl: u32) -> bool {
    // SAFETY: a privilege check of an existing OID.
    unsafe { pg_sys::pg_class_aclcheck(relid, pg_sys::GetUserId(), acl as pg_sys::AclMode) == pg_sys::AclResult::ACLCHECK_OK }
}

/// Whether a relation has a column of this name.
pub fn has_column(rel: pg_sys::Oid, name: &CStr) -> bool {
    // SAFETY: a syscache lookup; InvalidAttrNumber (0) when there is no such column.
    unsafe { pg_sys::get_attnum(rel, name.as_ptr()) != 0 }
}

/// The version of pg_idgen's objects in this database (`pg_extension.extversion`).
pub fn extension_version() -> String {
    query_one("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap_or_default()
}

/// The name of the current database.
pub fn database_name() -> String {
    // SAFETY: MyDatabaseId is set once connected.
    database_name_of(unsafe { pg_sys::MyDatabaseId }.to_u32())
}

/// The name of a database ("" when there is none of that OID).
pub fn database_name_of(dboid: u32) -> String {
    // SAFETY: a lookup in the shared catalog pg_database; a palloc'd copy or NULL.
    unsafe {
        let p = pg_sys::get_database_name(pg_sys::Oid::from(dboid));
        if p.is_null() { String::new() } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
    }
}

/// The first column of the first row of a table of ours whose first column
/// is a NOT NULL `bigint`, read under the active snapshot (the transaction's
/// when none is active) by a scan of the table itself: no SQL, so no check
/// of the current user's rights on the extension's schema, which a role may
/// lack while it runs functions that decode IDs.
pub fn first_bigint(rel: pg_sys::Oid) -> Option<i64> {
    // SAFETY: reads the active snapshot, or takes the transaction's.
    let snapshot = unsafe { if pg_sys::ActiveSnapshotSet() { pg_sys::GetActiveSnapshot() } else { pg_sys::GetTransactionSnapshot() } };
    rows_of(rel, snapshot, Some(1), |row| row.int8(1)).into_iter().next().flatten()
}

/// One row of a table of ours during [`scan`]: its columns by attribute
/// number ([`attnum`]), NULL (or a column the table lacks) as None.
pub struct Row {
    tuple: *mut pg_sys::HeapTupleData,
    desc: pg_sys::TupleDesc,
}

impl Row {
    fn datum(&self, att: i16) -> Option<pg_sys::Datum> {
        let att = std::num::NonZeroUsize::new(usize::try_from(att).ok()?)?;
        // SAFETY: the tuple and its descriptor come from the open scan, which holds the tuple.
        unsafe { pgrx::heap_getattr_raw(self.tuple, att, self.desc) }
    }

    pub fn int4(&self, att: i16) -> Option<i32> {
        self.datum(att).map(|d| d.value() as i32)
    }

    /// A `bigint` (passed by value on the 64-bit platforms pg_idgen builds for).
    pub fn int8(&self, att: i16) -> Option<i64> {
        self.datum(att).map(|d| d.value() as i64)
    }

    pub fn boolean(&self, att: i16) -> Option<bool> {
        self.datum(att).map(|d| d.value() != 0)
    }

    /// A `name` column's text.
    pub fn name(&self, att: i16) -> Option<String> {
        // SAFETY: a name datum points at a NUL-terminated NameData held by the tuple.
        self.datum(att).map(|d| unsafe { CStr::from_ptr(d.cast_mut_ptr::<std::ffi::c_char>()) }.to_string_lossy().into_owned())
    }
}

/// The attribute number of a column of a table of ours. A column renamed
/// or dropped (by hand) is an error, never read as NULL: a release or a
/// claim read as missing would let two servers mint one shard.
pub fn attnum(rel: pg_sys::Oid, column: &CStr) -> i16 {
    // SAFETY: a syscache lookup; InvalidAttrNumber for a missing column.
    let n = unsafe { pg_sys::get_attnum(rel, column.as_ptr()) };
    if n <= 0 {
        // SAFETY: a syscache lookup of an existing relation's name.
        let table = unsafe { pg_sys::get_rel_name(rel) };
        let table = if table.is_null() { "?".into() } else { unsafe { CStr::from_ptr(table) }.to_string_lossy() };
        IdError::Internal(format!("column {} of pg_idgen's table {table} is missing: was the table altered?", column.to_string_lossy()))
            .raise()
    }
    n
}

/// Every row of a table of ours, each given to `f`, read under a snapshot
/// taken now (seeing this transaction's own earlier commands, such as a
/// registration in the same statement; the active one in a parallel
/// operation, where no new snapshot can be taken) by a scan of the table
/// itself: no SQL and no planner, so no lock on the table's indexes. Any
/// role can queue for an AccessExclusiveLock on an index
/// (`ALTER INDEX ... DEPENDS ON EXTENSION` checks ownership only once the
/// lock is granted), and every later reader that plans a query of the table
/// would wait behind it; a scan takes the table's own AccessShareLock only.
pub fn scan<T>(rel: pg_sys::Oid, f: impl FnMut(&Row) -> T) -> Vec<T> {
    // SAFETY: reads or takes a snapshot inside the current transaction.
    let snapshot = unsafe {
        match pg_sys::IsInParallelMode() {
            true if pg_sys::ActiveSnapshotSet() => pg_sys::GetActiveSnapshot(),
            true => pg_sys::GetTransactionSnapshot(),
            false => pg_sys::GetLatestSnapshot(),
        }
    };
    rows_of(rel, snapshot, None, f)
}

/// The rows of a table of ours under `snapshot` (at most `limit`), each given
/// to `f`, by a heap scan under the table's AccessShareLock.
fn rows_of<T>(rel: pg_sys::Oid, snapshot: pg_sys::Snapshot, limit: Option<usize>, mut f: impl FnMut(&Row) -> T) -> Vec<T> {
    let mut rows = Vec::new();
    // SAFETY: opens an existing relation of ours and scans it; each tuple is
    // read while the scan holds it. An error raised by `f` ends the
    // transaction, whose abort closes the scan and the relation.
    unsafe {
        let lock = pg_sys::AccessShareLock as pg_sys::LOCKMODE;
        let table = pg_sys::table_open(rel, lock);
        let scan = pg_sys::systable_beginscan(table, pg_sys::InvalidOid, false, snapshot, 0, std::ptr::null_mut());
        while limit.is_none_or(|n| rows.len() < n) {
            let tuple = pg_sys::systable_getnext(scan);
            if tuple.is_null() {
                break;
            }
            rows.push(f(&Row { tuple, desc: (*table).rd_att }));
        }
        pg_sys::systable_endscan(scan);
        pg_sys::table_close(table, lock);
    }
    rows
}

/// The name of a schema.
pub fn schema_name(nsp: pg_sys::Oid) -> Option<String> {
    // SAFETY: a syscache lookup; NULL for a schema that does not exist.
    let p = unsafe { pg_sys::get_namespace_name(nsp) };
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// An object of the extension, qualified with the extension's schema and
/// quoted for SQL. Raises when the extension is not installed here.
pub fn qualified(object: &str) -> String {
    let schema = extension_schema().and_then(schema_name).ok_or(IdError::NotInstalled).or_raise();
    format!("{}.{}", quote(&schema), quote(object))
}

/// A relation of the extension, by name in the extension's schema.
pub fn relation(name: &CStr) -> Option<pg_sys::Oid> {
    let nsp = extension_schema()?;
    // SAFETY: a syscache lookup; InvalidOid when there is no such relation.
    let oid = unsafe { pg_sys::get_relname_relid(name.as_ptr(), nsp) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// A function of schema `nsp` with exactly these argument types, by the
/// syscache: no `search_path`, and no check of the current user's rights on
/// the schema (the planner hook looks up its own functions on every query of
/// every role, including roles without USAGE on the extension's schema).
pub fn function(nsp: pg_sys::Oid, name: &CStr, args: &[pg_sys::Oid]) -> Option<pg_sys::Oid> {
    // SAFETY: a syscache lookup by (name, argument types, schema) in the
    // current memory context; InvalidOid when there is no such function.
    // A name key may be given as a C string, as core's lookups do.
    let oid = unsafe {
        let argtypes = pg_sys::buildoidvector(args.as_ptr(), args.len() as i32);
        pg_sys::GetSysCacheOid(
            pg_sys::SysCacheIdentifier::PROCNAMEARGSNSP as i32,
            pg_sys::Anum_pg_proc_oid as pg_sys::AttrNumber,
            pg_sys::Datum::from(name.as_ptr()),
            pg_sys::Datum::from(argtypes),
            pg_sys::Datum::from(nsp),
            pg_sys::Datum::from(0),
        )
    };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// Whether the current user may execute a function: the check the executor
/// makes, answered rather than raised.
pub fn may_execute(func: pg_sys::Oid) -> bool {
    // SAFETY: an ACL check of an existing function for the current user.
    #[cfg(feature = "pg15")]
    let result = unsafe { pg_sys::pg_proc_aclcheck(func, pg_sys::GetUserId(), pg_sys::ACL_EXECUTE as pg_sys::AclMode) };
    // SAFETY: the same, under its PostgreSQL 16 name.
    #[cfg(not(feature = "pg15"))]
    let result = unsafe {
        pg_sys::object_aclcheck(pg_sys::ProcedureRelationId, func, pg_sys::GetUserId(), pg_sys::ACL_EXECUTE as pg_sys::AclMode)
    };
    result == pg_sys::AclResult::ACLCHECK_OK
}

/// The function behind an operator (InvalidOid for no such operator).
pub fn operator_function(op: pg_sys::Oid) -> pg_sys::Oid {
    // SAFETY: a syscache lookup; InvalidOid when there is no such operator.
    unsafe { pg_sys::get_opcode(op) }
}

/// A schema's OID, or None when there is no such schema.
pub fn schema_oid(name: &str) -> Option<pg_sys::Oid> {
    let c = CString::new(name).ok()?;
    // SAFETY: a catalog lookup with missing_ok = true; it raises nothing for a missing schema.
    let oid = unsafe { pg_sys::get_namespace_oid(c.as_ptr(), true) };
    (oid != pg_sys::InvalidOid).then_some(oid)
}

/// The OID of a schema that exists now and cannot be dropped until this
/// transaction ends: locked as core locks a schema it creates objects in
/// (DROP SCHEMA waits for the lock), then looked up again, since a drop may
/// have committed while we waited.
pub fn lock_schema(name: &str) -> Option<pg_sys::Oid> {
    let oid = schema_oid(name)?;
    // SAFETY: a shared lock on the schema object; interruptible, seen by
    // the deadlock detector, held until the end of the transaction.
    unsafe {
        pg_sys::LockDatabaseObject(pg_sys::NamespaceRelationId, oid, 0, pg_sys::AccessShareLock as pg_sys::LOCKMODE)
    };
    (schema_oid(name) == Some(oid)).then_some(oid)
}

/// Serializes our functions that change a table of ours: checks first that
/// the current user may make the change (`acl`, such as `ACL_INSERT`), so
/// that a role without the right cannot queue a lock others wait behind,
/// then takes a self-conflicting lock that plain reads and writes of the
/// table (the event triggers' among them) do not wait for. Held until the
/// end of the transaction.
pub fn lock_to_change(name: &CStr, acl: u32) -> pg_sys::Oid {
    let rel = relation(name).ok_or(IdError::NotInstalled).or_raise();
    if !has_privilege(rel, acl) {
        IdError::PermissionDenied(name.to_string_lossy().into_owned()).raise()
    }
    lock(rel, pg_sys::ShareUpdateExclusiveLock);
    rel
}

/// Takes a heavyweight lock on a relation of ours, without the privilege
/// check of `LOCK TABLE`. Released at the end of the transaction (or by `unlock`).
pub fn lock(rel: pg_sys::Oid, mode: u32) {
    // SAFETY: locks an existing relation's OID; interruptible and seen by the deadlock detector.
    unsafe { pg_sys::LockRelationOid(rel, mode as pg_sys::LOCKMODE) };
}

pub fn unlock(rel: pg_sys::Oid, mode: u32) {
    // SAFETY: releases a lock taken by `lock`.
    unsafe { pg_sys::UnlockRelationOid(rel, mode as pg_sys::LOCKMODE) };
}

/// Whether this transaction changed a sequence of ours: `setval`, `nextval`
/// and `ALTER SEQUENCE` take a RowExclusiveLock on it that is held until the
/// transaction ends (so do reads through `pg_sequence_last_value`).
pub fn sequence_touched(seq: pg_sys::Oid) -> bool {
    // SAFETY: MyDatabaseId is set in a connected backend; the tag is built as
    // SET_LOCKTAG_RELATION does, and LockHeldByMe only reads this backend's
    // own lock table.
    unsafe {
        let tag = pg_sys::LOCKTAG {
            locktag_field1: pg_sys::MyDatabaseId.to_u32(),
            locktag_field2: seq.to_u32(),
            locktag_field3: 0,
            locktag_field4: 0,
            locktag_type: pg_sys::LockTagType::LOCKTAG_RELATION as u8,
            locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
        };
        // setval and nextval take RowExclusiveLock; ALTER SEQUENCE a stronger one.
        [pg_sys::RowExclusiveLock, pg_sys::ShareRowExclusiveLock, pg_sys::AccessExclusiveLock].into_iter().any(|mode| {
            #[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16"))]
            let held = pg_sys::LockHeldByMe(&tag, mode as pg_sys::LOCKMODE);
            #[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15", feature = "pg16")))]
            let held = pg_sys::LockHeldByMe(&tag, mode as pg_sys::LOCKMODE, false);
            held
        })
    }
}

/// The last value of a sequence of ours, whether or not it was called (a
/// `setval(v, false)` or `ALTER SEQUENCE ... RESTART WITH v` sets `v` too).
pub fn sequence_value(seq: pg_sys::Oid) -> i64 {
    let relation = query_one::<String>("SELECT pg_catalog.format('%s', $1::pg_catalog.regclass)", &[seq.into()]).unwrap_or_default();
    query_one(&format!("SELECT last_value FROM {relation}"), &[]).unwrap_or(0)
}

/// Sets a sequence of ours (one WAL record, replayed by standbys).
pub fn set_sequence(seq: pg_sys::Oid, value: i64) {
    run("SELECT pg_catalog.setval($1, $2, true)", &[seq.into(), value.into()]);
}

/// Bumped by every relcache invalidation (any change to the registry or
/// claims tables sends one, through their triggers) and by every change to a
/// schema; backend caches of those tables are valid while it stands still.
static GENERATION: AtomicU64 = AtomicU64::new(1);
static CALLBACKS_REGISTERED: AtomicBool = AtomicBool::new(false);

// The callbacks run inside PostgreSQL's invalidation processing: they only
// bump an atomic, which can neither fail nor panic.
unsafe extern "C-unwind" fn invalidate_relcache(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C-unwind" fn invalidate_syscache(_arg: pg_sys::Datum, _cacheid: i32, _hash: u32) {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current cache generation of this backend. Invalidations are rare, and
/// a reload costs one query, so any relcache invalidation counts.
#[inline]
pub fn generation() -> u64 {
    if !CALLBACKS_REGISTERED.load(Ordering::Relaxed) {
        CALLBACKS_REGISTERED.store(true, Ordering::Relaxed);
        // SAFETY: the callbacks only bump an atomic; registered once per
        // process, within PostgreSQL's fixed number of slots.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(invalidate_relcache), pg_sys::Datum::from(0));
            for cache in [pg_sys::SysCacheIdentifier::NAMESPACEOID, pg_sys::SysCacheIdentifier::PROCOID] {
                pg_sys::CacheRegisterSyscacheCallback(cache as i32, Some(invalidate_syscache), pg_sys::Datum::from(0));
            }
        }
    }
    GENERATION.load(Ordering::Relaxed)
}

/// Processes pending invalidation messages, so that changes other backends
/// committed are seen now.
pub fn accept_invalidations() {
    // SAFETY: what every lock acquisition does; no preconditions.
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// Sends a relcache invalidation for the trigger's table on every change, so
/// that every backend drops its cached copy at its next transaction.
#[pg_trigger]
fn pg_idgen_table_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    invalidate(trigger.relation()?.oid());
    Ok(None)
}

/// Makes every backend drop its cached copy of a table of ours at its next transaction.
pub fn invalidate(relid: pg_sys::Oid) {
    // SAFETY: queues an invalidation message for a relation that exists.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
}
