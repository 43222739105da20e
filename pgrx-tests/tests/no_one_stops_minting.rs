//! Nothing an ordinary role does stops another database from minting: not
//! creating many databases (or reading status in them), not filling the
//! worker slots with parallel query, not an ownership change left open in
//! the fleet database. Ownership is loaded by one loader after a start,
//! crash or promotion, and when it cannot load, the error and the server
//! log both say why.

use std::time::{Duration, Instant};

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{eventually, sqlstate, Server};

const FALLBACK: &str = "more than pg_idgen.max_databases";

/// Loader processes running now.
fn loaders(c: &mut Client) -> i64 {
    c.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idgen loader'", &[]).unwrap().get(0)
}

#[test]
fn a_createdb_role_making_many_databases_stops_no_one() {
    // Few shared entries, so that most databases keep a reservation per session.
    let mut s = Server::start("many-dbs", &["pg_idgen.max_databases = 8", "max_connections = 100"]);
    s.client()
        .batch_execute("CREATE ROLE tenant LOGIN CREATEDB; CREATE ROLE app LOGIN")
        .unwrap();
    s.client().batch_execute("CREATE DATABASE tenant_tmpl OWNER tenant").unwrap();
    s.client_db("tenant_tmpl").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    // Reading never takes an entry: status in 8 databases leaves every entry free.
    for i in 0..8 {
        s.client_as("postgres", "tenant").batch_execute(&format!("CREATE DATABASE reader{i} TEMPLATE tenant_tmpl")).unwrap();
        let mut r = s.client_as(&format!("reader{i}"), "tenant");
        let reserved: Option<String> =
            r.query_one("SELECT reserved_until::text FROM id_generator_server_status()", &[]).unwrap().get(0);
        assert_eq!(reserved, None, "nothing reserved in a database that only read");
        r.batch_execute("SELECT id_decode(1026); SELECT * FROM id_generator_status()").unwrap();
    }
    // 70 databases made by an ordinary CREATEDB role from a template with the extension, each minting.
    let mut ids: Vec<i64> = vec![];
    for i in 0..70 {
        s.client_as("postgres", "tenant").batch_execute(&format!("CREATE DATABASE tcopy{i} TEMPLATE tenant_tmpl")).unwrap();
        let mut t = s.client_as(&format!("tcopy{i}"), "tenant");
        t.batch_execute("SELECT uuid_v7()").unwrap();
        ids.push(t.query_one("SELECT next_shard_id(7)", &[]).unwrap().get(0));
    }
    assert!(s.log().contains(FALLBACK), "past 8 databases, sessions keep their own reservations");
    // Everyone still mints, the fleet database and an ordinary role included.
    let mut app = s.client_as("postgres", "app");
    ids.push(app.query_one("SELECT next_shard_id(7)", &[]).unwrap().get(0));
    app.batch_execute("SELECT uuid_v7()").unwrap();
    ids.push(s.client_db("tcopy0").query_one("SELECT next_shard_id(7)", &[]).unwrap().get(0));
    let sorted = {
        let mut v = ids.clone();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(sorted, ids, "IDs of shard 7 across 72 mints in 71 databases: distinct and increasing");

    // After a crash, every database starts above every reservation, in
    // entries and in sessions alike; files of dropped databases are folded.
    let dropped_oid: u32 = s.client().query_one("SELECT oid FROM pg_database WHERE datname = 'tcopy69'", &[]).unwrap().get(0);
    s.client().batch_execute("DROP DATABASE tcopy69").unwrap();
    let before = *ids.last().unwrap();
    s.stop("immediate");
    s.start_process();
    let after: i64 = s.client_db("tcopy3").query_one("SELECT next_shard_id(7)", &[]).unwrap().get(0);
    assert!(after > before, "after a crash: {after} above {before}");
    let data = std::path::Path::new(&s.data()).to_path_buf();
    eventually(20, "the loader folds the mark file of the dropped database", || {
        !data.join(format!("pg_idgen/mark.{dropped_oid}")).exists()
    });
    assert!(data.join("pg_idgen/mark.0").exists(), "dropped databases' largest reservation is kept");
}

#[test]
fn a_dropped_database_frees_its_entry() {
    let s = Server::start("drop-frees", &["pg_idgen.max_databases = 2"]);
    for db in ["a", "b"] {
        s.client().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
    }
    for db in ["a", "b"] {
        s.client_db(db).batch_execute("CREATE EXTENSION pg_idgen; SELECT next_shard_id(1)").unwrap();
    }
    // postgres (the fleet database) has not minted: a and b hold both entries.
    s.client().batch_execute("DROP DATABASE a").unwrap();
    s.client().batch_execute("SELECT next_shard_id(1)").unwrap();
    assert!(!s.log().contains(FALLBACK), "the dropped database's entry was taken over");
    // Both entries are taken again (postgres, b): a third database falls
    // back, which the log says, so its silence above was not for want of a fallback.
    s.client().batch_execute("CREATE DATABASE c").unwrap();
    s.client_db("c").batch_execute("CREATE EXTENSION pg_idgen; SELECT next_shard_id(1)").unwrap();
    assert!(s.log().contains(FALLBACK), "a database past max_databases falls back, and the log says so");
}

#[test]
fn parallel_workers_held_by_an_ordinary_role_do_not_stop_minting() {
    let mut s = Server::start("parallel-hog", &["max_worker_processes = 8", "max_parallel_workers = 8"]);
    s.client()
        .batch_execute("CREATE ROLE mallory LOGIN")
        .unwrap();
    for db in ["CREATE DATABASE hog OWNER mallory", "CREATE DATABASE other"] {
        s.client().batch_execute(db).unwrap();
    }
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    s.client_as("hog", "mallory")
        .batch_execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 200000) g; ALTER TABLE t SET (parallel_workers = 8); ANALYZE t")
        .unwrap();
    for event in ["restart", "crash"] {
        if event == "crash" {
            s.stop("immediate");
            s.start_process();
        } else {
            s.restart();
        }
        let hog_dir = s.conninfo("hog").replace("user=postgres", "user=mallory");
        let hog = std::thread::spawn(move || {
            let mut h = Client::connect(&hog_dir, pg_idgen_e2e::postgres::NoTls).unwrap();
            h.batch_execute(
                "SET max_parallel_workers_per_gather = 8; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
                 SET min_parallel_table_scan_size = 0;
                 SELECT count(*) FROM t WHERE pg_sleep(0.0005) IS NOT NULL",
            )
        });
        let mut c = s.client();
        // Every worker slot is taken: another parallel query of mallory's
        // plans workers and gets none.
        let mut probe = s.client_as("hog", "mallory");
        probe
            .batch_execute(
                "SET max_parallel_workers_per_gather = 8; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0;
                 SET min_parallel_table_scan_size = 0",
            )
            .unwrap();
        eventually(20, "mallory's parallel workers run", || {
            c.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker'", &[]).unwrap().get::<_, i64>(0) > 0
        });
        eventually(20, "mallory's parallel workers take every slot", || {
            let plan: String = probe
                .query("EXPLAIN (ANALYZE) SELECT count(*) FROM t", &[])
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0) + "\n")
                .collect();
            plan.contains("Workers Planned: ") && !plan.contains("Workers Planned: 0") && plan.contains("Workers Launched: 0")
        });
        let mut o = s.client_db("other");
        let t0 = Instant::now();
        assert_eq!(sqlstate(o.query_one("SELECT next_shard_id(3)", &[])), "ok", "after a {event}, while workers are held");
        assert_eq!(sqlstate(o.batch_execute("CREATE TABLE IF NOT EXISTS ev (id bigint PRIMARY KEY DEFAULT next_shard_id(4)); INSERT INTO ev DEFAULT VALUES")), "ok");
        assert!(t0.elapsed() < Duration::from_secs(5), "minting waited {:?}", t0.elapsed());
        let busy: i64 =
            c.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker'", &[]).unwrap().get(0);
        assert!(busy > 0, "the workers were still held while minting");
        hog.join().unwrap().unwrap();
    }
}

