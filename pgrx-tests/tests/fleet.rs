//! Several servers, one ID space: disjoint claims, shard moves, and claims
//! that survive restarts and failovers.

use std::collections::HashSet;
use std::process::Command;
use std::time::Instant;

use pg_idgen_e2e::{decode, sqlstate, Server};

const RANGES: [(i32, i32); 3] = [(0, 2730), (2731, 5461), (5462, 8191)];

/// scripts/fleet-check on these servers: its exit code and what it printed.
fn fleet_check(servers: &[&Server]) -> (Option<i32>, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/fleet-check");
    let out = Command::new("bash").arg(script).args(servers.iter().map(|s| s.conninfo("postgres"))).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

#[test]
fn three_servers_with_disjoint_claims_never_collide() {
    let servers: Vec<Server> = (0..3).map(|i| Server::start(&format!("fleet{i}"), &[])).collect();
    for (s, (first, last)) in servers.iter().zip(RANGES) {
        s.client().execute("SELECT shard_claim($1, $2)", &[&first, &last]).unwrap();
    }
    let all: Vec<&Server> = servers.iter().collect();
    let (code, report) = fleet_check(&all);
    assert!(code == Some(0) && report.contains("OK: 3 servers"), "{code:?}: {report}");

    let (clients_per_server, batches, per_batch) = (2, 10, 10_000);
    let started = Instant::now();
    let handles: Vec<_> = servers
        .iter()
        .zip(RANGES)
        .flat_map(|(s, range)| (0..clients_per_server).map(move |_| (s.client(), range)))
        .map(|(mut c, (first, last))| {
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for _ in 0..batches {
                    let row = c
                        .query_one(
                            "SELECT array_agg(next_shard_id($1::int + (random() * ($2::int - $1::int))::int)) FROM generate_series(1, $3::int)",
                            &[&first, &last, &per_batch],
                        )
                        .unwrap();
                    ids.extend(row.get::<_, Vec<i64>>(0));
                }
                (first, last, ids)
            })
        })
        .collect();
    let mut seen = HashSet::new();
    let mut total = 0;
    for h in handles {
        let (first, last, ids) = h.join().unwrap();
        for &id in &ids {
            let shard = decode(id).1 as i32;
            assert!((first..=last).contains(&shard), "shard {shard} minted outside {first}..{last}");
        }
        total += ids.len();
        seen.extend(ids);
    }
    let seconds = started.elapsed().as_secs_f64();
    println!("three servers: {total} IDs merged in {seconds:.2} s ({:.0} IDs/s), {} distinct", total as f64 / seconds, seen.len());
    assert_eq!(total, 3 * clients_per_server * batches * per_batch as usize);
    assert_eq!(seen.len(), total, "{} duplicates", total - seen.len());

    let mut c = servers[0].client();
    assert_eq!(sqlstate(c.query_one("SELECT next_shard_id(5000)", &[])), "55000", "unclaimed shard");
    c.execute("SELECT shard_claim(3000, 3000)", &[]).unwrap();
    let (code, report) = fleet_check(&all);
    assert!(code == Some(1) && report.contains("OVERLAP: shards 3000 to 3000"), "{code:?}: {report}");
}

/// A server that never claimed a shard, or went back to every shard with
/// `shard_own_all()`, mints for every shard: scripts/fleet-check flags it
/// as overlapping the other servers' claims and exits 1.
#[test]
fn fleet_check_flags_a_server_that_owns_every_shard() {
    let (a, b) = (Server::start("fleet-all-a", &[]), Server::start("fleet-all-b", &[]));
    a.client().batch_execute("SELECT shard_claim(0, 2730)").unwrap();
    let overlap = "OVERLAP: shards 0 to 2730 of server 2 overlap shards up to 2730 of server 1\n";
    assert_eq!(fleet_check(&[&a, &b]), (Some(1), overlap.to_string()), "B never claimed");
    b.client().batch_execute("SELECT shard_claim(2731, 5461)").unwrap();
    assert_eq!(fleet_check(&[&a, &b]), (Some(0), "OK: 2 servers, no shard claimed twice\n".to_string()), "B claimed its own range");
    b.client().batch_execute("SELECT shard_own_all()").unwrap();
    assert_eq!(fleet_check(&[&a, &b]), (Some(1), overlap.to_string()), "B owns every shard again");
}

#[test]
fn a_moved_shard_never_mints_below_its_release_on_a_server_whose_clock_is_behind() {
    let a = Server::start("move_a", &[]);
    let mut b = Server::start_with_clock("move_b", &["pg_idgen.max_clock_lead_ms = '1h'"]);
    let mut ca = a.client();
    ca.batch_execute("SELECT shard_claim(0, 99); CREATE TABLE ids (id bigint PRIMARY KEY)").unwrap();
    b.client().batch_execute("SELECT shard_claim(100, 199); CREATE TABLE ids (id bigint PRIMARY KEY)").unwrap();
    ca.execute("INSERT INTO ids SELECT next_shard_id(42) FROM generate_series(1, 20000)", &[]).unwrap();
    let max_a: i64 = ca.query_one("SELECT max(id) FROM ids", &[]).unwrap().get(0);
    b.set_clock("-600s");

    let high: i64 = ca.query_one("SELECT shard_release(42)", &[]).unwrap().get(0);
    assert!(high > max_a);
    assert_eq!(sqlstate(ca.query_one("SELECT next_shard_id(42)", &[])), "55000", "A refuses after release");

    let mut cb = b.client();
    cb.execute("SELECT shard_adopt(42, $1)", &[&high]).unwrap();
    cb.execute("INSERT INTO ids SELECT next_shard_id(42) FROM generate_series(1, 20000)", &[]).unwrap();
    let min_b: i64 = cb.query_one("SELECT min(id) FROM ids", &[]).unwrap().get(0);
    assert!(min_b > high, "B minted {min_b}, not above A's release {high}");
    drop(cb);
    // Also after B restarts, its clock still ten minutes behind.
    b.restart();
    let mut cb = b.client();
    let max_before: i64 = cb.query_one("SELECT max(id) FROM ids", &[]).unwrap().get(0);
    let next: i64 = cb.query_one("SELECT next_shard_id(42)", &[]).unwrap().get(0);
    assert!(next > max_before, "after a restart B minted {next}, not above {max_before}");
}

#[test]
fn claims_survive_a_restart_and_reach_a_promoted_standby() {
    let mut a = Server::start("claims_primary", &[]);
    let standby = Server::standby_of(&a, "claims_standby", &[]);
    a.client().batch_execute("SELECT shard_claim(10, 20); SELECT shard_release(15)").unwrap();
    let claims = |s: &Server| -> String {
        s.client()
            .query_one("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims", &[])
            .unwrap()
            .get(0)
    };
    a.restart();
    assert_eq!(claims(&a), "10-14,16-20");
    assert_eq!(sqlstate(a.client().query_one("SELECT next_shard_id(15)", &[])), "55000");
    standby.wait_for_replay(&a);
    a.stop("immediate");
    standby.promote();
    assert_eq!(claims(&standby), "10-14,16-20");
    let mut s = standby.client();
    assert_eq!(sqlstate(s.query_one("SELECT next_shard_id(15)", &[])), "55000");
    assert_eq!(sqlstate(s.query_one("SELECT next_shard_id(30)", &[])), "55000");
    assert_eq!(sqlstate(s.query_one("SELECT next_shard_id(12)", &[])), "ok");
}
