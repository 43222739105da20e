//! What Citus's metadata says: whether this database is a node of a Citus
//! cluster (and which), where its coordinator is, and which node holds
//! each distributed schema's data. Read under a snapshot taken now (a
//! session must see a move or a join committed after it began), cached per
//! backend until the next invalidation.

use std::collections::HashMap;
use std::rc::Rc;

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::catalog;
use crate::errors::IdError;

/// A node, as Citus's metadata names it.
#[derive(Clone, PartialEq, Debug)]
pub struct Addr {
    pub host: String,
    pub port: i32,
}

impl Addr {
    pub fn describe(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// This database's place in a Citus cluster.
#[derive(Clone)]
pub struct Place {
    /// Its node group: 0 for the coordinator.
    pub group: i32,
    /// The coordinator (on the coordinator itself, as the others reach it,
    /// if its own entry is there).
    pub coordinator: Option<Addr>,
    /// Citus lists an active node here: with group 0, Citus's own test of
    /// a coordinator (a node never added, or whose metadata was cleared,
    /// says group 0 too).
    pub in_cluster: bool,
}

/// Where a distributed schema's data is: the node group holding its
/// placement, that node's address, and the schema's OID here.
#[derive(Clone)]
pub struct Holder {
    pub group: i32,
    pub addr: Addr,
    pub schema: pg_sys::Oid,
}

struct Cached {
    generation: u64,
    place: Option<Rc<Place>>,
    holders: HashMap<String, Option<Rc<Holder>>>,
    /// The last name looked up (a table's DEFAULT asks for the same one row after row).
    last: Option<(String, Option<Rc<Holder>>)>,
}

static CACHE: BackendLocal<Option<Cached>> = BackendLocal::new(None);

/// Runs `f` on the cache, emptied first if anything was invalidated since it was filled.
fn cached<T>(f: impl FnOnce(&mut Cached) -> T) -> T {
    let generation = catalog::generation();
    let mut c = CACHE.borrow_mut();
    if c.as_ref().is_none_or(|c| c.generation != generation) {
        // Filled at the generation seen before reading: an invalidation that
        // arrives meanwhile makes it stale again.
        *c = Some(Cached { generation, place: look_up_place().map(Rc::new), holders: HashMap::new(), last: None });
    }
    f(c.as_mut().expect("filled above"))
}

/// This database's place in a Citus cluster; None when it has no citus extension.
pub fn place() -> Option<Rc<Place>> {
    cached(|c| c.place.clone())
}

/// Refuses a function that changes state (a hand-over's, the registry's
/// copy) anywhere but on a writable coordinator.
pub fn on_coordinator_only(function: &'static str) {
    crate::mark::check_writable(function);
    match place() {
        Some(p) if p.group == 0 => {}
        Some(_) => IdError::CitusWorker(function).raise(),
        None => IdError::CitusNotANode(function).raise(),
    }
}

/// The same, for one that runs on writable workers only; this worker's place.
pub fn on_worker_only(function: &'static str) -> Rc<Place> {
    crate::mark::check_writable(function);
    match place() {
        Some(p) if p.group != 0 => p,
        Some(_) => IdError::CitusOnCoordinator(function).raise(),
        None => IdError::CitusNotANode(function).raise(),
    }
}

/// Forgets what was read, so that the next lookup reads the metadata again
/// (after a hand-over showed it stale).
pub fn forget() {
    catalog::accept_invalidations();
    *CACHE.borrow_mut() = None;
}

fn look_up_place() -> Option<Place> {
    if !catalog::extension_installed(c"citus") {
        return None;
    }
    let rows = catalog::query_text_rows_now(
        "SELECT l.groupid::text, n.nodename::text, n.nodeport::text,
                EXISTS (SELECT FROM pg_catalog.pg_dist_node a WHERE a.isactive)::text
            FROM pg_catalog.pg_dist_local_group l
            LEFT JOIN pg_catalog.pg_dist_node n ON n.groupid = 0 AND n.noderole = 'primary'",
        &[],
    );
    let row = rows.into_iter().next()?;
    let group: i32 = row[0].as_deref()?.parse().ok()?;
    let coordinator = match (&row[1], &row[2]) {
        (Some(host), Some(port)) => Some(Addr { host: host.clone(), port: port.parse().unwrap_or_default() }),
        _ if group == 0 => None,
        _ => IdError::CitusNoCoordinator.raise(),
    };
    Some(Place { group, coordinator, in_cluster: row[3].as_deref() == Some("true") })
}

/// Whether node groups mint shards of their own here: the extension's
/// objects in this database are of 0.11.0 or later (updated once every
/// node runs the new library). Kept until the next invalidation.
pub fn node_shards() -> bool {
    static UPDATED: Memo<(), bool> = BackendLocal::new(None);
    memo(&UPDATED, (), || {
        let v: Vec<u32> = catalog::extension_version().split('.').map(|p| p.parse().unwrap_or(0)).collect();
        v >= vec![0, 11, 0]
    })
}

/// Where the data of schema `name` is, if it is a distributed schema with
/// tables (a schema without any has no placement). Shared, not copied:
/// minting asks row after row.
pub fn holder(name: &str) -> Option<Rc<Holder>> {
    cached(|c| {
        if let Some((last, holder)) = &c.last {
            if last == name {
                return holder.clone();
            }
        }
        let holder = match c.holders.get(name) {
            Some(h) => h.clone(),
            None => {
                let h = look_up_holder(name).map(Rc::new);
                c.holders.insert(name.to_owned(), h.clone());
                h
            }
        };
        c.last = Some((name.to_owned(), holder.clone()));
        holder
    })
}

/// The same, read now, past any cache.
pub fn look_up_holder(name: &str) -> Option<Holder> {
    // The newest placement of any table colocated with the schema (during a
    // move both may be listed for a moment, within Citus's transaction).
    let rows = catalog::query_text_rows_now(
        "SELECT p.groupid::text, d.nodename::text, d.nodeport::text, n.oid::text
            FROM pg_catalog.pg_namespace n
            JOIN pg_catalog.pg_dist_schema s ON s.schemaid = n.oid
            JOIN LATERAL (SELECT pl.groupid FROM pg_catalog.pg_dist_partition dp
                            JOIN pg_catalog.pg_dist_shard sh ON sh.logicalrelid = dp.logicalrelid
                            JOIN pg_catalog.pg_dist_placement pl ON pl.shardid = sh.shardid
                           WHERE dp.colocationid = s.colocationid
                           ORDER BY pl.placementid DESC LIMIT 1) p ON true
            JOIN pg_catalog.pg_dist_node d ON d.groupid = p.groupid AND d.noderole = 'primary'
           WHERE n.nspname = $1::pg_catalog.name",
        &[name],
    );
    let row = rows.into_iter().next()?;
    match &row[..] {
        [Some(group), Some(host), Some(port), Some(oid)] => Some(Holder {
            group: group.parse().ok()?,
            addr: Addr { host: host.clone(), port: port.parse().ok()? },
            schema: pg_sys::Oid::from(oid.parse::<u32>().ok()?),
        }),
        _ => None,
    }
}

/// The primary node of node group `group`, if Citus lists one.
pub fn node_of_group(group: i32) -> Option<Addr> {
    static NODES: Memo<i32, Option<Addr>> = BackendLocal::new(None);
    memo(&NODES, group, || {
        let rows = catalog::query_text_rows_now(
            "SELECT n.nodename::text, n.nodeport::text FROM pg_catalog.pg_dist_node n
              WHERE n.groupid OPERATOR(pg_catalog.=) $1::pg_catalog.int4 AND n.noderole OPERATOR(pg_catalog.=) 'primary'",
            &[&group.to_string()],
        );
        match &rows.into_iter().next()?[..] {
            [Some(host), Some(port)] => Some(Addr { host: host.clone(), port: port.parse().ok()? }),
            _ => None,
        }
    })
}

/// Every active primary worker, as Citus lists them.
pub fn workers() -> Vec<Addr> {
    catalog::query_text_rows_now(
        "SELECT n.nodename::text, n.nodeport::text FROM pg_catalog.pg_dist_node n
          WHERE n.groupid OPERATOR(pg_catalog.<>) 0 AND n.noderole OPERATOR(pg_catalog.=) 'primary' AND n.isactive
          ORDER BY n.groupid",
        &[],
    )
    .into_iter()
    .filter_map(|r| match &r[..] {
        [Some(host), Some(port)] => Some(Addr { host: host.clone(), port: port.parse().ok()? }),
        _ => None,
    })
    .collect()
}

/// The schema registered for a logical shard: in the registry on the
/// coordinator, in its copy on a worker (see `registry`).
pub fn registered_schema(shard: i32) -> Option<String> {
    static REGISTERED: Memo<i32, Option<String>> = BackendLocal::new(None);
    memo(&REGISTERED, shard, || registry_row("r.shard::pg_catalog.text", &shard.to_string()).map(|(name, _)| name))
}

/// Answers looked up by key, kept until the next invalidation.
type Memo<K, V> = BackendLocal<Option<(u64, HashMap<K, V>)>>;

/// `memo`'s answer for `key`, looked up with `look_up` when it has none
/// since the last invalidation.
fn memo<K: std::hash::Hash + Eq, V: Clone>(memo: &Memo<K, V>, key: K, look_up: impl FnOnce() -> V) -> V {
    let generation = catalog::generation();
    let mut m = memo.borrow_mut();
    if m.as_ref().is_none_or(|(g, _)| *g != generation) {
        *m = Some((generation, HashMap::new()));
    }
    let (_, map) = m.as_mut().expect("filled above");
    map.entry(key).or_insert_with(look_up).clone()
}

/// The shard registered for schema `name` (read now), on the coordinator.
pub fn registered_shard(name: &str) -> Option<i32> {
    registry_row("r.schema_name::pg_catalog.text", name).map(|(_, shard)| shard)
}

/// The registry row of a live schema whose `column` (as text) is `value`: (name, shard).
fn registry_row(column: &str, value: &str) -> Option<(String, i32)> {
    catalog::relation(c"shard_schema_registry")?;
    let sql = format!(
        "SELECT r.schema_name::text, r.shard::text FROM {} r
           JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) r.schema_name
          WHERE {column} OPERATOR(pg_catalog.=) $1",
        catalog::qualified("shard_schema_registry")
    );
    let row = catalog::query_text_rows_now(&sql, &[value]).into_iter().next()?;
    match &row[..] {
        [Some(name), Some(shard)] => Some((name.clone(), shard.parse().ok()?)),
        _ => None,
    }
}

/// What `pg_dist_authinfo` gives Citus to connect to `addr` as `role`: the
/// row of that node, else the row of every node (node 0), as Citus chooses;
/// empty without one. Read as the bootstrap superuser (the table is not
/// readable by other roles), kept until the next invalidation (Citus sends
/// one when the table changes), never shown.
pub fn authinfo(addr: &Addr, role: &str) -> String {
    static AUTHINFO: Memo<(String, i32, String), String> = BackendLocal::new(None);
    memo(&AUTHINFO, (addr.host.clone(), addr.port, role.to_owned()), || {
        let rows = catalog::as_superuser(|| {
            catalog::query_text_rows_now(
                "SELECT a.authinfo FROM pg_catalog.pg_dist_authinfo a
                   WHERE a.rolename = $3::pg_catalog.name
                     AND (a.nodeid = 0 OR a.nodeid = (SELECT n.nodeid FROM pg_catalog.pg_dist_node n
                                                       WHERE n.nodename = $1 AND n.nodeport = $2::pg_catalog.int4
                                                       ORDER BY n.noderole = 'primary' DESC LIMIT 1))
                   ORDER BY a.nodeid = 0 LIMIT 1",
                &[&addr.host, &addr.port.to_string(), role],
            )
        });
        rows.into_iter().next().and_then(|r| r.into_iter().next().flatten()).unwrap_or_default()
    })
}
