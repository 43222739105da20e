//! A Citus cluster for end-to-end tests: a coordinator and workers, each a
//! [`Server`] of its own (Unix socket in its own directory, its own clock
//! file), with `shared_preload_libraries = 'citus,pg_idgen'`. Nodes name
//! each other by socket directory. Citus comes from `scripts/citus`; a test
//! that finds it missing fails saying so (scripts/test filters the Citus
//! tests out, and counts them as skipped, before that can happen).

use crate::postgres::{self, Client};
use crate::{pg_config, Server, PORT};

/// Why Citus cannot be used with the installation under test, if it cannot.
pub fn missing() -> Option<String> {
    let lib = pg_config("--pkglibdir").join("citus.so");
    (!lib.exists()).then(|| format!("Citus is not installed in this installation ({} is missing): run scripts/citus", lib.display()))
}

pub struct Cluster {
    pub coordinator: Server,
    pub workers: Vec<Server>,
    name: String,
    conf: Vec<String>,
}

impl Cluster {
    /// A coordinator and `workers` workers in one Citus cluster, with
    /// pg_idgen created on the coordinator (Citus creates it on the workers)
    /// in database `postgres`, plus any further `postgresql.conf` lines.
    pub fn start(name: &str, workers: usize, conf: &[&str]) -> Cluster {
        let cluster = Cluster::start_without_extension(name, workers, conf);
        cluster.coordinator.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        cluster
    }

    /// The same cluster, without pg_idgen created (only preloaded).
    pub fn start_without_extension(name: &str, workers: usize, conf: &[&str]) -> Cluster {
        if let Some(why) = missing() {
            panic!("{why}");
        }
        let conf: Vec<String> = conf.iter().map(|s| s.to_string()).collect();
        let coordinator = node(&format!("{name}-coordinator"), &conf);
        let mut cluster = Cluster { coordinator, workers: vec![], name: name.into(), conf };
        let mut c = cluster.coordinator.client();
        c.execute("SELECT citus_set_coordinator_host($1, $2)", &[&node_name(&cluster.coordinator), &(PORT as i32)])
            .unwrap();
        for _ in 0..workers {
            cluster.add_worker();
        }
        cluster
    }

    /// Starts one more worker and adds it to the cluster.
    pub fn add_worker(&mut self) -> &Server {
        let worker = self.start_node();
        self.join(worker)
    }

    /// Starts a node configured as the others are, not yet in the cluster.
    pub fn start_node(&self) -> Server {
        node(&format!("{}-worker{}", self.name, self.workers.len() + 1), &self.conf)
    }

    /// Adds a started node to the cluster as a worker.
    pub fn join(&mut self, worker: Server) -> &Server {
        self.coordinator
            .client()
            .execute("SELECT citus_add_node($1, $2)", &[&node_name(&worker), &(PORT as i32)])
            .unwrap();
        self.workers.push(worker);
        self.workers.last().unwrap()
    }

    /// The coordinator, then every worker.
    pub fn nodes(&self) -> Vec<&Server> {
        std::iter::once(&self.coordinator).chain(self.workers.iter()).collect()
    }
}

/// The name Citus knows a node by: its socket directory.
pub fn node_name(server: &Server) -> String {
    server.dir.display().to_string()
}

/// A started node with the citus extension created (pg_idgen comes from the coordinator).
fn node(name: &str, conf: &[String]) -> Server {
    let mut lines = vec![
        "shared_preload_libraries = 'citus,pg_idgen'".to_string(),
        "max_connections = 100".into(),
        // Shard moves copy with logical replication while writes go on.
        "wal_level = logical".into(),
        "max_replication_slots = 10".into(),
        "max_wal_senders = 10".into(),
    ];
    lines.extend(conf.iter().cloned());
    let lines: Vec<&str> = lines.iter().map(|s| s.as_str()).collect();
    let server = Server::init_with_clock(name, &lines);
    // How the node reaches itself (shard moves do): its socket directory, not localhost.
    server.append_conf(&format!("citus.local_hostname = '{}'", node_name(&server)));
    let mut c = server.client();
    c.batch_execute("SELECT pg_reload_conf()").unwrap();
    c.batch_execute("CREATE EXTENSION citus").unwrap();
    server
}