#[test]
fn an_ownership_change_left_open_does_not_stop_loading() {
    let mut s = Server::start("open-claim", &["max_prepared_transactions = 1"]);
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    // The locks an ownership change takes, held across a restart by a
    // prepared transaction (a change itself cannot be prepared): the
    // loader must load while they are held.
    s.client()
        .batch_execute(
            "BEGIN; LOCK TABLE shard_ownership, shard_releases, shard_fleet_mode IN SHARE UPDATE EXCLUSIVE MODE;
             PREPARE TRANSACTION 'change_locks'",
        )
        .unwrap();
    const LOADED: &str = "pg_idgen: loaded the server's shard ownership";
    let loads = s.log().matches(LOADED).count();
    s.restart();
    eventually(30, "the loader loads while the change's locks are held", || s.log().matches(LOADED).count() > loads);
    let locked: i64 = s
        .client()
        .query_one(
            "SELECT count(*) FROM pg_locks WHERE mode = 'ShareUpdateExclusiveLock' AND granted
                AND relation IN ('shard_ownership'::regclass, 'shard_releases'::regclass, 'shard_fleet_mode'::regclass)",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(locked, 3, "the prepared transaction still holds the three locks");
    s.client().batch_execute("COMMIT PREPARED 'change_locks'").unwrap();
    // A shard manager leaves a claim open in the fleet database right after the start.
    let mut manager = s.client();
    manager.batch_execute("BEGIN; SELECT shard_claim(0, 8191)").unwrap();
    let mut o = s.client_db("other");
    for _ in 0..20 {
        let t0 = Instant::now();
        assert_eq!(sqlstate(o.query_one("SELECT next_shard_id(3)", &[])), "ok");
        assert!(t0.elapsed() < Duration::from_secs(2), "minting waited {:?}", t0.elapsed());
        std::thread::sleep(Duration::from_millis(200));
    }
    manager.batch_execute("COMMIT").unwrap();
    // The claim, committed, is what every database now follows.
    s.client().batch_execute("SELECT shard_release(3)").unwrap();
    assert_eq!(sqlstate(o.query_one("SELECT next_shard_id(3)", &[])), "55000");
    assert_eq!(sqlstate(o.query_one("SELECT next_shard_id(4)", &[])), "ok");
}

#[test]
fn when_ownership_cannot_load_the_error_and_the_log_say_why() {
    let s = Server::start("loader-why", &["pg_idgen.fleet_database = 'fleet'"]);
    let mut c = s.client();
    let e = c.query_one("SELECT next_shard_id(1)", &[]).unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("55000"));
    let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert_eq!(message, "the fleet database \"fleet\" does not exist");
    assert!(s.log().contains("database \"fleet\" does not exist"), "the loader's failure is in the log");
    // The fleet database appears, but a transaction holds its ownership table locked.
    c.batch_execute("CREATE DATABASE fleet").unwrap();
    let mut f = s.client_db("fleet");
    f.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    f.batch_execute("BEGIN; LOCK TABLE shard_ownership IN ACCESS EXCLUSIVE MODE").unwrap();
    eventually(30, "the loader logs what it waits for", || s.log().contains("pg_idgen loader: waiting for a lock on an ownership table in database \"fleet\", held by process"));
    let t0 = Instant::now();
    let e = c.query_one("SELECT next_shard_id(1)", &[]).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(8), "a bounded wait: {:?}", t0.elapsed());
    assert_eq!(e.code().map(|c| c.code()), Some("55000"));
    let detail = e.as_db_error().and_then(|d| d.detail()).unwrap_or_default().to_string();
    assert!(detail.contains("waiting for a lock"), "{detail}");
    f.batch_execute("COMMIT").unwrap();
    eventually(10, "minting resumes once the lock is gone", || sqlstate(c.query_one("SELECT next_shard_id(1)", &[])) == "ok");
    assert!(s.log().contains("pg_idgen: loaded the server's shard ownership from database \"fleet\""));
}

