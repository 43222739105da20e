//! A hostile role: no superuser, CREATE on one schema of its own, a
//! `search_path` of its choosing, functions and operators that shadow
//! built-ins. Each attack asserts the exact outcome: the role is still not
//! superuser, none of its functions ran as another role, the mark and the
//! registry are unchanged, and its own work still succeeds.

use pg_idgen_e2e::{sqlstate, Server};

/// A server with the extension in `postgres`, a role `mallory` owning schema
/// `mal`, and a log table that records who ran each trap function.
fn setup(name: &str) -> Server {
    let server = Server::start(name, &[]);
    server
        .client()
        .batch_execute(
            "CREATE ROLE mallory LOGIN;
             CREATE SCHEMA mal AUTHORIZATION mallory;
             CREATE TABLE public.trap_calls (who text, what text);
             GRANT INSERT, SELECT ON public.trap_calls TO PUBLIC;",
        )
        .unwrap();
    server
}

/// Trap functions and operators in schema `mal` shadowing every built-in
/// that pg_idgen's internal SQL names, each logging `current_user`.
const TRAPS: &str = "
    CREATE SEQUENCE mal.pg_idgen_hwm;
    CREATE FUNCTION mal.logged(what text) RETURNS void LANGUAGE sql
        AS $$ INSERT INTO public.trap_calls VALUES (current_user, what) $$;
    CREATE FUNCTION mal.quote_ident(t text) RETURNS text LANGUAGE sql
        AS $$ SELECT mal.logged('quote_ident'); SELECT '\"' || t || '\"' $$;
    CREATE FUNCTION mal.to_regclass(t text) RETURNS regclass LANGUAGE sql
        AS $$ SELECT mal.logged('to_regclass'); SELECT 'mal.pg_idgen_hwm'::regclass $$;
    CREATE FUNCTION mal.to_regprocedure(t text) RETURNS regprocedure LANGUAGE sql
        AS $$ SELECT mal.logged('to_regprocedure'); SELECT 'mal.logged(text)'::regprocedure $$;
    CREATE FUNCTION mal.setval(r regclass, v bigint, c boolean) RETURNS bigint LANGUAGE sql
        AS $$ SELECT mal.logged('setval'); SELECT v $$;
    CREATE FUNCTION mal.pg_sequence_last_value(r regclass) RETURNS bigint LANGUAGE sql
        AS $$ SELECT mal.logged('pg_sequence_last_value'); SELECT 0::bigint $$;
    CREATE FUNCTION mal.int_eq(a int, b int) RETURNS boolean LANGUAGE sql
        AS $$ SELECT mal.logged('int ='); SELECT a OPERATOR(pg_catalog.=) b $$;
    CREATE OPERATOR mal.= (LEFTARG = int, RIGHTARG = int, FUNCTION = mal.int_eq);
    CREATE FUNCTION mal.oid_eq(a oid, b oid) RETURNS boolean LANGUAGE sql
        AS $$ SELECT mal.logged('oid ='); SELECT a OPERATOR(pg_catalog.=) b $$;
    CREATE OPERATOR mal.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = mal.oid_eq);
    CREATE FUNCTION mal.text_eq(a text, b text) RETURNS boolean LANGUAGE sql
        AS $$ SELECT mal.logged('text ='); SELECT a OPERATOR(pg_catalog.=) b $$;
    CREATE OPERATOR mal.= (LEFTARG = text, RIGHTARG = text, FUNCTION = mal.text_eq);
    CREATE FUNCTION pg_temp.quote_ident(t text) RETURNS text LANGUAGE sql
        AS $$ SELECT mal.logged('pg_temp.quote_ident'); SELECT t $$;
    CREATE TABLE mal.shard_ownership (first_shard int, last_shard int, adopted_after bigint, since timestamptz);
    CREATE TABLE mal.pg_idgen_epoch (epoch_ms bigint, singleton boolean);
    INSERT INTO mal.pg_idgen_epoch VALUES (0, true);
    SET search_path = mal, pg_catalog, public;
";

fn trap_calls(server: &Server) -> Vec<(String, String)> {
    server
        .client()
        .query("SELECT who, what FROM public.trap_calls ORDER BY 1, 2", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

fn mark(server: &Server) -> i64 {
    server.client().query_one("SELECT last_value FROM public.pg_idgen_hwm", &[]).unwrap().get(0)
}

fn is_superuser(server: &Server, role: &str) -> bool {
    server.client().query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role]).unwrap().get(0)
}

