//! A fleet without a lease store: a standby promoted while the primary it
//! replicated from still runs mints the same shards. The server that
//! `primary_conninfo` names is asked after every start and promotion, and
//! another primary of the same data is named in the log and by
//! `id_generator_copies()`; a standby or a stopped origin is not.

use std::net::TcpListener;

use pg_idgen_e2e::{eventually, sqlstate, Server};

/// `id_generator_copies()`'s row: (state, origin, detail, checked_at as text).
fn copies(s: &Server) -> Option<(String, String, String, String)> {
    s.client()
        .query_opt("SELECT state, origin, detail, checked_at::text FROM id_generator_copies()", &[])
        .unwrap()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// The row once the question was answered (not `asking`).
fn answered(s: &Server) -> Option<(String, String, String, String)> {
    copies(s).filter(|r| r.0 != "asking")
}

fn system_identifier(s: &Server) -> String {
    s.client().query_one("SELECT system_identifier::text FROM pg_control_system()", &[]).unwrap().get(0)
}

const WARNING: &str = "another primary of this data runs at";

#[test]
fn a_standby_promoted_while_its_primary_runs_names_it_and_a_standby_or_stopped_origin_is_not() {
    let mut a = Server::start("copies_a", &[]);
    let mut b = Server::standby_of(&a, "copies_b", &[]);
    let c = Server::standby_of(&b, "copies_c", &[]);
    let system = system_identifier(&a);
    // A primary with no primary_conninfo, and a standby, ask nobody.
    assert_eq!(copies(&a), None);
    assert_eq!(copies(&b), None);

    // C, promoted while B (its origin) is still a standby: B is named a
    // standby, and nothing is warned.
    c.promote();
    eventually(60, "C asked B after its promotion", || answered(&c).is_some());
    let (state, origin, detail, _) = copies(&c).unwrap();
    assert_eq!((state.as_str(), detail.as_str()), ("standby", "in_hot_standby = on"), "origin {origin}");
    assert!(!c.log().contains(WARNING), "{}", c.log());

    // B, promoted while A runs: another primary of this data, named.
    b.wait_for_replay(&a);
    b.promote();
    eventually(60, "B asked A after its promotion", || answered(&b).is_some());
    let (state, origin, detail, first_check) = copies(&b).unwrap();
    assert_eq!((state.as_str(), detail.as_str()), ("another primary", system.as_str()));
    assert!(origin.contains("copies_a"), "A's socket directory: {origin}");
    let log = b.log();
    let line = log.lines().find(|l| l.contains(WARNING)).unwrap_or_else(|| panic!("no warning in B's log:\n{log}"));
    assert!(line.contains("WARNING") && line.contains(&system) && line.contains("lease store"), "{line}");
    // What it warns of: both mint the same shard.
    for s in [&a, &b] {
        assert_eq!(sqlstate(s.client().query_one("SELECT next_shard_id(7)", &[])), "ok");
    }

    // A stopped: B's next start finds its origin unreachable, logs no
    // warning for it, and the row is replaced.
    a.stop("fast");
    let warnings = b.log().matches(WARNING).count();
    b.restart();
    eventually(60, "B asked again after its restart", || answered(&b).is_some_and(|r| r.3 != first_check));
    let (state, _, detail, _) = copies(&b).unwrap();
    assert_eq!(state, "unreachable", "{detail}");
    assert!(!detail.is_empty());
    assert_eq!(b.log().matches(WARNING).count(), warnings, "no new warning for an unreachable origin");
}

/// A primary whose primary_conninfo names itself (a name that follows the
/// primary, after a failover), with an application_name of its own, is not
/// another primary; with a lease store nothing is asked; and only
/// superusers and pg_monitor read what was found.
#[test]
fn a_primary_naming_itself_is_not_another_and_only_pg_monitor_reads_it() {
    let mut a = Server::start("copies_self", &[]);
    let own = a.conninfo("postgres");
    let mut c = a.client();
    c.batch_execute("CREATE ROLE plain LOGIN; CREATE ROLE watcher LOGIN IN ROLE pg_monitor").unwrap();
    c.batch_execute(&format!("ALTER SYSTEM SET primary_conninfo = '{own} application_name=node1'")).unwrap();
    a.restart();
    eventually(60, "A asked itself", || answered(&a).is_some());
    let (state, _, detail, _) = copies(&a).unwrap();
    assert_eq!((state.as_str(), detail.as_str()), ("this server", "primary_conninfo names this server"));
    assert!(!a.log().contains(WARNING), "{}", a.log());
    // The same in forms where a name added carelessly would not be read: a
    // URI with a `?` in its password, a keyword form ending in a backslash.
    let dir = own.split_whitespace().find_map(|kv| kv.strip_prefix("host=")).unwrap().replace('/', "%2F");
    let port = own.split_whitespace().find_map(|kv| kv.strip_prefix("port=")).unwrap().to_string();
    for conninfo in [format!("postgresql://postgres:pa?ss@{dir}:{port}/postgres"), format!("{own} application_name=node1\\")] {
        let checked = copies(&a).unwrap().3;
        a.client().batch_execute(&format!("ALTER SYSTEM SET primary_conninfo = '{conninfo}'")).unwrap();
        a.restart();
        eventually(60, "A asked itself again", || answered(&a).is_some_and(|r| r.3 != checked));
        let (state, _, detail, _) = copies(&a).unwrap();
        assert_eq!(state, "this server", "{conninfo}: {detail}");
    }
    assert!(!a.log().contains(WARNING), "{}", a.log());

    let read = |role: &str| sqlstate(a.client_as("postgres", role).query("SELECT * FROM id_generator_copies()", &[]));
    assert_eq!(read("plain"), "42501");
    assert_eq!(read("watcher"), "ok");
    assert_eq!(read("postgres"), "ok");

    // With a lease store (here one that never answers) the store decides
    // who mints: once loaded, nothing was asked.
    let loaded = a.log().matches("loaded the server's shard ownership").count();
    a.append_conf("pg_idgen.lease_store = 'http://127.0.0.1:9'");
    a.restart();
    eventually(60, "the loader loaded", || a.log().matches("loaded the server's shard ownership").count() > loaded);
    assert_eq!(copies(&a), None);
}

/// An origin that accepts connections and never answers (a frozen machine):
/// minting is open at once, the question ends as unreachable by its own
/// bound, and the server stops cleanly while it is being asked.
#[test]
fn a_silent_origin_holds_up_neither_minting_nor_a_shutdown() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let accepted = held.clone();
    std::thread::spawn(move || {
        for stream in silent.incoming().take(16).flatten() {
            accepted.lock().unwrap().push(stream);
        }
    });
    let conninfo = format!("primary_conninfo = 'host=127.0.0.1 port={port} user=postgres'");
    let mut s = Server::start("copies_silent", &[&conninfo]);
    // Minting is open while the question waits.
    assert_eq!(sqlstate(s.client().query_one("SELECT next_shard_id(3)", &[])), "ok");
    eventually(60, "the origin accepted the question", || !held.lock().unwrap().is_empty());
    assert_eq!(copies(&s).map(|r| r.0).as_deref(), Some("asking"), "no answer yet");
    eventually(120, "the question ended by its bound", || answered(&s).is_some());
    let (state, origin, detail, _) = copies(&s).unwrap();
    assert_eq!(state, "unreachable");
    assert_eq!(detail, "no answer within 10 s");
    assert!(s.log().contains("is unreachable: no answer within 10 s"), "the bound's end is logged");
    assert!(origin.contains(&port.to_string()) || origin.contains("primary_conninfo"), "{origin}");

    // Stopped while asking (it waits up to 10 s for an answer): SIGTERM
    // ends the question at once, not its bound, and the server starts again.
    let asked = held.lock().unwrap().len();
    s.stop("fast");
    s.start_process();
    eventually(60, "asked again after the restart", || held.lock().unwrap().len() > asked);
    s.stop("fast");
    let log = s.log();
    let shutdown = log.rfind("received fast shutdown request").expect("the last stop is logged");
    let last = &log[shutdown..];
    assert!(last.contains("terminating background worker \"pg_idgen loader\""), "{last}");
    assert!(!last.contains("no answer within"), "the question waited for its bound: {last}");
    let asked = held.lock().unwrap().len();
    s.start_process();
    assert_eq!(sqlstate(s.client().query_one("SELECT next_shard_id(3)", &[])), "ok");

    // The loader terminated while asking: the question shows as begun and
    // never answered.
    eventually(60, "asked after the last start", || held.lock().unwrap().len() > asked);
    const TERMINATED: &str = "terminating background worker \"pg_idgen loader\"";
    let terminated = s.log().matches(TERMINATED).count();
    let ended: bool = s
        .client()
        .query_one("SELECT bool_or(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'pg_idgen loader'", &[])
        .unwrap()
        .get(0);
    assert!(ended);
    eventually(30, "the loader ended", || s.log().matches(TERMINATED).count() > terminated);
    let (state, _, _, _) = copies(&s).unwrap();
    assert_eq!(state, "asking");
}
