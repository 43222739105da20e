//! pg_idgen's connections between Citus nodes: a server's sessions keep at
//! most `pg_idgen.citus_max_connections_per_node` open to another node (a
//! session needing one more waits, and gives up with 53300 after 10 s), busy
//! sessions share them without a failure, and a session another node opens
//! never takes the slots kept for administrators, even as a superuser.
//! Needs Citus (scripts/citus); scripts/test filters these tests out, and
//! counts them as skipped, where it is missing.

mod citus {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use pg_idgen_e2e::citus::{failure, Cluster};
    use pg_idgen_e2e::postgres::Client;
    use pg_idgen_e2e::{eventually, sqlstate, Server};

    /// Sessions other nodes opened on `server` to mint there.
    fn forwarding_sessions(server: &Server) -> i64 {
        let mut c = server.client();
        c.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap().get(0)
    }

    fn mint(c: &mut Client) -> Result<i64, pg_idgen_e2e::postgres::Error> {
        c.query_one("SELECT next_shard_id(7)", &[]).map(|r| r.get(0))
    }

    /// With one connection allowed from the worker to the coordinator (which
    /// mints shard 7), a session there minting inside an open transaction
    /// keeps it: a second session waits, opening none (the coordinator
    /// counts one forwarded session all along), and gets its ID once the
    /// first commits; a third, while the first keeps it again, gives up
    /// after 10 s with 53300. Then 8 sessions minting one ID per
    /// transaction share two connections: no failure, no duplicate, each
    /// session's IDs rising.
    #[test]
    fn a_workers_sessions_share_a_bounded_number_of_connections_to_a_node() {
        let cluster = Cluster::start("citus_pool", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut a = worker.client();
        a.batch_execute("BEGIN").unwrap();
        let first = mint(&mut a).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert_eq!(forwarding_sessions(&cluster.coordinator), 1);

        let waiting_is_seen = |name: &str| {
            let mut w = worker.client();
            eventually(30, &format!("session {name} waits on the worker"), || {
                let n: i64 = w
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active' AND wait_event_type = 'Extension'",
                        &[&name],
                    )
                    .unwrap()
                    .get(0);
                n == 1
            });
        };
        let second = std::thread::scope(|s| {
            let b = s.spawn(|| {
                let mut b = worker.client();
                b.batch_execute("SET application_name = 'second'").unwrap();
                mint(&mut b)
            });
            waiting_is_seen("second");
            // Waiting, it opened nothing; the first keeps its connection for
            // at least 100 ms (this sleep only makes sure of that).
            for _ in 0..5 {
                assert_eq!(forwarding_sessions(&cluster.coordinator), 1, "a waiting session opened a connection");
                std::thread::sleep(Duration::from_millis(100));
            }
            a.batch_execute("COMMIT").unwrap();
            b.join().unwrap()
        });
        let second = second.unwrap_or_else(|e| panic!("the waiting session: {}", failure(&e)));
        assert!(second > first, "{second} after {first}");

        // A session keeps its connection to the end of its transaction:
        // another one gives up after 10 s.
        let mut b2 = worker.client();
        b2.batch_execute("BEGIN").unwrap();
        let kept = mint(&mut b2).unwrap_or_else(|e| panic!("{}", failure(&e)));
        let started = Instant::now();
        let mut c = worker.client();
        let e = mint(&mut c).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "53300", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id found no free connection to the Citus node at "), "{}", db.message());
        assert!(started.elapsed() >= Duration::from_secs(10), "gave up after {:?}", started.elapsed());
        assert!(forwarding_sessions(&cluster.coordinator) <= 1);
        b2.batch_execute("COMMIT").unwrap();
        drop((a, b2, c));

        // Eight sessions, two connections, one ID per transaction.
        worker.append_conf("pg_idgen.citus_max_connections_per_node = 2");
        worker.client().batch_execute("SELECT pg_reload_conf()").unwrap();
        let per_session: Vec<(Vec<i64>, Vec<String>)> = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = worker.client();
                        let (mut ids, mut failed) = (vec![], vec![]);
                        for _ in 0..40 {
                            match mint(&mut c) {
                                Ok(id) => ids.push(id),
                                Err(e) => failed.push(failure(&e)),
                            }
                        }
                        (ids, failed)
                    })
                })
                .collect();
            sessions.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let failed: Vec<&String> = per_session.iter().flat_map(|(_, f)| f).collect();
        assert!(failed.is_empty(), "{} of 320 failed: {:?}", failed.len(), failed.first());
        assert!(per_session.iter().all(|(ids, _)| ids.windows(2).all(|w| w[0] < w[1])), "a session's IDs did not rise");
        let all: HashSet<i64> = per_session.iter().flat_map(|(ids, _)| ids.iter().copied()).chain([first, second, kept]).collect();
        assert_eq!(all.len(), 323, "duplicate IDs");
    }

    /// The coordinator keeps one slot for administrators, and ordinary
    /// roles take all the others: a superuser's `next_shard_id(7)` through a
    /// worker is refused there (08001 naming the coordinator, its reason the
    /// reserved slots) instead of taking that slot, and an administrator can
    /// still connect. Once one ordinary session leaves, the call mints.
    #[test]
    fn a_forwarded_session_never_takes_a_slot_kept_for_administrators() {
        let mut cluster = Cluster::start("citus_reserved", 1, &[]);
        cluster.coordinator.client().batch_execute("CREATE ROLE app LOGIN").unwrap();
        cluster.coordinator.append_conf("max_connections = 20\nsuperuser_reserved_connections = 1");
        cluster.coordinator.restart();
        let mut w = cluster.workers[0].client();
        let before = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        drop(w);
        eventually(30, "the worker's forwarded session ended", || forwarding_sessions(&cluster.coordinator) == 0);

        // Ordinary sessions until the server refuses one (at most 30).
        let mut ordinary = vec![];
        let refused = (0..30).find_map(|_| match cluster.coordinator.try_client_as("postgres", "app") {
            Ok(c) => {
                ordinary.push(c);
                None
            }
            Err(e) => Some(e),
        });
        let refused = refused.expect("20 connections allowed 30 ordinary sessions");
        assert_eq!(refused.code().map(|c| c.code()), Some("53300"), "{refused}");
        // Sessions of this test that were ending may have held slots: once
        // only the ordinary ones are left, fill what they freed (at most 10 rounds).
        for _ in 0..10 {
            eventually(30, "only the ordinary sessions are connected", || {
                let n: i64 = ordinary[0]
                    .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'", &[])
                    .unwrap()
                    .get(0);
                n as usize == ordinary.len()
            });
            match cluster.coordinator.try_client_as("postgres", "app") {
                Ok(c) => ordinary.push(c),
                Err(_) => break,
            }
        }

        let mut w = cluster.workers[0].client();
        let e = mint(&mut w).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "08001", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id cannot reach the Citus coordinator at "), "{}", db.message());
        let detail = db.detail().unwrap_or_default();
        assert!(detail.contains("reserved for administrators"), "{detail}");
        let mut admin = cluster.coordinator.client();
        assert_eq!(sqlstate(admin.query_one("SELECT 1", &[])), "ok");
        drop(admin);

        // Once an ordinary session has ended, the call mints.
        ordinary.pop();
        let mut after = None;
        eventually(30, "next_shard_id(7) mints once a slot is free", || {
            after = mint(&mut w).ok();
            after.is_some()
        });
        assert!(after.unwrap() > before);
    }
}
