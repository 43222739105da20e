//! Backups, upgrades and new versions keep every ID space intact:
//! pg_dump/pg_restore (custom and plain, new database and new server),
//! pg_dumpall, pg_upgrade, and ALTER EXTENSION UPDATE from 0.1.0.

use std::path::Path;

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{bin, pg_config, sqlstate, unpack_package, Installation, Server};

/// A database in use: a registered shard schema with rows, claims, a
/// release, and IDs minted. Returns the largest ID minted there.
fn fill(c: &mut Client) -> i64 {
    c.batch_execute(
        "SELECT shard_claim(0, 99);
         SELECT shard_schema_create('insta5', 5);
         CREATE TABLE insta5.photos (id bigint PRIMARY KEY DEFAULT next_schema_id('insta5'), n int);
         INSERT INTO insta5.photos (n) SELECT generate_series(1, 3000);
         CREATE TABLE public.ev (id bigint PRIMARY KEY DEFAULT next_shard_id(9), u uuid DEFAULT uuid_v7());
         INSERT INTO public.ev SELECT FROM generate_series(1, 3000);
         SELECT next_shard_id(7);
         SELECT shard_release(7);",
    )
    .unwrap();
    c.query_one("SELECT greatest((SELECT max(id) FROM insta5.photos), (SELECT max(id) FROM public.ev))", &[])
        .unwrap()
        .get(0)
}

/// The clock offset of the servers that make the old IDs, and the lead
/// bound of every server here, which lets a restored mark that far ahead be
/// taken at once (not held): a new ID is then above the old ones only because
/// the mark came through, never because the clock moved past them.
const SOURCE_AHEAD: &str = "+120s";
const LEAD: &str = "pg_idgen.max_clock_lead_ms = 300000";

/// A server whose clock runs `SOURCE_AHEAD`, for `fill`.
fn ahead_source(name: &str) -> Server {
    let source = Server::start_with_clock(name, &[LEAD]);
    source.set_clock(SOURCE_AHEAD);
    source
}

/// Everything `fill` made, checked in a restored or upgraded database: the
/// registry, claims and release are there, restored tables mint at once, and
/// every new ID is above every old one. With `behind`, the server checked
/// must still have its clock behind the old IDs' time when it mints.
fn check(c: &mut Client, old_max: i64, behind: bool) {
    if behind {
        let still: bool = c.query_one("SELECT id_ts($1) > clock_timestamp()", &[&old_max]).unwrap().get(0);
        assert!(still, "the clock passed the old IDs' time before minting: new IDs above them would prove nothing");
    }
    let schemas: String = c.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
    assert_eq!(schemas, "insta5=5");
    let claims: String =
        c.query_one("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims", &[]).unwrap().get(0);
    assert_eq!(claims, "0-6,8-99");
    let released: i64 = c.query_one("SELECT count(*) FROM shard_releases WHERE shard = 7", &[]).unwrap().get(0);
    assert_eq!(released, 1);
    c.batch_execute("INSERT INTO insta5.photos (n) SELECT generate_series(1, 1000); INSERT INTO public.ev SELECT FROM generate_series(1, 1000)")
        .unwrap();
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT id), min(id) FILTER (WHERE n IS NULL) FROM
               (SELECT id, n FROM insta5.photos UNION ALL SELECT id, NULL FROM public.ev) s",
            &[],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (8000, 8000), "no duplicates");
    let new_min: i64 = c
        .query_one(
            "SELECT least((SELECT min(id) FROM (SELECT id FROM insta5.photos ORDER BY id DESC LIMIT 1000) a),
                          (SELECT min(id) FROM (SELECT id FROM public.ev ORDER BY id DESC LIMIT 1000) b))",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(new_min > old_max, "new IDs ({new_min}) above every old one ({old_max})");
    assert_eq!(sqlstate(c.batch_execute("SELECT next_shard_id(7)")), "55000", "the released shard stays released");
    let epoch: String = c.query_one("SELECT id_epoch()::text", &[]).unwrap().get(0);
    assert_eq!(epoch, "2026-01-01 00:00:00+00");
}

