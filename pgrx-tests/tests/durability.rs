//! Never a value handed out twice, whatever the clock does across a step
//! back, a restart, a crash or a standby's promotion (libfaketime moves each
//! server's clock).

use pg_idgen_e2e::{sqlstate, Server};
use postgres::Client;

/// A lead bound large enough for the generators to run ahead of a clock
/// that is 30 minutes behind.
const LONG_LEAD: &str = "pg_idgen.max_clock_lead_ms = '1h'";

/// The largest ID and UUID handed out so far: stored ones and ones only returned.
#[derive(Debug, Clone, Copy)]
struct HighWater {
    id: i64,
    uuid: uuid::Uuid,
}

fn setup(c: &mut Client) {
    c.batch_execute("CREATE TABLE ids (batch int NOT NULL, id bigint PRIMARY KEY, u uuid NOT NULL UNIQUE)").unwrap();
}

/// Stores `n` new IDs and UUIDs as batch `batch`, returns one more of each that is
/// handed out but never stored, and checks they all lie above `after`.
fn mint(c: &mut Client, batch: i32, n: i32, after: Option<HighWater>) -> HighWater {
    c.execute(
        "INSERT INTO ids SELECT $1, next_shard_id(3), uuid_v7() FROM generate_series(1, $2)",
        &[&batch, &n],
    )
    .unwrap();
    let row = c
        .query_one(
            "SELECT (SELECT min(id) FROM ids WHERE batch = $1), (SELECT u FROM ids WHERE batch = $1 ORDER BY u LIMIT 1),
                    next_shard_id(3), uuid_v7()",
            &[&batch],
        )
        .unwrap();
    let (min_id, min_uuid): (i64, uuid::Uuid) = (row.get(0), row.get(1));
    if let Some(after) = after {
        assert!(min_id > after.id, "batch {batch}: ID {min_id} is not above {}", after.id);
        assert!(min_uuid > after.uuid, "batch {batch}: UUID {min_uuid} is not above {}", after.uuid);
    }
    let top = HighWater { id: row.get(2), uuid: row.get(3) };
    let stored: i64 = c.query_one("SELECT max(id) FROM ids WHERE batch = $1", &[&batch]).unwrap().get(0);
    assert!(top.id > stored);
    top
}

