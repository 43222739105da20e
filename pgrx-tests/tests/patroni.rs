//! Failover under Patroni, the HA manager operators run: etcd and Patroni
//! nodes on loopback, pg_idgen set up through Patroni's bootstrap, clients
//! following the primary through a multi-host connection string while
//! Patroni switches over, fails over, recovers from a killed primary and
//! promotes a node whose clock lags. (Whether Patroni ran pg_rewind for the
//! killed primary is printed, not asserted: in synchronous mode it usually
//! need not.)
//!
//! Each test prints its figures (events, outages, insert rates) with
//! `--nocapture`; BENCHMARKS.md records one run. Needs Debian's patroni
//! and etcd-server (scripts/setup); scripts/test filters these tests out,
//! and counts them as skipped, where they are missing.

mod patroni {
    use std::collections::HashMap;
    use std::time::{Duration, Instant};

    use pg_idgen_e2e::patroni::{
        self as harness, out_of_order, outage, rate, Ack, Cluster, Config, Etcd, Workload,
    };
    use pg_idgen_e2e::{decode, sqlstate};

    const TABLE: &str = "SELECT shard_schema_create('app', 7);
        CREATE TABLE app.events (
            id bigint NOT NULL DEFAULT next_schema_id('app'),
            u uuid NOT NULL DEFAULT uuid_v7(),
            client int NOT NULL);";
    const INSERT: &str = "INSERT INTO app.events (client) VALUES ($1) RETURNING id, u";

    /// Fails saying what is missing (scripts/test filters these tests out, and
    /// counts them as skipped, before that can happen).
    fn require_patroni() {
        if let Some(why) = harness::missing() {
            panic!("{why}");
        }
    }

    /// What one event did to the writes.
    struct Event {
        name: &'static str,
        start: Instant,
        recovered: Instant,
    }

    /// The rows stored on the cluster's primary: ID -> (UUID, how many rows carry the ID).
    fn stored(cluster: &Cluster) -> HashMap<i64, (uuid::Uuid, i64)> {
        let leader = cluster.wait_healthy();
        let mut c = cluster.nodes[leader].client();
        let mut rows = HashMap::new();
        for r in c.query("SELECT id, u FROM app.events", &[]).unwrap() {
            let e = rows
                .entry(r.get::<_, i64>(0))
                .or_insert((r.get::<_, uuid::Uuid>(1), 0));
            e.1 += 1;
        }
        rows
    }

    /// Acknowledged rows missing from the primary, and ones whose ID now belongs to another row.
    fn lost_and_repeated(
        acks: &[Ack],
        rows: &HashMap<i64, (uuid::Uuid, i64)>,
    ) -> (Vec<Ack>, Vec<Ack>) {
        let lost = acks
            .iter()
            .filter(|a| !rows.contains_key(&a.id))
            .copied()
            .collect();
        let repeated = acks
            .iter()
            .filter(|a| rows.get(&a.id).is_some_and(|(u, _)| *u != a.uuid))
            .copied()
            .collect();
        (lost, repeated)
    }

    /// The first figure of a 55000 refusal: "the clock is N ms behind ...".
    fn behind_ms(message: &str) -> Option<i64> {
        message
            .split("the clock is ")
            .nth(1)?
            .split(" ms behind")
            .next()?
            .parse()
            .ok()
    }

    fn print_events(title: &str, acks: &[Ack], events: &[Event]) {
        println!("{title}");
        println!("| event | outage | inserts/s in the 5 s before | inserts/s in the 5 s after |");
        println!("|---|---|---|---|");
        for e in events {
            let before = rate(acks, e.start - Duration::from_secs(5), e.start);
            let after = rate(acks, e.recovered, e.recovered + Duration::from_secs(5));
            let out = outage(acks, e.start, e.recovered + Duration::from_secs(5));
            println!(
                "| {} | {:.1} s | {before:.0} | {after:.0} |",
                e.name,
                out.as_secs_f64()
            );
        }
    }

    /// The lease TTL of the clusters that lease their shard from the DCS's etcd.
    const LEASE_TTL_S: u64 = 15;

