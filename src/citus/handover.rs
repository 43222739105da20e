//! Handing a logical shard from the node that minted it to the node that
//! now holds its schema's data, so that no two nodes ever mint it at once
//! and the new holder's first ID is above the old holder's last, whatever
//! their clocks say.
//!
//! The coordinator arbitrates: it keeps, per database, a record of which
//! node group last took each shard and the ID above which that node mints
//! (`pg_idgen_citus.<database OID>` in its data directory). A node that the
//! metadata names as a schema's holder, and that has not taken its shard,
//! asks the coordinator (`citus_shard_take`): under a lock on the shard,
//! the coordinator has the previous holder release it
//! (`citus_shard_release`: its generator stops at once, in every backend,
//! and it answers an ID above every one it minted), records the new holder
//! with that ID, and answers it; the new holder raises its generator above
//! it, and records in its own file that it took the shard (so that it goes
//! on minting it after a restart, with the coordinator down too). With no
//! record, the previous holder is the coordinator, which minted every shard
//! before (0.5.0) and still mints every shard no distributed schema holds.
//!
//! The records are files, not tables: a hand-over happens inside a
//! statement that mints, which may roll back, while what the release did
//! on the other node cannot be undone.

use pgrx::prelude::*;

use super::libpq::{self, Addr, Request};
use super::metadata;
use crate::backend::BackendLocal;
use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};
use crate::{catalog, fleet};

/// One line of a record: shard `shard` was taken by node group `group`
/// (at `addr`), which mints it above `after`; on a worker, `schema` is the
/// OID of the schema it took it for.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub shard: i32,
    pub group: i32,
    pub addr: Addr,
    pub after: i64,
    pub schema: u32,
}

const FILE_PREFIX: &str = "pg_idgen_citus.";
const LOCK_FILE: &str = "pg_idgen_citus.lock";

fn path() -> String {
    // SAFETY: MyDatabaseId is set once a backend has connected.
    format!("{FILE_PREFIX}{}", unsafe { pg_sys::MyDatabaseId }.to_u32())
}

fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.splitn(6, ' ');
            Some(Entry {
                shard: f.next()?.parse().ok()?,
                group: f.next()?.parse().ok()?,
                addr: Addr { port: f.next()?.parse().ok()?, host: String::new() },
                after: f.next()?.parse().ok()?,
                schema: f.next()?.parse().ok()?,
            })
            .map(|mut e| {
                e.addr.host = line.splitn(6, ' ').nth(5).unwrap_or_default().to_owned();
                e
            })
        })
        .collect()
}

/// The record as the file holds it now.
fn read() -> Vec<Entry> {
    std::fs::read_to_string(path()).map(|t| parse(&t)).unwrap_or_default()
}

/// Changes the record with `change`, under a lock every writer takes: read,
/// written anew under a name of this process's, synced and renamed into place.
fn write(change: impl FnOnce(&mut Vec<Entry>)) {
    let path = path();
    let written = (|| -> std::io::Result<()> {
        let lock = std::fs::File::options().create(true).truncate(false).write(true).open(LOCK_FILE)?;
        lock.lock()?;
        let mut entries = read();
        change(&mut entries);
        let text: String =
            entries.iter().map(|e| format!("{} {} {} {} {} {}\n", e.shard, e.group, e.addr.port, e.after, e.schema, e.addr.host)).collect();
        let tmp = format!("{path}.tmp{}", std::process::id());
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(".")?.sync_all()
    })();
    if let Err(e) = written {
        IdError::Internal(format!("could not write file \"{path}\": {e}")).raise()
    }
    forget();
}

/// The backend's copy of this node's record.
static ENTRIES: BackendLocal<Option<Vec<Entry>>> = BackendLocal::new(None);

/// The record's entry for `shard` (read once per backend, again after `forget`).
pub fn entry(shard: i32) -> Option<Entry> {
    let mut e = ENTRIES.borrow_mut();
    e.get_or_insert_with(read).iter().find(|e| e.shard == shard).cloned()
}

/// The entry of the shard this (worker) node took for schema `schema`.
pub fn entry_for_schema(schema: pg_sys::Oid) -> Option<Entry> {
    let mut e = ENTRIES.borrow_mut();
    e.get_or_insert_with(read).iter().find(|e| e.schema == schema.to_u32()).cloned()
}

/// Makes the next lookup read the record again.
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

