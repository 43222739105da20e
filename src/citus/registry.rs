//! The registry on every worker. The coordinator keeps the registry of
//! schemas registered as logical shards; each registration sends a copy of
//! it to every worker, so that a worker sends `next_shard_id` of a
//! schema's shard straight to the node holding the schema's data, with the
//! coordinator off the path. The coordinator's registry is the one that
//! counts: a worker's copy only says where to send a call, and the node
//! that mints answers for the schema, whose shard the sender checks.

use pgrx::prelude::*;

use super::{libpq, metadata};
use crate::catalog;
use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};

/// On the coordinator: sends its registry to every active worker (as the
/// extension's owner, in a session of its own); the number of workers.
/// A worker that cannot be reached fails the call (08001, naming it).
pub fn push(function: &'static str) -> i64 {
    let table = catalog::qualified("shard_schema_registry");
    let rows = catalog::query_text_rows_now(
        &format!(
            "SELECT coalesce(pg_catalog.array_agg(r.schema_name::pg_catalog.text ORDER BY r.shard), '{{}}')::pg_catalog.text,
                    coalesce(pg_catalog.array_agg(r.shard ORDER BY r.shard), '{{}}')::pg_catalog.text
               FROM {table} r JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) r.schema_name"
        ),
        &[],
    );
    let (Some(names), Some(shards)) = rows.into_iter().next().map(|r| (r[0].clone(), r[1].clone())).unwrap_or_default() else {
        IdError::Internal("the registry read no row".into()).raise()
    };
    let sql = format!("SELECT {}($1::pg_catalog.text[], $2::pg_catalog.int4[])", catalog::qualified("citus_registry_note"));
    let workers = metadata::workers();
    for addr in &workers {
        let what = || format!("the Citus worker {}", addr.describe());
        libpq::call(addr, &sql, &[names.clone(), shards.clone()], function, &what);
    }
    workers.len() as i64
}

/// Sends the coordinator's registry of schemas registered as logical
/// shards to every Citus worker (each registration does), so that workers
/// send `next_shard_id` of those shards straight to the node holding the
/// schema's data. Run after adding a worker.
#[pg_extern(volatile, parallel_unsafe)]
fn citus_registry_sync() -> i64 {
    metadata::on_coordinator_only("citus_registry_sync");
    push("citus_registry_sync")
}

/// On a Citus worker: replaces its copy of the registry with the
/// coordinator's (schema names and their shards); run by the coordinator.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn citus_registry_note(schema_names: Vec<Option<String>>, shards: Vec<Option<i32>>) {
    const F: &str = "citus_registry_note";
    metadata::on_worker_only(F);
    if schema_names.len() != shards.len() {
        IdError::BadArgument { function: F, why: "as many schema names as shards are needed" }.raise()
    }
    let Some(names) = schema_names.into_iter().collect::<Option<Vec<String>>>() else {
        IdError::BadArgument { function: F, why: "a schema name is NULL" }.raise()
    };
    let Some(shards) = shards.into_iter().collect::<Option<Vec<i32>>>() else {
        IdError::BadArgument { function: F, why: "a shard is NULL" }.raise()
    };
    for name in &names {
        catalog::check_schema_name(name);
    }
    for &shard in &shards {
        Shard::new(shard).or_raise();
    }
    let table = catalog::qualified("shard_schema_registry");
    catalog::run(&format!("DELETE FROM {table}"), &[]);
    catalog::run(
        &format!("INSERT INTO {table} (schema_name, shard) SELECT n::pg_catalog.name, s FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), pg_catalog.unnest($2::pg_catalog.int4[])) AS u(n, s)"),
        &[names.into(), shards.into()],
    );
}