#[test]
fn shadowed_builtins_never_run_and_the_mark_moves() {
    let mut server = setup("hostile-shadow");
    // After a restart the first mint in the database loads and writes the mark.
    server.restart();
    let before = mark(&server);
    let mut m = server.client_as("postgres", "mallory");
    m.batch_execute(TRAPS).unwrap();
    // Each answers exactly as without the traps (each query says true).
    for sql in [
        "SELECT pg_catalog.int4eq(id_shard(next_shard_id(1)), 1)",
        "SELECT pg_catalog.int8eq(count(DISTINCT next_shard_id(2)), 20000) FROM pg_catalog.generate_series(1, 20000)",
        "SELECT uuid_v7_ts(uuid_v7()) IS NOT NULL",
        "SELECT persisted_mark IS NOT NULL AND uuid_minted IS NOT NULL FROM id_generator_server_status()",
        "SELECT pg_catalog.int8eq(minted, 20000) FROM id_generator_status() WHERE shard OPERATOR(pg_catalog.=) 2",
        "SELECT id_ts(next_shard_id(3)) >= pg_catalog.now() - interval '1 day'",
        "SELECT id_epoch() OPERATOR(pg_catalog.=) '2026-01-01 00:00:00+00'::timestamptz",
    ] {
        let yes: bool = m.query_one(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}")).get(0);
        assert!(yes, "{sql} answered false");
    }
    // Minting for more than the reservation: the mark is extended (by setval).
    std::thread::sleep(std::time::Duration::from_millis(1200));
    m.batch_execute("SELECT next_shard_id(4)").unwrap();
    let calls = trap_calls(&server);
    assert!(calls.iter().all(|(who, _)| who == "mallory"), "a trap ran as another role: {calls:?}");
    assert!(calls.is_empty(), "pg_idgen called a function of the caller's: {calls:?}");
    assert!(!is_superuser(&server, "mallory"));
    assert!(mark(&server) > before, "the real mark moved");
    let decoy: i64 = server.client().query_one("SELECT last_value FROM mal.pg_idgen_hwm", &[]).unwrap().get(0);
    assert_eq!(decoy, 1, "the caller's sequence of the same name was not touched");
    // The decoy epoch table is not ours: IDs decode with the real epoch.
    let epoch: String = m.query_one("SELECT public.id_epoch()::text", &[]).unwrap().get(0);
    assert_eq!(epoch, "2026-01-01 00:00:00+00");
}

#[test]
fn a_security_definer_function_cannot_be_made_to_run_the_callers_code() {
    let server = setup("hostile-definer");
    server
        .client()
        .batch_execute(
            "CREATE TABLE public.ev (id bigint PRIMARY KEY DEFAULT next_shard_id(1));
             INSERT INTO public.ev SELECT FROM generate_series(1, 2000);
             ANALYZE public.ev;
             GRANT SELECT ON public.ev TO mallory;
             CREATE FUNCTION public.recent() RETURNS bigint LANGUAGE sql SECURITY DEFINER
                 SET search_path = public, pg_catalog
                 AS $$ SELECT count(*) FROM public.ev WHERE id_ts(id) >= now() - interval '1 day' $$;",
        )
        .unwrap();
    let mut m = server.client_as("postgres", "mallory");
    m.batch_execute(TRAPS).unwrap();
    // Fill any session cache under the hostile search_path first.
    m.batch_execute("EXPLAIN SELECT * FROM public.ev WHERE public.id_ts(id) >= pg_catalog.now()").unwrap();
    let n: i64 = m.query_one("SELECT public.recent()", &[]).unwrap().get(0);
    assert_eq!(n, 2000);
    let calls = trap_calls(&server);
    assert!(calls.is_empty(), "{calls:?}");
    assert!(!is_superuser(&server, "mallory"));
}