fn dump(server: &Server, program: &str, args: &[&str], file: &str) {
    let out = server.dir.join(file).to_string_lossy().into_owned();
    let mut all = vec!["-h", server.dir.to_str().unwrap(), "-p", "5499", "-U", "postgres", "-f", &out];
    all.extend_from_slice(args);
    server.run_as_owner(program, &all);
}

fn restore(target: &Server, db: &str, file: &Path, custom: bool) {
    let host = target.dir.to_str().unwrap().to_string();
    let file = file.to_str().unwrap();
    if custom {
        target.run_as_owner("pg_restore", &["-h", &host, "-p", "5499", "-U", "postgres", "-d", db, "--exit-on-error", file]);
    } else {
        target.run_as_owner("psql", &["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", &host, "-p", "5499", "-U", "postgres", "-d", db, "-f", file]);
    }
}

#[test]
fn dump_and_restore_into_a_new_database_and_a_new_server() {
    let source = ahead_source("dump-source");
    let old_max = fill(&mut source.client());
    source.set_clock("+0s");
    dump(&source, "pg_dump", &["-Fc", "-d", "postgres"], "db.dump");
    dump(&source, "pg_dump", &["-Fp", "-d", "postgres"], "db.sql");
    // The same server, new databases: custom and plain format.
    for (db, file, custom) in [("restored_custom", "db.dump", true), ("restored_plain", "db.sql", false)] {
        source.client().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        restore(&source, db, &source.dir.join(file), custom);
        check(&mut source.client_db(db), old_max, true);
    }
    // A new server, into its fleet database (which records the server's claims).
    let target = Server::init("dump-target", &["shared_preload_libraries = 'pg_idgen'", LEAD]);
    restore(&target, "postgres", &source.dir.join("db.dump"), true);
    check(&mut target.client(), old_max, true);
}

#[test]
fn pg_dumpall_into_a_new_server() {
    let source = ahead_source("dumpall-source");
    let old_max = fill(&mut source.client());
    dump(&source, "pg_dumpall", &[], "all.sql");
    let target = Server::init("dumpall-target", &["shared_preload_libraries = 'pg_idgen'", LEAD]);
    // The dump re-creates role postgres and database postgres' contents.
    let host = target.dir.to_str().unwrap().to_string();
    let file = source.dir.join("all.sql").to_string_lossy().into_owned();
    target.run_as_owner("psql", &["-X", "-q", "-h", &host, "-p", "5499", "-U", "postgres", "-d", "template1", "-f", &file]);
    check(&mut target.client(), old_max, true);
}

