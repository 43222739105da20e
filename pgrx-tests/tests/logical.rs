//! The mark travels with logical replication: a subscriber whose tables
//! carry the replica trigger `pg_idgen_follow_ids` mints, once writes move
//! to it, above every ID the publisher minted for them, with its clock 10 s
//! behind the publisher's while it replicates and 8 s behind the last ID at
//! the cutover; a subscriber without it (the control) repeats IDs.

use std::time::{Duration, Instant};

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{eventually, Server};

const TABLE: &str = "CREATE TABLE t (id bigint PRIMARY KEY DEFAULT next_shard_id(5), n int)";

/// A subscriber of publication `p` of `publisher`, its clock 10 s behind,
/// with the replica trigger on `t` when `follow`.
fn subscriber(name: &str, publisher: &Server, follow: bool) -> (Server, Client) {
    let s = Server::start_with_clock(name, &[]);
    s.set_clock("-10s");
    let mut c = s.client();
    c.batch_execute(TABLE).unwrap();
    if follow {
        c.batch_execute(
            "CREATE TRIGGER follow AFTER INSERT OR UPDATE ON t FOR EACH ROW EXECUTE FUNCTION pg_idgen_follow_ids('id');
             ALTER TABLE t ENABLE REPLICA TRIGGER follow;",
        )
        .unwrap();
    }
    c.batch_execute(&format!("CREATE SUBSCRIPTION {name} CONNECTION '{}' PUBLICATION p", publisher.conninfo("postgres")))
        .unwrap_or_else(|e| panic!("{e:?}"));
    (s, c)
}

fn count(c: &mut Client) -> i64 {
    c.query_one("SELECT count(*) FROM t", &[]).unwrap().get(0)
}

#[test]
fn a_subscriber_taking_over_writes_mints_above_every_replicated_id_with_its_clock_10_s_behind() {
    let a = Server::start("logical-pub", &["wal_level = logical", "max_wal_senders = 10", "max_replication_slots = 10"]);
    let mut pa = a.client();
    pa.batch_execute(TABLE).unwrap();
    pa.batch_execute("CREATE PUBLICATION p FOR TABLE t").unwrap();
    let (b, mut sb) = subscriber("follows", &a, true);
    let (control, mut sc) = subscriber("control", &a, false);
    // The publisher writes for 4 s, densely (every millisecond's sequence
    // numbers used).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        pa.batch_execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 3000) g").unwrap();
    }
    let written = Instant::now();
    let n = count(&mut pa);
    eventually(120, "the subscribers caught up", || count(&mut sb) == n && count(&mut sc) == n);
    let a_max: i64 = pa.query_one("SELECT max(id) FROM t", &[]).unwrap().get(0);
    // The naive cutover: writes move to the subscriber, no other step.
    sb.batch_execute("ALTER SUBSCRIPTION follows DISABLE").unwrap();
    sc.batch_execute("ALTER SUBSCRIPTION control DISABLE").unwrap();
    drop(a);
    // However long the apply took, the subscribers' clocks start 8 to 9 s
    // behind the publisher's last ID (within the 10 s lead bound, so that the
    // subscriber with the trigger mints at once, borrowing time), and pass
    // through every millisecond the publisher used in the loop below.
    let behind_s = 8 + written.elapsed().as_secs() + 1;
    for s in [&b, &control] {
        s.set_clock(&format!("-{behind_s}s"));
    }
    let gap_ms: f64 = sc
        .query_one("SELECT extract(epoch FROM id_ts($1) - clock_timestamp())::float8 * 1000", &[&a_max])
        .unwrap()
        .get(0);
    assert!((5000.0..10_000.0).contains(&gap_ms), "the subscribers' clocks are {gap_ms} ms behind the last ID, not 5 to 10 s");
    let cutover = Instant::now();
    let (mut violations, mut control_violations, mut rows) = (0, 0, 0);
    while cutover.elapsed() < Duration::from_secs(16) {
        match sb.execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 500) g", &[]) {
            Ok(k) => rows += k,
            Err(e) => {
                assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e:?}");
                violations += 1;
            }
        }
        if let Err(e) = sc.execute("INSERT INTO t (n) SELECT g FROM generate_series(1, 500) g", &[]) {
            assert_eq!(e.code().map(|c| c.code()), Some("23505"), "{e:?}");
            control_violations += 1;
        }
    }
    eprintln!("after the cutover: {rows} rows and {violations} unique violations with the trigger; {control_violations} statements failed with 23505 without it");
    assert!(control_violations > 0, "the control subscriber never repeated an ID: the test cannot fail");
    assert_eq!(violations, 0, "the subscriber with the trigger repeated replicated IDs");
    assert!(rows > 1000, "only {rows} rows were inserted after the cutover");
    let above: i64 = sb.query_one("SELECT count(*) FROM t WHERE id > $1", &[&a_max]).unwrap().get(0);
    assert_eq!(above as u64, rows, "not every ID minted after the cutover is above the publisher's last");
    // Outside replica mode the trigger does nothing: no role raises the
    // generators by writing IDs of its own choosing.
    sb.batch_execute("ALTER TABLE t ENABLE ALWAYS TRIGGER follow").unwrap();
    let far: i64 = sb.query_one("SELECT id_from_parts(now() + interval '1 day', 5, 0)", &[]).unwrap().get(0);
    sb.execute("INSERT INTO t (id, n) VALUES ($1, 0)", &[&far]).unwrap();
    let next: i64 = sb.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(next < far, "an ordinary insert moved the generator a day ahead");
    let granted: bool = sb.query_one("SELECT has_function_privilege('public', 'pg_idgen_follow_ids()', 'EXECUTE')", &[]).unwrap().get(0);
    assert!(!granted, "PUBLIC may attach the trigger");
    drop(b);
}

#[test]
fn a_replicated_id_far_ahead_of_the_subscribers_clock_stops_the_apply_instead_of_freezing_minting() {
    let a = Server::start("logical-far-pub", &["wal_level = logical"]);
    let mut pa = a.client();
    pa.batch_execute(TABLE).unwrap();
    pa.batch_execute("CREATE PUBLICATION p FOR TABLE t").unwrap();
    let (b, mut sb) = subscriber("far", &a, true);
    pa.batch_execute("INSERT INTO t (n) VALUES (1)").unwrap();
    eventually(60, "the subscriber applied the first row", || count(&mut sb) == 1);
    // An ID a day ahead, written on the publisher by hand.
    let far: i64 = pa.query_one("SELECT id_from_parts(now() + interval '1 day', 5, 0)", &[]).unwrap().get(0);
    pa.execute("INSERT INTO t (id, n) VALUES ($1, 2)", &[&far]).unwrap();
    eventually(60, "the apply worker refuses the row", || b.log().contains(&format!("replicated ID {far} is ")));
    assert_eq!(count(&mut sb), 1, "the row was applied");
    let next: i64 = sb.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(next < far, "the subscriber's generator moved a day ahead");
}