    /// How a cluster's nodes mint shard 7.
    #[derive(Clone, Copy, PartialEq)]
    enum Leases {
        /// As without a lease store.
        None,
        /// Leased from the DCS's etcd, TTL `LEASE_TTL_S`.
        Leased,
        /// Leased, each node following Patroni's leader key, TTL `LEASE_TTL_S`.
        LeaderKey,
    }

    /// The key of shard 7's lease (`pg_idgen.lease_prefix` left at its default).
    const SHARD_7_KEY: &str = "/pg_idgen/shard/0007";

    /// etcd and a cluster of `nodes` with the events table, and three clients
    /// inserting into it for 5 s already; with leases, every node leases
    /// shard 7 from the same etcd. (Dropped in reverse: clients, cluster, etcd.)
    fn under_load(scope: &str, nodes: usize, synchronous: bool, leases: Leases) -> (Etcd, Cluster, Workload) {
        require_patroni();
        let dir = harness::test_dir(scope);
        let etcd = Etcd::start(&dir);
        let parameters = match leases {
            Leases::None => vec![],
            _ => vec![
                format!("pg_idgen.lease_store: 'http://127.0.0.1:{}'", etcd.port),
                "pg_idgen.lease_shards: '7'".into(),
                format!("pg_idgen.lease_ttl: {LEASE_TTL_S}"),
            ],
        };
        // Patroni's leader key: its namespace, the scope, `leader`; its value the member's name.
        let node_parameters = match leases {
            Leases::LeaderKey => vec![format!("pg_idgen.lease_leader_key: '/pg_idgen_test/{scope}/leader={{member}}'")],
            _ => vec![],
        };
        let config = Config { nodes, synchronous, post_bootstrap_sql: TABLE.into(), parameters, node_parameters };
        let cluster = Cluster::start(&etcd, &dir, scope, &config);
        let workload = Workload::start(&cluster.conninfo(), 3, INSERT);
        workload.wait_for_ack_after(Instant::now(), 30);
        std::thread::sleep(Duration::from_secs(5));
        (etcd, cluster, workload)
    }

    /// Synchronous mode, three nodes, every replica in the sync set; four events
    /// under a workload of three clients: nothing acknowledged is lost, no ID
    /// or UUID repeats, each statement that began after another was
    /// acknowledged gets a larger ID and UUID, and every outage is bounded.
    #[test]
    fn failovers_under_patroni_lose_and_repeat_nothing() {
        let (_etcd, cluster, workload) = under_load("sync", 3, true, Leases::None);

        let mut events = Vec::new();
        let mut event = |name: &'static str, act: &dyn Fn(usize) -> usize| {
            let leader = cluster.wait_healthy();
            let start = Instant::now();
            let next = act(leader);
            patroni_eventually(
                &cluster,
                90,
                &format!("{name}: node {} leads", cluster.nodes[next].name),
                || cluster.leader() == Some(next),
            );
            // Acknowledged by the new primary: begun once it led.
            workload.wait_for_ack_after(Instant::now(), 90);
            let recovered = Instant::now();
            cluster.wait_healthy();
            std::thread::sleep(Duration::from_secs(5));
            events.push(Event {
                name,
                start,
                recovered,
            });
        };
        let other = |leader: usize, k: usize| (leader + k) % cluster.nodes.len();

        event("switchover", &|leader| {
            let to = other(leader, 1);
            cluster.patronictl(&[
                "switchover",
                "--leader",
                &cluster.nodes[leader].name,
                "--candidate",
                &cluster.nodes[to].name,
                "--force",
            ]);
            to
        });
        event("failover", &|leader| {
            let to = other(leader, 1);
            cluster.patronictl(&[
                "failover",
                "--candidate",
                &cluster.nodes[to].name,
                "--force",
            ]);
            to
        });
        let rewinds_before: usize = cluster
            .nodes
            .iter()
            .map(|n| n.log_mentions("pg_rewind"))
            .sum();
        event("the primary's PostgreSQL crashed", &|leader| {
            cluster.crash_postgres(leader);
            // Patroni promotes the most advanced replica: whichever it is.
            patroni_eventually(&cluster, 60, "a new leader", || {
                cluster.leader().is_some_and(|l| l != leader)
            });
            cluster.leader().unwrap()
        });
        let rewinds_after: usize = cluster
            .nodes
            .iter()
            .map(|n| n.log_mentions("pg_rewind"))
            .sum();

