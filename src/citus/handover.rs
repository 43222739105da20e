//! Handing a logical shard from the node that minted it to the node that
//! now holds its schema's data, so that no two nodes ever mint it at once
//! and the new holder's first ID is above the old holder's last, whatever
//! their clocks say.
//!
//! The coordinator arbitrates. Its table `citus_shard_holders` records, per
//! shard handed over, the node group that mints it, the ID above which it
//! mints, and the hand-over's number (no row: the coordinator mints it, as
//! it minted every shard before 0.6.0). A node that the metadata names as a
//! schema's holder, and that has not taken its shard, asks the coordinator
//! (`citus_shard_take`, as the extension's owner). Under a lock on the
//! shard, the coordinator has the previous holder release it
//! (`citus_shard_release`: its generator stops at once, in every backend,
//! and it answers an ID above every ID it minted), records the new holder
//! above both that ID and the one the previous holder was given (which it
//! may never have applied), and answers. The new holder then raises its
//! generator above that ID and files, in its data directory, that it took
//! the shard in that hand-over (`pg_idgen/citus.<database OID>`), so that it
//! goes on minting it after a restart, with the coordinator down too.
//!
//! A release leaves its hand-over's number in the released node's file, and
//! a node adopts a shard only for a hand-over later than any that released
//! it: an answer that arrives after the shard has moved on is refused. A
//! node that lost its file asks again and is given the recorded ID again.

use std::collections::HashMap;

use pgrx::prelude::*;

use super::libpq;
use super::metadata::Addr;
use super::metadata;
use crate::backend::BackendLocal;
pub use crate::core::handover::Entry;
use crate::core::handover::{parse, set};
use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};
use crate::{catalog, datafiles, fleet};

extension_sql_file!("../../sql/citus.sql", name = "citus", requires = [catalog::pg_idgen_table_changed]);

/// The file of a database's hand-overs, in pg_idgen's directory of the
/// data directory (see `datafiles`).
fn name() -> String {
    // SAFETY: MyDatabaseId is set once a backend has connected.
    format!("citus.{}", unsafe { pg_sys::MyDatabaseId }.to_u32())
}

/// The file as it is now.
fn read() -> Vec<Entry> {
    datafiles::read(&name()).map(|t| parse(&t)).unwrap_or_default()
}

/// Sets the file's entry for `entry.shard`, under the lock every writer of
/// pg_idgen's files takes.
fn write(entry: Entry) {
    datafiles::update(&name(), |now| Some(set(now.as_deref().unwrap_or_default(), entry)));
    forget();
}

/// The backend's copy of this node's file.
static ENTRIES: BackendLocal<Option<Vec<Entry>>> = BackendLocal::new(None);

fn find(f: impl Fn(&Entry) -> bool) -> Option<Entry> {
    let mut e = ENTRIES.borrow_mut();
    e.get_or_insert_with(read).iter().find(|e| f(e)).cloned()
}

/// The shard this (worker) node holds for `shard`, if it took it.
pub fn held(shard: i32) -> Option<Entry> {
    find(|e| e.shard == shard && e.held)
}

/// The shard this (worker) node took for the schema of OID `schema`.
pub fn held_for_schema(schema: pg_sys::Oid) -> Option<Entry> {
    find(|e| e.schema == schema.to_u32() && e.held)
}

/// Makes the next lookup read the file again.
pub fn forget() {
    *ENTRIES.borrow_mut() = None;
}

/// An exclusive lock on handing `shard` over in this database, which no
/// SQL function can take (an advisory tag of a class of its own): hand-overs
/// of one shard queue behind each other, cancellably. Released by
/// [`unlock`], or by the end of the transaction if an error comes first.
fn tag(shard: Shard) -> pg_sys::LOCKTAG {
    pg_sys::LOCKTAG {
        // SAFETY: MyDatabaseId is set once a backend has connected.
        locktag_field1: unsafe { pg_sys::MyDatabaseId }.to_u32(),
        locktag_field2: 0x7067_6964, // "pgid"
        locktag_field3: shard.index() as u32,
        locktag_field4: 0x6964,
        locktag_type: pg_sys::LockTagType::LOCKTAG_ADVISORY as u8,
        locktag_lockmethodid: pg_sys::DEFAULT_LOCKMETHOD as u8,
    }
}