#[test]
fn ordinary_roles_create_drop_mint_and_decode() {
    let server = setup("hostile-ddl");
    let mut m = server.client_as("postgres", "mallory");
    m.batch_execute(
        "CREATE TABLE mal.t (id bigint PRIMARY KEY DEFAULT next_shard_id(9), a int, b int);
         INSERT INTO mal.t (a, b) SELECT g, g FROM generate_series(1, 100) g;
         ALTER TABLE mal.t DROP COLUMN b;
         CREATE MATERIALIZED VIEW mal.mv AS SELECT id, id_ts(id) AS ts FROM mal.t;
         CREATE UNIQUE INDEX ON mal.mv (id);
         REFRESH MATERIALIZED VIEW CONCURRENTLY mal.mv;
         CREATE TEMP TABLE tt (x int); DROP TABLE tt;
         DROP MATERIALIZED VIEW mal.mv;
         DROP TABLE mal.t;",
    )
    .unwrap();
    let (shard, uuid_ok): (i32, bool) = {
        let r = m.query_one("SELECT (id_decode(next_shard_id(9))).shard, uuid_v7_ts(uuid_v7()) IS NOT NULL", &[]).unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((shard, uuid_ok), (9, true));
    // Without grants, the registry and the claims are not mallory's to change.
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_schema_register('mal', 5)")), "42501");
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_claim(1, 2)")), "42501");
    assert_eq!(sqlstate(m.batch_execute("DELETE FROM shard_schema_registry")), "42501");
    assert!(!is_superuser(&server, "mallory"));
}

#[test]
fn the_documented_grants_let_a_role_register_and_use_a_shard_schema() {
    let server = setup("hostile-grants");
    server.client().batch_execute("GRANT INSERT ON shard_schema_registry TO mallory").unwrap();
    let mut m = server.client_as("postgres", "mallory");
    m.batch_execute(
        "SELECT shard_schema_register('mal', 5);
         CREATE TABLE mal.photos (id bigint PRIMARY KEY DEFAULT next_schema_id('mal'), n int);
         INSERT INTO mal.photos (n) SELECT generate_series(1, 1000);",
    )
    .unwrap();
    let row = m.query_one("SELECT count(DISTINCT id), min(id_shard(id)), max(id_shard(id)) FROM mal.photos", &[]).unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i32>(1), row.get::<_, i32>(2)), (1000, 5, 5));
    // The documented grant for fleet ownership.
    assert_eq!(sqlstate(m.batch_execute("SELECT shard_claim(100, 199)")), "42501");
    server
        .client()
        .batch_execute("GRANT INSERT, UPDATE, DELETE ON shard_ownership, shard_releases, shard_fleet_mode TO mallory")
        .unwrap();
    m.batch_execute("SELECT shard_claim(100, 199); SELECT next_shard_id(150); SELECT shard_release(150)").unwrap();
    let high: i64 = m.query_one("SELECT high_water FROM shard_releases WHERE shard = 150", &[]).unwrap().get(0);
    m.execute("SELECT shard_adopt(150, $1)", &[&high]).unwrap();
    assert!(m.query_one("SELECT next_shard_id(150)", &[]).unwrap().get::<_, i64>(0) > high);
    // Dropping its own registered schema forgets the registration, through
    // the event trigger, without any right on the registry beyond INSERT.
    m.batch_execute("DROP SCHEMA mal CASCADE").unwrap();
    let left: i64 = server.client().query_one("SELECT count(*) FROM shard_schema_registry", &[]).unwrap().get(0);
    assert_eq!(left, 0);
    assert!(!is_superuser(&server, "mallory"));
}