        // A replica whose clock is 30 s behind becomes the primary. With the
        // default lead bound (10 s) it refuses to mint until its clock is within
        // 10 s of what the old primary handed out: about 20 s.
        const LAG_S: i64 = 30;
        let lagging = other(cluster.wait_healthy(), 1);
        cluster.nodes[lagging].set_clock(&format!("-{LAG_S}s"));
        let failures_before = workload.failures.lock().unwrap().len();
        let status = std::sync::Mutex::new(None);
        event("failover onto a node 30 s behind", &|_| {
            let asked = Instant::now();
            cluster.patronictl(&[
                "failover",
                "--candidate",
                &cluster.nodes[lagging].name,
                "--force",
            ]);
            patroni_eventually(&cluster, 60, "the lagging node leads", || {
                cluster.leader() == Some(lagging)
            });
            // What the status says while minting is held back, and how long
            // after the failover was asked for (the lead shrinks as the
            // lagging clock moves on, however slowly the machine gets here).
            let mut c = cluster.nodes[lagging].client();
            let row = c
                .query_one(
                    "SELECT mark_lead_ms, extract(epoch FROM minting_resumes_at - clock_timestamp())::float8 * 1000
                       FROM id_generator_server_status()",
                    &[],
                )
                .unwrap();
            *status.lock().unwrap() = Some((row, asked.elapsed().as_millis() as i64));
            lagging
        });
        let refusals: Vec<_> = workload.failures.lock().unwrap()[failures_before..]
            .iter()
            .filter(|f| f.code == "55000")
            .cloned()
            .collect();

        let (acks, failures) = workload.stop();
        print_events(
            "Patroni, synchronous mode, 3 nodes, 3 clients:",
            &acks,
            &events,
        );
        println!(
            "acknowledged rows: {}; failed statements by SQLSTATE: {:?}",
            acks.len(),
            count_codes(&failures)
        );
        // Patroni runs pg_rewind when the old primary's WAL went past the new
        // one's; in synchronous mode it usually did not.
        println!(
            "Patroni log lines naming pg_rewind after the kill: {}",
            rewinds_after - rewinds_before
        );