/// (clock_regressions, borrowed_ms, lead_ms) of shard 3.
fn shard_status(c: &mut Client) -> (i64, i64, i64) {
    let r = c
        .query_one("SELECT clock_regressions, borrowed_ms, lead_ms FROM id_generator_status() WHERE shard = 3", &[])
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

#[test]
fn clock_steps_back_while_running() {
    let server = Server::start_with_clock("clock_back", &[LONG_LEAD]);
    let mut c = server.client();
    setup(&mut c);
    let top = mint(&mut c, 1, 20_000, None);
    server.set_clock("-600s");
    mint(&mut c, 2, 20_000, Some(top));
    let (regressions, borrowed, lead) = shard_status(&mut c);
    assert!(regressions >= 20_000, "regressions {regressions}");
    assert!(borrowed >= 1, "borrowed {borrowed}");
    assert!((590_000..=610_000).contains(&lead), "lead {lead} ms");
}

#[test]
fn clean_restart_with_the_clock_ten_minutes_behind() {
    let mut server = Server::start_with_clock("restart", &[LONG_LEAD]);
    let mut c = server.client();
    setup(&mut c);
    let top = mint(&mut c, 1, 20_000, None);
    drop(c);
    server.set_clock("-600s");
    server.restart();
    let mut c = server.client();
    mint(&mut c, 2, 20_000, Some(top));
    let (_, borrowed, lead) = shard_status(&mut c);
    assert!(borrowed >= 1 && lead >= 590_000, "borrowed {borrowed}, lead {lead}");
}

#[test]
fn crash_and_restart_with_the_clock_further_behind() {
    let mut server = Server::start_with_clock("crash", &[LONG_LEAD]);
    let mut c = server.client();
    setup(&mut c);
    let first = mint(&mut c, 1, 20_000, None);
    server.set_clock("-600s");
    let second = mint(&mut c, 2, 20_000, Some(first));
    drop(c);
    server.stop("immediate");
    server.set_clock("-1200s");
    server.restart();
    let mut c = server.client();
    mint(&mut c, 3, 20_000, Some(second));
    let batches: i64 = c.query_one("SELECT count(DISTINCT batch) FROM ids", &[]).unwrap().get(0);
    assert_eq!(batches, 3, "committed batches survive the crash");
}

#[test]
fn standby_promoted_with_its_clock_thirty_minutes_behind() {
    let mut primary = Server::start_with_clock("primary", &[LONG_LEAD]);
    let standby = Server::standby_of(&primary, "standby", &[]);
    let mut p = primary.client();
    setup(&mut p);
    let top = mint(&mut p, 1, 20_000, None);
    standby.wait_for_replay(&primary);
    let mut s = standby.client();
    standby.set_clock("-1800s");
    assert_eq!(sqlstate(s.query_one("SELECT next_shard_id(3)", &[])), "25006", "a hot standby does not mint IDs");
    // The replayed mark is readable there, and covers what the primary handed out.
    let covered: bool = s
        .query_one("SELECT persisted_mark >= id_ts($1) FROM id_generator_server_status()", &[&top.id])
        .unwrap()
        .get(0);
    assert!(covered, "the standby's mark covers the primary's last ID");
    drop(p);
    primary.stop("immediate");
    standby.promote();
    let mut s = standby.client();
    mint(&mut s, 2, 20_000, Some(top));
    let (_, _, lead) = shard_status(&mut s);
    assert!(lead >= 1_790_000, "the promoted standby runs {lead} ms ahead of its clock");
}

/// The mark is flushed before any ID under it is handed out, even by a
/// transaction that never commits. A standby receives only flushed WAL: the
/// primary crashes with that transaction open, and the standby, promoted
/// with its clock 10 minutes behind, mints above the IDs it handed out.
/// Nothing else flushes the mark here: no commit follows it, autovacuum is
/// off and the WAL writer (which would flush it within 200 ms) waits 10 s.
#[test]
fn a_mark_written_by_a_transaction_that_never_commits_reaches_a_standby() {
    let mut primary = Server::start_with_clock("uncommitted", &[LONG_LEAD, "wal_writer_delay = '10s'", "autovacuum = off"]);
    let standby = Server::standby_of(&primary, "uncommitted-standby", &[]);
    let mut p = primary.client();
    p.batch_execute("BEGIN").unwrap();
    let top: i64 = p.query_one("SELECT max(next_shard_id(3)) FROM generate_series(1, 5000)", &[]).unwrap().get(0);
    let flushed: String = primary.client().query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).unwrap().get(0);
    let mut s = standby.client();
    pg_idgen_e2e::eventually(60, "the standby receives what the primary flushed", || {
        s.query_one("SELECT pg_last_wal_receive_lsn() >= $1::text::pg_lsn", &[&flushed]).unwrap().get::<_, bool>(0)
    });
    primary.stop("immediate");
    drop(p);
    standby.set_clock("-600s");
    standby.promote();
    let mut s = standby.client();
    let first: i64 = s.query_one("SELECT min(next_shard_id(3)) FROM generate_series(1, 1000)", &[]).unwrap().get(0);
    assert!(first > top, "the promoted standby minted {first}, not above {top} of the uncommitted transaction");
}

