//! Fleet ownership without a gap: a server's claims and releases hold in
//! every database, across restarts, and through any order of claims,
//! releases, prepared transactions and savepoints.

use pg_idgen_e2e::{sqlstate, Server};

fn mint(c: &mut pg_idgen_e2e::postgres::Client, shard: i32) -> String {
    sqlstate(c.query_one("SELECT next_shard_id($1)", &[&shard]))
}

#[test]
fn releasing_the_last_claim_never_means_every_shard() {
    let mut s = Server::start("own-last-claim", &[]);
    let mut c = s.client();
    c.batch_execute("SELECT shard_claim(5, 5); SELECT next_shard_id(5)").unwrap();
    let high: i64 = c.query_one("SELECT shard_release(5)", &[]).unwrap().get(0);
    for shard in [4, 5, 6, 4000] {
        assert_eq!(mint(&mut c, shard), "55000", "shard {shard} after releasing the last claim");
    }
    s.restart();
    let mut c = s.client();
    for shard in [5, 6, 4000] {
        assert_eq!(mint(&mut c, shard), "55000", "shard {shard} after a restart");
    }
    // Only an adoption (at or above the release) brings it back.
    c.execute("SELECT shard_adopt(5, $1)", &[&high]).unwrap();
    let id: i64 = c.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(id > high);
}

#[test]
fn a_release_holds_in_every_database_and_after_a_crash() {
    let mut s = Server::start("own-databases", &[]);
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    s.client().batch_execute("SELECT shard_claim(0, 99); SELECT next_shard_id(5); SELECT shard_release(5)").unwrap();
    let mut o = s.client_db("other");
    assert_eq!(mint(&mut o, 5), "55000", "released, in another database");
    assert_eq!(mint(&mut o, 500), "55000", "unclaimed, in another database");
    assert_eq!(mint(&mut o, 6), "ok");
    assert_eq!(sqlstate(o.batch_execute("SELECT shard_claim(500, 500)")), "55000", "ownership changes in the fleet database only");
    s.stop("immediate");
    s.start_process();
    let mut o = s.client_db("other");
    assert_eq!(mint(&mut o, 5), "55000", "released, after a crash, in another database");
    assert_eq!(mint(&mut o, 500), "55000");
    assert_eq!(mint(&mut o, 6), "ok");
}

#[test]
fn prepared_ownership_changes_are_refused_and_leave_nothing_behind() {
    let s = Server::start("own-prepared", &["max_prepared_transactions = 5"]);
    let mut c = s.client();
    c.batch_execute("SELECT shard_claim(0, 99); SELECT next_shard_id(5)").unwrap();
    for change in ["SELECT shard_release(5)", "SELECT shard_claim(200, 200)", "SELECT shard_own_all()", "DELETE FROM shard_releases"] {
        c.batch_execute("BEGIN").unwrap();
        c.batch_execute(change).unwrap();
        let e = c.batch_execute("PREPARE TRANSACTION 'x'").unwrap_err();
        assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{change}: {e:?}");
        let _ = c.batch_execute("ROLLBACK");
    }
    let prepared: i64 = c.query_one("SELECT count(*) FROM pg_prepared_xacts", &[]).unwrap().get(0);
    assert_eq!(prepared, 0);
    // A later abort in the same backend changes nothing.
    let _ = c.batch_execute("SELECT 1/0");
    assert_eq!(mint(&mut c, 5), "ok", "the refused release left the shard minting");
    assert_eq!(mint(&mut s.client_db("postgres"), 200), "55000", "the refused claim left nothing");
}

#[test]
fn a_release_rolled_back_to_a_savepoint_mints_again_at_once() {
    let s = Server::start("own-savepoint", &[]);
    let mut c = s.client();
    c.batch_execute("SELECT shard_claim(0, 99); SELECT next_shard_id(5)").unwrap();
    c.batch_execute("BEGIN; SAVEPOINT a; SELECT shard_release(5)").unwrap();
    assert_eq!(mint(&mut s.client(), 5), "55000", "retired at once, for other sessions too");
    c.batch_execute("ROLLBACK TO SAVEPOINT a").unwrap();
    assert_eq!(mint(&mut c, 5), "ok", "in the same transaction");
    assert_eq!(mint(&mut s.client(), 5), "ok", "and in another session, before commit");
    c.batch_execute("COMMIT").unwrap();
    assert_eq!(mint(&mut s.client(), 5), "ok");
    // A release inside a PL/pgSQL exception block that fails is undone too.
    c.batch_execute(
        "DO $$ BEGIN PERFORM shard_release(6); PERFORM 1/0; EXCEPTION WHEN division_by_zero THEN NULL; END $$",
    )
    .unwrap();
    assert_eq!(mint(&mut s.client(), 6), "ok");
}

