//! pg_idgen's connections between Citus nodes: a server's sessions mint on
//! another node through the server's forwarder, which keeps at most
//! `pg_idgen.citus_max_connections_per_node` (4 by default) connections to
//! it, as the extension's owner, whatever role each session runs as; a
//! call waits its turn, at most 10 s (53300), and can be cancelled; and a
//! session another node opens never takes the slots kept for
//! administrators, even as a superuser.
//! Needs Citus (scripts/citus); scripts/test filters these tests out, and
//! counts them as skipped, where it is missing.

mod citus {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    use pg_idgen_e2e::citus::{assert_repartitioned, failure, make_src_and_dst, node_name, Cluster, INSERT_SELECT};
    use pg_idgen_e2e::postgres::Client;
    use pg_idgen_e2e::{eventually, sqlstate, Server, PORT};

    /// Sessions other nodes opened, on the server of `c`, to mint there.
    fn forwarded(c: &mut Client) -> i64 {
        c.query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap().get(0)
    }

    /// The PIDs of those sessions, in order.
    fn forwarded_pids(c: &mut Client) -> Vec<i32> {
        c.query("SELECT pid FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding' ORDER BY pid", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// The same, in a session of its own on `server`.
    fn forwarding_sessions(server: &Server) -> i64 {
        forwarded(&mut server.client())
    }

    /// The most sessions other nodes opened on `server` at once, sampled
    /// every 20 ms while `busy` (at most 2 minutes), and once more after.
    fn most_forwarded_while(server: &Server, busy: &AtomicBool) -> i64 {
        let mut c = server.client();
        let mut most = 0;
        for _ in 0..6000 {
            let last = !busy.load(Ordering::Relaxed);
            most = most.max(forwarded(&mut c));
            if last {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        most
    }

    /// Opens ordinary sessions of role `app` on `server` until it refuses one
    /// (53300), at most 30; then, once only they are connected, fills what
    /// sessions that were ending had held.
    fn fill(server: &Server, ordinary: &mut Vec<Client>) {
        let refused = (0..30).find_map(|_| match server.try_client_as("postgres", "app") {
            Ok(c) => {
                ordinary.push(c);
                None
            }
            Err(e) => Some(e),
        });
        let refused = refused.expect("30 ordinary sessions connected");
        assert_eq!(refused.code().map(|c| c.code()), Some("53300"), "{refused}");
        for _ in 0..10 {
            only_ordinary(ordinary);
            match server.try_client_as("postgres", "app") {
                Ok(c) => ordinary.push(c),
                Err(_) => break,
            }
        }
    }

    /// Waits (at most 30 s) until the only client sessions of the server are `ordinary`.
    fn only_ordinary(ordinary: &mut [Client]) {
        let n = ordinary.len();
        eventually(30, "only the ordinary sessions are connected", || {
            let connected: i64 = ordinary[0]
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'", &[])
                .unwrap()
                .get(0);
            connected as usize == n
        });
    }

    /// Sessions started in the database of `c` so far.
    fn sessions_started(c: &mut Client) -> i64 {
        c.query_one("SELECT sessions FROM pg_stat_database WHERE datname = current_database()", &[]).unwrap().get(0)
    }

    fn mint(c: &mut Client) -> Result<i64, pg_idgen_e2e::postgres::Error> {
        c.query_one("SELECT next_shard_id(7)", &[]).map(|r| r.get(0))
    }

    /// The coordinator mints shard 7; the worker is allowed 2 connections to
    /// it. Two ordinary roles (neither has a password anywhere, nor a
    /// `pg_dist_authinfo` entry): 12 of mallory's sessions each mint in a
    /// transaction they keep open to the end, and 8 of alice's mint one ID per
    /// transaction until each has minted 40 and all 20 have minted (at most
    /// 60 s). No call fails, no ID repeats, each session's IDs rise; the
    /// coordinator never serves more than 2 forwarded sessions, all as the
    /// extension's owner, and 2 at most in the whole run (by their process
    /// IDs; and at most 5 sessions of any kind start there, where a session
    /// of its own for each of the 20 would start 20). After a reload to 1, a
    /// call leaves at most 1.
    #[test]
    fn every_session_of_a_server_mints_through_a_few_shared_connections() {
        let cluster = Cluster::start("citus_pool", 1, &["pg_idgen.citus_max_connections_per_node = 2"]);
        let worker = &cluster.workers[0];
        let mut cc = cluster.coordinator.client();
        cc.batch_execute("CREATE ROLE mallory LOGIN; CREATE ROLE alice LOGIN").unwrap();
        let mut w = worker.client();
        eventually(30, "the roles reached the worker", || {
            w.query_one("SELECT count(*) FROM pg_roles WHERE rolname IN ('mallory', 'alice')", &[]).unwrap().get::<_, i64>(0) == 2
        });
        let started_before = sessions_started(&mut cc);
        let have_minted = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let (per_session, most, owners) = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..20)
                .map(|i| {
                    let (have_minted, done) = (&have_minted, &done);
                    s.spawn(move || {
                        let role = if i < 12 { "mallory" } else { "alice" };
                        let mut c = worker.client_as("postgres", role);
                        let (mut ids, mut failed) = (vec![], vec![]);
                        let since = Instant::now();
                        if role == "mallory" {
                            c.batch_execute("BEGIN").unwrap();
                        }
                        while since.elapsed() < Duration::from_secs(60) {
                            let enough = if role == "mallory" { !ids.is_empty() } else { ids.len() >= 40 };
                            if enough && have_minted.load(Ordering::Relaxed) == 20 {
                                break;
                            }
                            if enough && role == "mallory" {
                                std::thread::sleep(Duration::from_millis(50));
                                continue;
                            }
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
                        done.fetch_add(1, Ordering::Relaxed);
                        (role, ids, failed)
                    })
                })
                .collect();
            let (mut most, mut owners, mut pids) = (0, HashSet::new(), HashSet::new());
            let since = Instant::now();
            // Until every session is done, and once more then (the forwarder
            // keeps its connections 10 s).
            let mut last = false;
            while !last {
                last = done.load(Ordering::Relaxed) >= 20 || since.elapsed() > Duration::from_secs(90);
                let rows = cc.query("SELECT usename::text, pid FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap();
                most = most.max(rows.len());
                for r in rows {
                    owners.insert(r.get::<_, String>(0));
                    pids.insert(r.get::<_, i32>(1));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            (sessions.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), most, (owners, pids))
        });
        let (owners, pids) = owners;
        let failed: Vec<&String> = per_session.iter().flat_map(|(_, _, f)| f).collect();
        let total: usize = per_session.iter().map(|(_, ids, _)| ids.len()).sum();
        assert!(failed.is_empty(), "{} calls failed ({total} minted): {:?}", failed.len(), failed.first());
        assert_eq!(have_minted.load(Ordering::Relaxed), 20);
        assert!(per_session.iter().filter(|(r, ..)| *r == "alice").all(|(_, ids, _)| ids.len() >= 40), "an alice session minted fewer than 40");
        assert!(per_session.iter().all(|(_, ids, _)| ids.windows(2).all(|w| w[0] < w[1])), "a session's IDs did not rise");
        let all: HashSet<i64> = per_session.iter().flat_map(|(_, ids, _)| ids.iter().copied()).collect();
        assert_eq!(all.len(), total, "duplicate IDs");
        assert!((1..=2).contains(&most), "the coordinator served {most} forwarded sessions at once");
        assert_eq!(owners, HashSet::from(["postgres".to_string()]), "forwarded sessions' roles");
        assert!((1..=2).contains(&pids.len()), "{} forwarded sessions in the run", pids.len());
        let started = sessions_started(&mut cc) - started_before;
        assert!((1..=5).contains(&started), "{started} sessions started on the coordinator for {total} calls");

        worker.append_conf("pg_idgen.citus_max_connections_per_node = 1");
        w.batch_execute("SELECT pg_reload_conf()").unwrap();
        let mut c = worker.client();
        eventually(30, "a call leaves one forwarded session", || {
            mint(&mut c).unwrap_or_else(|e| panic!("after the reload: {}", failure(&e)));
            forwarded(&mut cc) <= 1
        });
        // Then three sessions minting at once, which with a bound of 2 open
        // a second connection (the run above saw it), are served by one:
        // the connections above the bound did not just go idle and close.
        let busy = AtomicBool::new(true);
        let most = std::thread::scope(|s| {
            let minters: Vec<_> = (0..3)
                .map(|_| {
                    let mut m = worker.client();
                    s.spawn(move || {
                        for _ in 0..300 {
                            mint(&mut m).unwrap_or_else(|e| panic!("minting after the reload: {}", failure(&e)));
                        }
                    })
                })
                .collect();
            let sampler = s.spawn(|| most_forwarded_while(&cluster.coordinator, &busy));
            for m in minters {
                m.join().unwrap();
            }
            busy.store(false, Ordering::Relaxed);
            sampler.join().unwrap()
        });
        assert_eq!(most, 1, "forwarded sessions on the coordinator while three sessions minted after the reload to 1");
    }

    /// A cluster of one worker allowed 1 connection to the coordinator, the
    /// first ID minted through it, and a signaller of the coordinator's
    /// session serving that connection, which is stopped (SIGSTOP).
    fn one_connection_stopped(name: &str) -> (Cluster, i64, impl Fn(&str)) {
        let cluster = Cluster::start(name, 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let first = mint(&mut cluster.workers[0].client()).unwrap_or_else(|e| panic!("{}", failure(&e)));
        let mut cc = cluster.coordinator.client();
        let pid: i32 = cc.query_one("SELECT pid FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap().get(0);
        let signal = move |sig: &str| {
            let _ = std::process::Command::new("kill").args([sig, &pid.to_string()]).status();
        };
        signal("-STOP");
        (cluster, first, signal)
    }

    /// The process ID of the forwarder of the server of `c`.
    fn forwarder_pid(c: &mut Client) -> i32 {
        c.query_one("SELECT pid FROM pg_stat_activity WHERE backend_type = 'pg_idgen forwarder'", &[]).unwrap().get(0)
    }

    /// The worker's forwarder stopped (SIGSTOP), as a process that hangs
    /// would be: a call through it waits at most 95 s in all for its answer
    /// (docs/limits.md), then fails (08001) naming the wait; the forwarder
    /// let go on, the next call mints.
    #[test]
    fn a_call_through_a_forwarder_that_does_not_answer_waits_at_most_95_s() {
        let cluster = Cluster::start("citus_backstop", 1, &[]);
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let first = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        let pid = forwarder_pid(&mut worker.client()).to_string();
        let signal = |sig: &str| std::process::Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(signal("-STOP").success());
        let t0 = Instant::now();
        let outcome = mint(&mut w);
        let took = t0.elapsed();
        assert!(signal("-CONT").success());
        let e = outcome.expect_err("a call through a stopped forwarder failed");
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "08001", "{db}");
        let said = format!("{} {}", db.message(), db.detail().unwrap_or_default());
        assert!(said.contains("did not answer within 95 s"), "{said}");
        assert!(took >= Duration::from_secs(95) && took < Duration::from_secs(105), "{took:?}");
        let next = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert!(next > first);
    }

    /// The worker is allowed 1 connection to the coordinator, and the
    /// coordinator's session serving it is stopped (SIGSTOP): a call sent on
    /// it waits for its answer; another waits its turn and gives up after
    /// 10 s with 53300; the first, cancelled, ends with 57014 at once. Once
    /// the session goes on, the next call mints, above every ID before. The
    /// forwarder, terminated, is started again, and minting goes on.
    #[test]
    fn a_call_waits_its_turn_at_most_10_s_and_can_be_cancelled() {
        let (cluster, first, signal) = one_connection_stopped("citus_pool_wait");
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let (stuck, refused, waited) = std::thread::scope(|s| {
            let mut a = worker.client();
            let a_pid: i32 = a.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            let stuck = s.spawn(move || mint(&mut a).map_err(|e| e.code().map(|c| c.code().to_string())));
            eventually(30, "the first call waits for its answer", || {
                w.query_one("SELECT wait_event_type = 'Extension' FROM pg_stat_activity WHERE pid = $1", &[&a_pid]).unwrap().get::<_, Option<bool>>(0)
                    == Some(true)
            });
            let t0 = Instant::now();
            let refused = mint(&mut worker.client());
            let waited = t0.elapsed();
            let t1 = Instant::now();
            let cancelled: bool = w.query_one("SELECT pg_cancel_backend($1::int)", &[&a_pid]).unwrap().get(0);
            assert!(cancelled);
            let stuck = stuck.join().unwrap();
            // The cancel ends the call at once, not at any bound of its own (20 s, 30 s).
            assert!(t1.elapsed() < Duration::from_secs(8), "the cancelled call ended {:?} after the cancel", t1.elapsed());
            (stuck, refused, waited)
        });
        signal("-CONT");
        assert_eq!(stuck, Err(Some("57014".to_string())), "the cancelled call");
        let e = refused.unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "53300", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id found no free connection to the Citus node at "), "{}", db.message());
        // Its turn is waited for 10 s, not its own 20 s or 30 s bound (a
        // margin for a loaded machine: a connection attempt to the same
        // node is not made, the one connection being busy).
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(16), "gave up after {waited:?}");
        let after = mint(&mut w).unwrap_or_else(|e| panic!("once the coordinator's session goes on: {}", failure(&e)));
        assert!(after > first, "{after} after {first}");

        let forwarder = forwarder_pid(&mut w);
        assert!(w.query_one("SELECT pg_terminate_backend($1::int)", &[&forwarder]).unwrap().get::<_, bool>(0));
        // The call right after waits for the forwarder started anew, and mints.
        let again = mint(&mut w).unwrap_or_else(|e| panic!("the call right after the forwarder was terminated: {}", failure(&e)));
        assert!(again > after, "{again} after {after}");
        let restarted = forwarder_pid(&mut w);
        assert_ne!(restarted, forwarder);
    }

    /// The worker is allowed 1 connection to the coordinator, and the
    /// coordinator's session serving it is stopped: one call is sent and
    /// waits for its answer, three more wait in the forwarder, unsent. The
    /// forwarder, terminated, fails the call it sent (08001: it may have
    /// been minted there) and sends the three again once started anew: they
    /// mint, each an ID of its own above every ID before (a third review
    /// found them failed too).
    #[test]
    fn a_forwarder_started_again_sends_what_the_one_before_had_not_sent() {
        let (cluster, first, signal) = one_connection_stopped("citus_unsent");
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let waiting = |w: &mut Client, pids: &[i32]| -> bool {
            let n: i64 = w
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1) AND wait_event_type = 'Extension'", &[&pids])
                .unwrap()
                .get(0);
            n == pids.len() as i64
        };
        let (sent, unsent) = std::thread::scope(|s| {
            let mut sessions: Vec<Client> = (0..4).map(|_| worker.client()).collect();
            let pids: Vec<i32> = sessions.iter_mut().map(|c| c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0)).collect();
            let mut calls = sessions.into_iter().map(|mut c| move || mint(&mut c));
            let sent = s.spawn(calls.next().unwrap());
            eventually(30, "the first call waits for its answer", || waiting(&mut w, &pids[..1]));
            let unsent: Vec<_> = calls.map(|call| s.spawn(call)).collect();
            eventually(30, "three more calls wait", || waiting(&mut w, &pids));
            let forwarder = forwarder_pid(&mut w);
            assert!(w.query_one("SELECT pg_terminate_backend($1::int)", &[&forwarder]).unwrap().get::<_, bool>(0));
            (sent.join().unwrap(), unsent.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>())
        });
        signal("-CONT");
        let e = sent.expect_err("the call sent before the forwarder stopped");
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "08001", "{}", db.message());
        assert!(db.detail().unwrap_or_default().contains("the pg_idgen forwarder restarted"), "{:?}", db.detail());
        let ids: Vec<i64> = unsent.into_iter().map(|r| r.unwrap_or_else(|e| panic!("a call never sent: {}", failure(&e)))).collect();
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 3, "{ids:?}");
        assert!(ids.iter().all(|id| *id > first), "{ids:?} after {first}");
    }