#[test]
fn an_extension_schema_that_needs_quoting_and_is_off_the_search_path() {
    let server = setup("hostile-quoted");
    let mut c = server.client();
    c.batch_execute(
        "CREATE DATABASE q; ",
    )
    .unwrap();
    let mut q = server.client_db("q");
    q.batch_execute(
        "CREATE SCHEMA \"IdGen\"; CREATE EXTENSION pg_idgen SCHEMA \"IdGen\";
         SET search_path = public;
         CREATE TABLE ev (id bigint PRIMARY KEY DEFAULT \"IdGen\".next_shard_id(1), n int);
         INSERT INTO ev (n) SELECT generate_series(1, 5000);
         ANALYZE ev; SET enable_seqscan = off;",
    )
    .unwrap();
    let u: bool = q.query_one("SELECT \"IdGen\".uuid_v7_ts(\"IdGen\".uuid_v7()) IS NOT NULL", &[]).unwrap().get(0);
    assert!(u);
    let plan: Vec<String> = q
        .query("EXPLAIN (COSTS OFF) SELECT * FROM ev WHERE \"IdGen\".id_ts(id) >= now() - interval '1 hour'", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(plan.iter().any(|l| l.contains("ev_pkey")), "{plan:?}");
    let n: i64 = q.query_one("SELECT count(*) FROM ev WHERE \"IdGen\".id_ts(id) >= now() - interval '1 hour'", &[]).unwrap().get(0);
    assert_eq!(n, 5000);
}

/// The extension in a schema of its own that PUBLIC may not use: a role
/// with only its own schema runs every query, a stored time filter gets its
/// key range (the hook needs EXECUTE on what it adds, not USAGE), answers
/// as with the rewrite off, and pg_dump of the role's own schema works (0.4.0:
/// "permission denied for schema idgen" on any query, `SELECT 1` included).
#[test]
fn a_role_without_usage_on_the_extensions_schema_runs_every_query() {
    let server = Server::start("hostile-nousage", &[]);
    server.client().batch_execute("CREATE DATABASE nousage").unwrap();
    server
        .client_db("nousage")
        .batch_execute(
            "CREATE SCHEMA idgen; CREATE EXTENSION pg_idgen SCHEMA idgen;
             REVOKE ALL ON SCHEMA idgen FROM PUBLIC;
             CREATE ROLE tenant LOGIN;
             CREATE SCHEMA tenant AUTHORIZATION tenant;
             CREATE TABLE tenant.t (id bigint PRIMARY KEY);
             INSERT INTO tenant.t SELECT idgen.id_from_parts(now() - g * interval '1 hour', 1, 0) FROM generate_series(0, 999) g;
             ANALYZE tenant.t;
             CREATE VIEW tenant.recent AS SELECT id FROM tenant.t WHERE idgen.id_ts(id) >= now() - interval '10 hours 30 minutes';
             ALTER TABLE tenant.t OWNER TO tenant; ALTER VIEW tenant.recent OWNER TO tenant;",
        )
        .unwrap();
    let mut t = server.client_as("nousage", "tenant");
    assert_eq!(sqlstate(t.query_one("SELECT 1", &[])), "ok");
    assert_eq!(sqlstate(t.query_one("SELECT idgen.id_epoch()", &[])), "42501", "the role may not use the schema");
    let want: Vec<i64> = t.query_one("SELECT array_agg(id ORDER BY id) FROM (SELECT id FROM tenant.t ORDER BY id DESC LIMIT 11) s", &[]).unwrap().get(0);
    let recent = "SELECT array_agg(id ORDER BY id) FROM tenant.recent";
    for rewrite in ["on", "off"] {
        t.batch_execute(&format!("SET pg_idgen.rewrite_time_filters = {rewrite}")).unwrap();
        let got: Vec<i64> = t.query_one(recent, &[]).unwrap().get(0);
        assert_eq!(got, want, "rewrite {rewrite}");
    }
    t.batch_execute("RESET pg_idgen.rewrite_time_filters; SET enable_seqscan = off").unwrap();
    let plan: String =
        t.query("EXPLAIN (COSTS OFF) SELECT * FROM tenant.recent", &[]).unwrap().iter().map(|r| r.get::<_, String>(0) + "\n").collect();
    assert!(plan.contains("Index Cond: (id >= ") && plan.contains("id_lower_bound_clamped"), "{plan}");
    let dump = server.run_as_owner("pg_dump", &["-h", &server.dir.display().to_string(), "-p", &pg_idgen_e2e::PORT.to_string(), "-U", "tenant", "-n", "tenant", "nousage"]);
    assert!(String::from_utf8_lossy(&dump.stdout).contains("CREATE VIEW tenant.recent"), "pg_dump of the role's own schema");
}

#[test]
fn without_the_preload_no_session_changes_what_decoding_returns() {
    let server = Server::init("hostile-nopreload", &["pg_idgen.public_id_key = '000102030405060708090a0b0c0d0e0f'"]);
    server.client().batch_execute("CREATE EXTENSION pg_idgen; CREATE ROLE mallory LOGIN").unwrap();
    let mut m = server.client_as("postgres", "mallory");
    let stock: String = m.query_one("SELECT id_ts(1 << 23)::text", &[]).unwrap().get(0);
    m.batch_execute("SET pg_idgen.epoch = '2000-01-01 00:00:00+00'").unwrap();
    let after: String = m.query_one("SELECT id_ts(1 << 23)::text", &[]).unwrap().get(0);
    assert_eq!(stock, "2026-01-01 00:00:00.001+00");
    assert_eq!(after, stock, "a session's placeholder epoch is never read");
    // An expression index built in such a session agrees with a scan.
    m.batch_execute(
        "CREATE TEMP TABLE t AS SELECT (g::bigint << 23) AS id FROM generate_series(1, 1000) g;
         CREATE INDEX ON t (id_ts(id)); ANALYZE t;",
    )
    .unwrap();
    let n: i64 = m
        .query_one("SELECT count(*) FROM t WHERE id_ts(id) >= '2026-01-01 00:00:00.5+00'", &[])
        .unwrap()
        .get(0);
    assert_eq!(n, 501);
    // The key is never used from a placeholder.
    assert_eq!(sqlstate(m.batch_execute("SELECT id_public(1)")), "55000");
}

#[test]
fn a_changed_epoch_refuses_to_mint_and_decoding_stays() {
    let mut server = setup("hostile-epoch");
    let id: i64 = server.client().query_one("SELECT next_shard_id(3)", &[]).unwrap().get(0);
    let ts: String = server.client().query_one("SELECT id_ts($1)::text", &[&id]).unwrap().get(0);
    server.client().batch_execute("SELECT shard_schema_create('tenant4', 4)").unwrap();
    server.append_conf("pg_idgen.epoch = '2025-06-01 00:00:00+00'");
    server.restart();
    let mut c = server.client();
    // The refusal names both epochs (Unix ms: 2025-06-01 and 2026-01-01) and says what to do.
    for sql in ["SELECT next_shard_id(3)", "SELECT next_schema_id('tenant4')"] {
        let e = c.batch_execute(sql).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(db.code().code(), "55000", "{sql}: {db}");
        assert_eq!(db.message(), "pg_idgen.epoch differs from the epoch this database's IDs were minted with", "{sql}");
        assert_eq!(
            db.detail(),
            Some(
                "The server's epoch is 1748736000000 ms after 1970-01-01 UTC; this database's IDs count from 1767225600000 ms. \
                 Minting under another epoch would repeat IDs and make them decode wrongly."
            ),
            "{sql}"
        );
        assert_eq!(
            db.hint(),
            Some("Set pg_idgen.epoch back to the value shown by id_epoch() in this database and restart the server."),
            "{sql}"
        );
    }
    let again: String = c.query_one("SELECT id_ts($1)::text", &[&id]).unwrap().get(0);
    assert_eq!(again, ts, "decoding uses the recorded epoch");
    let epoch: String = c.query_one("SELECT id_epoch()::text", &[]).unwrap().get(0);
    assert_eq!(epoch, "2026-01-01 00:00:00+00");
    assert_eq!(sqlstate(c.batch_execute("SELECT uuid_v7()")), "ok", "UUIDs do not depend on the epoch");
    // A session of any role cannot set the server's epoch.
    assert_eq!(sqlstate(c.batch_execute("SET pg_idgen.epoch = '2000-01-01'")), "55P02");
}

/// The public-ID key in postgresql.conf: no role reads it back, not even
/// one with `pg_monitor` or `pg_read_all_settings` (which read every other
/// superuser-only setting), nor a superuser; every role can use it.
#[test]
fn the_key_is_not_readable_by_any_role_and_every_role_uses_it() {
    const KEY: &str = "000102030405060708090a0b0c0d0e0f";
    let server = setup("hostile-key");
    let mut admin = server.client();
    admin
        .batch_execute(
            "CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
             CREATE ROLE reader LOGIN IN ROLE pg_read_all_settings;",
        )
        .unwrap();
    let public_zero_before = sqlstate(admin.batch_execute("SELECT id_public(0)"));
    assert_eq!(public_zero_before, "55000", "a key is set before the test sets one");
    server.append_conf(&format!("pg_idgen.public_id_key = '{KEY}'"));
    admin.batch_execute("SELECT pg_reload_conf()").unwrap();
    pg_idgen_e2e::eventually(30, "the reload sets the key", || {
        sqlstate(server.client().batch_execute("SELECT id_public(0)")) == "ok"
    });
    let zero: String = admin.query_one("SELECT id_public(0)", &[]).unwrap().get(0);
    let shown = format!("(set; id_public(0) = {zero})");
    for role in ["postgres", "watcher", "reader"] {
        let mut c = server.client_as("postgres", role);
        let show: String = c.simple_query("SHOW pg_idgen.public_id_key").unwrap().iter().find_map(|m| match m {
            pg_idgen_e2e::postgres::SimpleQueryMessage::Row(r) => r.get(0).map(String::from),
            _ => None,
        }).unwrap();
        assert_eq!(show, shown, "SHOW as {role}");
        let current: String = c.query_one("SELECT current_setting('pg_idgen.public_id_key')", &[]).unwrap().get(0);
        assert_eq!(current, shown, "current_setting as {role}");
        // Nowhere a role can look: pg_settings, SHOW ALL, the file settings (superusers only).
        let seen: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_settings
                  WHERE name = 'pg_idgen.public_id_key' OR setting LIKE $1 OR reset_val LIKE $1 OR boot_val LIKE $1",
                &[&format!("%{KEY}%")],
            )
            .unwrap()
            .get(0);
        assert_eq!(seen, 0, "pg_settings shows the key to {role}");
        let all = c.simple_query("SHOW ALL").unwrap();
        let rows = all.iter().filter(|m| matches!(m, pg_idgen_e2e::postgres::SimpleQueryMessage::Row(_))).count();
        assert!(rows > 100, "SHOW ALL returned only {rows} rows as {role}: the probe did not look");
        for m in &all {
            if let pg_idgen_e2e::postgres::SimpleQueryMessage::Row(r) = m {
                assert!(!r.get(1).unwrap_or("").contains(KEY), "SHOW ALL shows the key to {role}");
            }
        }
        let p: String = c.query_one("SELECT id_public(12345)", &[]).unwrap().get(0);
        let back: i64 = c.query_one("SELECT id_from_public($1)", &[&p]).unwrap().get(0);
        assert_eq!(back, 12345, "public IDs round-trip as {role}");
    }
    let mut m = server.client_as("postgres", "mallory");
    assert_eq!(sqlstate(m.batch_execute("SHOW pg_idgen.public_id_key")), "42501");
    assert_eq!(sqlstate(m.batch_execute("SELECT current_setting('pg_idgen.public_id_key')")), "42501");
    let p: String = m.query_one("SELECT id_public(12345)", &[]).unwrap().get(0);
    assert_eq!(p.len(), 11);
}

/// The key is taken only from the configuration files: a role's or a
/// database's stored value (written before pg_idgen 0.12.0 checked, here
/// while the library was not loaded) is ignored with a WARNING at each
/// connection, a connection's options are refused, and the file's key is
/// the one in force.
#[test]
fn a_key_set_anywhere_but_the_files_is_not_used() {
    const FILE_KEY: &str = "000102030405060708090a0b0c0d0e0f";
    const ROLE_KEY: &str = "ffeeddccbbaa99887766554433221100";
    let mut server = Server::init("hostile-keyplaces", &[]);
    server
        .client()
        .batch_execute(&format!(
            "CREATE ROLE keyed LOGIN; ALTER ROLE keyed SET pg_idgen.public_id_key = '{ROLE_KEY}';
             ALTER DATABASE postgres SET pg_idgen.public_id_key = '{ROLE_KEY}'"
        ))
        .unwrap();
    server.append_conf(&format!("shared_preload_libraries = 'pg_idgen'\npg_idgen.public_id_key = '{FILE_KEY}'"));
    server.restart();
    server.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let expected: String = server.client().query_one("SELECT id_public(1)", &[]).unwrap().get(0);
    // Stored values are refused at each connection (a WARNING, for the
    // role and for the database), and the file's key is the one used.
    let warnings = server.log().matches("can only be set in the configuration file").count();
    let mut k = server.client_as("postgres", "keyed");
    let used: String = k.query_one("SELECT id_public(1)", &[]).unwrap().get(0);
    assert_eq!(used, expected, "the role's stored key was used");
    pg_idgen_e2e::eventually(30, "the connection's warnings are logged", || {
        server.log().matches("can only be set in the configuration file").count() >= warnings + 2
    });
    // A connection's options: refused, the session is not opened.
    let options = format!("{} options='-c pg_idgen.public_id_key={ROLE_KEY}'", server.conninfo("postgres"));
    let e = pg_idgen_e2e::postgres::Client::connect(&options, pg_idgen_e2e::postgres::NoTls).err().expect("refused");
    let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(db.code().code(), "55P02", "{db}");
    assert!(!db.message().contains(ROLE_KEY), "{db}");
    assert!(!server.log().contains(ROLE_KEY), "a refused key is in the log");
}

/// A role without grants cannot queue for a lock on pg_idgen's relations
/// behind a transaction that holds one (its own open read of the registry):
/// each statement that asks for its lock before PostgreSQL checks who may
/// run it is refused at once (42501), where on a table of another owner
/// it queues (55P03 here, by its lock_timeout); minting never waits.
#[test]
fn statements_that_would_queue_on_pg_idgens_relations_are_refused_before_they_lock() {
    let server = setup("hostile-queue");
    server
        .client()
        .batch_execute(
            "SELECT shard_schema_create('tenant', 9);
             CREATE TABLE public.other (x int); GRANT SELECT ON public.other TO PUBLIC;
             CREATE ROLE app LOGIN;",
        )
        .unwrap();
    // Locks held: the registry, an ownership table and `other` by mallory's
    // open read; the mark sequence by a superuser's.
    let mut holder = server.client_as("postgres", "mallory");
    holder
        .batch_execute("BEGIN; SELECT FROM shard_schema_registry; SELECT FROM shard_ownership; SELECT FROM public.other;")
        .unwrap();
    let mut admin = server.client();
    admin.batch_execute("BEGIN; SELECT last_value FROM pg_idgen_hwm;").unwrap();
    let mut m = server.client_as("postgres", "mallory");
    m.batch_execute("SET lock_timeout = '2s'").unwrap();
    // The control: on a table of another owner the same statement queues.
    assert_eq!(sqlstate(m.batch_execute("CREATE RULE r AS ON INSERT TO public.other DO INSTEAD NOTHING")), "55P03");
    server.client().batch_execute("GRANT CREATE ON DATABASE postgres TO mallory").unwrap();
    m.batch_execute(
        "CREATE TABLE mal.p (x int) PARTITION BY LIST (x); CREATE INDEX mal_pi ON mal.p (x); CREATE TABLE mal.q (x int);
         CREATE TABLE mal.shard_schema_registry (x int); SET search_path = mal, public",
    )
    .unwrap();
    for sql in [
        "CREATE RULE r AS ON INSERT TO public.shard_schema_registry DO INSTEAD NOTHING",
        // Unqualified, it finds mallory's own table first; PostgreSQL looks
        // again after a lock wait and may find pg_idgen's behind it.
        "CREATE RULE r AS ON INSERT TO shard_schema_registry DO INSTEAD NOTHING",
        "CREATE RULE r AS ON INSERT TO pg_idgen_hwm DO INSTEAD NOTHING",
        "CREATE TRIGGER t BEFORE INSERT ON shard_ownership FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "CREATE TRIGGER t BEFORE INSERT ON pg_idgen_hwm FOR EACH ROW EXECUTE FUNCTION suppress_redundant_updates_trigger()",
        "ALTER INDEX shard_schema_registry_pkey DEPENDS ON EXTENSION plpgsql",
        "CREATE TABLE mal.child () INHERITS (shard_ownership)",
        "ALTER TABLE mal.p ATTACH PARTITION public.shard_schema_registry FOR VALUES IN (1)",
        "ALTER TABLE mal.p ATTACH PARTITION pg_idgen_hwm FOR VALUES IN (1)",
        "ALTER TABLE mal.p DETACH PARTITION shard_ownership",
        "ALTER INDEX mal.mal_pi ATTACH PARTITION shard_schema_registry_pkey",
        "CREATE TEMP TABLE f (x bigint REFERENCES pg_idgen_hwm)",
        "CREATE TEMP TABLE f (x int, FOREIGN KEY (x) REFERENCES shard_ownership)",
        "ALTER TABLE mal.p ADD FOREIGN KEY (x) REFERENCES shard_releases",
        "ALTER TABLE mal.p ADD COLUMN y int REFERENCES shard_schema_registry",
        "ALTER TABLE mal.q INHERIT shard_ownership",
        "CREATE STATISTICS mal.s ON last_value, log_cnt FROM pg_idgen_hwm",
        // Each table held while the next is waited for.
        "CREATE PUBLICATION p FOR TABLE pg_idgen_hwm, mal.q",
        // The catalog every session of this database reads for pg_idgen.
        "CREATE RULE r AS ON INSERT TO pg_catalog.pg_extension DO INSTEAD NOTHING",
        "ALTER INDEX pg_catalog.pg_extension_name_index DEPENDS ON EXTENSION pg_idgen",
    ] {
        let e = m.batch_execute(sql).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
        assert_eq!(db.code().code(), "42501", "{sql}: {db}");
        assert!(
            ["must be owner of ", "permission denied for ", "permission denied: \"pg_extension"].iter().any(|p| db.message().starts_with(p)),
            "{sql}: {db}"
        );
    }
    // Statements whose lock on our relations conflicts with no mint are not
    // refused: a DROP ... IF EXISTS of a trigger that is not there.
    // Nor a statement on mallory's own table of the same name, named
    // so that it cannot find pg_idgen's.
    for sql in [
        "DROP TRIGGER IF EXISTS t ON public.shard_schema_registry",
        "DROP RULE IF EXISTS r ON shard_ownership",
        "CREATE RULE r AS ON INSERT TO mal.shard_schema_registry DO INSTEAD NOTHING",
    ] {
        assert_eq!(sqlstate(m.batch_execute(sql)), "ok", "{sql}");
    }
    // Minting, with nothing queued, does not wait (a wait would last until
    // the holders end, past the 10 s timeout).
    let mut app = server.client_as("postgres", "app");
    app.batch_execute("SET statement_timeout = '10s'").unwrap();
    for sql in ["SELECT next_schema_id('tenant')", "SELECT next_shard_id(5)", "SELECT count(*) FROM shard_schemas"] {
        let t0 = std::time::Instant::now();
        assert_eq!(sqlstate(app.batch_execute(sql)), "ok", "{sql}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{sql} waited {:?}", t0.elapsed());
    }
    // The owner and superusers are not checked by the guard.
    admin.batch_execute("ROLLBACK; CREATE RULE r AS ON INSERT TO shard_releases DO ALSO NOTHING; DROP RULE r ON shard_releases").unwrap();
    holder.batch_execute("ROLLBACK").unwrap();
}

/// The read-only UUID is minted while the generator is ahead of the clock
/// (stepped back 5 s, within the bound), so only continuing above the
/// backend's last value, not the clock, keeps it in order.
#[test]
fn uuids_stay_ordered_in_a_backend_through_read_only_transactions() {
    let server = Server::start_with_clock("hostile-uuid-ro", &[]);
    let mut c = server.client();
    let last: uuid::Uuid =
        c.query_one("SELECT u FROM (SELECT uuid_v7() AS u FROM generate_series(1, 1000)) s ORDER BY u DESC LIMIT 1", &[])
            .unwrap()
            .get(0);
    server.set_clock("-5s");
    c.batch_execute("BEGIN READ ONLY").unwrap();
    let ro: uuid::Uuid = c.query_one("SELECT uuid_v7()", &[]).unwrap().get(0);
    c.batch_execute("COMMIT").unwrap();
    let rw: uuid::Uuid = c.query_one("SELECT uuid_v7()", &[]).unwrap().get(0);
    assert!(last < ro && ro < rw, "{last} {ro} {rw}");
}

/// An administrator's statement queued for an AccessExclusiveLock on the
/// indexes of the registry and the ownership tables (a role without rights
/// is refused before it queues: see above), behind a role's open
/// transaction that read them: new sessions still mint, within their 5 s
/// statement timeout, because pg_idgen reads those tables by scanning them,
/// never by planning a query that locks their indexes.
#[test]
fn a_lock_queued_on_an_index_of_ours_stops_no_mint() {
    let server = setup("hostile-index-queue");
    server.client().batch_execute("SELECT shard_schema_create('tenant7', 7)").unwrap();
    let mut holder = server.client_as("postgres", "mallory");
    holder
        .batch_execute(
            "BEGIN;
             SELECT * FROM shard_schema_registry WHERE schema_name = 'tenant7';
             SELECT * FROM shard_releases WHERE shard = 1;
             SELECT * FROM shard_fleet_mode WHERE singleton;",
        )
        .unwrap();
    let indexes = ["shard_schema_registry_pkey", "shard_releases_pkey", "shard_fleet_mode_pkey"];
    let queued: Vec<_> = indexes
        .iter()
        .map(|index| {
            let mut c = server.client();
            let sql = format!("ALTER INDEX {index} DEPENDS ON EXTENSION plpgsql");
            std::thread::spawn(move || sqlstate(c.batch_execute(&sql)))
        })
        .collect();
    // The positive control: all three requests wait in the lock queue.
    let mut admin = server.client();
    pg_idgen_e2e::eventually(30, "the three lock requests are queued", || {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
                  WHERE NOT l.granted AND l.mode = 'AccessExclusiveLock' AND c.relname = ANY($1)",
                &[&indexes.to_vec()],
            )
            .unwrap()
            .get(0);
        waiting == 3
    });
    // A plain query of the registry waits behind them: what a planned read would do.
    let mut probe = server.client();
    probe.batch_execute("SET statement_timeout = '2s'").unwrap();
    assert_eq!(
        sqlstate(probe.batch_execute("SELECT count(*) FROM shard_schema_registry WHERE schema_name = 'tenant7'")),
        "57014",
        "a planned read of the registry did not wait: the probe shows nothing"
    );
    for role in ["postgres", "mallory"] {
        let mut victim = server.client_as("postgres", role);
        victim.batch_execute("SET statement_timeout = '5s'").unwrap();
        let id: i64 = victim.query_one("SELECT next_schema_id('tenant7')", &[]).unwrap().get(0);
        assert_eq!(id >> 10 & 8191, 7);
        let id: i64 = victim.query_one("SELECT next_shard_id(3)", &[]).unwrap().get(0);
        assert_eq!(id >> 10 & 8191, 3);
    }
    holder.batch_execute("ROLLBACK").unwrap();
    for q in queued {
        assert_eq!(q.join().unwrap(), "ok", "the administrator's statement ran once its lock was granted");
    }
}