/// With no worker slot left for the loader at server start
/// (`max_worker_processes = 0`), PostgreSQL logs "too many background
/// workers", and minting outside the fleet database refuses with 55000
/// after its bounded wait, saying the loader has not started, until the
/// fleet database, which reads the ownership itself, has minted. Raised
/// and restarted, the loader loads it again.
#[test]
fn without_a_worker_slot_for_the_loader_minting_elsewhere_refuses_and_says_why() {
    let mut s = Server::start("no-slot", &["max_worker_processes = 0"]);
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    let mut o = s.client_db("other");
    o.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    assert!(s.log().contains("too many background workers"), "{}", s.log());
    let t0 = Instant::now();
    let e = o.query_one("SELECT next_shard_id(1)", &[]).unwrap_err();
    let waited = t0.elapsed();
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(db.code().code(), "55000", "{}", db.message());
    assert_eq!(db.message(), "the server's shard ownership is not loaded yet");
    assert_eq!(
        db.detail(),
        Some(
            "The pg_idgen loader reads it from database \"postgres\" (pg_idgen.fleet_database) after a start, crash recovery or \
             promotion; it has not started yet (if the server log said \"too many background workers\" at start, \
             max_worker_processes left no room for it: raise it and restart)."
        )
    );
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(8), "refused after {waited:?}");
    assert_eq!(loaders(&mut s.client()), 0);
    // The fleet database reads the ownership itself, for every database.
    assert_eq!(sqlstate(s.client().query_one("SELECT next_shard_id(1)", &[])), "ok", "in the fleet database");
    assert_eq!(sqlstate(o.query_one("SELECT next_shard_id(1)", &[])), "ok", "in database other once the fleet database read it");
    // With a slot, after a restart, the loader loads it with no help.
    s.append_conf("max_worker_processes = 8");
    s.restart();
    let mut o = s.client_db("other");
    eventually(10, "minting in database other after the restart", || sqlstate(o.query_one("SELECT next_shard_id(1)", &[])) == "ok");
    eventually(10, "the loader logs its load", || s.log().contains("pg_idgen: loaded the server's shard ownership from database \"postgres\""));
}