/// The `INSERT ... SELECT` between the tables of [`make_src_and_dst`].
pub const INSERT_SELECT: &str = "INSERT INTO dst (tenant_id, n) SELECT tenant_id, n FROM src";

/// Co-located distributed tables `src` (30,000 rows over 100 tenants) and
/// `dst`, whose key's DEFAULT is `next_shard_id(8)` (a shard the
/// coordinator mints).
pub fn make_src_and_dst(c: &mut Client) {
    c.batch_execute(
        "CREATE TABLE src (tenant_id int, n int);
         CREATE TABLE dst (tenant_id int, id bigint DEFAULT next_shard_id(8), n int);
         SELECT create_distributed_table('src', 'tenant_id');
         SELECT create_distributed_table('dst', 'tenant_id', colocate_with => 'src');
         INSERT INTO src SELECT g % 100, g FROM generate_series(1, 30000) g;",
    )
    .unwrap();
}

/// Fails unless Citus repartitions [`INSERT_SELECT`]: each worker runs its
/// shards' SELECT with the DEFAULT in it.
pub fn assert_repartitioned(c: &mut Client) {
    let plan: String =
        c.query(&format!("EXPLAIN (COSTS OFF) {INSERT_SELECT}"), &[]).unwrap().iter().map(|r| r.get::<_, String>(0) + "\n").collect();
    assert!(plan.contains("INSERT/SELECT method: repartition"), "Citus plans it otherwise now, so this test tests less:\n{plan}");
}

/// A failed statement's SQLSTATE and message.
pub fn failure(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// Per inserting client: the IDs acknowledged, the statements that failed.
pub type PerClient = Vec<(Vec<i64>, Vec<String>)>;

/// Runs `op` while each of `clients` inserts one row at a time with
/// `insert` (given the client's number and the row's, returning the ID).
/// Once `op` returned, a client stops after more than `after` further
/// attempts, with at least `total` IDs in all. Each client makes at most
/// 20,000 attempts and inserts for at most 300 s before `op` returns; one
/// that runs out of either before `op` returned fails the test (it did not
/// insert while the operation ran). Returns what `op` returned and, per
/// client, the IDs acknowledged and the statements that failed.
pub fn while_inserting<T>(
    clients: Vec<Client>,
    after: usize,
    total: usize,
    insert: impl Fn(usize, i32, &mut Client) -> Result<i64, postgres::Error> + Sync,
    op: impl FnOnce() -> T,
) -> (T, PerClient) {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    std::thread::scope(|s| {
        let inserters: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                let (stop, insert) = (&stop, &insert);
                s.spawn(move || {
                    let (mut ids, mut failed, mut since) = (vec![], vec![], 0);
                    for n in 0..20_000 {
                        if stop.load(std::sync::atomic::Ordering::Relaxed) {
                            since += 1;
                            if since > after && ids.len() >= total {
                                break;
                            }
                        } else if std::time::Instant::now() > deadline {
                            break;
                        }
                        match insert(i, n, &mut c) {
                            Ok(id) => ids.push(id),
                            Err(e) => failed.push(failure(&e)),
                        }
                    }
                    (ids, failed, since)
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let result = op();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let per_client: Vec<_> = inserters.into_iter().map(|h| h.join().unwrap()).collect();
        for (i, (ids, _, since)) in per_client.iter().enumerate() {
            assert!(*since > after, "client {i} stopped inserting ({} IDs) before the operation under test ended", ids.len());
        }
        (result, per_client.into_iter().map(|(ids, failed, _)| (ids, failed)).collect())
    })
}
