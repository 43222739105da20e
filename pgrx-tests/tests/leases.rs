//! Shard leases in etcd (a real one, Debian's etcd-server): no two running
//! servers mint the same shard, whatever copies of a server are started,
//! whichever server crashes, pauses or loses the store, and whatever their
//! clocks say. Every test uses TTL 4 s (a margin of 1 s, renewals every 1.3 s).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pg_idgen_e2e::etcd::Etcd;
use pg_idgen_e2e::patroni::test_dir;
use pg_idgen_e2e::{eventually, sqlstate, Server};

const TTL_S: u64 = 4;
/// `core::lease::margin_ms(4000)`.
const MARGIN: Duration = Duration::from_millis(1000);

fn etcd(name: &str) -> Etcd {
    assert!(Etcd::missing().is_none(), "{}", Etcd::missing().unwrap_or_default());
    Etcd::start(&test_dir(name))
}

/// Settings of a server that leases `shards` (and `auto` free ones) from `etcd`.
fn leasing(etcd: &Etcd, shards: &str, auto: i32) -> Vec<String> {
    vec![
        format!("pg_idgen.lease_store = '{}'", etcd.url()),
        format!("pg_idgen.lease_shards = '{shards}'"),
        format!("pg_idgen.lease_auto_shards = {auto}"),
        format!("pg_idgen.lease_ttl = {TTL_S}"),
    ]
}

/// The SQLSTATE of an error.
fn code(e: &pg_idgen_e2e::postgres::Error) -> String {
    e.code().map_or_else(|| format!("not a server error: {e}"), |c| c.code().to_string())
}

fn conf(lines: &[String]) -> Vec<&str> {
    lines.iter().map(String::as_str).collect()
}

/// The shards a server holds leases on now.
fn held(server: &Server) -> Vec<i32> {
    server
        .client()
        .query("SELECT shard FROM shard_leases() WHERE state = 'held' AND valid_for_ms > 0 ORDER BY shard", &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn wait_held(server: &Server, shards: &[i32], secs: u64) {
    eventually(secs, &format!("the server holds leases on {shards:?}"), || {
        let h = held(server);
        shards.iter().all(|s| h.contains(s))
    });
}

/// Thaws a frozen server when dropped, whatever happens meanwhile, so that it can be stopped.
struct Thaw<'a>(&'a Server);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

/// Calls `next_shard_id(shard)` every `pause` for `span`, each call refused
/// (55000, else it fails saying `what`); how many calls were made.
fn refuses_for(c: &mut pg_idgen_e2e::postgres::Client, shard: i32, span: Duration, pause: Duration, what: &str) -> usize {
    let start = Instant::now();
    let mut refused = 0;
    while start.elapsed() < span {
        assert_eq!(sqlstate(c.query_one("SELECT next_shard_id($1)", &[&shard])), "55000", "{what}");
        refused += 1;
        std::thread::sleep(pause);
    }
    refused
}

/// One call's outcome: when the call was sent, and the ID or the SQLSTATE.
type Call = (Instant, Result<i64, String>);

/// A client calling `next_shard_id(shard)` in a loop until `stop` is set.
fn minter(server: &Server, shard: i32, stop: &Arc<AtomicBool>) -> JoinHandle<Vec<Call>> {
    let mut c = server.client();
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut calls = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(300);
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            let sent = Instant::now();
            let r = c.query_one("SELECT next_shard_id($1)", &[&shard]);
            calls.push((sent, r.map(|row| row.get::<_, i64>(0)).map_err(|e| sqlstate(Err::<(), _>(e)))));
            if calls.last().unwrap().1.is_err() {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        calls
    })
}

fn ids(calls: &[Call]) -> Vec<i64> {
    calls.iter().filter_map(|(_, r)| r.as_ref().ok().copied()).collect()
}

