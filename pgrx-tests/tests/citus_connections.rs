//! pg_idgen's connections between Citus nodes: a server's sessions keep at
//! most `pg_idgen.citus_max_connections_per_node` (when set; 0, no bound,
//! by default) open to another node; a session needing one more takes the place of one unused
//! for 4 s, or waits and gives up with 53300 after 10 s; busy sessions share them without a failure, taking
//! turns; and a session another node opens never takes the slots kept for
//! administrators, even as a superuser.
//! Needs Citus (scripts/citus); scripts/test filters these tests out, and
//! counts them as skipped, where it is missing.

mod citus {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use pg_idgen_e2e::citus::{assert_repartitioned, failure, make_src_and_dst, Cluster, INSERT_SELECT};
    use pg_idgen_e2e::postgres::Client;
    use pg_idgen_e2e::{eventually, sqlstate, Server};

    /// Sessions other nodes opened, on the server of `c`, to mint there.
    fn forwarded(c: &mut Client) -> i64 {
        c.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap().get(0)
    }

    /// The same, in a session of its own on `server`.
    fn forwarding_sessions(server: &Server) -> i64 {
        forwarded(&mut server.client())
    }

    fn mint(c: &mut Client) -> Result<i64, pg_idgen_e2e::postgres::Error> {
        c.query_one("SELECT next_shard_id(7)", &[]).map(|r| r.get(0))
    }

