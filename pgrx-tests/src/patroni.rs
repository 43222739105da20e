//! Patroni clusters for end-to-end tests: one etcd and PostgreSQL nodes
//! managed by Patroni (Debian's `patroni` and `etcd-server`, installed by
//! scripts/setup), all on loopback TCP ports of their own, each node with
//! its own data directory and its own clock file (libfaketime, set through
//! a wrapper program directory as an operator would set `bin_dir`).
//! Processes run as `postgres` and are stopped when the handle is dropped,
//! even when a test fails. pg_idgen comes in through Patroni's bootstrap:
//! the preload and settings as DCS parameters, the extension created by a
//! `post_bootstrap` script.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use crate::{bindir, eventually, write_clock, FAKETIME_CACHE, FAKETIME_LIB};
pub use crate::etcd::Etcd;

/// Why Patroni clusters cannot run here, if they cannot.
pub fn missing() -> Option<String> {
    ["patroni", "patronictl", "etcd"]
        .iter()
        .find(|p| !Path::new("/usr/bin").join(p).exists())
        .map(|p| {
            format!(
                "/usr/bin/{p} is missing: scripts/setup installs Debian's patroni and etcd-server"
            )
        })
}

/// A TCP port on loopback that was free when asked and that this process
/// has not handed out before: the listener is closed before etcd or Patroni
/// binds the port, so without the record two tests running at once (or two
/// calls in a row) could be given the same one.
pub(crate) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    for _ in 0..1000 {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
    panic!("no free loopback port not handed out before, in 1,000 tries");
}

pub(crate) fn owned_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .unwrap();
}

/// A process started as `postgres`, with its output in `log`; `setpriv`
/// execs the program itself, so the child is the process to signal.
pub(crate) fn spawn_as_postgres(program: &str, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Child {
    let out = std::fs::File::create(log).unwrap();
    Command::new("setpriv")
        .args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
            program,
        ])
        .args(args)
        .envs(env.iter().copied())
        .env("HOME", log.parent().unwrap())
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn signal(pid: u32, sig: &str) {
    signal_all(&[pid.to_string()], sig);
}

fn signal_all(pids: &[String], sig: &str) {
    let _ = Command::new("kill").arg(sig).args(pids).status();
}


/// How a cluster is configured.
pub struct Config {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Synchronous mode, with every replica in the sync set.
    pub synchronous: bool,
    /// SQL the `post_bootstrap` script runs after `CREATE EXTENSION pg_idgen`.
    pub post_bootstrap_sql: String,
    /// More PostgreSQL parameters for every node, through the DCS (`name: value` lines).
    pub parameters: Vec<String>,
    /// PostgreSQL parameters in each node's own configuration, `{member}`
    /// standing for its member name (`name: value` lines).
    pub node_parameters: Vec<String>,
}

pub struct Node {
    pub name: String,
    pub dir: PathBuf,
    pub pg_port: u16,
    config: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Shifts this node's PostgreSQL clock (libfaketime syntax, such as
    /// `-30s`); every process of the node reads it by the time this returns.
    pub fn set_clock(&self, offset: &str) {
        write_clock(&self.dir.join("faketime"), offset);
    }