#[test]
fn pg_upgrade_to_a_new_cluster_keeps_every_id_space() {
    let mut old = ahead_source("upgrade-old");
    let old_max = fill(&mut old.client());
    let old_oid: u32 = old.client().query_one("SELECT 'insta5'::regnamespace::oid", &[]).unwrap().get(0);
    old.stop("fast");
    let new = Server::init_stopped("upgrade-new", &["shared_preload_libraries = 'pg_idgen'", LEAD]);
    let bindir = Path::new(&bin("postgres")).parent().unwrap().to_string_lossy().into_owned();
    let (old_data, new_data) = (old.data(), new.data());
    let out = new.run_as_owner(
        "pg_upgrade",
        &["-b", &bindir, "-B", &bindir, "-d", &old_data, "-D", &new_data, "-p", "50532", "-P", "50533", "-U", "postgres"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Upgrade Complete"), "{}", String::from_utf8_lossy(&out.stdout));
    let mut new = new;
    new.start_process();
    let mut c = new.client();
    let new_oid: u32 = c.query_one("SELECT 'insta5'::regnamespace::oid", &[]).unwrap().get(0);
    // pg_upgrade re-creates schemas under new OIDs (it keeps relations' and
    // types'), which is why the registry is keyed by name: the case tested.
    assert_ne!(new_oid, old_oid, "schema insta5 kept its OID through pg_upgrade: the stale-OID case is not tested");
    check(&mut c, old_max, true);
    registry_follows_schemas(&mut c);
}

/// pg_upgrade to a later major, between two installations each with this
/// release's package, as scripts/test names them: `PG_IDGEN_UPGRADE_FROM`
/// (default: the installation under test) and `PG_IDGEN_UPGRADE_TO` (their
/// program directories; 16 to the 16 wheel's 18, 17 to the 18 wheel). Registry,
/// claims, release and mark kept, new IDs above old ones.
#[test]
fn pg_upgrade_to_a_later_major_keeps_every_id_space() {
    let to = std::env::var("PG_IDGEN_UPGRADE_TO").ok().filter(|v| !v.is_empty()).expect(
        "PG_IDGEN_UPGRADE_TO names the program directory of a later major with pg_idgen installed; scripts/test reports this test as skipped without it",
    );
    let to = Path::new(&to);
    let from = std::env::var("PG_IDGEN_UPGRADE_FROM").ok().filter(|v| !v.is_empty()).map(std::path::PathBuf::from).unwrap_or_else(pg_idgen_e2e::bindir);
    let mut old = Server::init_in(&from, "major-old", &["shared_preload_libraries = 'pg_idgen'"]);
    old.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let old_max = fill(&mut old.client());
    let old_version: i32 = old.client().query_one("SELECT current_setting('server_version_num')::int", &[]).unwrap().get(0);
    old.stop("fast");
    let mut new = Server::init_stopped_in(to, "major-new", &["shared_preload_libraries = 'pg_idgen'"]);
    // initdb of 18 turns data checksums on, as no earlier major did by default: match the old cluster.
    let control = String::from_utf8_lossy(&new.run_as_owner("pg_controldata", &[&new.data()]).stdout).into_owned();
    if !control.lines().any(|l| l.starts_with("Data page checksum version:") && l.trim_end().ends_with(" 0")) {
        new.run_as_owner("pg_checksums", &["--disable", "-D", &new.data()]);
    }
    let (old_bin, old_data, new_data) = (from.to_string_lossy().into_owned(), old.data(), new.data());
    let out = new.run_as_owner(
        "pg_upgrade",
        &["-b", &old_bin, "-B", &to.to_string_lossy(), "-d", &old_data, "-D", &new_data, "-p", "50534", "-P", "50535", "-U", "postgres"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Upgrade Complete"), "{}", String::from_utf8_lossy(&out.stdout));
    new.start_process();
    let mut c = new.client();
    let new_version: i32 = c.query_one("SELECT current_setting('server_version_num')::int", &[]).unwrap().get(0);
    assert!(new_version / 10000 > old_version / 10000, "{old_version} -> {new_version} is not a later major");
    eprintln!("pg_upgrade from {old_version} to {new_version}");
    check(&mut c, old_max, false);
    registry_follows_schemas(&mut c);
}

/// After pg_upgrade or a restore with triggers disabled, the registry's
/// stored OIDs may be stale: a rename is still followed, a new schema of the
/// old name inherits nothing, and a dropped schema frees its shard.
fn registry_follows_schemas(c: &mut Client) {
    c.batch_execute("ALTER SCHEMA insta5 RENAME TO insta5_archive").unwrap();
    let schemas: String = c.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
    assert_eq!(schemas, "insta5_archive=5", "the rename is followed");
    let shard: i32 = c.query_one("SELECT id_shard(next_schema_id('insta5_archive'))", &[]).unwrap().get(0);
    assert_eq!(shard, 5);
    c.batch_execute(
        "CREATE ROLE creator LOGIN;
         DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO creator', current_database()); END $$",
    )
    .unwrap();
    c.batch_execute("SET ROLE creator; CREATE SCHEMA insta5; RESET ROLE").unwrap();
    assert_eq!(sqlstate(c.query_one("SELECT next_schema_id('insta5')", &[])), "42704", "a new schema of the old name inherits nothing");
    assert_eq!(sqlstate(c.batch_execute("SELECT shard_schema_register('insta5', 5)")), "23505", "shard 5 is still held");
    c.batch_execute("DROP SCHEMA insta5_archive CASCADE; SELECT shard_schema_register('insta5', 5)").unwrap();
    let schemas: String = c.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
    assert_eq!(schemas, "insta5=5");
    let rows: i64 = c.query_one("SELECT count(*) FROM shard_schema_registry", &[]).unwrap().get(0);
    assert_eq!(rows, 1, "no orphan row");
}

#[test]
fn restore_with_triggers_disabled_keeps_the_registry_right() {
    let source = Server::start("restore-notrig", &[]);
    fill(&mut source.client());
    // Shift OIDs in the target so that the dumped ones are stale there.
    source.client().batch_execute("CREATE DATABASE target").unwrap();
    source.client_db("target").batch_execute("CREATE SCHEMA pad1; CREATE SCHEMA pad2; CREATE TABLE pad1.t (a int)").unwrap();
    dump(&source, "pg_dump", &["-Fc", "-d", "postgres"], "db.dump");
    let host = source.dir.to_str().unwrap().to_string();
    let file = source.dir.join("db.dump").to_string_lossy().into_owned();
    // Definitions first, then the registry's data alone with triggers
    // disabled (the only restore where --disable-triggers applies).
    for part in [&["--schema-only"][..], &["--data-only", "--disable-triggers", "-t", "shard_schema_registry"][..]] {
        let mut args = vec!["-h", &host, "-p", "5499", "-U", "postgres", "-d", "target", "--exit-on-error", &file];
        args.extend_from_slice(part);
        source.run_as_owner("pg_restore", &args);
    }
    let mut c = source.client_db("target");
    let stale: bool = c
        .query_one(
            "SELECT r.schema_oid IS DISTINCT FROM n.oid FROM shard_schema_registry r JOIN pg_namespace n ON n.nspname = r.schema_name",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(stale, "the restored row keeps the source's OID");
    let schemas: String = c.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
    assert_eq!(schemas, "insta5=5");
    registry_follows_schemas(&mut c);
}

/// Every object of the extension in a database, with what defines it.
fn inventory(c: &mut Client) -> Vec<String> {
    c.query(
        "SELECT pg_describe_object(d.classid, d.objid, 0) || ' ' || coalesce((
             SELECT p.provolatile::text || p.proparallel::text || p.proisstrict::text || p.prosecdef::text || coalesce(p.proconfig::text, '')
                    || pg_get_function_result(p.oid) || prosrc
               FROM pg_proc p WHERE d.classid = 'pg_proc'::regclass AND p.oid = d.objid), '') || coalesce((
             SELECT string_agg(a.attname || ':' || format_type(a.atttypid, a.atttypmod) || ':' || a.attnotnull, ',' ORDER BY a.attname)
               FROM pg_attribute a WHERE d.classid = 'pg_class'::regclass AND a.attrelid = d.objid AND a.attnum > 0 AND NOT a.attisdropped), '')
           || ' ' || coalesce((SELECT c.description FROM pg_description c
                                WHERE c.objoid = d.objid AND c.classoid = d.classid AND c.objsubid = 0), '')
           || ' ' || coalesce((SELECT e.evtevent || coalesce(e.evttags::text, '') FROM pg_event_trigger e
                                WHERE d.classid = 'pg_event_trigger'::regclass AND e.oid = d.objid), '')
           || ' grants ' || coalesce((SELECT p.proacl::text FROM pg_proc p WHERE d.classid = 'pg_proc'::regclass AND p.oid = d.objid),
                                     (SELECT r.relacl::text FROM pg_class r WHERE d.classid = 'pg_class'::regclass AND r.oid = d.objid), '')
           || ' triggers ' || coalesce((SELECT string_agg(pg_get_triggerdef(t.oid), '; ' ORDER BY t.tgname) FROM pg_trigger t
                                         WHERE d.classid = 'pg_class'::regclass AND t.tgrelid = d.objid AND NOT t.tgisinternal), '')
           || ' constraints ' || coalesce((SELECT string_agg(pg_get_constraintdef(k.oid), '; ' ORDER BY pg_get_constraintdef(k.oid)) FROM pg_constraint k
                                            WHERE d.classid = 'pg_class'::regclass AND k.conrelid = d.objid), '')
           FROM pg_depend d
          WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
            AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'pg_idgen')
          ORDER BY 1",
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The updated extension has exactly the objects of a fresh install of this
/// version: definitions, descriptions, event-trigger events and tags, grants,
/// and the triggers and constraints of its tables.
fn assert_same_objects_as_a_fresh_install(server: &Server, c: &mut Client) {
    c.batch_execute("DROP DATABASE IF EXISTS fresh").unwrap();
    c.batch_execute("CREATE DATABASE fresh").unwrap();
    server.client_db("fresh").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let (updated, fresh) = (inventory(c), inventory(&mut server.client_db("fresh")));
    let only_updated: Vec<_> = updated.iter().filter(|o| !fresh.contains(o)).collect();
    let only_fresh: Vec<_> = fresh.iter().filter(|o| !updated.contains(o)).collect();
    assert!(only_updated.is_empty() && only_fresh.is_empty(), "updated only: {only_updated:#?}\nfresh only: {only_fresh:#?}");
}

/// A released version's script (kept in sql/), next to this build's files
/// in the test installation, removed again when the test ends, failed or not.
struct ReleasedScript(std::path::PathBuf);

impl Drop for ReleasedScript {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn install_released_script(sharedir: &Path, version: &str) -> ReleasedScript {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../sql/pg_idgen--{version}.sql"));
    let installed = sharedir.join(format!("extension/pg_idgen--{version}.sql"));
    std::fs::copy(&script, &installed).unwrap();
    ReleasedScript(installed)
}

#[test]
fn alter_extension_update_from_0_1_0_keeps_the_registry_claims_and_mark() {
    // The 0.1.0 script, as released, next to this build's files.
    let sharedir = pg_config("--sharedir");
    let _installed = install_released_script(&sharedir, "0.1.0");

    let server = Server::init("update-010", &["shared_preload_libraries = 'pg_idgen'"]);
    let mut c = server.client();
    // A 0.1.0 database: its registry keyed by schema OID, claims, a release, a mark.
    c.batch_execute(
        "CREATE EXTENSION pg_idgen VERSION '0.1.0';
         CREATE SCHEMA insta5;
         INSERT INTO shard_schema_registry (schema_oid, shard) VALUES ('insta5'::regnamespace, 5);
         CREATE SCHEMA gone; INSERT INTO shard_schema_registry (schema_oid, shard) VALUES ('gone'::regnamespace, 6);
         DROP SCHEMA gone;
         SELECT shard_claim(0, 99);
         CREATE TABLE insta5.photos (id bigint PRIMARY KEY DEFAULT next_shard_id(5), n int);
         INSERT INTO insta5.photos (n) SELECT generate_series(1, 3000);
         SELECT next_shard_id(7); SELECT shard_release(7);",
    )
    .unwrap();
    let old_max: i64 = c.query_one("SELECT max(id) FROM insta5.photos", &[]).unwrap().get(0);
    let mark: i64 = c.query_one("SELECT last_value FROM pg_idgen_hwm", &[]).unwrap().get(0);
    // Before the update, this library refuses what needs the newer registry
    // (55000, naming the update), never reading columns the 0.1.0 one lacks.
    for sql in ["SELECT shard_schema_create('s1', 3)", "SELECT shard_schema_register('public', 4)", "SELECT next_schema_id('insta5')"] {
        let err = c.batch_execute(sql).unwrap_err();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "55000", "{sql}: {db}");
        assert!(db.message().contains("version 0.1.0"), "{sql}: {}", db.message());
        assert_eq!(db.hint(), Some("Run ALTER EXTENSION pg_idgen UPDATE in this database."), "{sql}");
    }
    assert_eq!(sqlstate(c.batch_execute("SELECT next_shard_id(5), uuid_v7(), id_ts(next_shard_id(6))")), "ok");
    c.batch_execute("ALTER EXTENSION pg_idgen UPDATE").unwrap();
    let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap().get(0);
    assert_eq!(version, "0.13.0");
    let after: i64 = c.query_one("SELECT last_value FROM pg_idgen_hwm", &[]).unwrap().get(0);
    assert!(after >= mark, "the mark is kept");
    let schemas: String = c.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
    assert_eq!(schemas, "insta5=5", "registered schemas kept, the dropped one's row gone");
    c.batch_execute("ALTER TABLE insta5.photos ALTER COLUMN id SET DEFAULT next_schema_id('insta5');
                     INSERT INTO insta5.photos (n) SELECT generate_series(1, 1000)")
        .unwrap();
    let min_new: i64 = c.query_one("SELECT min(id) FROM (SELECT id FROM insta5.photos ORDER BY id DESC LIMIT 1000) s", &[]).unwrap().get(0);
    assert!(min_new > old_max);
    let claims: String =
        c.query_one("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims", &[]).unwrap().get(0);
    assert_eq!(claims, "0-6,8-99");
    assert_eq!(sqlstate(c.batch_execute("SELECT next_shard_id(7)")), "55000");

    assert_same_objects_as_a_fresh_install(&server, &mut c);

    // A 0.1.0 database other than the fleet database with claims of its own:
    // the update refuses, rather than let them silently stop counting.
    c.batch_execute("CREATE DATABASE app").unwrap();
    let mut app = server.client_db("app");
    app.batch_execute("CREATE EXTENSION pg_idgen VERSION '0.1.0'; INSERT INTO shard_ownership (first_shard, last_shard) VALUES (0, 4)")
        .unwrap();
    assert_eq!(sqlstate(app.batch_execute("ALTER EXTENSION pg_idgen UPDATE")), "55000");
    app.batch_execute("DELETE FROM shard_ownership; ALTER EXTENSION pg_idgen UPDATE").unwrap();
}

#[test]
fn alter_extension_update_from_0_2_0_works_before_and_keeps_everything_after() {
    let _installed = install_released_script(&pg_config("--sharedir"), "0.2.0");
    let server = Server::init("update-020", &["shared_preload_libraries = 'pg_idgen'"]);
    let mut c = server.client();
    c.batch_execute("CREATE EXTENSION pg_idgen VERSION '0.2.0'").unwrap();
    let old_max = fill(&mut c);
    // The update to 0.4.0 drops and re-creates id_generator_server_status():
    // a view over it, another role's or a temporary one, stops the update
    // with 2BP01 naming the view, and the update changes nothing; grants and
    // revokes on the function return to the defaults.
    c.batch_execute(
        "CREATE ROLE watcher LOGIN; CREATE ROLE outsider LOGIN; GRANT CREATE ON SCHEMA public TO watcher;
         REVOKE EXECUTE ON FUNCTION id_generator_server_status() FROM PUBLIC;
         GRANT EXECUTE ON FUNCTION id_generator_server_status() TO watcher;",
    )
    .unwrap();
    server.client_as("postgres", "watcher").batch_execute("CREATE VIEW public.watched AS SELECT epoch FROM id_generator_server_status()").unwrap();
    c.batch_execute("CREATE TEMP VIEW mine AS SELECT * FROM id_generator_server_status()").unwrap();
    let may_run = |c: &mut Client| -> bool {
        c.query_one("SELECT has_function_privilege('outsider', 'id_generator_server_status()', 'EXECUTE')", &[]).unwrap().get(0)
    };
    assert!(!may_run(&mut c), "revoked from PUBLIC before the update");
    for (views, drop) in [(&["view watched", "view mine"][..], "DROP VIEW public.watched"), (&["view mine"][..], "DROP VIEW mine")] {
        let e = c.batch_execute("ALTER EXTENSION pg_idgen UPDATE").unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "2BP01", "{db}");
        assert_eq!(db.message(), "cannot drop function id_generator_server_status() because other objects depend on it");
        let expected: Vec<String> = views.iter().map(|v| format!("{v} depends on function id_generator_server_status()")).collect();
        assert_eq!(db.detail(), Some(expected.join("\n").as_str()));
        let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap().get(0);
        assert_eq!(version, "0.2.0", "the failed update changed nothing");
        c.batch_execute(drop).unwrap();
    }
    update_with_this_library(&server, &mut c, old_max, "0.2.0");
    assert!(may_run(&mut c), "EXECUTE for PUBLIC again after the update");
}

/// A release as its users have it: its library and SQL built from the
/// commit it landed as (scripts/previous-release, named by
/// `PG_IDGEN_RELEASE_0_2_0` or `PG_IDGEN_RELEASE_0_3_0`), installed in a copy
/// of the installation, used (`before` checks it is the old library that
/// runs), then this release's package installed over it and the server
/// restarted, as CHANGELOG.md and docs/backups-and-upgrades.md say to update; then the update itself.
fn update_from_the_release(release: &str, before: fn(&mut Client)) {
    let var = format!("PG_IDGEN_RELEASE_{}", release.replace('.', "_"));
    let built = std::env::var(&var).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| {
        panic!("{var} names the {release} release's build (scripts/previous-release); scripts/test reports this test as skipped without it")
    });
    let package = std::env::var("PG_IDGEN_PACKAGE").expect("PG_IDGEN_PACKAGE names the package under test: run the suite with scripts/test");
    // Declared before the server: the server stops before the copy it runs from is removed.
    let installation = Installation::copy(&format!("release-{release}"));
    installation.install(Path::new(&built));
    let mut server = Server::init_in(&installation.bindir, &format!("release-{release}"), &["shared_preload_libraries = 'pg_idgen'"]);
    let mut c = server.client();
    c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap().get(0);
    assert_eq!(version, release, "the release's default version");
    let library = |dir: &Path| std::fs::read(dir.join("pg_idgen.so")).unwrap();
    let unpacked = std::env::temp_dir().join(format!("pg_idgen_e2e/release-{release}-package-{}", std::process::id()));
    let new = unpack_package(Path::new(&package), &unpacked);
    let running = library(&installation.pkglibdir);
    assert!(
        running == library(&Path::new(&built).join("lib")) && running != library(&new.join("lib")),
        "the server runs the {release} release's library, not this one's"
    );
    before(&mut c);
    let old_max = fill(&mut c);
    // This release's package installed while the old library runs, and the
    // update run before the restart (an order many administrators use): the
    // new SQL binds symbols the old library lacks, so the update fails whole
    // with 42883, nothing is read past the end of the old library's rows, and
    // the old objects keep answering.
    installation.install(&new);
    let _ = std::fs::remove_dir_all(&unpacked);
    let err = c.batch_execute("ALTER EXTENSION pg_idgen UPDATE").unwrap_err();
    let db = err.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "42883", "{db}");
    assert!(db.message().contains("could not find function"), "{}", db.message());
    let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap().get(0);
    assert_eq!(version, release, "the failed update changed nothing");
    let columns = c.query_one("SELECT * FROM id_generator_server_status()", &[]).unwrap().len();
    assert_eq!(columns, 8, "the release's status function, as it was");
    drop(c);
    server.stop("fast");
    server.start_process();
    let mut c = server.client();
    let has: bool = c
        .query_one("SELECT 'mark_lead_ms' = ANY (proargnames) FROM pg_proc WHERE proname = 'id_generator_server_status'", &[])
        .unwrap()
        .get(0);
    assert!(!has, "the release's status function, without 0.4.0's columns, until the update");
    update_with_this_library(&server, &mut c, old_max, release);
}

#[test]
fn update_from_the_0_1_0_release_as_built_from_its_commit() {
    update_from_the_release("0.1.0", |c| {
        // The 0.1.0 library is the one loaded: it has no pg_idgen.fleet_database (0.2.0's).
        assert_eq!(sqlstate(c.query_one("SHOW pg_idgen.fleet_database", &[])), "42704");
    });
}

#[test]
fn update_from_the_0_2_0_release_as_built_from_its_commit() {
    update_from_the_release("0.2.0", |c| {
        // The 0.2.0 library is the one loaded: it has no pg_idgen.max_databases (0.3.0's).
        assert_eq!(sqlstate(c.query_one("SHOW pg_idgen.max_databases", &[])), "42704");
    });
}

#[test]
fn update_from_the_0_3_0_release_as_built_from_its_commit() {
    // 0.3.0 differs from this release only in the status function's columns,
    // which its own SQL does not ask for: the library file tells them apart.
    update_from_the_release("0.3.0", |_| {});
}

/// With an earlier release's objects and this library, before and after
/// ALTER EXTENSION UPDATE: everything works before, and is kept and equal to
/// a fresh install after, where this library's status columns are read.
fn update_with_this_library(server: &Server, c: &mut Client, old_max: i64, release: &str) {
    if release == "0.1.0" {
        // The 0.1.0 registry (keyed by OID) with this library: what needs the
        // newer one refuses with 55000 naming the update; the rest answers.
        for sql in ["INSERT INTO insta5.photos (n) VALUES (0)", "SELECT shard_schema_create('before_update', 11)"] {
            let err = c.batch_execute(sql).unwrap_err();
            let db = err.as_db_error().expect("a server error");
            assert_eq!((db.code().code(), db.hint()), ("55000", Some("Run ALTER EXTENSION pg_idgen UPDATE in this database.")), "{sql}: {db}");
        }
        c.batch_execute("SELECT next_shard_id(5); SELECT uuid_v7(); SELECT * FROM id_generator_server_status(); SELECT * FROM id_generator_status();")
            .unwrap();
    } else {
        // The new library with the old objects, before ALTER EXTENSION UPDATE:
        // DEFAULTs mint, registration, renames and drops work, status reads.
        c.batch_execute(
            "INSERT INTO insta5.photos (n) VALUES (0);
             SELECT shard_schema_create('before_update', 11);
             ALTER SCHEMA before_update RENAME TO renamed_before_update;
             SELECT id_shard(next_schema_id('renamed_before_update'));
             DROP SCHEMA renamed_before_update;
             SELECT uuid_v7(); SELECT * FROM id_generator_server_status(); SELECT * FROM id_generator_status();",
        )
        .unwrap();
        let shard: i32 = c.query_one("SELECT id_shard(max(id)) FROM insta5.photos", &[]).unwrap().get(0);
        assert_eq!(shard, 5);
        c.batch_execute("DELETE FROM insta5.photos WHERE n = 0").unwrap();
    }
    c.batch_execute("ALTER EXTENSION pg_idgen UPDATE").unwrap();
    let version: String = c.query_one("SELECT extversion FROM pg_extension WHERE extname = 'pg_idgen'", &[]).unwrap().get(0);
    assert_eq!(version, "0.13.0");
    // This library answers the new status columns (an old one leaves the
    // last two NULL: it returns eight values), and minting is not stopped.
    let (lead, running): (Option<i64>, bool) = c
        .query_one("SELECT mark_lead_ms, minting_resumes_at IS NULL FROM id_generator_server_status()", &[])
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert!(lead.is_some() && running, "mark_lead_ms {lead:?}, minting_resumes_at NULL: {running}");
    check(c, old_max, false);
    registry_follows_schemas(c);
    assert_same_objects_as_a_fresh_install(server, c);
}
