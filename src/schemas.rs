//! Logical shards as schemas (Instagram's model): a registry table mapping a
//! schema to its shard, and `next_schema_id(schema)` minting for that shard.
//!
//! The registry is keyed by the schema's name, which survives dumps and
//! pg_upgrade; event triggers keep it right when a schema is renamed (it
//! keeps its shard) or dropped (forgotten, so a new schema of the same name
//! never inherits it). Each backend caches the name → shard map; any change
//! to the registry (through a trigger that sends a relcache invalidation) or
//! to any schema clears it.

use pgrx::prelude::*;

use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};
use crate::citus::{self, Call, Routed};
use crate::catalog;
use crate::schema_shards::{registry, shard_of};

extension_sql_file!("../sql/registry.sql", name = "registry", requires = [catalog::pg_idgen_table_changed]);

/// The registry table, qualified and quoted for use in SQL.
fn registry_table() -> String {
    registry();
    catalog::qualified("shard_schema_registry")
}

/// The next ID for the logical shard registered for a schema.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn next_schema_id(schema_name: &str) -> i64 {
    // Longer than a name can be: PostgreSQL (and Citus's metadata) would
    // truncate it to another schema's name.
    if schema_name.len() >= pg_sys::NAMEDATALEN as usize {
        IdError::SchemaMissing(schema_name.into()).raise()
    }
    let shard = match citus::route(Call::Schema(schema_name), "next_schema_id") {
        Some(Routed::Minted(id)) => return id,
        Some(Routed::Here(shard)) => shard,
        None => {
            // A standby's or an uninstalled server's error comes first.
            crate::shared::state().or_raise();
            crate::mark::check_writable("next_schema_id");
            shard_of(schema_name)
        }
    };
    crate::minting::mint(shard, "next_schema_id")
}

/// Registers an existing schema as a logical shard.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_schema_register(schema_name: &str, shard: i32) {
    catalog::check_schema_name(schema_name);
    let shard = Shard::new(shard).or_raise();
    if catalog::schema_oid(schema_name).is_none() {
        IdError::SchemaMissing(schema_name.into()).raise()
    }
    register(schema_name, shard, "shard_schema_register");
}

/// Creates a schema and registers it as a logical shard, all or nothing.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_schema_create(schema_name: &str, shard: i32) {
    catalog::check_schema_name(schema_name);
    let shard = Shard::new(shard).or_raise();
    // Before CREATE SCHEMA, which Citus refuses on a worker in its own words.
    citus::refuse_on_worker("shard_schema_create");
    // Registrations queue behind each other before anything else: CREATE
    // SCHEMA's event trigger writes the registry, and a registration taking
    // its lock after that could deadlock with one that holds it and waits
    // for a row that trigger wrote.
    catalog::lock_to_change(c"shard_schema_registry", pg_sys::ACL_INSERT);
    // An error in `register` rolls the new schema back with it.
    catalog::run(&format!("CREATE SCHEMA {}", catalog::quote(schema_name)), &[]);
    register(schema_name, shard, "shard_schema_create");
}

/// Rows of the registry whose schema exists: a row whose schema is gone
/// (restored with triggers disabled, say) holds nothing, and the insert's
/// trigger removes it when a registration needs its name or shard.
const LIVE: &str = "JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) r.schema_name";

fn check_shard_free(table: &str, shard: Shard) {
    let holder: Option<String> = catalog::query_one(
        &format!("SELECT r.schema_name::text FROM {table} r {LIVE} WHERE r.shard OPERATOR(pg_catalog.=) $1"),
        &[(shard.index() as i32).into()],
    );
    if let Some(schema) = holder {
        IdError::ShardTaken { shard: shard.index() as i32, schema }.raise()
    }
}