    /// The postmaster's process id, if it runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    pub fn conninfo(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=3",
            self.pg_port
        )
    }

    pub fn client(&self) -> Client {
        crate::connect(&self.conninfo(), || self.log())
    }

    pub fn log(&self) -> String {
        let patroni = std::fs::read_to_string(self.dir.join("patroni.log")).unwrap_or_default();
        let tail: Vec<&str> = patroni.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// How many lines of this node's Patroni log mention `text`.
    pub fn log_mentions(&self, text: &str) -> usize {
        std::fs::read_to_string(self.dir.join("patroni.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(text))
            .count()
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Patroni stops its PostgreSQL on SIGTERM; what outlives it is stopped by pg_ctl.
            signal(child.id(), "-TERM");
            let deadline = Instant::now() + Duration::from_secs(20);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.postmaster_pid().is_some() {
            let _ = crate::as_owner(&crate::bin("pg_ctl"))
                .args([
                    "-D",
                    &self.data().to_string_lossy(),
                    "stop",
                    "-m",
                    "immediate",
                    "-w",
                    "-t",
                    "30",
                ])
                .output();
        }
    }
}

/// A Patroni cluster (one scope in the shared etcd).
pub struct Cluster {
    pub scope: String,
    pub nodes: Vec<Node>,
    synchronous: bool,
    dir: PathBuf,
}

impl Cluster {
    /// Starts the nodes one after the other (the first bootstraps) and
    /// waits until every one runs, the replicas streaming.
    pub fn start(etcd: &Etcd, dir: &Path, scope: &str, config: &Config) -> Cluster {
        let dir = dir.join(scope);
        owned_dir(&dir);
        let post_bootstrap = dir.join("post_bootstrap.sh");
        std::fs::write(
            &post_bootstrap,
            format!(
                "#!/bin/sh\n# Patroni passes the new cluster's connection URL.\nexec {} -X -v ON_ERROR_STOP=1 \"$1\" -c 'CREATE EXTENSION pg_idgen' -c \"$(cat {})\"\n",
                crate::bin("psql"),
                dir.join("post_bootstrap.sql").display()
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("post_bootstrap.sql"),
            if config.post_bootstrap_sql.is_empty() {
                "SELECT 1"
            } else {
                &config.post_bootstrap_sql
            },
        )
        .unwrap();
        Command::new("chmod")
            .arg("0755")
            .arg(&post_bootstrap)
            .status()
            .unwrap();

        let sync = if config.synchronous {
            format!(
                "    synchronous_mode: true\n    synchronous_node_count: {}\n",
                config.nodes - 1
            )
        } else {
            "    synchronous_mode: false\n".to_string()
        };
        let mut nodes = Vec::new();
        for i in 1..=config.nodes {
            let name = format!("{scope}-n{i}");
            let node_dir = dir.join(format!("n{i}"));
            owned_dir(&node_dir);
            let bin = wrapper_bindir(&node_dir);
            let (rest_port, pg_port) = (free_port(), free_port());
            let yaml = format!(
                "scope: {scope}
name: {name}
namespace: /pg_idgen_test/
restapi:
  listen: 127.0.0.1:{rest_port}
  connect_address: 127.0.0.1:{rest_port}
etcd3:
  hosts: 127.0.0.1:{etcd}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    primary_start_timeout: 0
{sync}    postgresql:
      use_pg_rewind: true
      parameters:
        shared_preload_libraries: pg_idgen
        max_connections: 50
        wal_log_hints: 'on'
        fsync: 'off'
{extra}  initdb:
    - encoding: UTF8
    - locale: C
  post_bootstrap: {post}
postgresql:
  listen: 127.0.0.1:{pg_port}
  connect_address: 127.0.0.1:{pg_port}
  data_dir: {data}
  bin_dir: {bin}
  pgpass: {dir}/pgpass
  authentication:
    superuser:
      username: postgres
      password: postgres
    replication:
      username: replicator
      password: replicator
    rewind:
      username: postgres
      password: postgres
  parameters:
    unix_socket_directories: '{dir}'
{own}  pg_hba:
    - local all all trust
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
",
                etcd = etcd.port,
                extra = config.parameters.iter().map(|p| format!("        {p}\n")).collect::<String>(),
                own = config.node_parameters.iter().map(|p| format!("    {}\n", p.replace("{member}", &name))).collect::<String>(),
                post = post_bootstrap.display(),
                data = node_dir.join("data").display(),
                bin = bin.display(),
                dir = node_dir.display(),
            );
            let config_path = node_dir.join("patroni.yml");
            std::fs::write(&config_path, yaml).unwrap();
            owned_dir(&node_dir);
            nodes.push(Node {
                name,
                dir: node_dir,
                pg_port,
                config: config_path,
                child: None,
            });
        }
        let mut cluster = Cluster {
            scope: scope.into(),
            nodes,
            synchronous: config.synchronous,
            dir,
        };
        for i in 0..cluster.nodes.len() {
            cluster.start_node(i);
            if i == 0 {
                eventually(90, "the first node bootstraps and leads", || {
                    cluster.leader().is_some()
                });
            }
        }
        cluster.wait_healthy();
        cluster
    }

    fn start_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        let config = node.config.to_string_lossy().into_owned();
        node.child = Some(spawn_as_postgres(
            "/usr/bin/patroni",
            &[&config],
            &node.dir.join("patroni.log"),
            &[],
        ));
    }

    /// `patronictl` on this cluster, failing the test if it fails.
    pub fn patronictl(&self, args: &[&str]) -> String {
        let out = Command::new("patronictl")
            .arg("-c")
            .arg(&self.nodes[0].config)
            .args(args)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "patronictl {args:?} failed:\n{text}\n{}",
            self.logs()
        );
        text
    }

    /// The members as `patronictl list` shows them: (name, role, state).
    pub fn members(&self) -> Vec<(String, String, String)> {
        let out = Command::new("patronictl")
            .arg("-c")
            .arg(&self.nodes[0].config)
            .args(["list", "-f", "tsv"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                (f.len() > 4).then(|| (f[1].to_string(), f[3].to_string(), f[4].to_string()))
            })
            .collect()
    }

    /// The index of the node that leads, running, if one does.
    pub fn leader(&self) -> Option<usize> {
        let members = self.members();
        let leader = members
            .iter()
            .find(|(_, role, state)| role == "Leader" && state == "running")?;
        self.nodes.iter().position(|n| n.name == leader.0)
    }

    /// Waits (at most 2 minutes) until one node leads and every other one
    /// runs and streams from it (in synchronous mode, as a sync standby).
    pub fn wait_healthy(&self) -> usize {
        eventually(120, &format!("cluster {} healthy", self.scope), || {
            let members = self.members();
            let Some(leader) = self.leader() else {
                return false;
            };
            let wanted = if self.synchronous { "sync" } else { "async" };
            members.len() == self.nodes.len()
                && members.iter().all(|(_, _, state)| state == "running")
                && Client::connect(&self.nodes[leader].conninfo(), NoTls)
                    .and_then(|mut c| {
                        c.query_one("SELECT count(*) FROM pg_catalog.pg_stat_replication WHERE state = 'streaming' AND sync_state = $1", &[&wanted])
                    })
                    .is_ok_and(|r| r.get::<_, i64>(0) == self.nodes.len() as i64 - 1)
        });
        self.leader().unwrap()
    }

    /// A connection string naming every node, for a client that follows the primary.
    pub fn conninfo(&self) -> String {
        let hosts = vec!["127.0.0.1"; self.nodes.len()].join(",");
        let ports: Vec<String> = self.nodes.iter().map(|n| n.pg_port.to_string()).collect();
        format!("host={hosts} port={} user=postgres dbname=postgres connect_timeout=2 target_session_attrs=read-write", ports.join(","))
    }

    /// Kills a node's PostgreSQL as a crash of its host would: the postmaster
    /// and every child stopped at once (none sends anything more), then
    /// killed with SIGKILL. Patroni itself keeps running.
    pub fn crash_postgres(&self, i: usize) {
        let pid = self.nodes[i]
            .postmaster_pid()
            .expect("the node's postmaster runs")
            .to_string();
        signal_all(&[pid.clone()], "-STOP");
        // Listed once stopped (none can start another); killed together, so
        // that none is left stopped with its connections open.
        let out = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
        let mut pids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(String::from)
            .collect();
        pids.push(pid);
        signal_all(&pids, "-KILL");
    }

    /// The last lines of every node's Patroni log, for failure messages.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {}\n{}\n", n.name, n.log()))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        if std::env::var_os("PG_IDGEN_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A program directory for Patroni's `bin_dir`: links to the installation
/// under test, except `postgres`, which runs under libfaketime with the
/// node's clock file (`+0` until a test moves it).
fn wrapper_bindir(node_dir: &Path) -> PathBuf {
    let bin = node_dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let clock = node_dir.join("faketime");
    std::fs::write(&clock, "+0\n").unwrap();
    for entry in std::fs::read_dir(bindir()).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n != "postgres") {
            std::os::unix::fs::symlink(&path, bin.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::write(
        bin.join("postgres"),
        format!(
            "#!/bin/sh\nLD_PRELOAD={FAKETIME_LIB} FAKETIME_TIMESTAMP_FILE={} {FAKETIME_CACHE} FAKETIME_DONT_FAKE_MONOTONIC=1 exec {} \"$@\"\n",
            clock.display(),
            bindir().join("postgres").display()
        ),
    )
    .unwrap();
    Command::new("chmod")
        .arg("0755")
        .arg(bin.join("postgres"))
        .status()
        .unwrap();
    bin
}

/// The directory for a test's etcd and clusters, removed by the handles.
pub fn test_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "pg_idgen_e2e/patroni-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    owned_dir(&dir);
    Command::new("chmod")
        .arg("0755")
        .arg(dir.parent().unwrap())
        .status()
        .unwrap();
    dir
}

/// A row a client was told was stored: the statement's start and
/// acknowledgement, and the ID and UUID it returned.
#[derive(Debug, Clone, Copy)]
pub struct Ack {
    pub start: Instant,
    pub end: Instant,
    pub id: i64,
    pub uuid: uuid::Uuid,
}

/// A statement or connection attempt that failed: when, its SQLSTATE
/// (`connect` when no server answered), and its message.
#[derive(Debug, Clone)]
pub struct Failure {
    pub at: Instant,
    pub code: String,
    pub message: String,
}

/// Clients inserting one row at a time through a connection string that
/// names every node (`target_session_attrs=read-write`), reconnecting after
/// each lost connection, logging every acknowledged row and every failure.
pub struct Workload {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    pub acks: std::sync::Arc<std::sync::Mutex<Vec<Ack>>>,
    pub failures: std::sync::Arc<std::sync::Mutex<Vec<Failure>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workload {
    /// `clients` clients running `insert` (one parameter: the client's
    /// number; returns the ID and the UUID), for at most 10 minutes.
    pub fn start(conninfo: &str, clients: i32, insert: &str) -> Workload {
        use std::sync::{atomic::AtomicBool, atomic::Ordering, Arc, Mutex};
        let stop = Arc::new(AtomicBool::new(false));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let threads = (0..clients)
            .map(|n| {
                let (stop, acks, failures) = (stop.clone(), acks.clone(), failures.clone());
                let (conninfo, insert) = (conninfo.to_string(), insert.to_string());
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(600);
                    let fail = |code: String, message: String| {
                        failures.lock().unwrap().push(Failure {
                            at: Instant::now(),
                            code,
                            message,
                        });
                    };
                    let mut session: Option<(Client, postgres::Statement)> = None;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        let (client, statement) = match session.as_mut() {
                            Some(s) => (&mut s.0, &s.1),
                            None => {
                                match Client::connect(&conninfo, NoTls)
                                    .and_then(|mut c| c.prepare(&insert).map(|s| (c, s)))
                                {
                                    Ok(s) => session = Some(s),
                                    Err(e) => {
                                        fail(
                                            e.code()
                                                .map_or("connect".into(), |c| c.code().to_string()),
                                            e.to_string(),
                                        );
                                        std::thread::sleep(Duration::from_millis(50));
                                    }
                                }
                                continue;
                            }
                        };
                        let start = Instant::now();
                        match client.query_one(statement, &[&n]) {
                            Ok(row) => acks.lock().unwrap().push(Ack {
                                start,
                                end: Instant::now(),
                                id: row.get(0),
                                uuid: row.get(1),
                            }),
                            Err(e) => {
                                let code = e
                                    .code()
                                    .map_or("connection".into(), |c| c.code().to_string());
                                let message = e
                                    .as_db_error()
                                    .map_or(e.to_string(), |d| d.message().to_string());
                                // A node that is no longer the primary refuses writes: find the new one.
                                if client.is_closed() || code == "25006" || code == "connection" {
                                    session = None;
                                }
                                fail(code, message);
                                std::thread::sleep(Duration::from_millis(50));
                            }
                        }
                    }
                })
            })
            .collect();
        Workload {
            stop,
            acks,
            failures,
            threads,
        }
    }

    /// Waits (at most `secs`) until a row is acknowledged whose statement started after `after`.
    pub fn wait_for_ack_after(&self, after: Instant, secs: u64) {
        eventually(secs, "a row acknowledged after the event", || {
            self.acks.lock().unwrap().iter().any(|a| a.start > after)
        });
    }

    /// Stops the clients; returns what they logged, the acknowledgements in order of their end.
    pub fn stop(mut self) -> (Vec<Ack>, Vec<Failure>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in std::mem::take(&mut self.threads) {
            t.join().unwrap();
        }
        let mut acks = std::mem::take(&mut *self.acks.lock().unwrap());
        acks.sort_by_key(|a| a.end);
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        (acks, failures)
    }
}