/// On the coordinator: hands the shard registered for `schema` to the node
/// that holds the schema's data (the coordinator when none does), and
/// answers (shard, the ID above which that node mints it, its group).
pub fn take(schema: &str) -> (Shard, i64, i32) {
    let shard = match metadata::registered_shard(schema) {
        Some(s) => Shard::new(s).or_raise(),
        None if catalog::schema_oid(schema).is_none() => IdError::SchemaMissing(schema.into()).raise(),
        None => IdError::SchemaNotRegistered(schema.into()).raise(),
    };
    let (group, addr) = match metadata::look_up_holder(schema) {
        Some(h) => (h.group, h.addr),
        None => (0, Addr { host: String::new(), port: 0 }),
    };
    let after = hand_over(shard, group, addr);
    (shard, after, group)
}

/// On the coordinator: makes node group `group` (at `addr`) the one that
/// mints `shard`, releasing it where it was minted before; returns the ID
/// above which it mints.
pub fn hand_over(shard: Shard, group: i32, addr: Addr) -> i64 {
    lock(shard);
    forget();
    let prev = entry(shard.index() as i32);
    let after = match &prev {
        Some(e) if e.group == group => e.after,
        // The coordinator minted it: it stops at once, for good.
        None | Some(Entry { group: 0, .. }) => fleet::high_water(shard, fleet::retire_for_good(shard)),
        Some(e) => {
            let sql = format!("SELECT {}($1::pg_catalog.int4)", catalog::qualified("citus_shard_release"));
            let what = || format!("the Citus node that last minted shard {}", shard.index());
            let rows = libpq::call(&e.addr, &Request::Sql { sql, params: vec![shard.index().to_string()] }, "citus_shard_take", &what);
            rows.first().and_then(|r| r.first().cloned().flatten()).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                IdError::Internal(format!("node {} answered no ID for the release of shard {}", e.addr.describe(), shard.index())).raise()
            })
        }
    };
    if prev.as_ref().is_none_or(|e| e.group != group) {
        let entry = Entry { shard: shard.index() as i32, group, addr, after, schema: 0 };
        write(|entries| {
            entries.retain(|e| e.shard != entry.shard);
            entries.push(entry);
        });
    }
    if group == 0 {
        fleet::raise_above(shard, after);
    }
    unlock(shard);
    after
}

/// On a worker: mints `shard` from now on for schema `schema`, above `after`
/// (what the coordinator's `take` answered).
pub fn adopt(shard: Shard, after: i64, group: i32, schema: pg_sys::Oid) {
    lock(shard);
    fleet::raise_above(shard, after);
    let entry = Entry { shard: shard.index() as i32, group, addr: Addr { host: String::new(), port: 0 }, after, schema: schema.to_u32() };
    write(|entries| {
        entries.retain(|e| e.shard != entry.shard);
        entries.push(entry);
    });
    unlock(shard);
}

/// On a worker: stops minting `shard`, for good, unless this node holds the
/// data of the schema it took the shard for; returns an ID above every ID
/// it minted for it.
fn release(shard: Shard) -> i64 {
    let Some(place) = metadata::place() else { IdError::CitusNotANode("citus_shard_release").raise() };
    if place.group == 0 {
        IdError::CitusOnCoordinator("citus_shard_release").raise()
    }
    lock(shard);
    forget();
    if let Some(e) = entry(shard.index() as i32) {
        if let Some(name) = catalog::schema_name(pg_sys::Oid::from(e.schema)) {
            if metadata::look_up_holder(&name).is_some_and(|h| h.group == place.group) {
                IdError::CitusStillHolds { shard: shard.index() as i32, schema: name }.raise()
            }
        }
    }
    let after = fleet::high_water(shard, fleet::retire_for_good(shard));
    write(|entries| entries.retain(|e| e.shard != shard.index() as i32));
    unlock(shard);
    after
}

/// Hands the shard registered for a distributed schema to the Citus node
/// that holds the schema's data; run on the coordinator by that node.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_shard_take(
    schema_name: &str,
) -> TableIterator<'static, (name!(shard, i32), name!(after, i64), name!(holder_group, i32))> {
    crate::mark::check_writable("citus_shard_take");
    match metadata::place() {
        Some(p) if p.group == 0 => {}
        Some(_) => IdError::CitusWorker("citus_shard_take").raise(),
        None => IdError::CitusNotANode("citus_shard_take").raise(),
    }
    let (shard, after, group) = take(schema_name);
    TableIterator::once((shard.index() as i32, after, group))
}

/// Stops a Citus worker minting a shard whose schema's data it no longer
/// holds, and returns an ID above every ID it minted for it; run by the
/// coordinator during a hand-over.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_shard_release(shard: i32) -> i64 {
    let shard = Shard::new(shard).or_raise();
    crate::mark::check_writable("citus_shard_release");
    release(shard)
}
