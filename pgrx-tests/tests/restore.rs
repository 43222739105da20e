//! No ID is ever repeated after a restore or an upgrade onto a server whose
//! clock is behind the source's, whichever database mints first and whether
//! or not it minted before: pg_restore into a database that already minted
//! (custom format and plain, `--data-only`), pg_dumpall, pg_upgrade with a
//! shard minted in two databases. And a restored mark too far ahead stops
//! its own database only, and is kept nowhere once that database is gone.

use std::path::Path;

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{bin, sqlstate, Server};

/// The source server's clock runs this far ahead of the target's, whose
/// lead bound allows minting that far ahead (beyond it a database whose
/// mark is ahead refuses: the last test). Each test checks that the
/// target's clock is still behind the restored IDs when it mints, so that
/// new IDs above them show the mark came through, not the clock.
const AHEAD: &str = "+100s";
const LEAD: &str = "pg_idgen.max_clock_lead_ms = 200000";

/// Fails unless this server's clock is still behind the time of the
/// largest ID in table `table`: minting now tests the restored mark.
fn clock_behind(c: &mut Client, table: &str) {
    let behind: bool = c
        .query_one(&format!("SELECT id_ts(max(id)) > clock_timestamp() FROM {table}"), &[])
        .unwrap()
        .get(0);
    assert!(behind, "the clock passed the restored IDs' time before minting: new IDs above them would prove nothing");
}

fn host(server: &Server) -> String {
    server.dir.to_str().unwrap().to_string()
}

fn dump(server: &Server, program: &str, args: &[&str], file: &str) -> String {
    let out = server.dir.join(file).to_string_lossy().into_owned();
    let h = host(server);
    let mut all = vec!["-h", &h, "-p", "5499", "-U", "postgres", "-f", &out];
    all.extend_from_slice(args);
    server.run_as_owner(program, &all);
    out
}

fn psql_file(target: &Server, db: &str, file: &str) {
    let h = host(target);
    target.run_as_owner("psql", &["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", &h, "-p", "5499", "-U", "postgres", "-d", db, "-f", file]);
}

/// A table keyed by `next_shard_id(shard)`, with `rows` rows minted now.
fn minted_table(c: &mut Client, table: &str, shard: i32, rows: i32) {
    c.batch_execute(&format!(
        "CREATE TABLE {table} (id bigint PRIMARY KEY DEFAULT next_shard_id({shard}), batch int);
         INSERT INTO {table} (batch) SELECT 0 FROM generate_series(1, {rows});"
    ))
    .unwrap();
}

/// Inserts `rows` new rows in one statement per 500; every one must succeed (no 23505).
fn insert_new(c: &mut Client, table: &str, rows: i32) {
    for _ in 0..rows / 500 {
        c.batch_execute(&format!("INSERT INTO {table} (batch) SELECT 1 FROM generate_series(1, 500)"))
            .unwrap_or_else(|e| panic!("insert into {table}: {e:?}"));
    }
}

/// (rows, distinct IDs, largest old ID, smallest new ID) of a table.
fn tally(c: &mut Client, table: &str) -> (i64, i64, i64, i64) {
    let r = c
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT id), max(id) FILTER (WHERE batch = 0), min(id) FILTER (WHERE batch = 1) FROM {table}"
            ),
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

/// A source whose clock runs `ahead` of the target's.
fn source(name: &str, ahead: &str) -> Server {
    let s = Server::start_with_clock(name, &[]);
    s.set_clock(ahead);
    s
}

/// A full custom-format dump of database postgres of a source `ahead` of
/// the target's clock, with `rows` rows minted for shard 5 in its table t.
fn dump_from_ahead(name: &str, ahead: &str, rows: i32) -> (Server, String) {
    let a = source(name, ahead);
    minted_table(&mut a.client(), "t", 5, rows);
    let file = dump(&a, "pg_dump", &["-Fc", "-d", "postgres"], &format!("{name}.dump"));
    (a, file)
}