fn lock(shard: Shard) {
    let tag = tag(shard);
    // SAFETY: a transaction lock on a tag of our own; waiting is cancellable.
    unsafe { pg_sys::LockAcquire(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false, false) };
}

fn unlock(shard: Shard) {
    let tag = tag(shard);
    // SAFETY: releases the lock `lock` took in this transaction.
    unsafe { pg_sys::LockRelease(&tag, pg_sys::ExclusiveLock as pg_sys::LOCKMODE, false) };
}

/// A hand-over as the coordinator answers it: the shard, the ID above
/// which its holder mints (none: the coordinator mints it, never handed
/// over), the holder's node group and the hand-over's number.
pub struct Taken {
    pub shard: Shard,
    pub after: Option<i64>,
    pub group: i32,
    pub handover: i64,
}

/// The coordinator's record of a shard: (group, host, port, after, hand-over).
fn recorded(shard: Shard) -> Option<(i32, Addr, i64, i64)> {
    if catalog::relation(c"citus_shard_holders").is_none() {
        IdError::NotUpdated(catalog::extension_version()).raise()
    }
    let sql = format!(
        "SELECT holder_group::pg_catalog.text, holder_host, holder_port::pg_catalog.text, after::pg_catalog.text, handover::pg_catalog.text
           FROM {} WHERE shard OPERATOR(pg_catalog.=) $1::pg_catalog.int4",
        catalog::qualified("citus_shard_holders")
    );
    let row = catalog::as_superuser(|| catalog::query_text_rows_now(&sql, &[&shard.index().to_string()])).into_iter().next()?;
    match &row[..] {
        [Some(g), Some(host), Some(port), Some(after), Some(n)] => Some((
            g.parse().ok()?,
            Addr { host: host.clone(), port: port.parse().ok()? },
            after.parse().ok()?,
            n.parse().ok()?,
        )),
        _ => None,
    }
}

/// The node group the coordinator's record names for `shard` (0: itself),
/// from the backend's copy of the record, read again after it changed.
pub fn recorded_group(shard: Shard) -> i32 {
    static RECORD: BackendLocal<Option<(u64, HashMap<i32, i32>)>> = BackendLocal::new(None);
    let generation = catalog::generation();
    let mut r = RECORD.borrow_mut();
    if r.as_ref().is_none_or(|(g, _)| *g != generation) {
        let sql = format!("SELECT shard::pg_catalog.text, holder_group::pg_catalog.text FROM {}", catalog::qualified("citus_shard_holders"));
        let rows = match catalog::relation(c"citus_shard_holders") {
            Some(_) => catalog::as_superuser(|| catalog::query_text_rows_now(&sql, &[])),
            None => vec![],
        };
        let map = rows
            .into_iter()
            .filter_map(|row| match &row[..] {
                [Some(s), Some(g)] => Some((s.parse().ok()?, g.parse().ok()?)),
                _ => None,
            })
            .collect();
        *r = Some((generation, map));
    }
    r.as_ref().and_then(|(_, m)| m.get(&(shard.index() as i32)).copied()).unwrap_or(0)
}

/// On the coordinator: hands the shard registered for `schema` to the node
/// that holds the schema's data (the coordinator when none does); a fresh
/// hand-over numbered at least `renew` even to the node already recorded
/// (one whose release was never recorded, as the transaction that released
/// it rolled back, asks so).
pub fn take(schema: &str, renew: Option<i64>) -> Taken {
    let shard = match metadata::registered_shard(schema) {
        Some(s) => Shard::new(s).or_raise(),
        None if catalog::schema_oid(schema).is_none() => IdError::SchemaMissing(schema.into()).raise(),
        None => IdError::SchemaNotRegistered(schema.into()).raise(),
    };
    // A node group's own shard is never handed to a schema's holder.
    if let (Some(group), true) = (crate::core::route::node_group_of(shard.index() as i32), metadata::node_shards()) {
        IdError::CitusNodeShard { shard: shard.index() as i32, group }.raise()
    }
    hand_over(shard, metadata::look_up_holder(schema), renew)
}