    /// With one connection allowed from the worker to the coordinator (which
    /// mints shard 7): session A mints in a transaction it keeps open; B
    /// waits, opening none (the coordinator counts one forwarded session all
    /// along), and takes A's place once A's connection has gone unused for
    /// 4 s (the coordinator ended that session after 2 s), though A's
    /// transaction is still open; A's next mint in it connects again. A call
    /// left without an answer (the coordinator's backend stopped) keeps its
    /// connection: another session gives up after 10 s with 53300. Then 8
    /// sessions minting one ID per transaction share two connections, taking
    /// turns: no failure, no duplicate, each session's IDs rising, and the
    /// coordinator starts at most one session per two calls.
    #[test]
    fn a_workers_sessions_share_a_bounded_number_of_connections_to_a_node() {
        let cluster = Cluster::start("citus_pool", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut a = worker.client();
        let mut cc = cluster.coordinator.client();
        a.batch_execute("BEGIN").unwrap();
        let t0 = Instant::now();
        let first = mint(&mut a).unwrap_or_else(|e| panic!("{}", failure(&e)));
        let second = std::thread::scope(|s| {
            let b = s.spawn(|| mint(&mut worker.client()));
            // Until it has minted, one forwarded session at most (at most 300 looks).
            for _ in 0..300 {
                if b.is_finished() {
                    break;
                }
                assert!(forwarded(&mut cc) <= 1, "a waiting session opened a connection");
                std::thread::sleep(Duration::from_millis(20));
            }
            b.join().unwrap()
        });
        // B took A's place no sooner than 4 s after A's call ended (the
        // coordinator ended A's session after 2 s).
        assert!(t0.elapsed() >= Duration::from_secs(4), "B minted {:?} after A", t0.elapsed());
        let second = second.unwrap_or_else(|e| panic!("the waiting session: {}", failure(&e)));
        assert!(second > first, "{second} after {first}");
        let again = mint(&mut a).unwrap_or_else(|e| panic!("A again, in its open transaction: {}", failure(&e)));
        assert!(again > second, "{again} after {second}");
        a.batch_execute("COMMIT").unwrap();
        drop(a);

        // A call that gets no answer (the coordinator's backend serving it
        // stopped with SIGSTOP) keeps its connection in use: another session
        // gives up after 10 s with 53300; the call ends once it answers. (The
        // coordinator ends that session after 2 s unused: on a machine so
        // loaded that it did before the stop, the call answers at once from a
        // new session, and the round starts again, at most 5 times.)
        let mut h = worker.client();
        let mut w = worker.client();
        let mut outcome = None;
        let mut minted = vec![];
        for _ in 0..5 {
            minted.push(mint(&mut h).unwrap_or_else(|e| panic!("{}", failure(&e))));
            let newest = "SELECT pid FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding' ORDER BY backend_start DESC LIMIT 1";
            let Some(pid) = cc.query_opt(newest, &[]).unwrap().map(|r| r.get::<_, i32>(0)) else { continue };
            let signal = |sig: &str| {
                let _ = std::process::Command::new("kill").args([sig, &pid.to_string()]).status();
            };
            signal("-STOP");
            let round = std::thread::scope(|s| {
                let stuck = s.spawn(|| mint(&mut h).map_err(|e| failure(&e)));
                let waiting = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT next_shard_id(7)' AND pid <> pg_backend_pid()";
                let mut stuck_seen = false;
                eventually(30, "the call waits for its answer, or was answered", || {
                    stuck_seen = w.query_one(waiting, &[]).unwrap().get::<_, i64>(0) == 1;
                    stuck_seen || stuck.is_finished()
                });
                if stuck.is_finished() {
                    signal("-CONT");
                    return (stuck.join().unwrap(), None);
                }
                let mut c = worker.client();
                let t0 = Instant::now();
                let refused = mint(&mut c);
                let waited = t0.elapsed();
                signal("-CONT");
                (stuck.join().unwrap(), Some((refused, waited)))
            });
            let answered = round.0.unwrap_or_else(|e| panic!("the call without an answer for a while: {e}"));
            minted.push(answered);
            if let Some(r) = round.1 {
                outcome = Some(r);
                break;
            }
        }
        let (refused, waited) = outcome.expect("in 5 rounds the coordinator's session ended each time before it was stopped");
        let e = refused.unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "53300", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id found no free connection to the Citus node at "), "{}", db.message());
        assert!(waited >= Duration::from_secs(10), "gave up after {waited:?}");
        assert!(minted.windows(2).all(|p| p[0] < p[1]) && minted[0] > again, "{minted:?} after {again}");
        drop(h);

        // Eight sessions, two connections, one ID per transaction, each going
        // on until every one has minted (so none of the first two stops
        // before the others had their turn), at least 40 IDs, at most 60 s.
        // Each keeps a connection for its turn (0.2 s), not for one call: the
        // coordinator starts far fewer sessions than there are calls.
        worker.append_conf("pg_idgen.citus_max_connections_per_node = 2");
        worker.client().batch_execute("SELECT pg_reload_conf()").unwrap();
        let mut sessions_started = || {
            eventually(30, "no forwarding session left on the coordinator", || {
                forwarded(&mut cc) == 0
            });
            cc.query_one("SELECT sessions FROM pg_stat_database WHERE datname = current_database()", &[]).unwrap().get::<_, i64>(0)
        };
        let started_before = sessions_started();
        let have_minted = AtomicUsize::new(0);
        let per_session: Vec<(Vec<i64>, Vec<String>)> = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = worker.client();
                        let (mut ids, mut failed) = (vec![], vec![]);
                        let since = Instant::now();
                        while (ids.len() < 40 || have_minted.load(Ordering::Relaxed) < 8) && since.elapsed() < Duration::from_secs(60) {
                            match mint(&mut c) {
                                Ok(id) => {
                                    if ids.is_empty() {
                                        have_minted.fetch_add(1, Ordering::Relaxed);
                                    }
                                    ids.push(id)
                                }
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
        let total: usize = per_session.iter().map(|(ids, _)| ids.len()).sum();
        assert!(failed.is_empty(), "{} calls failed ({total} minted): {:?}", failed.len(), failed.first());
        assert_eq!(have_minted.load(Ordering::Relaxed), 8);
        let started = sessions_started() - started_before;
        assert!(started > 0 && started as usize * 2 <= total, "{started} sessions started on the coordinator for {total} calls");
        assert!(per_session.iter().all(|(ids, _)| ids.windows(2).all(|w| w[0] < w[1])), "a session's IDs did not rise");
        let all: HashSet<i64> =
            per_session.iter().flat_map(|(ids, _)| ids.iter().copied()).chain([first, second, again]).chain(minted.iter().copied()).collect();
        assert_eq!(all.len(), total + 3 + minted.len(), "duplicate IDs");
    }

    /// Connections opened while there was no bound are given up at their
    /// next call once there is one: four sessions that minted unbounded,
    /// then once more each after a reload to 2, leave at most 2 forwarded
    /// sessions on the coordinator. Then an ordinary role's 12 sessions each
    /// mint in a transaction they keep open 4.3 s, again and again, holding
    /// both places and queueing for them: another ordinary role's 6 calls, a
    /// second apart, all mint (its sessions go before those of a role
    /// holding more places, and that role's sessions give theirs up to it).
    /// No ID repeats.
    #[test]
    fn one_roles_sessions_cannot_keep_another_roles_waiting() {
        let cluster = Cluster::start("citus_pool_roles", 1, &["pg_idgen.citus_max_connections_per_node = 0"]);
        let worker = &cluster.workers[0];
        cluster.coordinator.client().batch_execute("CREATE ROLE mallory LOGIN; CREATE ROLE alice LOGIN").unwrap();
        let mut w = worker.client();
        eventually(30, "the roles reached the worker", || {
            w.query_one("SELECT count(*) FROM pg_roles WHERE rolname IN ('mallory', 'alice')", &[]).unwrap().get::<_, i64>(0) == 2
        });
        let mut cc = cluster.coordinator.client();
        let mut four: Vec<Client> = (0..4).map(|_| worker.client()).collect();
        let mut ids: Vec<i64> = four.iter_mut().map(|c| mint(c).unwrap_or_else(|e| panic!("{}", failure(&e)))).collect();
        assert_eq!(forwarded(&mut cc), 4);
        worker.append_conf("pg_idgen.citus_max_connections_per_node = 2");
        w.batch_execute("SELECT pg_reload_conf()").unwrap();
        for c in &mut four {
            ids.push(mint(c).unwrap_or_else(|e| panic!("after the reload: {}", failure(&e))));
        }
        let left = forwarded(&mut cc);
        assert!(left <= 2, "{left} forwarded sessions at a bound of 2");
        drop(four);

        let stop = AtomicBool::new(false);
        let (mallory, alice) = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..12)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = worker.client_as("postgres", "mallory");
                        let mut minted = vec![];
                        let since = Instant::now();
                        while !stop.load(Ordering::Relaxed) && since.elapsed() < Duration::from_secs(120) {
                            c.batch_execute("BEGIN").unwrap();
                            if let Ok(id) = mint(&mut c) {
                                minted.push(id);
                                for _ in 0..43 {
                                    if stop.load(Ordering::Relaxed) {
                                        break;
                                    }
                                    std::thread::sleep(Duration::from_millis(100));
                                }
                            }
                            c.batch_execute("ROLLBACK").unwrap();
                        }
                        minted
                    })
                })
                .collect();
            // Once mallory's sessions hold both places and queue (at most 30 s).
            eventually(30, "mallory's sessions wait for a place", || {
                let n: i64 = w
                    .query_one("SELECT count(*) FROM pg_stat_activity WHERE usename = 'mallory' AND wait_event_type = 'Extension'", &[])
                    .unwrap()
                    .get(0);
                n >= 8
            });
            let mut a = worker.client_as("postgres", "alice");
            let alice: Vec<Result<i64, String>> = (0..6)
                .map(|_| {
                    let r = mint(&mut a).map_err(|e| failure(&e));
                    std::thread::sleep(Duration::from_secs(1));
                    r
                })
                .collect();
            stop.store(true, Ordering::Relaxed);
            (sessions.into_iter().flat_map(|h| h.join().unwrap()).collect::<Vec<i64>>(), alice)
        });
        let alice: Vec<i64> = alice.into_iter().map(|r| r.unwrap_or_else(|e| panic!("alice's call, with mallory's 12 sessions: {e}"))).collect();
        assert!(alice.windows(2).all(|p| p[0] < p[1]), "{alice:?}");
        let all: HashSet<i64> = ids.iter().chain(&alice).chain(&mallory).copied().collect();
        assert_eq!(all.len(), ids.len() + alice.len() + mallory.len(), "duplicate IDs");
    }

    /// A repartitioned `INSERT ... SELECT` mints shard 8 (the coordinator's)
    /// in its shard queries on the worker, which is allowed 2 connections to
    /// the coordinator. An idle session there keeps one (it minted once), and
    /// Citus keeps its backends there idle after each statement, with theirs:
    /// five statements at once (their shard queries take turns, the one
    /// waiting longest first), then three from sessions that stay open
    /// (one worker connection each), all succeed, storing every row with an
    /// ID of its own.
    #[test]
    fn repartitioned_inserts_go_on_past_idle_sessions_keeping_connections() {
        let cluster = Cluster::start("citus_pool_insel", 1, &["pg_idgen.citus_max_connections_per_node = 2"]);
        let mut c = cluster.coordinator.client();
        make_src_and_dst(&mut c);
        assert_repartitioned(&mut c);
        let mut idle = cluster.workers[0].client();
        mint(&mut idle).unwrap();
        let mut done = 0;
        let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
            let statements: Vec<_> = (0..5)
                .map(|_| s.spawn(|| cluster.coordinator.client().execute(INSERT_SELECT, &[]).map_err(|e| failure(&e))))
                .collect();
            statements.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (i, r) in results.into_iter().enumerate() {
            assert_eq!(r, Ok(30000), "statement {i} of the five at once");
            done += 1;
        }
        let mut open = vec![];
        for i in 0..3 {
            let mut s = cluster.coordinator.client();
            s.batch_execute("SET citus.max_adaptive_executor_pool_size = 1").unwrap();
            assert_eq!(s.execute(INSERT_SELECT, &[]).map_err(|e| failure(&e)), Ok(30000), "session {i}");
            open.push(s);
            done += 1;
        }
        let (rows, distinct): (i64, i64) = c.query_one("SELECT count(*), count(DISTINCT id) FROM dst", &[]).map(|r| (r.get(0), r.get(1))).unwrap();
        assert_eq!((rows, distinct), (done * 30000, done * 30000));
        drop(idle);
    }

    /// The coordinator allows 19 sessions besides the one slot it keeps for
    /// administrators. Twenty worker sessions each mint in a transaction they
    /// keep open until all have minted: with a bound of 16 connections from
    /// the worker (there is none by default), all mint and the coordinator never
    /// serves more than 16 forwarded sessions (unbounded, the twentieth would
    /// find no slot there). Then ordinary roles take all the other slots: a superuser's `next_shard_id(7)` through a
    /// worker is refused there (08001 naming the coordinator, its reason the
    /// reserved slots) instead of taking that slot, and an administrator can
    /// still connect. Once one ordinary session leaves, the call mints.
    #[test]
    fn a_forwarded_session_never_takes_a_slot_kept_for_administrators() {
        let mut cluster = Cluster::start("citus_reserved", 1, &[]);
        cluster.coordinator.client().batch_execute("CREATE ROLE app LOGIN").unwrap();
        cluster.coordinator.append_conf("max_connections = 20\nsuperuser_reserved_connections = 1");
        cluster.coordinator.restart();
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let show = |c: &mut Client| c.query_one("SHOW pg_idgen.citus_max_connections_per_node", &[]).unwrap().get::<_, String>(0);
        assert_eq!(show(&mut w), "0", "no bound by default");
        worker.append_conf("pg_idgen.citus_max_connections_per_node = 16");
        w.batch_execute("SELECT pg_reload_conf()").unwrap();
        eventually(30, "the worker's new sessions are bounded", || show(&mut worker.client()) == "16");
        let mut w = worker.client();
        let mut cc = cluster.coordinator.client();
        let have_minted = AtomicUsize::new(0);
        let (minted, most) = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..20)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = worker.client();
                        c.batch_execute("BEGIN").unwrap();
                        let id = mint(&mut c).map_err(|e| failure(&e));
                        have_minted.fetch_add(1, Ordering::Relaxed);
                        // Until every session has minted (or failed), at most 60 s.
                        let since = Instant::now();
                        while have_minted.load(Ordering::Relaxed) < 20 && since.elapsed() < Duration::from_secs(60) {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        id
                    })
                })
                .collect();
            let mut most = 0;
            let since = Instant::now();
            while have_minted.load(Ordering::Relaxed) < 20 && since.elapsed() < Duration::from_secs(60) {
                most = most.max(forwarded(&mut cc));
                std::thread::sleep(Duration::from_millis(100));
            }
            (sessions.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), most)
        });
        let ids: HashSet<i64> = minted.iter().map(|r| *r.as_ref().unwrap_or_else(|e| panic!("one of 20 sessions at once: {e}"))).collect();
        assert_eq!(ids.len(), 20, "duplicate IDs");
        assert!((1..=16).contains(&most), "the coordinator served {most} forwarded sessions at once");
        drop(cc);
        let before = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert!(ids.iter().all(|id| *id < before), "{before} after {ids:?}");
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