impl Drop for Workload {
    /// A test that fails midway stops its clients too.
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Acknowledgements that break real-time order: a statement that started
/// after another was acknowledged got a smaller (or equal) ID or UUID.
/// Returns (statement, the largest value acknowledged before it began) pairs.
pub fn out_of_order<T: Ord + Copy>(acks: &[Ack], value: impl Fn(&Ack) -> T) -> Vec<(T, T)> {
    let mut by_end: Vec<&Ack> = acks.iter().collect();
    by_end.sort_by_key(|a| a.end);
    let mut by_start: Vec<&Ack> = acks.iter().collect();
    by_start.sort_by_key(|a| a.start);
    let (mut ended, mut largest, mut bad) = (0, None::<T>, Vec::new());
    for b in by_start {
        while ended < by_end.len() && by_end[ended].end < b.start {
            let v = value(by_end[ended]);
            largest = Some(largest.map_or(v, |l: T| l.max(v)));
            ended += 1;
        }
        if let Some(l) = largest.filter(|l| value(b) <= *l) {
            bad.push((value(b), l));
        }
    }
    bad
}

/// The longest time between two acknowledgements (or the window's edges)
/// from `from` to `to`: how long no write succeeded.
pub fn outage(acks: &[Ack], from: Instant, to: Instant) -> Duration {
    let mut last = acks
        .iter()
        .rev()
        .map(|a| a.end)
        .find(|e| *e <= from)
        .unwrap_or(from);
    let mut longest = Duration::ZERO;
    for end in acks.iter().map(|a| a.end).filter(|e| *e > from && *e <= to) {
        longest = longest.max(end - last);
        last = end;
    }
    longest.max(to.saturating_duration_since(last))
}

/// Acknowledgements per second from `from` to `to`.
pub fn rate(acks: &[Ack], from: Instant, to: Instant) -> f64 {
    acks.iter().filter(|a| a.end > from && a.end <= to).count() as f64 / (to - from).as_secs_f64()
}