#[test]
fn restoring_into_a_database_that_already_minted_repeats_nothing() {
    let a = source("restore-src", AHEAD);
    minted_table(&mut a.client(), "t", 5, 20_000);
    let custom = dump(&a, "pg_dump", &["-Fc", "--data-only", "-d", "postgres"], "data.dump");
    let plain = dump(&a, "pg_dump", &["-Fp", "--data-only", "-d", "postgres"], "data.sql");
    let b = Server::start("restore-dst", &[LEAD]);
    for (db, file, custom) in [("custom", &custom, true), ("plain", &plain, false)] {
        b.client().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut c = b.client_db(db);
        // The database mints (its mark is loaded) before the restore.
        c.batch_execute(
            "CREATE EXTENSION pg_idgen; SELECT next_shard_id(0);
             CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_shard_id(5), batch int);",
        )
        .unwrap();
        if custom {
            let h = host(&b);
            b.run_as_owner("pg_restore", &["-h", &h, "-p", "5499", "-U", "postgres", "-d", db, "--exit-on-error", file]);
        } else {
            psql_file(&b, db, file);
        }
        clock_behind(&mut c, "t");
        insert_new(&mut c, "t", 5_000);
        let (rows, distinct, old_max, new_min) = tally(&mut c, "t");
        assert_eq!((rows, distinct), (25_000, 25_000), "{db}: no ID repeated");
        assert!(new_min > old_max, "{db}: new IDs ({new_min}) above every restored one ({old_max})");
    }
}

#[test]
fn pg_dumpall_with_a_shard_minted_in_two_databases_repeats_nothing() {
    let a = source("dumpall2-src", AHEAD);
    a.client().batch_execute("CREATE DATABASE b").unwrap();
    a.client_db("b").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    minted_table(&mut a.client(), "t", 3, 10_000);
    // b mints the same shard later: its mark is the higher one.
    std::thread::sleep(std::time::Duration::from_secs(2));
    minted_table(&mut a.client_db("b"), "t", 3, 10_000);
    let file = dump(&a, "pg_dumpall", &[], "all.sql");
    let b = Server::init("dumpall2-dst", &["shared_preload_libraries = 'pg_idgen'", LEAD]);
    let h = host(&b);
    b.run_as_owner("psql", &["-X", "-q", "-h", &h, "-p", "5499", "-U", "postgres", "-d", "template1", "-f", &file]);
    check_two_databases(&b);
}

