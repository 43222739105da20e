//! Each backend's copy of the schema registry (see `schemas`): name →
//! shard, read again whenever the registry or any schema changes (a
//! relcache invalidation, see `catalog::generation`).

use std::collections::HashMap;

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::catalog;
use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};

/// The backend's copy of the registry: name → shard, and the cache
/// generation it was read at.
struct Cached {
    generation: u64,
    map: HashMap<String, Shard>,
    /// The last name looked up and its shard: a table's DEFAULT asks for the
    /// same schema row after row, and comparing a few bytes beats hashing.
    last: Option<(String, Shard)>,
}

static CACHE: BackendLocal<Option<Cached>> = BackendLocal::new(None);

/// The registry table. The 0.1.0 registry (keyed by OID, with no
/// `schema_name`) is refused with 55000 until `ALTER EXTENSION pg_idgen
/// UPDATE`, never read for columns it lacks.
pub fn registry() -> pg_sys::Oid {
    let rel = catalog::relation(c"shard_schema_registry").ok_or(IdError::NotInstalled).or_raise();
    if !catalog::has_column(rel, c"schema_name") {
        IdError::NotUpdated(catalog::extension_version()).raise()
    }
    rel
}

/// The registry's rows whose schema exists, read by a scan of the table
/// (`catalog::scan`): no lock on its indexes, so a role queueing for one
/// never makes a mint wait.
fn load() -> HashMap<String, Shard> {
    let rel = registry();
    let (name, shard) = (catalog::attnum(rel, c"schema_name"), catalog::attnum(rel, c"shard"));
    let rows = catalog::scan(rel, |row| (row.name(name), row.int4(shard)));
    let mut map = HashMap::new();
    for (name, shard) in rows {
        if let (Some(name), Some(shard)) = (name, shard) {
            if catalog::schema_oid(&name).is_some() {
                map.insert(name, Shard::new(shard).or_raise());
            }
        }
    }
    map
}

fn cached(name: &str) -> Option<Shard> {
    let generation = catalog::generation();
    let mut c = CACHE.borrow_mut();
    if c.as_ref().is_none_or(|c| c.generation != generation) {
        // Read at the generation seen before reading: an invalidation that
        // arrives meanwhile makes it stale again.
        *c = Some(Cached { generation, map: load(), last: None });
    }
    let c = c.as_mut()?;
    match &c.last {
        Some((last, shard)) if last == name => Some(*shard),
        _ => {
            let shard = c.map.get(name).copied()?;
            c.last = Some((name.to_owned(), shard));
            Some(shard)
        }
    }
}

/// The shard registered for a schema.
pub fn shard_of(name: &str) -> Shard {
    if let Some(shard) = cached(name) {
        return shard;
    }
    // A miss: make sure no registration committed since is left unseen.
    catalog::accept_invalidations();
    if let Some(shard) = cached(name) {
        return shard;
    }
    if catalog::schema_oid(name).is_none() {
        IdError::SchemaMissing(name.into()).raise()
    }
    IdError::SchemaNotRegistered(name.into()).raise()
}