fn register(schema_name: &str, shard: Shard, function: &'static str) {
    citus::refuse_on_worker(function);
    citus::refuse_node_shard(shard);
    crate::mark::check_writable(function);
    crate::fleet::check(shard).or_raise();
    let table = registry_table();
    // Registrations queue behind each other, so the checks below stay true
    // until the insert (the unique keys catch anyone else); INSERT on the
    // registry is what registering takes, checked before queueing.
    catalog::lock_to_change(c"shard_schema_registry", pg_sys::ACL_INSERT);
    // A DROP SCHEMA in progress either committed (then the schema is gone
    // now) or waits for this transaction, and its trigger then sees the row.
    if catalog::lock_schema(schema_name).is_none() {
        IdError::SchemaMissing(schema_name.into()).raise()
    }
    let existing: Option<i32> = catalog::query_one(
        &format!("SELECT r.shard FROM {table} r {LIVE} WHERE r.schema_name OPERATOR(pg_catalog.=) $1::text::name"),
        &[schema_name.into()],
    );
    if let Some(shard) = existing {
        IdError::SchemaAlreadyRegistered { schema: schema_name.into(), shard }.raise()
    }
    check_shard_free(&table, shard);
    catalog::run(
        &format!("INSERT INTO {table} (schema_name, shard) VALUES ($1::text::name, $2)"),
        &[schema_name.into(), (shard.index() as i32).into()],
    );
    citus::registered(function);
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn a_schema_registered_earlier_in_the_statement_mints_and_a_renamed_column_is_an_error() {
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id(s)) FROM (SELECT 's8' AS s, shard_schema_create('s8', 8)) r"), 8);
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id('s9')) FROM (SELECT shard_schema_create('s9', 9)) r"), 9);
        // Read by a scan of the table: a column it lacks is an error, never NULL.
        Spi::run("ALTER TABLE shard_schema_registry RENAME COLUMN shard TO s").unwrap();
        assert_eq!(sqlstate("next_schema_id('s8')"), "XX000");
    }

    #[pg_test]
    fn create_registers_and_ids_carry_the_schema_shard() {
        Spi::run("SELECT shard_schema_create('insta5', 5)").unwrap();
        assert_eq!(one::<String>("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas"), "insta5=5");
        Spi::run(
            "CREATE TABLE insta5.photos (id bigint PRIMARY KEY DEFAULT next_schema_id('insta5'), n int);
             INSERT INTO insta5.photos (n) SELECT generate_series(1, 2000)",
        )
        .unwrap();
        assert_eq!(one::<String>("SELECT min(id_shard(id)) || '-' || max(id_shard(id)) || '-' || count(DISTINCT id) FROM insta5.photos"), "5-5-2000");
    }

    #[pg_test]
    fn register_an_existing_schema_and_mixed_case_names() {
        Spi::run("CREATE SCHEMA \"Shard Nine\"; SELECT shard_schema_register('Shard Nine', 9)").unwrap();
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id('Shard Nine'))"), 9);
        Spi::run("SELECT shard_schema_create('Quoted\"Name', 10)").unwrap();
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id('Quoted\"Name'))"), 10);
    }

    #[pg_test]
    fn registry_errors_have_their_sqlstates() {
        Spi::run("SELECT shard_schema_create('s1', 1); CREATE SCHEMA s2; CREATE SCHEMA s3").unwrap();
        assert_eq!(sqlstate("shard_schema_register('s2', 1)"), "23505", "shard held by another schema");
        assert_eq!(sqlstate("shard_schema_register('s1', 2)"), "23505", "schema registered twice");
        assert_eq!(sqlstate("shard_schema_register('nope', 3)"), "3F000");
        assert_eq!(sqlstate("shard_schema_register('s2', 8192)"), "22003");
        assert_eq!(sqlstate("shard_schema_create('s4', -1)"), "22003");
        assert_eq!(sqlstate("shard_schema_create('s3', 4)"), "42P06", "CREATE SCHEMA of an existing schema");
        assert_eq!(sqlstate("next_schema_id('nope')"), "3F000");
        assert_eq!(sqlstate("shard_schema_create('', 13)"), "42602");
        assert_eq!(sqlstate("shard_schema_create(repeat('a', 64), 13)"), "42622");
        assert_eq!(sqlstate("shard_schema_register(repeat('a', 70), 13)"), "42622");
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_catalog.pg_namespace WHERE nspname LIKE 'aaaa%'"), 0);
        assert_eq!(sqlstate("next_schema_id('s3')"), "42704");
        assert_eq!(Spi::get_one::<i64>("SELECT next_schema_id(NULL)").unwrap(), None);
    }

    #[pg_test(error = "schema \"s3\" is not registered as a pg_idgen shard")]
    fn unregistered_schema_says_so() {
        Spi::run("CREATE SCHEMA s3; SELECT next_schema_id('s3')").unwrap();
    }

    #[pg_test]
    fn a_failed_create_leaves_no_schema_behind() {
        Spi::run("SELECT shard_schema_create('first', 7)").unwrap();
        assert_eq!(sqlstate("shard_schema_create('second', 7)"), "23505");
        assert!(!one::<bool>("SELECT EXISTS (SELECT FROM pg_catalog.pg_namespace WHERE nspname = 'second')"));
    }

    #[pg_test]
    fn a_dropped_schema_frees_its_shard_and_its_name() {
        Spi::run("SELECT shard_schema_create('gone', 12); DROP SCHEMA gone").unwrap();
        assert_eq!(one::<i64>("SELECT count(*) FROM shard_schema_registry"), 0);
        Spi::run("CREATE SCHEMA gone").unwrap();
        assert_eq!(sqlstate("next_schema_id('gone')"), "42704", "a new schema of the same name must not inherit");
        Spi::run("SELECT shard_schema_create('other', 12)").unwrap();
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id('other'))"), 12);
    }

    #[pg_test]
    fn a_renamed_schema_keeps_its_shard() {
        Spi::run("SELECT shard_schema_create('before', 14); ALTER SCHEMA before RENAME TO after").unwrap();
        assert_eq!(one::<String>("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas"), "after=14");
        assert_eq!(one::<i32>("SELECT id_shard(next_schema_id('after'))"), 14);
        assert_eq!(sqlstate("next_schema_id('before')"), "3F000");
        Spi::run("CREATE SCHEMA before").unwrap();
        assert_eq!(sqlstate("next_schema_id('before')"), "42704");
    }

    #[pg_test]
    fn registry_functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(proname || ':' || provolatile::text || proparallel::text || proisstrict::text, ' ' ORDER BY proname)
               FROM pg_proc WHERE proname IN ('next_schema_id', 'shard_schema_register', 'shard_schema_create')",
        );
        assert_eq!(rows, "next_schema_id:vutrue shard_schema_create:vutrue shard_schema_register:vutrue");
    }
}