/// pg_upgrade --link (same major: the suite's installation), the new
/// cluster's clock behind the old one's, a shard minted in two databases.
#[test]
fn pg_upgrade_with_a_shard_minted_in_two_databases_repeats_nothing() {
    let mut old = source("upgrade2-old", AHEAD);
    old.client().batch_execute("CREATE DATABASE b").unwrap();
    old.client_db("b").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    minted_table(&mut old.client(), "t", 3, 10_000);
    std::thread::sleep(std::time::Duration::from_secs(2));
    minted_table(&mut old.client_db("b"), "t", 3, 10_000);
    old.stop("fast");
    let mut new = Server::init_stopped("upgrade2-new", &["shared_preload_libraries = 'pg_idgen'", LEAD]);
    let bindir = Path::new(&bin("postgres")).parent().unwrap().to_string_lossy().into_owned();
    let (old_data, new_data) = (old.data(), new.data());
    let out = new.run_as_owner(
        "pg_upgrade",
        &["--link", "-b", &bindir, "-B", &bindir, "-d", &old_data, "-D", &new_data, "-p", "50536", "-P", "50537", "-U", "postgres"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("Upgrade Complete"), "{}", String::from_utf8_lossy(&out.stdout));
    new.start_process();
    check_two_databases(&new);
}

/// Database postgres mints first, then b (whose restored mark is higher):
/// across both, no ID repeats and every new ID is above every old one.
fn check_two_databases(server: &Server) {
    let (mut p, mut b) = (server.client(), server.client_db("b"));
    clock_behind(&mut p, "t");
    clock_behind(&mut b, "t");
    insert_new(&mut p, "t", 5_000);
    insert_new(&mut b, "t", 5_000);
    let old_max = tally(&mut p, "t").2.max(tally(&mut b, "t").2);
    for (db, c) in [("postgres", &mut p), ("b", &mut b)] {
        let (rows, distinct, _, new_min) = tally(c, "t");
        assert_eq!((rows, distinct), (15_000, 15_000), "{db}: no ID repeated");
        assert!(new_min > old_max, "{db}: new IDs ({new_min}) above every old one in either database ({old_max})");
    }
    let b_ids: Vec<i64> = b.query("SELECT id FROM t", &[]).unwrap().iter().map(|r| r.get(0)).collect();
    let shared: i64 = p.query_one("SELECT count(*) FROM t WHERE id = ANY($1)", &[&b_ids]).unwrap().get(0);
    assert_eq!(shared, 0, "no ID of shard 3 is in both databases");
}

/// A dump whose mark is an hour ahead of this server's clock (a source with
/// a fast clock, or an edited dump), restored, then first used by a role that
/// may only insert: the mark is held. No database mints (55000 naming the
/// database, the distance and when minting resumes), so none repeats one of
/// its IDs, through a restart too; its `DROP DATABASE` releases it at once,
/// and no mark file ever holds the hour.
#[test]
fn a_mark_restored_far_ahead_is_held_until_its_database_is_dropped() {
    let (_a, file) = dump_from_ahead("ahead-src", "+3600s", 1_000);
    let mut b = Server::start("ahead-dst", &[]);
    b.client()
        .batch_execute(
            "CREATE ROLE tenant LOGIN CREATEDB; CREATE ROLE writer LOGIN;
             CREATE TABLE mine (id bigint PRIMARY KEY DEFAULT next_shard_id(5), u uuid DEFAULT uuid_v7());
             INSERT INTO mine DEFAULT VALUES;",
        )
        .unwrap();
    b.client_as("postgres", "tenant").batch_execute("CREATE DATABASE tenantdb").unwrap();
    let h = host(&b);
    b.run_as_owner("pg_restore", &["-h", &h, "-p", "5499", "-U", "postgres", "-d", "tenantdb", "--exit-on-error", &file]);
    b.client_db("tenantdb").batch_execute("GRANT INSERT ON t TO writer").unwrap();
    let refused = |c: &mut Client, sql: &str| {
        let err = c.batch_execute(sql).unwrap_err();
        let db = err.as_db_error().unwrap_or_else(|| panic!("{sql}: not a server error: {err}"));
        assert_eq!(db.code().code(), "55000", "{sql}: {db}");
        assert!(db.message().contains("high-water mark of database \"tenantdb\""), "{}", db.message());
        assert!(db.hint().unwrap_or("").contains("resumes at"), "{:?}", db.hint());
        let ahead: i64 = db.message().split("the clock is ").nth(1).and_then(|r| r.split(" ms").next()).unwrap().parse().unwrap();
        assert!(ahead > 3_500_000, "the refusal states the hour: {}", db.message());
    };
    refused(&mut b.client_as("tenantdb", "writer"), "INSERT INTO t (batch) VALUES (1)");
    refused(&mut b.client(), "INSERT INTO mine DEFAULT VALUES");
    refused(&mut b.client(), "SELECT uuid_v7()");
    let lead: i64 = b.client().query_one("SELECT mark_lead_ms FROM id_generator_server_status()", &[]).unwrap().get(0);
    assert!(lead > 3_500_000, "the status shows what minting waits for: {lead} ms");
    b.restart();
    refused(&mut b.client(), "INSERT INTO mine DEFAULT VALUES");
    b.client().batch_execute("DROP DATABASE tenantdb").unwrap();
    let mut c = b.client();
    c.batch_execute("INSERT INTO mine SELECT FROM generate_series(1, 1000)").unwrap();
    let lead: i64 = c.query_one("SELECT max(lead_ms) FROM id_generator_status()", &[]).unwrap().get(0);
    assert!(lead < 10_000, "the generators were raised {lead} ms ahead");
    b.restart();
    b.client().batch_execute("INSERT INTO mine SELECT FROM generate_series(1, 1000); SELECT uuid_v7()").unwrap();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let dir = std::path::Path::new(&b.data()).join("pg_idgen");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(!name.starts_with("held."), "{name} is left after its database was dropped");
        // The mark files are pg_idgen/mark.<database OID>.
        if name.strip_prefix("mark.").is_some_and(|oid| oid.parse::<u32>().is_ok()) {
            let ms: i64 = std::fs::read_to_string(entry.path()).unwrap().trim().parse().unwrap();
            assert!(ms < now_ms + 60_000, "{name} holds {ms}, {} ms ahead", ms - now_ms);
            checked += 1;
        }
    }
    assert!(checked >= 1, "no mark file in {}", dir.display());
    let old: Vec<String> = std::fs::read_dir(b.data())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pg_idgen_"))
        .collect();
    assert!(old.is_empty(), "files of pg_idgen in the data directory's root: {old:?}");
}

