//! pg_idgen: Instagram-style 64-bit IDs and RFC 9562 UUIDv7, minted inside PostgreSQL.
//!
//! `core` is plain Rust, free of pgrx: layouts, the generator state machine,
//! codecs and foreign schemes. SQL functions: `ids` (64-bit IDs), `uuid7`,
//! `schemas` (logical shards as schemas), `ownership` (claims and shard
//! moves), `public` (text forms), `schemes` (foreign layouts, ULID, KSUID,
//! ObjectID), `status`. Behind them: `mark` (the persisted high-water mark),
//! `epoch` (the epoch each database records), `fleet` (the server's shard
//! ownership, in shared memory), `lease` (shards leased from a store,
//! etcd, so that no two running servers mint one), `planner` (time filters as key ranges),
//! `catalog` (the one door to the catalog), `ddl_guard` (no role queues
//! for a lock on pg_idgen's relations unless it may run the statement), `citus` (on a Citus cluster,
//! the node holding a shard's data mints it; others forward to it),
//! `shared` (shared memory), `settings` (GUCs), `backend`, `clock`,
//! `random`, `follow` (on a logical-replication subscriber, generators
//! follow the replicated IDs), `copies` (another primary of this data,
//! seen through `primary_conninfo`), and `errors` (every error and the one way to raise it).

use pgrx::prelude::*;

mod backend;
mod catalog;
mod citus;
mod clock;
mod copies;
mod datafiles;
mod ddl_guard;
pub mod core;
mod epoch;
mod errors;
mod fleet;
mod follow;
mod ids;
mod lease;
mod mark;
mod minting;
mod ownership;
mod planner;
mod public;
mod random;
mod schema_shards;
mod schemas;
mod schemes;
mod settings;
mod shared;
mod status;
mod uuid7;
#[cfg(any(test, feature = "pg_test"))]
mod testing;

::pgrx::pg_module_magic!();

// A description of every function and event trigger, after they all exist.
extension_sql_file!("../sql/comments.sql", name = "comments", finalize);

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    no_backtraces();
    let preloading = shared::preloading();
    if preloading {
        settings::set_preloaded();
    }
    settings::register(preloading);
    citus::register_settings();
    if preloading {
        datafiles::move_old_files();
        shared::init(mark::restart_state);
        mark::init();
        planner::init();
        ddl_guard::init();
        fleet::register_loader();
        copies::init();
        lease::init();
        lease::register();
        citus::init();
    }
}

/// No error of ours carries a Rust backtrace, whatever the server's
/// environment: pgrx appends one to an error's DETAIL when
/// `std::backtrace::Backtrace::capture` is enabled, which the standard
/// library decides once per process from `RUST_LIB_BACKTRACE` (then
/// `RUST_BACKTRACE`). Decide it now, disabled, and leave the environment of
/// the server and its children as it was.
fn no_backtraces() {
    const VAR: &str = "RUST_LIB_BACKTRACE";
    let saved = std::env::var_os(VAR);
    // SAFETY (of the environment changes): _PG_init runs in a
    // single-threaded process (the postmaster, or a backend loading us).
    std::env::set_var(VAR, "0");
    let _ = std::backtrace::Backtrace::capture();
    match saved {
        Some(v) => std::env::set_var(VAR, v),
        None => std::env::remove_var(VAR),
    }
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_idgen'", "pg_idgen.fleet_database = 'pgrx_tests'"]
    }
}