/// After a promotion onto a clock further behind the old primary's than
/// the lead bound allows, the first refusal states the whole distance to
/// what the server must stay above (the database's replayed mark), not the
/// distance to the older mark files the standby copied at its base backup
/// (0.3.0 understated it by however long the primary ran after the copy).
#[test]
fn the_first_refusal_after_a_promotion_states_the_whole_distance() {
    let mut primary = Server::start_with_clock("gap_primary", &["pg_idgen.max_clock_lead_ms = 2000"]);
    let mut p = primary.client();
    setup(&mut p);
    mint(&mut p, 1, 1000, None);
    let standby = Server::standby_of(&primary, "gap_standby", &[]);
    // The primary goes on minting after the copy: its mark moves 10 s past
    // what the standby's mark files hold.
    std::thread::sleep(std::time::Duration::from_secs(10));
    mint(&mut p, 2, 1000, None);
    standby.wait_for_replay(&primary);
    drop(p);
    primary.stop("immediate");
    standby.set_clock("-60s");
    standby.promote();
    let mut s = standby.client();
    let err = s.query_one("SELECT next_shard_id(3)", &[]).unwrap_err();
    let message = err.as_db_error().expect("a server error").message().to_string();
    let behind: i64 = message
        .split("the clock is ")
        .nth(1)
        .and_then(|r| r.split(" ms behind").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no distance in: {message}"));
    // 60 s, plus at most the 1 s the mark reserves ahead, less the seconds
    // the promotion took; the copied files alone would give about 50 s.
    assert!((55_000..=61_500).contains(&behind), "the refusal says {behind} ms: {message}");
}

#[test]
fn beyond_the_lead_bound_minting_refuses_clearly() {
    let server = Server::start_with_clock("small_lead", &["pg_idgen.max_clock_lead_ms = 2000"]);
    let mut c = server.client();
    setup(&mut c);
    let top = mint(&mut c, 1, 5_000, None);
    server.set_clock("-600s");
    for sql in ["INSERT INTO ids SELECT 2, next_shard_id(3), gen_random_uuid()", "SELECT uuid_v7()"] {
        let err = c.execute(sql, &[]).unwrap_err();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "55000", "{sql}: {db}");
        assert!(db.message().contains("ms behind the last"), "{}", db.message());
        assert!(db.hint().unwrap_or("").contains("pg_idgen.max_clock_lead_ms"), "{:?}", db.hint());
    }
    let count: i64 = c.query_one("SELECT count(*) FROM ids", &[]).unwrap().get(0);
    assert_eq!(count, 5_000, "nothing was half-written");
    server.set_clock("+0");
    mint(&mut c, 3, 5_000, Some(top));
}