/// A mark restored past the lead bound (a source 30 s ahead, the default
/// 10 s bound; the target is made before the source mints, so that only the
/// dump and the restore stand between them, and checked still past the
/// bound) holds every database only until the clock is within the bound of
/// it: then minting resumes by itself, above every restored ID in every
/// database (the case that let 0.5.0's first draft repeat 19,486 IDs).
#[test]
fn a_mark_held_past_the_bound_is_taken_when_the_clock_comes_within_it() {
    let b = Server::start("held-dst", &[]);
    b.client().batch_execute("CREATE DATABASE r").unwrap();
    b.client().batch_execute("CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_shard_id(5), batch int)").unwrap();
    let (_a, file) = dump_from_ahead("held-src", "+30s", 5_000);
    let h = host(&b);
    b.run_as_owner("pg_restore", &["-h", &h, "-p", "5499", "-U", "postgres", "-d", "r", "--exit-on-error", &file]);
    let mut c = b.client();
    let past: bool = b
        .client_db("r")
        .query_one("SELECT id_ts(max(id)) > clock_timestamp() + interval '11 s' FROM t", &[])
        .unwrap()
        .get(0);
    let held = sqlstate(c.batch_execute("INSERT INTO t (batch) VALUES (1)"));
    assert!(past, "the dump and restore took so long that the restored IDs are within the bound: nothing to hold");
    assert_eq!(held, "55000", "held right after the restore");
    pg_idgen_e2e::eventually(60, "minting resumes once the clock is within the bound", || {
        c.batch_execute("INSERT INTO t (batch) VALUES (1)").is_ok()
    });
    insert_new(&mut c, "t", 5_000);
    let restored_max: i64 = b.client_db("r").query_one("SELECT max(id) FROM t", &[]).unwrap().get(0);
    let new_min: i64 = c.query_one("SELECT min(id) FROM t", &[]).unwrap().get(0);
    assert!(new_min > restored_max, "database postgres minted {new_min}, not above {restored_max} restored in r");
}