    /// Three databases mint through the worker, which is allowed 2
    /// connections to the coordinator: more databases than connections. A
    /// connection is held 1 s before another database may take it, so they
    /// pass between databases at most once a second each: fewer than 2
    /// sessions a second (and the first 2, and a margin of 6 for Citus's own)
    /// start on the coordinator. In 0.8.0 one started at almost every call (a
    /// third review: about 115 a second). Every call mints, no ID twice in
    /// any database.
    #[test]
    fn more_databases_than_the_bound_take_connections_in_turn() {
        let cluster = Cluster::start("citus_databases", 1, &["pg_idgen.citus_max_connections_per_node = 2"]);
        let dbs = ["postgres", "d2", "d3"];
        for db in &dbs[1..] {
            for node in cluster.nodes() {
                node.client().batch_execute(&format!("CREATE DATABASE {db}")).unwrap();
                node.client_db(db).batch_execute("CREATE EXTENSION citus").unwrap();
            }
            let mut c = cluster.coordinator.client_db(db);
            c.execute("SELECT citus_set_coordinator_host($1, $2)", &[&node_name(&cluster.coordinator), &(PORT as i32)]).unwrap();
            c.execute("SELECT citus_add_node($1, $2)", &[&node_name(&cluster.workers[0]), &(PORT as i32)]).unwrap();
            c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        }
        let worker = &cluster.workers[0];
        let mut cc = cluster.coordinator.client();
        let started = |c: &mut Client| -> i64 { c.query_one("SELECT sum(sessions)::bigint FROM pg_stat_database", &[]).unwrap().get(0) };
        let before = started(&mut cc);
        let t0 = Instant::now();
        let failed = AtomicUsize::new(0);
        let ids: Vec<i64> = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..9)
                .map(|i| {
                    let failed = &failed;
                    s.spawn(move || {
                        let mut c = worker.client_db(dbs[i % 3]);
                        (0..300)
                            .filter_map(|_| {
                                mint(&mut c)
                                    .map_err(|e| {
                                        failed.fetch_add(1, Ordering::Relaxed);
                                        eprintln!("{}: {}", dbs[i % 3], failure(&e));
                                    })
                                    .ok()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            sessions.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let secs = t0.elapsed().as_secs() as i64;
        let new = started(&mut cc) - before;
        assert_eq!(failed.load(Ordering::Relaxed), 0, "failed calls");
        // The coordinator's generators are the server's, for all its databases.
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 2700, "duplicate IDs");
        eprintln!("{new} sessions started on the coordinator in {secs} s");
        assert!(new <= 2 * (secs + 1) + 2 + 6, "{new} sessions started on the coordinator in {secs} s");
    }

    /// A call cancelled on the node called (an administrator's cancel there,
    /// or that session's statement timeout), not by the caller, fails with
    /// 08001 saying so, not with 57014, which the caller would take for its
    /// own cancel (a third review). The connection goes on serving calls.
    #[test]
    fn a_cancel_on_the_node_called_is_not_the_callers_cancel() {
        let cluster = Cluster::start("citus_cancel_there", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut lock = cluster.coordinator.client();
        // The forwarder's session reads this table at its first call.
        lock.batch_execute("BEGIN; LOCK TABLE citus_shard_holders IN ACCESS EXCLUSIVE MODE").unwrap();
        let mut cc = cluster.coordinator.client();
        let (outcome, pid) = std::thread::scope(|s| {
            let call = s.spawn(|| mint(&mut worker.client()));
            let mut pid = None;
            eventually(30, "the forwarder's session waits for the lock", || {
                pid = cc
                    .query_opt("SELECT pid FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding' AND wait_event_type = 'Lock'", &[])
                    .unwrap()
                    .map(|r| r.get::<_, i32>(0));
                pid.is_some()
            });
            assert!(cc.query_one("SELECT pg_cancel_backend($1::int)", &[&pid]).unwrap().get::<_, bool>(0));
            (call.join().unwrap(), pid.unwrap())
        });
        lock.batch_execute("ROLLBACK").unwrap();
        let e = outcome.expect_err("a call cancelled on the coordinator");
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "08001", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id cannot reach the Citus coordinator at "), "{}", db.message());
        assert_eq!(db.detail(), Some("canceling statement due to user request (on the node called)"));
        let mut w = worker.client();
        mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert_eq!(forwarded_pids(&mut cc), [pid], "the connection goes on serving calls (the cancelled call's session)");
    }

    /// A repartitioned `INSERT ... SELECT` mints shard 8 (the coordinator's)
    /// in its shard queries on the worker, which is allowed 2 connections to
    /// the coordinator; an idle session there minted once. Five statements
    /// at once, then three from sessions that stay open (one worker
    /// connection each), all succeed, storing every row with an ID of its own.
    #[test]
    fn repartitioned_inserts_share_the_forwarders_connections() {
        let cluster = Cluster::start("citus_pool_insel", 1, &["pg_idgen.citus_max_connections_per_node = 2"]);
        let mut c = cluster.coordinator.client();
        make_src_and_dst(&mut c);
        assert_repartitioned(&mut c);
        let mut idle = cluster.workers[0].client();
        mint(&mut idle).unwrap();
        let mut done = 0;
        let busy = AtomicBool::new(true);
        let (results, most): (Vec<Result<u64, String>>, i64) = std::thread::scope(|s| {
            let statements: Vec<_> = (0..5)
                .map(|_| s.spawn(|| cluster.coordinator.client().execute(INSERT_SELECT, &[]).map_err(|e| failure(&e))))
                .collect();
            // The coordinator's sessions opened by the worker's forwarder, the most seen at once.
            let sampler = s.spawn(|| most_forwarded_while(&cluster.coordinator, &busy));
            let results = statements.into_iter().map(|h| h.join().unwrap()).collect();
            busy.store(false, Ordering::Relaxed);
            (results, sampler.join().unwrap())
        });
        // Shared: the worker runs the five statements' shard queries (with
        // their DEFAULT) at once, through at most the 2 connections allowed;
        // at least one was seen (the probe sees them).
        assert!((1..=2).contains(&most), "{most} forwarded sessions on the coordinator during the five statements");
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
    /// keep open until all have minted: all mint, and the coordinator never
    /// serves more than 4 forwarded sessions (the default bound). With only
    /// 2 ordinary slots free, 12 sessions mint 25 IDs each, none failing.
    /// Then ordinary roles take all the other slots: a superuser's `next_shard_id(7)` through a
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
        assert_eq!(show(&mut w), "4", "the default bound");
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
            // Until every session has minted, and once more then (the
            // forwarder keeps its connections 10 s: all 20 may mint before
            // the first look).
            let mut most = 0;
            let since = Instant::now();
            loop {
                let last = have_minted.load(Ordering::Relaxed) >= 20 || since.elapsed() > Duration::from_secs(60);
                most = most.max(forwarded(&mut cc));
                if last {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (sessions.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), most)
        });
        let ids: HashSet<i64> = minted.iter().map(|r| *r.as_ref().unwrap_or_else(|e| panic!("one of 20 sessions at once: {e}"))).collect();
        assert_eq!(ids.len(), 20, "duplicate IDs");
        assert!((1..=4).contains(&most), "the coordinator served {most} forwarded sessions at once");
        drop(cc);
        let before = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert!(ids.iter().all(|id| *id < before), "{before} after {ids:?}");
        drop(w);
        // The forwarder keeps its connections 10 s unused: end them here.
        cluster.coordinator.client().batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'").unwrap();
        eventually(30, "the worker's forwarded sessions ended", || forwarding_sessions(&cluster.coordinator) == 0);

        let mut ordinary = vec![];
        fill(&cluster.coordinator, &mut ordinary);

        // Two ordinary slots free: the forwarder's attempts past them are
        // refused, and the calls go on over the two connections it has (a
        // third review saw 38% of them fail with the refusals).
        ordinary.truncate(ordinary.len() - 2);
        only_ordinary(&mut ordinary);
        let failed = AtomicUsize::new(0);
        let ids: Vec<i64> = std::thread::scope(|s| {
            let sessions: Vec<_> = (0..12)
                .map(|_| {
                    s.spawn(|| {
                        let mut c = worker.client();
                        (0..25)
                            .filter_map(|_| {
                                mint(&mut c)
                                    .map_err(|e| {
                                        failed.fetch_add(1, Ordering::Relaxed);
                                        eprintln!("{}", failure(&e));
                                    })
                                    .ok()
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            sessions.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(failed.load(Ordering::Relaxed), 0, "calls failed with 2 slots free");
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 300, "duplicate IDs");
        cluster.coordinator.client().batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'").unwrap();
        eventually(30, "the worker's forwarded sessions ended", || forwarding_sessions(&cluster.coordinator) == 0);
        fill(&cluster.coordinator, &mut ordinary);

        let mut w = cluster.workers[0].client();
        let e = mint(&mut w).unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "08001", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id cannot reach the Citus coordinator at "), "{}", db.message());
        let detail = db.detail().unwrap_or_default();
        assert!(detail.contains("reserved for administrators"), "{detail}");
        // The administrators' slots are there for them, at once (one attempt).
        let mut admin = cluster.coordinator.try_client_as("postgres", "postgres").unwrap_or_else(|e| panic!("an administrator's session: {e}"));
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