        // Nothing lost, nothing repeated.
        let rows = stored(&cluster);
        let (lost, repeated) = lost_and_repeated(&acks, &rows);
        let duplicated = rows.values().filter(|(_, n)| *n > 1).count();
        assert_eq!(
            (lost.len(), repeated.len(), duplicated),
            (0, 0, 0),
            "lost, repeated, duplicated IDs of {} acknowledged",
            acks.len()
        );
        let uuids: std::collections::HashSet<_> = rows.values().map(|(u, _)| *u).collect();
        assert_eq!(uuids.len(), rows.len(), "a UUID repeats");
        // Real-time order across every event.
        assert_eq!(out_of_order(&acks, |a| a.id), vec![], "IDs out of order");
        assert_eq!(
            out_of_order(&acks, |a| a.uuid),
            vec![],
            "UUIDs out of order"
        );
        // The lagging node's 55000 only during the failover onto it: not
        // before it began, and not past its first insert (a statement
        // refused just before that may be reported a little after).
        let lag = events.last().expect("the failover onto the lagging node");
        for (i, f) in failures.iter().enumerate().filter(|(_, f)| f.code == "55000") {
            assert!(
                i >= failures_before && f.at >= lag.start && f.at <= lag.recovered + Duration::from_secs(5),
                "a 55000 outside the failover onto the lagging node: {}",
                f.message
            );
        }
        // Only what a failover explains: lost connections, a demoted node's
        // read-only refusal, and the lagging node's 55000.
        for f in &failures {
            assert!(
                [
                    "connect",
                    "connection",
                    "25006",
                    "55000",
                    "57P01",
                    "57P02",
                    "57P03",
                    "08006",
                    "08001",
                    "40001"
                ]
                .contains(&f.code.as_str()),
                "unexpected failure {}: {}",
                f.code,
                f.message
            );
        }
        // Outages bounded: Patroni's loop plus reconnecting, and for the lagging
        // node, the 20 s it waits for its clock.
        for e in &events[..3] {
            let out = outage(&acks, e.start, e.recovered + Duration::from_secs(5));
            assert!(
                out < Duration::from_secs(20),
                "{}: no write for {out:?}",
                e.name
            );
        }
        let lag = &events[3];
        let out = outage(&acks, lag.start, lag.recovered + Duration::from_secs(5));
        assert!(
            out < Duration::from_secs(LAG_S as u64 - 10 + 15),
            "{}: no write for {out:?}",
            lag.name
        );
        // Minting resumed as soon as the lead bound allowed, not when the
        // clock caught up: the first ID the lagging primary acknowledged ran
        // ahead of its clock by about the bound (10 s). Measured against the
        // clock at the acknowledgement, which is later than the mint, so
        // the figure errs low; a build that waited out the whole lag gives 0.
        let epoch_ms: i64 = cluster.nodes[lagging]
            .client()
            .query_one("SELECT (extract(epoch FROM id_ts(0)) * 1000)::int8", &[])
            .unwrap()
            .get(0);
        let first = acks.iter().find(|a| a.end > lag.recovered).expect("an insert acknowledged after the failover");
        let real_ms = |at: Instant| {
            let unix = std::time::SystemTime::now() - Instant::now().duration_since(at);
            unix.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
        };
        let ran_ahead_ms = epoch_ms + decode(first.id).0 - (real_ms(first.end) - LAG_S * 1000);
        assert!(
            (5_000..=11_000).contains(&ran_ahead_ms),
            "the first ID after the failover ran {ran_ahead_ms} ms ahead of the lagging clock"
        );
        // The refusal tells the truth from the first one on: the whole distance
        // between the clock and what the server must stay above.
        let first = refusals.first().unwrap_or_else(|| {
            panic!(
                "the lagging node refused nothing: {:?}",
                count_codes(&failures)
            )
        });
        let figure =
            behind_ms(&first.message).unwrap_or_else(|| panic!("no figure in {:?}", first.message));
        assert!(
            (LAG_S * 1000 - 2000..=LAG_S * 1000 + 3000).contains(&figure),
            "first refusal: {}",
            first.message
        );
        // And the status said how far ahead minting is and when it resumes:
        // the old primary's mark (at most its 1 s reservation past the moment
        // it stopped minting, after the failover was asked for) less the
        // lagging clock. So the lead plus the time since the failover was
        // asked is at least the lag, and the lead alone never more than the
        // lag and the reservation, whenever the status was read.
        let (status, read_after_ms) = status.into_inner().unwrap().expect("the status was read");
        let (lead, resumes_in): (i64, Option<f64>) = (status.get(0), status.get(1));
        assert!(
            lead + read_after_ms >= LAG_S * 1000 - 1000 && lead <= LAG_S * 1000 + 3000,
            "mark_lead_ms {lead}, read {read_after_ms} ms after the failover was asked for"
        );
        let resumes_in = resumes_in.expect("minting_resumes_at is set while minting is held back");
        assert!(
            (resumes_in - (lead - 10_000) as f64).abs() < 1000.0,
            "resumes in {resumes_in} ms with a lead of {lead} ms"
        );
    }

    /// A killed primary, measured without shard leases, with them (the
    /// same etcd as Patroni's), and with them following Patroni's leader
    /// key, one after the other: each keeps every ID and UUID unique and in
    /// order; the lease adds at most its TTL to the outage, and with the
    /// leader key the new primary mints while the old primary's lease still
    /// lives (taken once it missed a renewal, above its mark, minting once
    /// the old primary's shorter deadline passed).
    #[test]
    fn asynchronous_replication_under_a_killed_primary_is_measured_with_and_without_leases() {
        let without = killed_primary("async", Leases::None);
        let with = killed_primary("leased", Leases::Leased);
        let leader_key = killed_primary("leader", Leases::LeaderKey);
        println!(
            "outage after a killed primary: {:.1} s without shard leases, {:.1} s with them, {:.1} s with them following Patroni's leader key (pg_idgen.lease_ttl = {LEASE_TTL_S} s, Patroni ttl = 10 s)",
            without.as_secs_f64(),
            with.as_secs_f64(),
            leader_key.as_secs_f64(),
        );
        assert!(
            with < without + Duration::from_secs(LEASE_TTL_S + 5),
            "the lease added {:?} to the outage",
            with.saturating_sub(without)
        );
    }

    /// Asynchronous replication, two nodes, a primary killed under load. What
    /// docs/patroni.md says of it: rows acknowledged in the last moments may be lost
    /// and their IDs handed out again; the new primary's own rows never repeat
    /// an ID, and it mints above everything it replayed. Returns the outage.
    fn killed_primary(scope: &str, leases: Leases) -> Duration {
        let (etcd, cluster, workload) = under_load(scope, 2, false, leases);
        let leader = cluster.wait_healthy();
        // The old primary's lease on shard 7 (its inserts succeed, so it holds it).
        let old_lease = (leases != Leases::None).then(|| etcd.lease_of(SHARD_7_KEY).expect("the primary holds shard 7's lease"));
        let start = Instant::now();
        cluster.crash_postgres(leader);
        // Every process of the old primary is stopped from here on: a statement
        // begun later can only be acknowledged by the new primary.
        let crashed = Instant::now();
        patroni_eventually(&cluster, 60, "the replica leads", || {
            cluster.leader().is_some_and(|l| l != leader)
        });
        workload.wait_for_ack_after(crashed, 60);
        let recovered = Instant::now();
        if leases == Leases::LeaderKey {
            // The first insert the new primary acknowledged came while the
            // old primary's lease still lived: taken over, not waited for.
            let left = etcd.ttl_left(old_lease.unwrap());
            assert!(left > 0, "the old primary's lease had run out ({left}) before the new primary minted");
            assert_ne!(etcd.lease_of(SHARD_7_KEY), old_lease, "shard 7 still under the old primary's lease");
            println!("the new primary minted shard 7 with {left} s left on the old primary's lease");
        }
        cluster.wait_healthy();
        std::thread::sleep(Duration::from_secs(3));
        let (acks, failures) = workload.stop();
        let events = [Event {
            name: "the primary's PostgreSQL crashed (asynchronous)",
            start,
            recovered,
        }];
        print_events(
            match leases {
                Leases::None => "Patroni, asynchronous replication, 2 nodes, 3 clients:",
                Leases::Leased => "Patroni, asynchronous replication, 2 nodes, 3 clients, shard 7 leased:",
                Leases::LeaderKey => "Patroni, asynchronous replication, 2 nodes, 3 clients, shard 7 leased, leader key followed:",
            },
            &acks,
            &events,
        );

        let rows = stored(&cluster);
        let (lost, repeated) = lost_and_repeated(&acks, &rows);
        let before_kill = acks.iter().filter(|a| a.end < crashed).count();
        println!(
            "acknowledged rows: {} ({before_kill} before the kill); lost: {}; IDs handed out again: {}; failed statements by SQLSTATE: {:?}",
            acks.len(),
            lost.len(),
            repeated.len(),
            count_codes(&failures)
        );
        // The new primary's table never holds an ID or a UUID twice.
        assert_eq!(
            rows.values().filter(|(_, n)| *n > 1).count(),
            0,
            "an ID is stored twice"
        );
        let uuids: std::collections::HashSet<_> = rows.values().map(|(u, _)| *u).collect();
        assert_eq!(uuids.len(), rows.len(), "a UUID is stored twice");
        // Only rows the old primary acknowledged can be lost.
        assert!(
            lost.iter().all(|a| a.start < crashed),
            "a row acknowledged by the new primary is lost"
        );
        // What survived keeps real-time order, across the failover too.
        let kept: Vec<Ack> = acks
            .iter()
            .filter(|a| rows.get(&a.id).is_some_and(|(u, _)| *u == a.uuid))
            .copied()
            .collect();
        assert_eq!(out_of_order(&kept, |a| a.id), vec![], "IDs out of order");
        assert_eq!(
            out_of_order(&kept, |a| a.uuid),
            vec![],
            "UUIDs out of order"
        );
        let out = outage(&acks, start, recovered + Duration::from_secs(3));
        let bound = Duration::from_secs(if leases == Leases::Leased { 20 + LEASE_TTL_S } else { 20 });
        assert!(out < bound, "no write for {out:?}");
        if leases != Leases::None {
            // Refusals while the old primary's lease runs out are 55000, never a repeat.
            assert!(count_codes(&failures).iter().all(|(code, _)| code != "23505"), "{:?}", count_codes(&failures));
        }
        out
    }

    /// A shard moved between two Patroni clusters: released on A, A fails over
    /// right after the release committed, and A's new primary still refuses the
    /// shard; B (its clock 10 minutes behind, far more than the failover takes,
    /// so that only the adopted floor puts its IDs above) adopts it and mints
    /// above the release ID.
    #[test]
    fn a_shard_moved_between_patroni_clusters_survives_a_failover() {
        require_patroni();
        let dir = harness::test_dir("move");
        let etcd = Etcd::start(&dir);
        let a = Cluster::start(
            &etcd,
            &dir,
            "a",
            &Config {
                nodes: 2,
                synchronous: true,
                post_bootstrap_sql: String::new(),
                parameters: vec![],
                node_parameters: vec![],
            },
        );
        let b = Cluster::start(
            &etcd,
            &dir,
            "b",
            &Config {
                nodes: 1,
                synchronous: false,
                post_bootstrap_sql: String::new(),
                parameters: vec![],
                node_parameters: vec![],
            },
        );
        let mut ca = postgres::Client::connect(&a.conninfo(), postgres::NoTls).unwrap();
        ca.batch_execute("SELECT shard_claim(0, 99)").unwrap();
        let minted: i64 = ca
            .query_one(
                "SELECT max(next_shard_id(9)) FROM generate_series(1, 1000)",
                &[],
            )
            .unwrap()
            .get(0);
        let released: i64 = ca.query_one("SELECT shard_release(9)", &[]).unwrap().get(0);
        assert!(released > minted);
        // A fails over right after the release committed.
        let old = a.wait_healthy();
        let to = (old + 1) % 2;
        a.patronictl(&["failover", "--candidate", &a.nodes[to].name, "--force"]);
        patroni_eventually(&a, 60, "A's replica leads", || a.leader() == Some(to));
        let mut ca = a.nodes[to].client();
        assert_eq!(
            sqlstate(ca.query_one("SELECT next_shard_id(9)", &[])),
            "55000",
            "A's new primary mints the released shard"
        );
        assert_eq!(
            sqlstate(ca.query_one("SELECT next_shard_id(8)", &[])),
            "ok",
            "A keeps its other shards"
        );
        // B, its clock behind A's, adopts the shard and mints above the release,
        // with a lead bound that lets it mint that far ahead of its clock.
        b.nodes[0].set_clock("-600s");
        let mut cb = b.nodes[b.wait_healthy()].client();
        cb.batch_execute("ALTER SYSTEM SET pg_idgen.max_clock_lead_ms = '1h'").unwrap();
        cb.batch_execute("SELECT pg_reload_conf()").unwrap();
        patroni_eventually(&b, 30, "B reloaded the lead bound", || {
            let mut c = b.nodes[0].client();
            c.query_one("SHOW pg_idgen.max_clock_lead_ms", &[]).is_ok_and(|r| r.get::<_, String>(0) == "1h")
        });
        let mut cb = b.nodes[b.wait_healthy()].client();
        cb.batch_execute("SELECT shard_claim(100, 199)").unwrap();
        cb.execute("SELECT shard_adopt(9, $1)", &[&released])
            .unwrap();
        let first: i64 = cb
            .query_one(
                "SELECT min(next_shard_id(9)) FROM generate_series(1, 1000)",
                &[],
            )
            .unwrap()
            .get(0);
        assert!(
            first > released,
            "B minted {first}, not above the release ID {released}"
        );
        assert_eq!(
            sqlstate(cb.query_one("SELECT next_shard_id(8)", &[])),
            "55000",
            "B mints only what it owns"
        );
    }

    fn count_codes(failures: &[harness::Failure]) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for f in failures {
            *counts.entry(f.code.clone()).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort();
        counts
    }

    /// `eventually`, with the nodes' Patroni logs in the failure message.
    fn patroni_eventually(cluster: &Cluster, secs: u64, what: &str, f: impl FnMut() -> bool) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pg_idgen_e2e::eventually(secs, what, f)
        }));
        if result.is_err() {
            panic!("{what}: not within {secs} s\n{}", cluster.logs());
        }
    }
}