/// On the coordinator: hands `shard` to the node holding the data of the
/// schema registered for it, or to the coordinator itself (no schema, or
/// not a distributed one), afresh if `renew` (a coordinator whose own
/// release was rolled back).
fn take_back(shard: Shard, renew: bool) -> Taken {
    let holder = metadata::registered_schema(shard.index() as i32).and_then(|s| metadata::look_up_holder(&s));
    hand_over(shard, holder, renew.then_some(0))
}

/// On the coordinator, in a transaction of its own (a session a node opened
/// for the hand-over, never a caller's): makes the node holding the data
/// (`holder`; the coordinator when none does) the one that mints `shard`,
/// releasing it where it was minted before. The lock is held, and the record written, until the transaction
/// ends: a hand-over that rolls back leaves the record as it was, and the
/// next one releases the same node again, which answers at least as much.
fn hand_over(shard: Shard, holder: Option<metadata::Holder>, renew: Option<i64>) -> Taken {
    let (group, addr) = holder.map_or((0, Addr { host: String::new(), port: 0 }), |h| (h.group, h.addr));
    lock(shard);
    let prev = recorded(shard);
    let (prev_group, prev_after, prev_handover) = prev.as_ref().map_or((0, None, 0), |(g, _, a, n)| (*g, Some(*a), *n));
    if prev_group == group && renew.is_none_or(|n| n <= prev_handover) {
        return Taken { shard, after: prev_after, group, handover: prev_handover };
    }
    let handover = (prev_handover + 1).max(renew.unwrap_or(0));
    let released = match &prev {
        // The coordinator minted it: it stops at once, for good.
        None | Some((0, ..)) => fleet::retire_above_all(shard, true),
        Some((_, from, _, _)) => {
            let sql = format!("SELECT {}($1::pg_catalog.int4, $2::pg_catalog.int8)", catalog::qualified("citus_shard_release"));
            let what = || format!("the Citus node that last minted shard {}", shard.index());
            let params = [shard.index().to_string(), handover.to_string()];
            let rows = libpq::call(from, &sql, &params, "citus_shard_take", &what);
            rows.first().and_then(|r| r.first().cloned().flatten()).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                IdError::Internal(format!("node {} answered no ID for the release of shard {}", from.describe(), shard.index())).raise()
            })
        }
    };
    // The previous holder was given `prev_after`, and may never have raised
    // its generator above it (it failed or was cancelled before it did).
    let after = prev_after.map_or(released, |a| a.max(released));
    catalog::as_superuser(|| {
        catalog::run(
            &format!(
                "INSERT INTO {} (shard, holder_group, holder_host, holder_port, after, handover) VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (shard) DO UPDATE SET holder_group = excluded.holder_group, holder_host = excluded.holder_host,
                     holder_port = excluded.holder_port, after = excluded.after, handover = excluded.handover, taken_at = now()",
                catalog::qualified("citus_shard_holders")
            ),
            &[(shard.index() as i32).into(), group.into(), addr.host.as_str().into(), addr.port.into(), after.into(), handover.into()],
        )
    });
    if group == 0 {
        fleet::raise_above(shard, after);
    }
    Taken { shard, after: Some(after), group, handover }
}

/// What a node asks the coordinator: the shard of a schema whose data it
/// holds (afresh, numbered at least this, when its own release was never
/// recorded), or, the coordinator itself, a shard back (afresh, when its
/// own release was never recorded).
pub enum Ask<'a> {
    Schema(&'a str, Option<i64>),
    Back(Shard, bool),
}