#[test]
fn adopting_beyond_the_lead_bound_is_refused() {
    let s = Server::start("own-adopt-ahead", &[]);
    let mut c = s.client();
    let far: i64 = c.query_one("SELECT id_from_parts(clock_timestamp() + interval '3 minutes', 90, 0)", &[]).unwrap().get(0);
    assert_eq!(sqlstate(c.execute("SELECT shard_adopt(90, $1)", &[&far])), "22023");
    let near: i64 = c.query_one("SELECT id_from_parts(clock_timestamp() + interval '2 seconds', 90, 0)", &[]).unwrap().get(0);
    c.execute("SELECT shard_adopt(90, $1)", &[&near]).unwrap();
    let id: i64 = c.query_one("SELECT next_shard_id(90)", &[]).unwrap().get(0);
    assert!(id > near);
    assert_eq!(sqlstate(c.batch_execute("SELECT uuid_v7()")), "ok");
}

#[test]
fn every_shard_again_only_by_an_explicit_call() {
    let s = Server::start("own-all", &[]);
    let mut c = s.client();
    c.batch_execute("SELECT shard_claim(0, 9); SELECT next_shard_id(5)").unwrap();
    let high: i64 = c.query_one("SELECT shard_release(5)", &[]).unwrap().get(0);
    assert_eq!(sqlstate(c.batch_execute("SELECT shard_own_all()")), "55000", "refused while a release stands");
    c.execute("SELECT shard_adopt(5, $1)", &[&high]).unwrap();
    c.batch_execute("SELECT shard_own_all()").unwrap();
    assert_eq!(mint(&mut c, 4000), "ok");
    assert_eq!(mint(&mut s.client(), 5), "ok");
}

#[test]
fn a_shard_is_never_adopted_back_below_its_own_release() {
    let s = Server::start("own-adopt-below", &[]);
    let mut c = s.client();
    c.batch_execute("SELECT shard_claim(50, 50); SELECT next_shard_id(50) FROM generate_series(1, 3000)").unwrap();
    let high: i64 = c.query_one("SELECT shard_release(50)", &[]).unwrap().get(0);
    let below: i64 = c.query_one("SELECT id_from_parts(clock_timestamp() - interval '1 hour', 50, 0)", &[]).unwrap().get(0);
    assert_eq!(sqlstate(c.execute("SELECT shard_adopt(50, $1)", &[&below])), "22023");
    assert_eq!(mint(&mut c, 50), "55000", "still released");
    c.execute("SELECT shard_adopt(50, $1)", &[&high]).unwrap();
    let id: i64 = c.query_one("SELECT next_shard_id(50)", &[]).unwrap().get(0);
    assert!(id > high);
}

#[test]
fn a_missing_fleet_database_refuses_rather_than_owning_every_shard() {
    let s = Server::start("own-no-fleet-db", &["pg_idgen.fleet_database = 'postgress'"]);
    let mut c = s.client();
    assert_eq!(mint(&mut c, 5), "55000");
    assert_eq!(sqlstate(c.batch_execute("SELECT uuid_v7()")), "ok", "UUIDs do not depend on shard ownership");
}

/// A superuser's direct writes to the ownership tables (a restore, a repair)
/// queue behind each other, so that each change publishes an image that
/// includes every earlier one.
#[test]
fn direct_writes_to_the_ownership_tables_are_serialized() {
    let s = Server::start("own-direct", &[]);
    s.client().batch_execute("SELECT shard_claim(0, 0)").unwrap();
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let mut a = s.client();
    a.batch_execute("SET application_name = 'first'; BEGIN; INSERT INTO shard_ownership (first_shard, last_shard) VALUES (10, 10)").unwrap();
    let conninfo = s.conninfo("postgres");
    let b = std::thread::spawn(move || {
        let mut b = pg_idgen_e2e::postgres::Client::connect(&conninfo, pg_idgen_e2e::postgres::NoTls).unwrap();
        b.batch_execute("SET application_name = 'second'; INSERT INTO shard_ownership (first_shard, last_shard) VALUES (20, 20)").unwrap();
    });
    pg_idgen_e2e::eventually_waits_for_a_lock(&s, "second");
    a.batch_execute("COMMIT").unwrap();
    b.join().unwrap();
    let mut o = s.client_db("other");
    for shard in [0, 10, 20] {
        assert_eq!(mint(&mut o, shard), "ok", "shard {shard}");
    }
    assert_eq!(mint(&mut o, 30), "55000");
}