#[test]
fn new_sessions_past_the_limit_do_not_push_minting_ahead_of_the_clock() {
    let s = Server::start("sessions-ahead", &["pg_idgen.max_databases = 1", "max_connections = 60"]);
    s.client().batch_execute("CREATE ROLE nobody LOGIN").unwrap();
    s.client().batch_execute("CREATE DATABASE d2").unwrap();
    s.client_db("d2").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    s.client().batch_execute("SELECT next_shard_id(1)").unwrap(); // postgres takes the one entry
    // 40 short sessions of a role without rights in d2, each minting once, 20 at a time.
    for _ in 0..2 {
        let sessions: Vec<_> = (0..20)
            .map(|_| {
                let conninfo = s.conninfo("d2").replace("user=postgres", "user=nobody");
                std::thread::spawn(move || {
                    let mut c = Client::connect(&conninfo, pg_idgen_e2e::postgres::NoTls).unwrap();
                    c.batch_execute("SELECT uuid_v7(); SELECT next_shard_id(2)").unwrap();
                })
            })
            .collect();
        for t in sessions {
            t.join().unwrap();
        }
    }
    let mut c = s.client();
    assert_eq!(sqlstate(c.query_one("SELECT next_shard_id(1)", &[])), "ok");
    assert_eq!(sqlstate(c.query_one("SELECT uuid_v7()", &[])), "ok");
    let lead: i64 = c.query_one("SELECT max(lead_ms) FROM id_generator_status()", &[]).unwrap().get(0);
    assert!(lead <= 2000, "generators {lead} ms ahead of the clock after 40 sessions");
    let ahead: i64 = s
        .client_db("d2")
        .query_one("SELECT (extract(epoch FROM persisted_mark - clock_timestamp()) * 1000)::bigint FROM id_generator_server_status()", &[])
        .unwrap()
        .get(0);
    assert!(ahead <= 2000, "d2's mark {ahead} ms ahead of the clock after 40 sessions");
    let logged = s.log().matches(FALLBACK).count();
    assert_eq!(logged, 1, "said once, not once per session");
}

#[test]
fn a_lock_held_by_a_prepared_transaction_is_named_and_minting_waits_a_bounded_time() {
    let mut s = Server::start("prepared-lock", &["max_prepared_transactions = 5"]);
    s.client()
        .batch_execute("CREATE ROLE mgr LOGIN; GRANT INSERT, UPDATE, DELETE ON shard_ownership, shard_releases, shard_fleet_mode TO mgr")
        .unwrap();
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    s.client_as("postgres", "mgr")
        .batch_execute("BEGIN; LOCK TABLE shard_ownership IN ACCESS EXCLUSIVE MODE; PREPARE TRANSACTION 'hold'")
        .unwrap();
    s.restart();
    for db in ["other", "postgres"] {
        let mut c = s.client_db(db);
        let t0 = Instant::now();
        let e = c.query_one("SELECT next_shard_id(1)", &[]).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(8), "{db}: a bounded wait, not {:?}", t0.elapsed());
        assert_eq!(e.code().map(|c| c.code()), Some("55000"), "{db}");
        let detail = e.as_db_error().and_then(|d| d.detail()).unwrap_or_default().to_string();
        assert!(detail.contains("waiting for a lock"), "{db}: {detail}");
    }
    eventually(10, "the log names the holder", || s.log().contains("held by a prepared transaction"));
    s.client().batch_execute("ROLLBACK PREPARED 'hold'").unwrap();
    let mut o = s.client_db("other");
    eventually(10, "minting resumes", || sqlstate(o.query_one("SELECT next_shard_id(1)", &[])) == "ok");
}