/// A mark set by hand (`setval` of `pg_idgen_hwm`, as an edited dump would):
/// - past the last time IDs can carry: the commit is refused (22008) and the
///   mark set back, never wrapped into a small floor; the database mints on;
/// - in a savepoint rolled back (setval is not transactional, so the value
///   stays): seen at commit all the same; an hour ahead, it is held, and the
///   status functions show it; past the range, the commit is refused;
/// - dropping the database releases it.
#[test]
fn a_mark_set_by_hand_past_the_range_or_in_a_rolled_back_savepoint_is_seen_at_commit() {
    let mut b = Server::start("hand-mark", &[]);
    b.client().batch_execute("CREATE DATABASE r").unwrap();
    let mut r = b.client_db("r");
    r.batch_execute("CREATE EXTENSION pg_idgen; CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_shard_id(5), batch int)").unwrap();
    insert_new(&mut r, "t", 1_000);
    let mark = |c: &mut Client| -> i64 { c.query_one("SELECT last_value FROM pg_idgen_hwm", &[]).unwrap().get(0) };
    let before = mark(&mut r);
    let commit_code = |c: &mut Client, sql: &str| -> (String, String) {
        match c.batch_execute(sql) {
            Ok(()) => ("ok".into(), String::new()),
            Err(e) => {
                let _ = c.batch_execute("ROLLBACK");
                let db = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
                (e.code().map_or("none".into(), |c| c.code().to_string()), db)
            }
        }
    };
    for sql in [
        "BEGIN; SELECT setval('pg_idgen_hwm', 9000000000000000000); COMMIT",
        "BEGIN; SAVEPOINT s; SELECT setval('pg_idgen_hwm', 9000000000000000000); ROLLBACK TO s; COMMIT",
    ] {
        let prev_max: i64 = r.query_one("SELECT max(id) FROM t", &[]).unwrap().get(0);
        let (code, message) = commit_code(&mut r, sql);
        assert_eq!(code, "22008", "{sql}: {message}");
        assert!(message.contains("past the last time IDs can carry"), "{message}");
        let now = mark(&mut r);
        assert!(now >= before && now < before + 600_000, "{sql}: the mark {now} was not set back (it was {before})");
        // The database mints on, above what it minted.
        insert_new(&mut r, "t", 1_000);
        let new_min: i64 = r.query_one("SELECT min(id) FROM t WHERE id > $1", &[&prev_max]).unwrap().get(0);
        let new_rows: i64 = r.query_one("SELECT count(*) FROM t WHERE id > $1", &[&prev_max]).unwrap().get(0);
        assert_eq!(new_rows, 1_000, "{sql}: new IDs not above the old ones (first {new_min})");
    }
    // Rolled back, setval's value stays (setval is not transactional) and
    // no commit sees it: the next mint sets it back, with a warning, rather
    // than hold every database behind a mark no ID can pass.
    r.batch_execute("BEGIN; SELECT setval('pg_idgen_hwm', 9000000000000); ROLLBACK").unwrap();
    // Read at the next reservation: after a restart, at the first mint.
    drop(r);
    b.restart();
    let mut r = b.client_db("r");
    insert_new(&mut r, "t", 1_000);
    let now = mark(&mut r);
    assert!(now < before + 600_000, "the rolled-back mark {now} was kept");
    assert!(b.log().contains("is past the last time IDs can carry; set back"), "not logged");
    assert_eq!(sqlstate(b.client().batch_execute("SELECT next_shard_id(3)")), "ok", "another database was held");
    let distinct: i64 = r.query_one("SELECT count(DISTINCT id) FROM t", &[]).unwrap().get(0);
    assert_eq!(distinct, 4_000);

    // An hour ahead, in a savepoint rolled back: held at commit.
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let ahead = now_ms + 3_600_000;
    let (code, message) = commit_code(
        &mut r,
        &format!("BEGIN; SAVEPOINT s; SELECT setval('pg_idgen_hwm', {ahead}); ROLLBACK TO s; COMMIT"),
    );
    assert_eq!(code, "ok", "{message}");
    let mut p = b.client();
    assert_eq!(sqlstate(p.batch_execute("SELECT next_shard_id(3)")), "55000", "the rolled-back setval was not seen at commit");
    let (lead, resumes): (i64, Option<std::time::SystemTime>) = p
        .query_one("SELECT mark_lead_ms, minting_resumes_at FROM id_generator_server_status()", &[])
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert!(lead > 3_500_000, "the status shows the held mark: {lead} ms");
    assert!(resumes.is_some(), "the status says when minting resumes");
    drop(r);
    p.batch_execute("DROP DATABASE r").unwrap();
    let id: i64 = p.query_one("SELECT next_shard_id(3)", &[]).unwrap().get(0);
    assert_eq!(id >> 10 & 8191, 3);
}

/// More databases holding a mark ahead than there are slots (16): the
/// seventeenth is not lost. It raises every generator instead (logged), so
/// that every database refuses to mint until the clock is within the bound
/// of it, as with a clock step back.
#[test]
fn a_seventeenth_held_mark_raises_every_generator_and_is_logged() {
    let b = Server::start("held-many", &[]);
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    for i in 1..=17 {
        let db = format!("h{i}");
        b.client().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
        let mut c = b.client_db(&db);
        c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        c.batch_execute(&format!("BEGIN; SELECT setval('pg_idgen_hwm', {}); COMMIT", now_ms + 3_600_000 + i)).unwrap();
    }
    let log = b.log();
    assert!(log.contains("more than 16 databases hold a mark ahead of the clock"), "not logged:\n{log}");
    // Dropping the sixteen held databases releases their holds; the
    // seventeenth raised every generator, so minting still refuses.
    for i in 1..=16 {
        b.client().batch_execute(&format!("DROP DATABASE h{i}")).unwrap();
    }
    let mut c = b.client();
    assert_eq!(sqlstate(c.batch_execute("SELECT next_shard_id(3)")), "55000", "a database minted below the seventeenth mark");
    let lead: i64 = c.query_one("SELECT max(lead_ms) FROM id_generator_status()", &[]).map(|r| r.get::<_, Option<i64>>(0).unwrap_or(0)).unwrap();
    assert!(lead > 3_500_000, "the generators were not raised to the seventeenth mark: {lead} ms ahead");
}