/// Asks the coordinator at `coordinator` for a hand-over, in a session of
/// its own as the extension's owner (committed before the answer is used).
pub fn ask(coordinator: &Addr, what: Ask<'_>, function: &'static str) -> Taken {
    let columns = "shard::pg_catalog.text, after::pg_catalog.text, holder_group::pg_catalog.text, handover::pg_catalog.text";
    let (sql, params) = match what {
        Ask::Schema(name, renew) => (
            format!("SELECT {columns} FROM {}($1::pg_catalog.text, $2::pg_catalog.int8)", catalog::qualified("citus_shard_take")),
            vec![name.to_string(), renew.unwrap_or(0).to_string()],
        ),
        Ask::Back(shard, renew) => (
            format!("SELECT {columns} FROM {}($1::pg_catalog.int4, $2::pg_catalog.bool)", catalog::qualified("citus_shard_take_back")),
            vec![shard.index().to_string(), renew.to_string()],
        ),
    };
    let who = || "the Citus coordinator".to_string();
    let rows = libpq::call(coordinator, &sql, &params, function, &who);
    let taken = rows.first().and_then(|r| match &r[..] {
        [Some(s), a, Some(g), Some(n)] => Some(Taken {
            shard: Shard::new(s.parse().ok()?).ok()?,
            after: a.as_ref().and_then(|a| a.parse().ok()),
            group: g.parse().ok()?,
            handover: n.parse().ok()?,
        }),
        _ => None,
    });
    // The coordinator's record changed: read it again (on the coordinator).
    catalog::accept_invalidations();
    taken.unwrap_or_else(|| IdError::Internal("the coordinator answered no hand-over".into()).raise())
}

/// The number of the hand-over that released `shard` here, if one did.
pub fn released_in(shard: i32) -> Option<i64> {
    find(|e| e.shard == shard && !e.held).map(|e| e.handover)
}

/// On a worker: mints `taken.shard` from now on for schema `schema`, above
/// `taken.after`; false (nothing done) if a later hand-over released it
/// here already.
pub fn adopt(taken: &Taken, schema: pg_sys::Oid) -> bool {
    lock(taken.shard);
    let index = taken.shard.index() as i32;
    forget();
    if find(|e| e.shard == index && !e.held && e.handover > taken.handover).is_some() {
        unlock(taken.shard);
        return false;
    }
    if let Some(after) = taken.after {
        fleet::raise_above(taken.shard, after);
    }
    write(Entry { shard: index, handover: taken.handover, held: true, after: taken.after.unwrap_or(0), schema: schema.to_u32() });
    unlock(taken.shard);
    true
}

/// On a worker: stops minting `shard`, for good, in hand-over `handover`,
/// unless this node holds the data of the schema it took the shard for;
/// returns an ID above every ID it minted for it.
fn release(shard: Shard, handover: i64) -> i64 {
    let place = metadata::on_worker_only("citus_shard_release");
    lock(shard);
    forget();
    let index = shard.index() as i32;
    let held = held(index);
    if let Some(e) = &held {
        if let Some(name) = catalog::schema_name(pg_sys::Oid::from(e.schema)) {
            if metadata::look_up_holder(&name).is_some_and(|h| h.group == place.group) {
                IdError::CitusStillHolds { shard: index, schema: name }.raise()
            }
        }
    }
    let after = fleet::retire_above_all(shard, true);
    let schema = held.map_or(0, |e| e.schema);
    write(Entry { shard: index, handover, held: false, after, schema });
    unlock(shard);
    after
}

/// Hands the shard registered for a distributed schema to the Citus node
/// that holds the schema's data; run on the coordinator by that node.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_shard_take(schema_name: &str, renew_from: default!(i64, 0)) -> TableIterator<'static, (name!(shard, i32), name!(after, Option<i64>), name!(holder_group, i32), name!(handover, i64))> {
    metadata::on_coordinator_only("citus_shard_take");
    let t = take(schema_name, (renew_from > 0).then_some(renew_from));
    TableIterator::once((t.shard.index() as i32, t.after, t.group, t.handover))
}

/// Hands a shard back to the Citus coordinator, or to the node holding the
/// data of the schema registered for it; run by the coordinator itself,
/// in a session of its own, before it mints a shard a worker took.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_shard_take_back(logical_shard: i32, renew: default!(bool, false)) -> TableIterator<'static, (name!(shard, i32), name!(after, Option<i64>), name!(holder_group, i32), name!(handover, i64))> {
    metadata::on_coordinator_only("citus_shard_take_back");
    let t = take_back(Shard::new(logical_shard).or_raise(), renew);
    TableIterator::once((t.shard.index() as i32, t.after, t.group, t.handover))
}

/// Stops a Citus worker minting a shard whose schema's data it no longer
/// holds, and returns an ID above every ID it minted for it; run by the
/// coordinator during hand-over `handover`.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_shard_release(shard: i32, handover: i64) -> i64 {
    let shard = Shard::new(shard).or_raise();
    release(shard, handover)
}