/// A role granted the ownership tables (which is what lets it call
/// shard_claim and the others) cannot write them around those functions'
/// checks: taking back a released shard, or adopting a day ahead, is
/// refused with 42501, the shard stays released after a restart, and the
/// functions still work for it. Nor can it attach the tables' trigger
/// function to a table of its own (whose lock every claim would queue on).
#[test]
fn the_ownership_tables_cannot_be_written_around_the_functions() {
    let mut s = Server::start("own-around", &[]);
    s.client()
        .batch_execute(
            "CREATE ROLE mgr LOGIN; GRANT INSERT, UPDATE, DELETE ON shard_ownership, shard_releases, shard_fleet_mode TO mgr;
             SELECT shard_claim(0, 9); SELECT next_shard_id(5); SELECT shard_release(5);",
        )
        .unwrap();
    let mut m = s.client_as("postgres", "mgr");
    for sql in [
        "DELETE FROM shard_releases WHERE shard = 5",
        "INSERT INTO shard_ownership (first_shard, last_shard) VALUES (5, 5)",
        "INSERT INTO shard_ownership (first_shard, last_shard, adopted_after)
         VALUES (6, 6, id_from_parts(now() + interval '1 day', 6, 0))",
        "UPDATE shard_fleet_mode SET claims_only = false",
        "DELETE FROM shard_ownership",
    ] {
        assert_eq!(sqlstate(m.batch_execute(sql)), "42501", "{sql}");
    }
    assert_eq!(
        sqlstate(m.batch_execute(
            "CREATE TEMP TABLE t (x int);
             CREATE TRIGGER t AFTER INSERT ON t FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_ownership_changed()"
        )),
        "42501"
    );
    // With ALL (so TRIGGER), a trigger of its own on the tables would write
    // them while shard_claim may: the functions refuse while one is there.
    s.client().batch_execute("GRANT ALL ON shard_ownership TO mgr; GRANT CREATE ON SCHEMA public TO mgr").unwrap();
    m.batch_execute(
        "CREATE FUNCTION public.sneak() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN INSERT INTO public.shard_releases (shard, high_water) VALUES (42, 0); RETURN NULL; END $$;
         CREATE TRIGGER sneak AFTER INSERT ON shard_ownership FOR EACH ROW EXECUTE FUNCTION public.sneak();",
    )
    .unwrap();
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_claim(500, 500)")), "55000");
    let sneaked: i64 = s.client().query_one("SELECT count(*) FROM shard_releases WHERE shard = 42", &[]).unwrap().get(0);
    assert_eq!(sneaked, 0);
    s.client().batch_execute("DROP TRIGGER sneak ON shard_ownership").unwrap();
    // Nor under the name of one of pg_idgen's triggers, on another of the tables.
    s.client().batch_execute("GRANT ALL ON shard_releases TO mgr").unwrap();
    m.batch_execute("CREATE TRIGGER shard_ownership_changed AFTER INSERT ON shard_releases FOR EACH ROW EXECUTE FUNCTION public.sneak()")
        .unwrap();
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_claim(501, 501)")), "55000", "a trigger named as pg_idgen's");
    s.client().batch_execute("DROP TRIGGER shard_ownership_changed ON shard_releases").unwrap();
    s.restart();
    assert_eq!(mint(&mut s.client(), 5), "55000", "shard 5 stays released");
    let mut m = s.client_as("postgres", "mgr");
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_claim(20, 20)")), "ok", "the functions still work for the role");
    assert_eq!(mint(&mut s.client(), 20), "ok");
}

