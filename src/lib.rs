//! pg_idgen: Instagram-style 64-bit IDs and RFC 9562 UUIDv7, minted inside PostgreSQL.
//!
//! Plain-Rust core: `layout` (the 64-bit arithmetic) and `generator` (the
//! per-shard state machine). SQL functions: `ids` (64-bit IDs), `uuid7`,
//! `schemas` (logical shards as schemas), `ownership` (claims and shard
//! moves), `public` (text forms), `status`. Behind them: `durable` (the
//! persisted high-water mark), `planner` (time filters as key ranges),
//! `shared` (shared memory), `settings` (GUCs), `catalog`, `backend`,
//! `clock`, `random`, and `errors` (every error and the one way to raise it).

use pgrx::prelude::*;

mod backend;
mod catalog;
mod clock;
mod durable;
mod errors;
mod generator;
mod ids;
mod layout;
mod ownership;
mod planner;
mod public;
mod random;
mod schemas;
mod settings;
mod shared;
mod status;
mod uuid7;
#[cfg(any(test, feature = "pg_test"))]
mod testing;

::pgrx::pg_module_magic!();

#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    let preloading = shared::preloading();
    if preloading {
        shared::init();
        planner::init();
    }
    settings::register(preloading);
}

#[cfg(test)]
pub mod pg_test {
    pub fn setup(_options: Vec<&str>) {}

    pub fn postgresql_conf_options() -> Vec<&'static str> {
        vec!["shared_preload_libraries = 'pg_idgen'"]
    }
}
