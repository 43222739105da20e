//! pg_idgen's connections between Citus nodes: each session mints on
//! another node over a connection of its own, as the extension's owner,
//! whatever role the session runs as; a server's sessions together keep at
//! most `pg_idgen.citus_max_connections_per_node` (16 by default)
//! connections to any one node; a call waits its turn, at most 10 s
//! (53300), and can be cancelled; and a session another node opens never
//! takes the slots kept for administrators, even as a superuser.
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

    fn mint(c: &mut Client) -> Result<i64, pg_idgen_e2e::postgres::Error> {
        c.query_one("SELECT next_shard_id(7)", &[]).map(|r| r.get(0))
    }

    /// The coordinator mints shard 7; the worker is allowed 2 connections to
    /// it. Two ordinary roles (neither has a password anywhere, nor a
    /// `pg_dist_authinfo` entry): 12 of mallory's sessions each mint in a
    /// transaction they keep open to the end, and 8 of alice's mint one ID per
    /// transaction until each has minted 40 and all 20 have minted (at most
    /// 60 s). No call fails, no ID repeats, each session's IDs rise; the
    /// coordinator never serves more than 2 forwarded sessions at once, all
    /// as the extension's owner: mallory's sessions, idle in their
    /// transactions, hold none of the turns alice's wait for. After a reload
    /// to 1, three sessions minting at once are served by 1.
    #[test]
    fn every_session_of_a_server_mints_within_the_bound() {
        let cluster = Cluster::start("citus_pool", 1, &["pg_idgen.citus_max_connections_per_node = 2"]);
        let worker = &cluster.workers[0];
        let mut cc = cluster.coordinator.client();
        cc.batch_execute("CREATE ROLE mallory LOGIN; CREATE ROLE alice LOGIN").unwrap();
        let mut w = worker.client();
        eventually(30, "the roles reached the worker", || {
            w.query_one("SELECT count(*) FROM pg_roles WHERE rolname IN ('mallory', 'alice')", &[]).unwrap().get::<_, i64>(0) == 2
        });
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
            let (mut most, mut owners) = (0, HashSet::new());
            let since = Instant::now();
            // Until every session is done, and once more then.
            let mut last = false;
            while !last {
                last = done.load(Ordering::Relaxed) >= 20 || since.elapsed() > Duration::from_secs(90);
                let rows = cc.query("SELECT usename::text FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'", &[]).unwrap();
                most = most.max(rows.len());
                // A session still authenticating has no user yet: counted, not named.
                owners.extend(rows.iter().filter_map(|r| r.get::<_, Option<String>>(0)));
                std::thread::sleep(Duration::from_millis(50));
            }
            (sessions.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>(), most, owners)
        });
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

        worker.append_conf("pg_idgen.citus_max_connections_per_node = 1");
        w.batch_execute("SELECT pg_reload_conf()").unwrap();
        let mut c = worker.client();
        eventually(30, "the reload reached the worker's sessions", || {
            c.query_one("SHOW pg_idgen.citus_max_connections_per_node", &[]).unwrap().get::<_, String>(0) == "1"
        });
        // Connections made before the reload end once idle 250 ms.
        eventually(30, "the connections made before the reload ended", || forwarded(&mut cc) == 0);
        // Three sessions minting at once, which with a bound of 2 open a
        // second connection (the run above saw it), are served by one.
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

    /// The worker is allowed 1 connection to the coordinator; one session
    /// mints again and again, and the coordinator's session serving it is
    /// stopped (SIGSTOP), as a process that hangs would be. The call on it
    /// fails (08001, "no answer within 30 s") after 30 s, not made again on
    /// a new connection: the stopped session may still run it. That session
    /// still counts against the bound: another call waits its turn and
    /// fails with 53300, and no other session of the worker's starts on the
    /// coordinator. Once it goes on, calls mint again, above every ID before.
    #[test]
    fn a_call_whose_answer_does_not_come_ends_and_the_session_there_still_counts() {
        let cluster = Cluster::start("citus_no_answer", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut cc = cluster.coordinator.client();
        let (calls, pid) = std::thread::scope(|s| {
            let caller = s.spawn(|| {
                let mut c = worker.client();
                let mut calls = vec![];
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(120) {
                    let t = Instant::now();
                    let r = mint(&mut c);
                    calls.push((r, t.elapsed()));
                    if t.elapsed() > Duration::from_secs(20) {
                        break;
                    }
                }
                calls
            });
            let mut pid = vec![];
            eventually(30, "the caller's connection serves its calls", || {
                pid = forwarded_pids(&mut cc);
                pid.len() == 1
            });
            assert!(std::process::Command::new("kill").args(["-STOP", &pid[0].to_string()]).status().unwrap().success());
            (caller.join().unwrap(), pid[0])
        });
        let resume = || {
            let _ = std::process::Command::new("kill").args(["-CONT", &pid.to_string()]).status();
        };
        let (last, took) = calls.last().unwrap();
        let e = last.as_ref().err().unwrap_or_else(|| {
            resume();
            panic!("the call on the stopped session minted")
        });
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        let (code, detail) = (db.code().code().to_string(), db.detail().unwrap_or_default().to_string());
        let t0 = Instant::now();
        let other = mint(&mut worker.client());
        let waited = t0.elapsed();
        let sessions = forwarded_pids(&mut cc);
        resume();
        assert_eq!(code, "08001", "{detail}");
        assert_eq!(detail, "no answer within 30 s");
        assert!(*took >= Duration::from_secs(30) && *took < Duration::from_secs(36), "the call on the stopped session took {took:?}");
        let e = other.expect_err("a call while the stopped session counts");
        assert_eq!(e.code().map(|c| c.code()), Some("53300"), "{}", failure(&e));
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(16), "waited {waited:?}");
        assert_eq!(sessions, [pid], "the worker's sessions on the coordinator while the stopped one counts");
        let before: Vec<i64> = calls[..calls.len() - 1].iter().map(|(r, _)| *r.as_ref().unwrap_or_else(|e| panic!("{}", failure(e)))).collect();
        let mut w = worker.client();
        let mut after = None;
        eventually(60, "calls mint once the session there went on and its count ended", || {
            after = mint(&mut w).ok();
            after.is_some()
        });
        assert!(before.iter().all(|b| *b < after.unwrap()), "{after:?} after {:?}", before.last());
    }

    /// The worker is allowed 1 connection to the coordinator, and a table
    /// the coordinator's session reads at its first call is locked there: a
    /// call waits for its answer; another waits its turn and gives up after
    /// 10 s with 53300; the first, cancelled, ends with 57014 at once. Once
    /// the lock goes, a call mints, above every ID before (once the
    /// cancelled call's session there, which went on waiting for the lock,
    /// no longer counts: no more of the worker's sessions start there
    /// meanwhile).
    #[test]
    fn a_call_waits_its_turn_at_most_10_s_and_can_be_cancelled() {
        let cluster = Cluster::start("citus_pool_wait", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let first = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        let mut lock = cluster.coordinator.client();
        lock.batch_execute("BEGIN; LOCK TABLE citus_shard_holders IN ACCESS EXCLUSIVE MODE").unwrap();
        let mut cc = cluster.coordinator.client();
        let (stuck, refused, waited) = std::thread::scope(|s| {
            let mut a = worker.client();
            let a_pid: i32 = a.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
            let stuck = s.spawn(move || mint(&mut a).map_err(|e| e.code().map(|c| c.code().to_string())));
            eventually(30, "the first call waits for its answer", || {
                cc.query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding' AND wait_event_type = 'Lock'",
                    &[],
                )
                .unwrap()
                .get::<_, i64>(0)
                    == 1
            });
            let t0 = Instant::now();
            let refused = mint(&mut worker.client());
            let waited = t0.elapsed();
            let t1 = Instant::now();
            let cancelled: bool = w.query_one("SELECT pg_cancel_backend($1::int)", &[&a_pid]).unwrap().get(0);
            assert!(cancelled);
            let stuck = stuck.join().unwrap();
            // The cancel ends the call at once, not at any bound of its own (30 s).
            assert!(t1.elapsed() < Duration::from_secs(8), "the cancelled call ended {:?} after the cancel", t1.elapsed());
            (stuck, refused, waited)
        });
        // The cancelled call's session there still waits for the lock: it
        // counts, and no other starts.
        let still = forwarded_pids(&mut cc);
        lock.batch_execute("ROLLBACK").unwrap();
        assert_eq!(still.len(), 1, "the worker's sessions on the coordinator after the cancel: {still:?}");
        assert_eq!(stuck, Err(Some("57014".to_string())), "the cancelled call");
        let e = refused.unwrap_err();
        let db = e.as_db_error().unwrap_or_else(|| panic!("{e}"));
        assert_eq!(db.code().code(), "53300", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id found no free connection to the Citus node at "), "{}", db.message());
        // Its turn is waited for 10 s, not its 30 s bound for an answer (a
        // margin for a loaded machine).
        assert!(waited >= Duration::from_secs(10) && waited < Duration::from_secs(16), "gave up after {waited:?}");
        let mut after = None;
        eventually(60, "a call mints once the lock is gone", || {
            after = mint(&mut w).ok();
            after.is_some()
        });
        let after = after.unwrap();
        assert!(after > first, "{after} after {first}");
    }

    /// Three databases mint through the worker, which is allowed 2
    /// connections to the coordinator, all databases together: more
    /// databases than connections, three sessions in each. Every call
    /// mints, no ID twice in any database, and the coordinator never serves
    /// more than 2 forwarded sessions at once.
    #[test]
    fn more_databases_than_the_bound_share_it() {
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
        let failed = AtomicUsize::new(0);
        let busy = AtomicBool::new(true);
        let (ids, most): (Vec<i64>, i64) = std::thread::scope(|s| {
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
            let sampler = s.spawn(|| most_forwarded_while(&cluster.coordinator, &busy));
            let ids = sessions.into_iter().flat_map(|h| h.join().unwrap()).collect();
            busy.store(false, Ordering::Relaxed);
            (ids, sampler.join().unwrap())
        });
        assert_eq!(failed.load(Ordering::Relaxed), 0, "failed calls");
        // The coordinator's generators are the server's, for all its databases.
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 2700, "duplicate IDs");
        assert!((1..=2).contains(&most), "{most} forwarded sessions on the coordinator at once");
    }

    /// A call cancelled on the node called (an administrator's cancel there,
    /// or that session's statement timeout), not by the caller, fails with
    /// 08001 saying so, not with 57014, which the caller would take for its
    /// own cancel (a third review). The connection goes on serving the
    /// caller's calls.
    #[test]
    fn a_cancel_on_the_node_called_is_not_the_callers_cancel() {
        let cluster = Cluster::start("citus_cancel_there", 1, &["pg_idgen.citus_max_connections_per_node = 1"]);
        let worker = &cluster.workers[0];
        let mut lock = cluster.coordinator.client();
        // The coordinator's session reads this table at its first call.
        lock.batch_execute("BEGIN; LOCK TABLE citus_shard_holders IN ACCESS EXCLUSIVE MODE").unwrap();
        let mut cc = cluster.coordinator.client();
        let mut w = worker.client();
        let (outcome, pid) = std::thread::scope(|s| {
            let call = s.spawn(|| mint(&mut w));
            let mut pid = None;
            eventually(30, "the coordinator's session waits for the lock", || {
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
        mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert_eq!(forwarded_pids(&mut cc), [pid], "the connection goes on serving the caller's calls (the cancelled call's session)");
    }

    /// A repartitioned `INSERT ... SELECT` mints shard 8 (the coordinator's)
    /// in its shard queries on the worker, each in a session of its own
    /// there, which is allowed the default 16 connections to the coordinator;
    /// an idle session there minted once. Five statements at once, then
    /// three from sessions that stay open (one worker connection each), all
    /// succeed, storing every row with an ID of its own, and the coordinator
    /// never serves more than 16 of the worker's sessions at once.
    #[test]
    fn repartitioned_inserts_stay_within_the_bound() {
        let cluster = Cluster::start("citus_pool_insel", 1, &[]);
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
            // The coordinator's sessions opened by the worker's sessions, the most seen at once.
            let sampler = s.spawn(|| most_forwarded_while(&cluster.coordinator, &busy));
            let results = statements.into_iter().map(|h| h.join().unwrap()).collect();
            busy.store(false, Ordering::Relaxed);
            (results, sampler.join().unwrap())
        });
        // The worker runs the five statements' shard queries (with their
        // DEFAULT) at once, through at most the 16 connections allowed; at
        // least one was seen (the probe sees them).
        assert!((1..=16).contains(&most), "{most} forwarded sessions on the coordinator during the five statements");
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
    /// serves more than 16 forwarded sessions (the default bound), though
    /// only 18 of its slots are free for them and Citus. With only 2
    /// ordinary slots free, 12 sessions mint 25 IDs each, none failing: the
    /// sessions refused a connection take turns on the ones made. Then
    /// ordinary roles take all the other slots: a superuser's
    /// `next_shard_id(7)` through a worker is refused there (08001 naming
    /// the coordinator, its reason the reserved slots) instead of taking
    /// that slot, and an administrator can still connect. Once one ordinary session leaves, the call mints.
    #[test]
    fn a_forwarded_session_never_takes_a_slot_kept_for_administrators() {
        let mut cluster = Cluster::start("citus_reserved", 1, &[]);
        cluster.coordinator.client().batch_execute("CREATE ROLE app LOGIN").unwrap();
        cluster.coordinator.append_conf("max_connections = 20\nsuperuser_reserved_connections = 1");
        cluster.coordinator.restart();
        let worker = &cluster.workers[0];
        let mut w = worker.client();
        let show = |c: &mut Client| c.query_one("SHOW pg_idgen.citus_max_connections_per_node", &[]).unwrap().get::<_, String>(0);
        assert_eq!(show(&mut w), "16", "the default bound");
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
            // Until every session has minted, and once more then.
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
        assert!((1..=16).contains(&most), "the coordinator served {most} forwarded sessions at once");
        drop(cc);
        let before = mint(&mut w).unwrap_or_else(|e| panic!("{}", failure(&e)));
        assert!(ids.iter().all(|id| *id < before), "{before} after {ids:?}");
        drop(w);
        // End the worker's connections here at once (they end 250 ms unused).
        cluster.coordinator.client().batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pg_idgen forwarding'").unwrap();
        eventually(30, "the worker's forwarded sessions ended", || forwarding_sessions(&cluster.coordinator) == 0);

        let mut ordinary = vec![];
        fill(&cluster.coordinator, &mut ordinary);

        // Two ordinary slots free: the attempts past them are refused, and
        // the calls go on by turns over the connections made (a third
        // review saw 38% of them fail with the refusals).
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
