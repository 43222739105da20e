//! Schema-to-shard registry changes are seen by other backends at their next call.

use pg_idgen_e2e::{decode, sqlstate, Server};

#[test]
fn registry_changes_reach_other_backends_and_dropped_schemas_are_forgotten() {
    let server = Server::start("schemas", &[]);
    let mut a = server.client();
    let mut b = server.client();
    b.batch_execute("CREATE SCHEMA insta5").unwrap();
    // A looks the schema up (and caches the registry) before it is registered.
    assert_eq!(sqlstate(a.query_one("SELECT next_schema_id('insta5')", &[])), "42704");
    b.batch_execute("SELECT shard_schema_register('insta5', 5)").unwrap();
    let id: i64 = a.query_one("SELECT next_schema_id('insta5')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 5);
    // Dropped and created again by B: the new schema does not inherit the shard.
    b.batch_execute("DROP SCHEMA insta5; CREATE SCHEMA insta5").unwrap();
    assert_eq!(sqlstate(a.query_one("SELECT next_schema_id('insta5')", &[])), "42704");
    b.batch_execute("SELECT shard_schema_register('insta5', 6)").unwrap();
    let id: i64 = a.query_one("SELECT next_schema_id('insta5')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 6);
    // A renamed schema keeps its shard under its new name.
    b.batch_execute("ALTER SCHEMA insta5 RENAME TO insta6").unwrap();
    assert_eq!(sqlstate(a.query_one("SELECT next_schema_id('insta5')", &[])), "3F000");
    let id: i64 = a.query_one("SELECT next_schema_id('insta6')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 6);
    // A table DEFAULT in another backend.
    b.batch_execute(
        "CREATE TABLE insta6.photos (id bigint PRIMARY KEY DEFAULT next_schema_id('insta6'), n int);
         INSERT INTO insta6.photos (n) SELECT g FROM generate_series(1, 1000) g",
    )
    .unwrap();
    let row = a.query_one("SELECT count(*), count(DISTINCT id), min(id_shard(id)), max(id_shard(id)) FROM insta6.photos", &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i32>(2), row.get::<_, i32>(3)), (1000, 1000, 6, 6));
}

#[test]
fn the_extension_drops_and_comes_back_cleanly() {
    let server = Server::start("drop_extension", &[]);
    let mut c = server.client();
    c.batch_execute(
        "SELECT shard_schema_create('s1', 1);
         DROP EXTENSION pg_idgen;
         DROP SCHEMA s1;
         CREATE EXTENSION pg_idgen;
         CREATE SCHEMA s1;",
    )
    .unwrap();
    assert_eq!(sqlstate(c.query_one("SELECT next_schema_id('s1')", &[])), "42704");
    c.batch_execute("SELECT shard_schema_register('s1', 1)").unwrap();
    let id: i64 = c.query_one("SELECT next_schema_id('s1')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 1);
}

/// DROP SCHEMA and a registration of the same schema, in either order,
/// never leave a row for a schema that is gone.
#[test]
fn drop_schema_racing_a_registration_leaves_no_orphan() {
    let server = Server::start("schema-race", &[]);
    let mut a = server.client();
    a.batch_execute("CREATE SCHEMA race2; CREATE SCHEMA race4; CREATE ROLE registrar LOGIN; GRANT INSERT ON shard_schema_registry TO registrar")
        .unwrap();
    // The drop first, still open while the registration comes.
    a.batch_execute("BEGIN; DROP SCHEMA race2").unwrap();
    let conninfo = server.conninfo("postgres").replace("user=postgres", "user=registrar");
    let register = std::thread::spawn(move || {
        let mut b = pg_idgen_e2e::postgres::Client::connect(&conninfo, pg_idgen_e2e::postgres::NoTls).unwrap();
        sqlstate(b.batch_execute("SET application_name = 'racer'; SELECT shard_schema_register('race2', 401)"))
    });
    pg_idgen_e2e::eventually_waits_for_a_lock(&server, "racer");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(register.join().unwrap(), "3F000", "the registration waited for the drop and saw it");
    // The registration first, still open while the drop comes.
    a.batch_execute("BEGIN; SELECT shard_schema_register('race4', 402)").unwrap();
    let conninfo = server.conninfo("postgres");
    let drop = std::thread::spawn(move || {
        let mut b = pg_idgen_e2e::postgres::Client::connect(&conninfo, pg_idgen_e2e::postgres::NoTls).unwrap();
        sqlstate(b.batch_execute("SET application_name = 'racer'; DROP SCHEMA race4"))
    });
    pg_idgen_e2e::eventually_waits_for_a_lock(&server, "racer");
    a.batch_execute("COMMIT").unwrap();
    assert_eq!(drop.join().unwrap(), "ok");
    let rows: i64 = a.query_one("SELECT count(*) FROM shard_schema_registry", &[]).unwrap().get(0);
    assert_eq!(rows, 0, "no row for a schema that no longer exists");
    a.batch_execute("CREATE SCHEMA race3; SELECT shard_schema_register('race3', 401); CREATE SCHEMA race5; SELECT shard_schema_register('race5', 402)")
        .unwrap();
}

/// A registry row whose schema is gone (written with triggers disabled, as
/// `pg_restore --disable-triggers` writes it) holds nothing: a registration
/// that needs its shard removes it, a new schema of its name removes it,
/// and a role with only INSERT on the registry does both; so does a schema
/// renamed onto its name; rows of schemas that exist stay.
#[test]
fn a_row_whose_schema_is_gone_makes_way_for_a_registration() {
    let server = Server::start("schema-orphan", &[]);
    let mut a = server.client();
    a.batch_execute(
        "CREATE ROLE registrar LOGIN; GRANT INSERT ON shard_schema_registry TO registrar;
         DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO registrar', current_database()); END $$;
         SELECT shard_schema_create('live', 5);
         SET session_replication_role = replica;
         INSERT INTO shard_schema_registry (schema_name, shard) VALUES ('gone7', 7), ('gone8', 8);
         RESET session_replication_role;",
    )
    .unwrap();
    let rows = |c: &mut pg_idgen_e2e::postgres::Client| -> String {
        c.query_one("SELECT string_agg(schema_name || '=' || shard, ',' ORDER BY shard) FROM shard_schema_registry", &[]).unwrap().get(0)
    };
    assert_eq!(rows(&mut a), "live=5,gone7=7,gone8=8", "the orphan rows are there");
    let mut r = server.client_as("postgres", "registrar");
    // Its shard: a registration for shard 7 removes gone7's row.
    r.batch_execute("SELECT shard_schema_create('new7', 7)").unwrap();
    assert_eq!(rows(&mut a), "live=5,new7=7,gone8=8");
    let id: i64 = r.query_one("SELECT next_schema_id('new7')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 7);
    // Its name: a new schema gone8 inherits nothing, and its row is gone.
    r.batch_execute("CREATE SCHEMA gone8").unwrap();
    assert_eq!(rows(&mut a), "live=5,new7=7");
    assert_eq!(sqlstate(r.query_one("SELECT next_schema_id('gone8')", &[])), "42704");
    r.batch_execute("SELECT shard_schema_register('gone8', 8)").unwrap();
    // A row whose schema exists is not removed, through the function or by
    // the role's own INSERT (which runs the same trigger).
    assert_eq!(sqlstate(r.batch_execute("SELECT shard_schema_create('new5', 5)")), "23505");
    assert_eq!(sqlstate(r.batch_execute("INSERT INTO shard_schema_registry (schema_name, shard) VALUES ('new5', 5)")), "23505");
    assert_eq!(rows(&mut a), "live=5,new7=7,gone8=8");
    // Its name, by a rename: a registered schema renamed onto an orphan's
    // name keeps its own shard and the orphan's row is gone (it failed with
    // 23505); an unregistered schema renamed onto one inherits nothing.
    a.batch_execute(
        "SET session_replication_role = replica;
         INSERT INTO shard_schema_registry (schema_name, shard) VALUES ('gone9', 9), ('gone10', 10);
         RESET session_replication_role;
         CREATE SCHEMA plain;",
    )
    .unwrap();
    a.batch_execute("ALTER SCHEMA live RENAME TO gone9").unwrap();
    assert_eq!(rows(&mut a), "gone9=5,new7=7,gone8=8,gone10=10");
    a.batch_execute("ALTER SCHEMA plain RENAME TO gone10").unwrap();
    assert_eq!(rows(&mut a), "gone9=5,new7=7,gone8=8");
    assert_eq!(sqlstate(a.query_one("SELECT next_schema_id('gone10')", &[])), "42704");
    let id: i64 = a.query_one("SELECT next_schema_id('gone9')", &[]).unwrap().get(0);
    assert_eq!(decode(id).1, 5);
}