/// Every failed call failed with 55000, the lease refusal (or the clock
/// refusal of a new holder whose clock is behind the mark).
fn only_refusals(calls: &[Call]) {
    for (_, r) in calls {
        if let Err(state) = r {
            assert_eq!(state, "55000", "a call failed for another reason");
        }
    }
}

#[test]
fn a_clone_started_while_the_original_mints_takes_other_shards_and_mints_none_of_its_ids() {
    let etcd = etcd("lease-clone");
    let a = Server::start("lease-clone-a", &conf(&leasing(&etcd, "5", 2)));
    wait_held(&a, &[0, 1, 5], 30);
    let stop = Arc::new(AtomicBool::new(false));
    let on_a = minter(&a, 5, &stop);
    // The clone copies A's settings and A's list of shards to ask for first.
    let clone = Server::clone_of(&a, "lease-clone-b", &[]);
    // After a TTL and a half of patience it takes two other free shards.
    wait_held(&clone, &[2, 3], 30);
    let on_clone = minter(&clone, 5, &stop);
    std::thread::sleep(Duration::from_secs(3));
    let mut c = clone.client();
    for s in [0, 1, 5] {
        let e = c.query_one("SELECT next_shard_id($1)", &[&s]).unwrap_err();
        assert_eq!(code(&e), "55000", "shard {s}: {e}");
        let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
        assert!(message.contains(&format!("shard {s} has no lease")), "{e:?}");
    }
    stop.store(true, Ordering::Relaxed);
    let (on_a, on_clone) = (on_a.join().unwrap(), on_clone.join().unwrap());
    only_refusals(&on_clone);
    eprintln!("clone: A minted {} IDs of shard 5; the clone {} in {} calls", ids(&on_a).len(), ids(&on_clone).len(), on_clone.len());
    assert!(ids(&on_a).len() > 100, "A minted {} IDs: the control did not run", ids(&on_a).len());
    assert_eq!(ids(&on_clone).len(), 0, "the clone minted shard 5, which A holds");
    assert!(on_clone.len() > 10, "the clone was asked only {} times", on_clone.len());
    assert_eq!(held(&a), vec![0, 1, 5], "A kept its leases");
    assert!(held(&clone).iter().all(|s| ![0, 1, 5].contains(s)), "{:?}", held(&clone));
    assert!(clone.log().contains("a copy of this server"), "the clone did not warn that it is a copy");
    // The clone's own shards mint.
    let id: i64 = c.query_one("SELECT next_shard_id(2)", &[]).unwrap().get(0);
    assert_eq!(id >> 10 & 8191, 2);
}