/// A role without the grant is refused (42501) before it queues for the
/// lock that registrations and ownership changes take: while another session
/// holds that lock, it gets 42501 at once, where a role with the grant waits
/// (its `lock_timeout` ends the wait with 55P03, so a refusal that came
/// after queueing would show as 55P03 too). So it cannot make others wait.
#[test]
fn a_role_without_the_grant_is_refused_before_it_would_wait_for_a_lock() {
    let s = Server::start("own-nogrant", &[]);
    s.client()
        .batch_execute(
            "CREATE ROLE mgr LOGIN; GRANT INSERT, UPDATE, DELETE ON shard_ownership, shard_releases, shard_fleet_mode TO mgr;
             GRANT INSERT ON shard_schema_registry TO mgr;
             CREATE ROLE nobody LOGIN;
             DO $$ BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO mgr, nobody', current_database()); END $$;
             CREATE SCHEMA mine AUTHORIZATION nobody; CREATE SCHEMA theirs AUTHORIZATION mgr;
             SELECT shard_claim(0, 99); SELECT next_shard_id(5); SELECT shard_release(5);",
        )
        .unwrap();
    // Held: the ownership tables' lock (by a claim) and the registry's (by a registration), until COMMIT.
    let mut holder = s.client();
    holder.batch_execute("BEGIN; SELECT shard_claim(200, 200); SELECT shard_schema_create('held', 10)").unwrap();
    // A session with the grants queues behind it.
    let conninfo = s.conninfo("postgres").replace("user=postgres", "user=mgr");
    let queued = std::thread::spawn(move || {
        let mut q = pg_idgen_e2e::postgres::Client::connect(&conninfo, pg_idgen_e2e::postgres::NoTls).unwrap();
        sqlstate(q.batch_execute("SET application_name = 'queued'; SELECT shard_claim(201, 201)"))
    });
    pg_idgen_e2e::eventually_waits_for_a_lock(&s, "queued");
    let calls = [
        "SELECT shard_claim(100, 100)",
        "SELECT shard_release(6)",
        "SELECT shard_adopt(5, id_from_parts(now(), 5, 0))",
        "SELECT shard_own_all()",
        "SELECT shard_schema_register('mine', 11)",
        "SELECT shard_schema_create('another', 12)",
    ];
    let (mut granted, mut nobody) = (s.client_as("postgres", "mgr"), s.client_as("postgres", "nobody"));
    for c in [&mut granted, &mut nobody] {
        c.batch_execute("SET lock_timeout = '1s'").unwrap();
    }
    for sql in calls {
        let sql = sql.replace("'mine'", "'theirs'");
        assert_eq!(sqlstate(granted.batch_execute(&sql)), "55P03", "with the grant, {sql} waits for the lock");
    }
    for sql in calls {
        assert_eq!(sqlstate(nobody.batch_execute(sql)), "42501", "without the grant, {sql}");
    }
    let left: i64 = s.client().query_one("SELECT count(*) FROM pg_namespace WHERE nspname = 'another'", &[]).unwrap().get(0);
    assert_eq!(left, 0, "the refused shard_schema_create left no schema");
    holder.batch_execute("COMMIT").unwrap();
    assert_eq!(queued.join().unwrap(), "ok", "the queued claim went through after the holder committed");
}

/// `shard_release` stops minting at once, also in a statement of another
/// database already under way: that statement fails (55000) at its next ID
/// of the shard rather than finish, and nothing it minted is kept.
#[test]
fn a_release_stops_a_statement_under_way_in_another_database() {
    let s = Server::start("own-under-way", &[]);
    s.client().batch_execute("CREATE DATABASE other").unwrap();
    s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen; CREATE TABLE t (id bigint PRIMARY KEY)").unwrap();
    s.client().batch_execute("SELECT shard_claim(0, 99)").unwrap();
    let mut o = s.client_db("other");
    // Bounded: a statement the release does not stop ends by itself in 120 s.
    o.batch_execute("SET statement_timeout = '30s'").unwrap();
    let running = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        // Two small series joined (a set-returning function in FROM is
        // materialized first): rows, each with a new ID, from the start.
        let r = o.batch_execute("INSERT INTO t SELECT next_shard_id(9) FROM generate_series(1, 100000) a, generate_series(1, 20000) b");
        (sqlstate(r), started.elapsed(), o)
    });
    let mut c = s.client();
    pg_idgen_e2e::eventually(30, "the insert is under way", || {
        c.query_one(
            "SELECT count(*) = 1 FROM pg_stat_activity WHERE datname = 'other' AND state = 'active' AND query LIKE 'INSERT INTO t%'",
            &[],
        )
        .unwrap()
        .get(0)
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    let high: i64 = c.query_one("SELECT shard_release(9)", &[]).unwrap().get(0);
    let (state, took, mut o) = running.join().unwrap();
    assert_eq!(state, "55000", "the statement under way was not stopped by the release");
    assert!(took < std::time::Duration::from_secs(25), "stopped only by its timeout");
    let kept: i64 = o.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0);
    assert_eq!(kept, 0, "rows of the stopped statement were kept");
    assert!(high > 0);
    assert_eq!(mint(&mut o, 9), "55000", "released, in the other database");
}