/// With `max_clock_lead_ms = 0` a burst waits for the clock: no ID carries
/// a time ahead of the clock read right after it.
#[test]
fn without_lead_a_burst_waits_for_the_clock_and_stays_honest() {
    let server = Server::start("no_lead", &["pg_idgen.max_clock_lead_ms = 0"]);
    let honest: bool = server
        .client()
        .query_one(
            "SELECT max(id_ts(id)) <= clock_timestamp() FROM (SELECT next_shard_id(11) AS id FROM generate_series(1, 4000)) s",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(honest, "an ID ran ahead of the clock with max_clock_lead_ms = 0");
}

/// The lead bound is one for the server (the generators are): a stricter
/// bound cannot be set for one role, so others flooding a shard ahead of the
/// clock within the server's bound never make that role's mint fail.
#[test]
fn no_role_has_a_stricter_lead_bound_than_the_server() {
    let server = Server::start("role_lead", &[]);
    let mut c = server.client();
    c.batch_execute("CREATE ROLE victim LOGIN").unwrap();
    assert_eq!(sqlstate(c.batch_execute("ALTER ROLE victim SET pg_idgen.max_clock_lead_ms = 100")), "55P02");
    assert_eq!(sqlstate(c.batch_execute("ALTER DATABASE postgres SET pg_idgen.max_clock_lead_ms = 100")), "55P02");
    // Shard 7 pushed 2 s ahead of the clock (within the server's 10 s).
    c.batch_execute("SELECT shard_adopt(7, id_from_parts(clock_timestamp() + interval '2 s', 7, 0))").unwrap();
    let mut v = server.client_as("postgres", "victim");
    let ok: i64 = v.query_one("SELECT count(DISTINCT next_shard_id(7)) FROM generate_series(1, 60)", &[]).unwrap().get(0);
    assert_eq!(ok, 60, "the victim mints every ID of the shard others put ahead");
}

#[test]
fn an_unprivileged_role_writes_the_mark_with_the_first_id_after_a_start() {
    let mut server = Server::start("minter", &[]);
    server.client().batch_execute("CREATE ROLE minter").unwrap();
    server.restart();
    let mut c = server.client();
    c.batch_execute("SET ROLE minter").unwrap();
    let reserved: Option<String> =
        c.query_one("SELECT reserved_until::text FROM id_generator_server_status()", &[]).unwrap().get(0);
    assert_eq!(reserved, None, "nothing reserved since the start");
    let id: i64 = c.query_one("SELECT next_shard_id(1)", &[]).unwrap().get(0);
    let covered: bool = c
        .query_one("SELECT persisted_mark >= id_ts($1) FROM id_generator_server_status()", &[&id])
        .unwrap()
        .get(0);
    assert!(covered, "the mark on disk covers the first ID after the start");
    assert_eq!(sqlstate(c.query_one("SELECT setval('pg_idgen_hwm', 1)", &[])), "42501");
}

/// After a promotion, a shard minted in two databases never repeats an ID
/// minted within the old primary's clock: the promoted server's first mark
/// load in each database starts above the last transaction it replayed,
/// whichever database minted it, even with its clock behind the old
/// primary's (a reviewer's reproducer). IDs another database borrowed ahead
/// of that clock (more than 1,024 of a shard in a millisecond) are the case
/// docs/limits.md says is not covered: a statement of 2,000 IDs, minted at
/// full speed, was repeated here (found once libfaketime stopped slowing
/// every clock reading), so the IDs below are checked not to be borrowed.
#[test]
fn a_promoted_standby_with_a_lagging_clock_does_not_repeat_another_databases_ids() {
    // The standby's clock a minute behind (far longer than any promotion
    // takes, so a floor that missed the replayed transactions would mint
    // below them), within the lead bound both servers have.
    let mut primary = Server::start_with_clock("promo_primary", &[LONG_LEAD]);
    primary.client().batch_execute("CREATE DATABASE b").unwrap();
    primary.client_db("b").batch_execute("CREATE EXTENSION pg_idgen; SELECT next_shard_id(3)").unwrap();
    primary.client().batch_execute("SELECT next_shard_id(3)").unwrap();
    let standby = Server::standby_of(&primary, "promo_standby", &[]);
    standby.set_clock("-60s");
    // The primary goes on minting in database postgres, past everything the
    // standby's copied files and database b's mark know.
    std::thread::sleep(std::time::Duration::from_secs(6));
    let mut p = primary.client();
    for _ in 0..4 {
        p.batch_execute("CREATE TABLE IF NOT EXISTS old_ids (id bigint); INSERT INTO old_ids SELECT next_shard_id(3) FROM generate_series(1, 500)").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let borrowed: i64 = p.query_one("SELECT borrowed_ms FROM id_generator_status() WHERE shard = 3", &[]).unwrap().get(0);
    assert_eq!(borrowed, 0, "the IDs were minted within the primary's clock, none borrowed ahead of it");
    drop(p);
    standby.wait_for_replay(&primary);
    primary.stop("fast");
    standby.promote();
    let mut b = standby.client_db("b");
    b.batch_execute("CREATE TABLE new_ids AS SELECT next_shard_id(3) AS id FROM generate_series(1, 20000)").unwrap();
    let old_max: i64 = standby.client().query_one("SELECT max(id) FROM old_ids", &[]).unwrap().get(0);
    let new_min: i64 = b.query_one("SELECT min(id) FROM new_ids", &[]).unwrap().get(0);
    assert!(new_min > old_max, "database b minted {new_min}, not above {old_max} from database postgres");
}

/// A database past `pg_idgen.max_databases` (whose sessions keep their own
/// reservations) does not repeat IDs after a promotion onto a lagging clock,
/// nor after the promoted server restarts.
#[test]
fn a_database_past_max_databases_does_not_repeat_ids_after_a_promotion() {
    let mut primary = Server::start_with_clock("promo_many_primary", &[LONG_LEAD, "pg_idgen.max_databases = 1"]);
    primary.client().batch_execute("SELECT next_shard_id(4)").unwrap(); // postgres takes the one entry
    primary.client().batch_execute("CREATE DATABASE b").unwrap();
    primary.client_db("b").batch_execute("CREATE EXTENSION pg_idgen; SELECT next_shard_id(3)").unwrap();
    let mut standby = Server::standby_of(&primary, "promo_many_standby", &[]);
    standby.set_clock("-1800s");
    std::thread::sleep(std::time::Duration::from_secs(2));
    // Database b mints on after the standby copied the files.
    primary
        .client_db("b")
        .batch_execute("CREATE TABLE old_ids AS SELECT next_shard_id(3) AS id FROM generate_series(1, 3000)")
        .unwrap();
    standby.wait_for_replay(&primary);
    primary.stop("fast");
    standby.promote();
    standby.client().batch_execute("SELECT next_shard_id(4)").unwrap();
    let mut b = standby.client_db("b");
    let old_max: i64 = b.query_one("SELECT max(id) FROM old_ids", &[]).unwrap().get(0);
    let first: i64 = b.query_one("SELECT next_shard_id(3)", &[]).unwrap().get(0);
    assert!(first > old_max, "after the promotion: {first} not above {old_max}");
    drop(b);
    standby.restart();
    let again: i64 = standby.client_db("b").query_one("SELECT next_shard_id(3)", &[]).unwrap().get(0);
    assert!(again > first, "after the promoted server restarted: {again} not above {first}");
}

/// The files of pg_idgen 0.10.0 and before lie in the data directory's
/// root (`pg_idgen_mark.<database OID>`, lock files, what a crash left
/// written aside): the first start of this release moves them into
/// `pg_idgen/` and starts above the marks they hold, and none is left.
#[test]
fn the_files_of_an_earlier_release_are_moved_and_their_marks_kept() {
    let mut server = Server::start("oldfiles", &[LONG_LEAD]);
    let mut c = server.client();
    setup(&mut c);
    mint(&mut c, 1, 1_000, None);
    drop(c);
    server.stop("fast");
    let data = std::path::PathBuf::from(server.data());
    let dir = data.join("pg_idgen");
    let ahead_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 + 20 * 60_000;
    let mut moved = 0;
    for entry in std::fs::read_dir(&dir).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(oid) = name.strip_prefix("mark.") {
            // As 0.10.0 left it, holding a mark 20 minutes ahead.
            std::fs::remove_file(entry.path()).unwrap();
            std::fs::write(data.join(format!("pg_idgen_mark.{oid}")), ahead_ms.to_string()).unwrap();
            moved += 1;
        }
    }
    assert!(moved >= 1, "no mark file in {}", dir.display());
    for leftover in ["pg_idgen_mark.lock", "pg_idgen_citus.lock", "pg_idgen_mark.5.tmp4242"] {
        std::fs::write(data.join(leftover), "0").unwrap();
    }
    std::fs::write(dir.join("mark.9.tmp4243"), "0").unwrap();
    let owner = std::process::Command::new("chown").args(["-R", "postgres:postgres"]).arg(&data).status().unwrap();
    assert!(owner.success());

    server.start_process();
    let mut c = server.client();
    let ts_ms: i64 = c.query_one("SELECT (extract(epoch FROM id_ts(next_shard_id(3))) * 1000)::bigint", &[]).unwrap().get(0);
    assert!(ts_ms > ahead_ms, "minted at {ts_ms}, not above the moved mark {ahead_ms}");
    let root: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pg_idgen_"))
        .collect();
    assert!(root.is_empty(), "left in the root: {root:?}");
    let in_dir: Vec<String> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(in_dir.iter().all(|n| !n.contains(".tmp")), "left written aside: {in_dir:?}");
    let marks: Vec<i64> = in_dir
        .iter()
        .filter(|n| n.starts_with("mark.") && n != &"mark.0")
        .map(|n| std::fs::read_to_string(dir.join(n)).unwrap().trim().parse().unwrap())
        .collect();
    assert_eq!(marks.len(), moved, "{in_dir:?}");
    assert!(marks.iter().all(|ms| *ms >= ahead_ms), "{marks:?}");
}