#[test]
fn a_standby_promoted_while_the_primary_runs_mints_none_of_its_ids_then_takes_over_above_them() {
    let etcd = etcd("lease-split");
    let mut a = Server::start("lease-split-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let standby = Server::standby_of(&a, "lease-split-b", &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let on_a = minter(&a, 5, &stop);
    standby.wait_for_replay(&a);
    standby.promote();
    let on_b = minter(&standby, 5, &stop);
    std::thread::sleep(Duration::from_secs(2 * TTL_S));
    stop.store(true, Ordering::Relaxed);
    let (on_a, on_b) = (on_a.join().unwrap(), on_b.join().unwrap());
    only_refusals(&on_b);
    eprintln!("split brain: A minted {} IDs of shard 5; the promoted standby {} in {} calls", ids(&on_a).len(), ids(&on_b).len(), on_b.len());
    assert!(ids(&on_a).len() > 100, "A minted {} IDs: the control did not run", ids(&on_a).len());
    assert_eq!(ids(&on_b).len(), 0, "the promoted standby minted shard 5 while A held it");
    let a_last = *ids(&on_a).iter().max().unwrap();
    // A stops cleanly: it files its exact mark and gives the lease back;
    // the promoted standby takes the shard and mints above A's last ID.
    a.stop("fast");
    wait_held(&standby, &[5], 30);
    let first: i64 = standby.client().query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(first > a_last, "the new holder's first ID {first} is not above the old one's last {a_last}");
}

#[test]
fn after_a_crash_the_next_holder_starts_above_the_last_id_with_its_clock_30_s_behind() {
    let etcd = etcd("lease-crash");
    let mut a = Server::start("lease-crash-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let b = Server::start_with_clock("lease-crash-b", &conf(&leasing(&etcd, "5", 0)));
    b.set_clock("-30s");
    let mut c = a.client();
    let mut a_last = 0i64;
    for _ in 0..50 {
        a_last = c.query_one("SELECT max(next_shard_id(5)) FROM generate_series(1, 2000)", &[]).unwrap().get(0);
    }
    // B is refused while A holds the lease.
    assert_eq!(sqlstate(b.client().query_one("SELECT next_shard_id(5)", &[])), "55000");
    a.stop("immediate");
    let crashed = Instant::now();
    // The lease runs out in the store after the TTL; B takes the shard, its
    // generator above the mark A filed; with B's clock 30 s behind, B refuses
    // (55000) until its clock is within the lead bound of that mark.
    wait_held(&b, &[5], 30);
    let mut cb = b.client();
    let mut refused = 0;
    let first = loop {
        match cb.query_one("SELECT next_shard_id(5)", &[]) {
            Ok(row) => break row.get::<_, i64>(0),
            Err(e) => {
                assert_eq!(sqlstate(Err::<(), _>(e)), "55000");
                refused += 1;
                assert!(crashed.elapsed() < Duration::from_secs(120), "B refused for 2 minutes");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    eprintln!("crash: B refused {refused} calls, then minted {first} above A's last {a_last}, {:.1} s after the crash", crashed.elapsed().as_secs_f64());
    assert!(first > a_last, "B's first ID {first} is not above A's last {a_last}");
    assert!(refused > 0, "B, 30 s behind, minted at once: its first ID carries a time its clock had not reached");
}

#[test]
fn with_the_store_stopped_past_the_ttl_minting_stops_within_the_ttl_and_resumes_when_it_returns() {
    let mut etcd = etcd("lease-store");
    let a = Server::start("lease-store-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let stop = Arc::new(AtomicBool::new(false));
    let on_a = minter(&a, 5, &stop);
    std::thread::sleep(Duration::from_secs(1));
    etcd.stop();
    let stopped = Instant::now();
    // The last renewal was sent before `stopped`: it lets A mint until at
    // most a TTL minus the margin after it.
    std::thread::sleep(Duration::from_secs(3 * TTL_S));
    let mut c = a.client();
    let e = c.query_one("SELECT next_shard_id(5)", &[]).unwrap_err();
    assert_eq!(code(&e), "55000");
    assert!(e.as_db_error().and_then(|d| d.detail()).unwrap_or("").contains(&etcd.url()), "{e:?}");
    etcd.start_again();
    let returned = Instant::now();
    wait_held(&a, &[5], 30);
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let calls = on_a.join().unwrap();
    only_refusals(&calls);
    let fence = stopped + Duration::from_secs(TTL_S) - MARGIN;
    let last_ok = calls.iter().filter(|(t, r)| r.is_ok() && *t < returned).map(|(t, _)| *t).max();
    let first_refused = calls.iter().filter(|(t, r)| r.is_err() && *t > stopped).map(|(t, _)| *t).min();
    eprintln!(
        "store stopped: last ID {:.2} s after, first refusal {:.2} s after (fence {:.2} s); resumed {:.2} s after it returned",
        last_ok.map_or(-1.0, |t| t.saturating_duration_since(stopped).as_secs_f64()),
        first_refused.map_or(-1.0, |t| (t - stopped).as_secs_f64()),
        (fence - stopped).as_secs_f64(),
        calls.iter().filter(|(t, r)| r.is_ok() && *t > returned).map(|(t, _)| (*t - returned).as_secs_f64()).fold(f64::MAX, f64::min)
    );
    let late: Vec<_> = calls.iter().filter(|(t, r)| r.is_ok() && *t > fence && *t < returned).collect();
    assert!(late.is_empty(), "{} IDs minted in calls sent after the fence and before the store returned", late.len());
    assert!(calls.iter().any(|(t, r)| r.is_err() && *t < returned), "minting never stopped");
    assert!(calls.iter().any(|(t, r)| r.is_ok() && *t > returned), "minting did not resume");
    let all = ids(&calls);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "IDs did not keep increasing across the outage");
}

#[test]
fn a_server_paused_past_its_ttl_mints_nothing_on_waking_and_repeats_nothing() {
    let etcd = etcd("lease-frozen");
    let a = Server::start("lease-frozen-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let b = Server::start("lease-frozen-b", &conf(&leasing(&etcd, "5", 0)));
    let mut ca = a.client();
    let a_last: i64 = ca.query_one("SELECT max(next_shard_id(5)) FROM generate_series(1, 10000)", &[]).unwrap().get(0);
    a.freeze();
    let thaw = Thaw(&a);
    wait_held(&b, &[5], 30);
    let b_ids: Vec<i64> = b.client().query_one("SELECT array_agg(next_shard_id(5)) FROM generate_series(1, 10000)", &[]).unwrap().get(0);
    assert!(b_ids.iter().all(|id| *id > a_last), "B minted at or below A's last ID");
    drop(thaw);
    // At once on waking, and for two TTLs after: A mints nothing.
    let what = "A minted after waking, while B holds the lease";
    let refused = refuses_for(&mut ca, 5, Duration::from_secs(2 * TTL_S), Duration::from_millis(50), what);
    assert!(refused > 10);
    assert!(held(&a).is_empty() && held(&b) == vec![5]);
}

#[test]
fn servers_asking_for_free_shards_at_once_get_disjoint_ones_and_a_restart_gets_them_back() {
    let etcd = etcd("lease-auto");
    let lines = leasing(&etcd, "", 3);
    let servers: Vec<Server> = std::thread::scope(|s| {
        let lines = &lines;
        let handles: Vec<_> = (0..3).map(|i| s.spawn(move || Server::start(&format!("lease-auto-{i}"), &conf(lines)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eventually(30, "each server holds 3 shards", || servers.iter().all(|s| held(s).len() == 3));
    let mut all = HashSet::new();
    for s in &servers {
        for shard in held(s) {
            assert!(all.insert(shard), "shard {shard} is held by two servers");
        }
    }
    assert_eq!(all, (0..9).collect::<HashSet<i32>>(), "not the lowest free shards");
    // A clean restart gives the leases back and takes the same shards again.
    let mut servers = servers;
    let before = held(&servers[1]);
    servers[1].restart();
    wait_held(&servers[1], &before, 30);
    assert_eq!(held(&servers[1]), before);
    // So does a crash, once the old lease has run out (the shards wait for it).
    let before = held(&servers[2]);
    servers[2].stop("immediate");
    servers[2].start_process();
    wait_held(&servers[2], &before, 30);
    assert_eq!(held(&servers[2]), before);
}

#[test]
fn with_the_store_unreachable_at_start_minting_refuses_then_resumes_by_itself() {
    let mut etcd = etcd("lease-start");
    etcd.stop();
    let a = Server::start("lease-start-a", &conf(&leasing(&etcd, "5", 0)));
    let mut c = a.client();
    std::thread::sleep(Duration::from_secs(2));
    let e = c.query_one("SELECT next_shard_id(5)", &[]).unwrap_err();
    assert_eq!(code(&e), "55000");
    let detail = e.as_db_error().and_then(|d| d.detail()).unwrap_or("").to_string();
    assert!(detail.contains("cannot be reached") && detail.contains(&etcd.url()), "{detail}");
    // Shards it does not ask for never mint, and UUIDs are not leased.
    let e = c.query_one("SELECT next_shard_id(6)", &[]).unwrap_err();
    assert!(e.as_db_error().and_then(|d| d.detail()).unwrap_or("").contains("does not ask for shard 6"), "{e:?}");
    c.query_one("SELECT uuid_v7()", &[]).unwrap();
    etcd.start_again();
    wait_held(&a, &[5], 30);
    let id: i64 = c.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert_eq!(id >> 10 & 8191, 5);
}

#[test]
fn a_lease_setting_that_cannot_be_read_stops_the_server_from_starting() {
    for (name, value) in [("lease_shards", "5-3"), ("lease_leader_key", "/service/batman/leader")] {
        let line = format!("pg_idgen.{name} = '{value}'");
        let s = Server::init_stopped(&format!("lease-bad-{name}"), &["shared_preload_libraries = 'pg_idgen'", &line]);
        let out = s.run_as_owner_unchecked("pg_ctl", &["-D", &s.data(), "-l", "bad.log", "-w", "-t", "30", "start"]);
        assert!(!out.status.success(), "the server started with {line}");
        let log = std::fs::read_to_string(s.dir.join("bad.log")).unwrap_or_default();
        assert!(log.contains(&format!("invalid value for parameter \"pg_idgen.{name}\"")), "{log}");
    }
}

#[test]
fn a_clock_stepping_forward_stops_at_the_filed_mark_and_a_terminated_keeper_gives_back_and_retakes() {
    let etcd = etcd("lease-step");
    let a = Server::start_with_clock("lease-step-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let mut c = a.client();
    let before: i64 = c.query_one("SELECT max(next_shard_id(5)) FROM generate_series(1, 1000)", &[]).unwrap().get(0);
    let mark: i64 = c
        .query_one("SELECT (extract(epoch FROM mark) * 1000)::bigint FROM shard_leases() WHERE shard = 5", &[])
        .unwrap()
        .get(0);
    // An hour ahead: the next ID would carry a time past the filed mark.
    a.set_clock("+3600s");
    let e = c.query_one("SELECT next_shard_id(5)", &[]).unwrap_err();
    let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert_eq!((code(&e).as_str(), message.as_str()), ("55000", "the next ID of shard 5 would pass the mark filed with its lease"));
    // No ID passes it, however many calls are made (the keeper's own clock
    // is not shifted here: libfaketime shifts the backends only).
    for _ in 0..20 {
        assert_eq!(sqlstate(c.query_one("SELECT next_shard_id(5)", &[])), "55000");
    }
    let filed: i64 = c
        .query_one("SELECT (extract(epoch FROM mark) * 1000)::bigint FROM shard_leases() WHERE shard = 5", &[])
        .unwrap()
        .get(0);
    assert!(filed >= mark, "the filed mark went back");
    a.set_clock("+0s");
    let after: i64 = c.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(after > before && (after >> 23) + 1_767_225_600_000 <= filed, "{after} is not above {before}, or past the mark {filed}");
    // A terminated keeper stops minting, gives the lease back, and its
    // successor (started by PostgreSQL after 1 s) takes the shard again.
    let pid: i32 = c.query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_idgen lease keeper'", &[]).unwrap().get(0);
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    eventually(30, "a new keeper holds the shard", || {
        let other: i64 = c
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idgen lease keeper' AND pid <> $1", &[&pid])
            .unwrap()
            .get(0);
        other == 1 && held(&a) == vec![5]
    });
    let last: i64 = c.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    assert!(last > after, "{last} is not above {after}");
    assert!(a.log().contains("gave back the lease on shards 5"), "the keeper did not give the lease back");
}

#[test]
fn addresses_of_two_etcd_clusters_are_refused_rather_than_leased_from_both() {
    let (e1, e2) = (etcd("lease-two-1"), etcd("lease-two-2"));
    let lines = vec![
        format!("pg_idgen.lease_store = '{},{}'", e1.url(), e2.url()),
        "pg_idgen.lease_shards = '7'".into(),
        format!("pg_idgen.lease_ttl = {TTL_S}"),
    ];
    let a = Server::start("lease-two-a", &conf(&lines));
    eventually(30, "the keeper says why it leases nothing", || a.log().contains("belong to different etcd clusters"));
    assert!(held(&a).is_empty());
    let e = a.client().query_one("SELECT next_shard_id(7)", &[]).unwrap_err();
    assert_eq!(code(&e), "55000");
}

#[test]
fn a_mark_that_cannot_be_read_or_was_filed_under_another_epoch_is_refused() {
    let etcd = etcd("lease-mark");
    let a = Server::start("lease-mark-a", &conf(&leasing(&etcd, "9", 0)));
    wait_held(&a, &[9], 30);
    a.client().query_one("SELECT max(next_shard_id(9)) FROM generate_series(1, 1000)", &[]).unwrap();
    drop(a);
    // Garbage in the mark: the next holder refuses the shard rather than start at 0.
    etcd.put("/pg_idgen/mark/0009", "garbage");
    let b = Server::start("lease-mark-b", &conf(&leasing(&etcd, "9", 0)));
    eventually(30, "the keeper refuses shard 9", || b.log().contains("shard 9 is not minted here: the mark \"garbage\" cannot be read"));
    let e = b.client().query_one("SELECT next_shard_id(9)", &[]).unwrap_err();
    assert_eq!(code(&e), "55000");
    assert!(e.as_db_error().and_then(|d| d.detail()).unwrap_or("").contains("cannot be used"), "{e:?}");
    drop(b);
    // A mark filed by a server with another epoch: refused the same way.
    etcd.put("/pg_idgen/mark/0009", "1800000000000 1767225600000");
    let c = Server::start(
        "lease-mark-c",
        &conf(&[leasing(&etcd, "9", 0), vec!["pg_idgen.epoch = '2026-01-01 00:01:00+00'".into()]].concat()),
    );
    eventually(30, "the keeper refuses shard 9", || c.log().contains("shard 9 is not minted here: the mark was filed by a server whose pg_idgen.epoch"));
    assert_eq!(sqlstate(c.client().query_one("SELECT next_shard_id(9)", &[])), "55000");
    // With a store, the store alone says which shards mint here.
    let e = c.client().execute("SELECT shard_claim(0, 99)", &[]).unwrap_err();
    let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert_eq!((code(&e).as_str(), message.as_str()), ("55000", "shard_claim cannot change shard ownership on a server with a lease store"));
}

#[test]
fn a_keeper_stopped_while_the_store_stalls_leaves_its_shard_minting_after_its_restart() {
    let etcd = etcd("lease-stall");
    let a = Server::start("lease-stall-a", &conf(&leasing(&etcd, "5", 0)));
    wait_held(&a, &[5], 30);
    let mut c = a.client();
    let before: i64 = c.query_one("SELECT next_shard_id(5)", &[]).unwrap().get(0);
    etcd.pause();
    let pid: i32 = c.query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_idgen lease keeper'", &[]).unwrap().get(0);
    c.execute("SELECT pg_terminate_backend($1)", &[&pid]).unwrap();
    // It cannot file exact marks nor give the lease back; the store returns.
    eventually(30, "the keeper gave up giving back", || a.log().contains("the marks filed before stand"));
    etcd.resume();
    let mut after = 0i64;
    eventually(30, "shard 5 mints again", || match c.query_one("SELECT next_shard_id(5)", &[]) {
        Ok(row) => {
            after = row.get(0);
            true
        }
        Err(e) => {
            assert_eq!(code(&e), "55000", "{e:?}");
            false
        }
    });
    assert!(after > before);
}

/// A leader key, as Patroni keeps one, decides between servers of the same
/// data (TTL 30 s here, which the Patroni settings filed beside the key
/// allow: 24 s of minting < ttl 60 - loop_wait 10 - retry_timeout 10).
/// - A frozen primary's lease is not waited for: the standby the key names,
///   promoted, takes its shard once the lease missed a renewal (11 s of its
///   30), and mints above what it replayed; the old primary, thawed after
///   its lease ran out, mints none of it.
/// - A copy that follows another election's key never takes it.
/// - A deposed primary that still runs gives its shard back with its exact
///   mark: the server named next, its clock 5 s behind, mints above it
///   although it never replayed the deposed one's IDs (with no mark it would
///   mint below them; with the mark filed before, 24 s + the 10 s lead
///   ahead, it would refuse).
/// - With Patroni's settings too short to fence, nothing is taken at once.
#[test]
fn the_leader_key_lets_the_elected_primary_take_a_silent_ones_shard_before_its_lease_runs_out() {
    let etcd = etcd("lease-leader");
    let fencing = r#"{"ttl":60,"loop_wait":10,"retry_timeout":10}"#;
    for (election, leader) in [("e", "a"), ("f", "c")] {
        etcd.put(&format!("/{election}/leader"), leader);
        etcd.put(&format!("/{election}/config"), fencing);
    }
    let follows = |name: &str, election: &str| {
        let mut lines = leasing(&etcd, "5", 0);
        lines.push("pg_idgen.lease_ttl = 30".into());
        lines.push(format!("pg_idgen.lease_leader_key = '/{election}/leader={name}'"));
        lines
    };
    let a = Server::start_with_clock("lease-leader-a", &conf(&follows("a", "e")));
    wait_held(&a, &[5], 30);
    let b = Server::standby_of(&a, "lease-leader-b", &conf(&follows("b", "e")));
    let mut ca = a.client();
    let a_last: i64 = ca.query_one("SELECT max(next_shard_id(5)) FROM generate_series(1, 20000)", &[]).unwrap().get(0);
    let a_lease = etcd.lease_of("/pg_idgen/shard/0005").expect("A holds shard 5");
    b.wait_for_replay(&a);

    // A freezes; the election names b, which is promoted and takes shard 5 from A's live lease.
    // (A running primary is never taken from: see the last part.)
    a.freeze();
    let thaw = Thaw(&a);
    etcd.elect("/e/leader", "b");
    b.promote();
    wait_held(&b, &[5], 60);
    assert!(b.log().contains("took shard 5 from an earlier primary"), "B did not take the shard over");
    // B starts above the mark A filed: it refuses (55000, its clock behind
    // the mark by more than the lead bound) until A's own deadline has
    // passed, which comes before A's lease runs out in the store.
    let mut cb = b.client();
    let b_first: i64 = {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match cb.query_one("SELECT min(next_shard_id(5)) FROM generate_series(1, 1000)", &[]) {
                Ok(row) => break row.get(0),
                Err(e) => {
                    assert_eq!(code(&e), "55000", "{e}");
                    assert!(Instant::now() < deadline, "B never minted shard 5");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    };
    let left = etcd.ttl_left(a_lease);
    assert!(left > 0, "A's lease ran out before B minted: nothing shows it was not waited for");
    eprintln!("leader key: B minted shard 5 with {left} s left on A's lease");
    assert!(b_first > a_last, "the new primary's first ID {b_first} is not above A's last {a_last}");

    // A wakes once its lease ran out in the store: it mints nothing of shard 5.
    eventually(60, "A's lease runs out in the store", || etcd.ttl_left(a_lease) <= 0);
    drop(thaw);
    let refused = refuses_for(&mut ca, 5, Duration::from_secs(4), Duration::from_millis(50), "A minted after waking");
    assert!(refused > 10, "A was asked only {refused} times");
    eventually(30, "A sees it is not the leader", || {
        ca.query_one("SELECT state FROM shard_leases() WHERE shard = 5", &[]).unwrap().get::<_, String>(0) == "not leader"
    });
    let e = ca.query_one("SELECT next_shard_id(5)", &[]).unwrap_err();
    let detail = e.as_db_error().and_then(|d| d.detail()).unwrap_or_default().to_string();
    assert!(detail.contains("names another server"), "{detail}");

    // A copy of B following another election, named leader there, never takes shard 5.
    let c = Server::clone_of(&b, "lease-leader-c", &conf(&follows("c", "f")));
    let mut cc = c.client();
    eventually(60, "the copy sees shard 5 held elsewhere", || {
        cc.query_one("SELECT state FROM shard_leases() WHERE shard = 5", &[]).unwrap().get::<_, String>(0) == "held elsewhere"
    });
    for _ in 0..20 {
        assert_eq!(sqlstate(cc.query_one("SELECT next_shard_id(5)", &[])), "55000", "the copy minted shard 5");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!c.log().contains("took shard 5"), "the copy took shard 5");
    drop(cc);
    drop(c);

    // The election names a again while B runs: B, renewing its lease, is not
    // taken from; it gives shard 5 back with its exact mark, and A, which
    // never replayed B's IDs, mints above them.
    a.set_clock("-5s");
    let b_last: i64 = cb.query_one("SELECT max(next_shard_id(5)) FROM generate_series(1, 20000)", &[]).unwrap().get(0);
    etcd.elect("/e/leader", "a");
    eventually(30, "B gives shard 5 back", || etcd.lease_of("/pg_idgen/shard/0005").is_none() || !held(&b).contains(&5));
    wait_held(&a, &[5], 60);
    assert!(b.log().contains("gave back shards 5 with their exact marks"), "B did not give the shard back");
    assert_eq!(sqlstate(cb.query_one("SELECT next_shard_id(5)", &[])), "55000", "B minted after it was deposed");
    let a_next: i64 = ca.query_one("SELECT min(next_shard_id(5)) FROM generate_series(1, 1000)", &[]).unwrap().get(0);
    assert!(a_next > b_last, "A's first ID {a_next} after taking the shard back is not above B's last {b_last}");
}

/// A copy of the elected primary (its data directory and settings, so the
/// same member name) never takes the shard from it, even while the primary
/// is silent: the primary took its shard after the election, and only an
/// election newer than a holder's key lets a server take that key.
#[test]
fn a_copy_of_the_elected_primary_never_takes_its_shard() {
    let etcd = etcd("lease-copy-leader");
    etcd.put("/e/leader", "a");
    let mut lines = leasing(&etcd, "5", 0);
    lines.push("pg_idgen.lease_ttl = 30".into());
    lines.push("pg_idgen.lease_leader_key = '/e/leader=a'".into());
    let a = Server::start("lease-copy-a", &conf(&lines));
    wait_held(&a, &[5], 30);
    let a_lease = etcd.lease_of("/pg_idgen/shard/0005").expect("A holds shard 5");
    let copy = Server::clone_of(&a, "lease-copy-c", &[]);
    let mut cc = copy.client();
    eventually(60, "the copy sees shard 5 held elsewhere", || {
        cc.query_one("SELECT state FROM shard_leases() WHERE shard = 5", &[]).unwrap().get::<_, String>(0) == "held elsewhere"
    });
    // A silent for 15 s: more than a missed renewal (11 s of 30), less than its lease.
    a.freeze();
    let thaw = Thaw(&a);
    let refused = refuses_for(&mut cc, 5, Duration::from_secs(15), Duration::from_millis(200), "the copy minted shard 5");
    drop(thaw);
    assert!(refused > 20, "the copy was asked only {refused} times");
    assert!(!copy.log().contains("took shard 5"), "the copy took shard 5 from the primary");
    assert_eq!(etcd.lease_of("/pg_idgen/shard/0005"), Some(a_lease), "shard 5 left A's lease");
    // A, thawed, mints on.
    let mut ca = a.client();
    eventually(30, "A mints again", || ca.query_one("SELECT next_shard_id(5)", &[]).is_ok());
}
