//! pg_idgen on a Citus cluster: `next_node_id()` mints each node group's
//! own shard on the node a statement enters, with no call to another node,
//! so a hash-distributed table keyed by it takes inserts through every node
//! with the coordinator stopped, and its IDs never repeat across nodes (a
//! node added, a node removed and added again as a new group, a node's clock
//! 30 s behind). Another group's shard goes straight to that group's node,
//! and a schema's shard through the worker that does not hold it straight to
//! the holder. Needs Citus (scripts/citus); scripts/test filters these tests
//! out, and counts them as skipped, where it is missing.

mod citus {
    use std::collections::HashSet;

    use pg_idgen_e2e::citus::{failure, node_name, Cluster};
    use pg_idgen_e2e::postgres::Client;
    use pg_idgen_e2e::{decode, Server, PORT};

    /// The shard node group `group` mints with next_node_id().
    fn own_shard(group: i32) -> i64 {
        8191 - group as i64
    }

    fn group_of(server: &Server) -> i32 {
        server.client().query_one("SELECT groupid FROM pg_dist_local_group", &[]).unwrap().get(0)
    }

    /// Inserts `n` rows into `events` one statement each, returning the IDs.
    fn insert_rows(c: &mut Client, n: i32, by: i32) -> Vec<i64> {
        (0..n)
            .map(|i| {
                c.query_one("INSERT INTO events (tenant_id, by_node) VALUES ($1, $2) RETURNING id", &[&(i % 40), &by])
                    .unwrap_or_else(|e| panic!("insert {i} through node {by}: {}", failure(&e)))
                    .get(0)
            })
            .collect()
    }

    /// Calls that sessions of other nodes made here: the log with
    /// log_statement = 'all' names each session's application_name.
    fn forwarded_calls(server: &Server) -> usize {
        server.log().lines().filter(|l| l.contains("pg_idgen forwarding") && l.contains("next_")).count()
    }

    fn log_statements(server: &Server) {
        server.append_conf("log_statement = 'all'\nlog_line_prefix = '%a: '");
        server.client().batch_execute("SELECT pg_reload_conf()").unwrap();
    }

    /// A hash-distributed table keyed by next_node_id(): each node's
    /// inserts carry its group's own shard and call no other node, also
    /// with the coordinator stopped; across the nodes, with a worker's clock
    /// 30 s behind, a worker added, and one removed and added again (a new
    /// group, a new shard), no ID repeats.
    #[test]
    fn next_node_id_mints_on_the_node_entered_and_never_repeats_across_nodes() {
        let mut cluster = Cluster::start("citus_nodeid", 2, &[]);
        for node in cluster.nodes() {
            log_statements(node);
        }
        // The second worker's clock is 30 s behind the others' from the start.
        cluster.workers[1].set_clock("-30s");
        let mut c = cluster.coordinator.client();
        c.batch_execute(
            "CREATE TABLE events (tenant_id int, id bigint DEFAULT next_node_id(), by_node int, PRIMARY KEY (tenant_id, id));
             SELECT create_distributed_table('events', 'tenant_id');",
        )
        .unwrap();
        let mut all: Vec<i64> = vec![];
        let groups: Vec<i32> = cluster.nodes().iter().map(|n| group_of(n)).collect();
        assert_eq!(groups[0], 0);
        // The positive control of the probe below, on every node's log: a
        // call that node must mint, made through the next node, is seen.
        let nodes = cluster.nodes();
        for (i, node) in nodes.iter().enumerate() {
            let through = nodes[(i + 1) % nodes.len()];
            let seen_before = forwarded_calls(node);
            let forwarded: i64 = through
                .client()
                .query_one("SELECT next_shard_id($1::int)", &[&(own_shard(groups[i]) as i32)])
                .unwrap_or_else(|e| panic!("next_shard_id of node {i}'s own shard through another node: {}", failure(&e)))
                .get(0);
            assert_eq!(decode(forwarded).1, own_shard(groups[i]), "minted as node {i}'s shard");
            assert!(forwarded_calls(node) > seen_before, "node {i}'s probe does not see a call from another node");
            all.push(forwarded);
        }

        let nodes_controlled = nodes.len();
        let before: Vec<usize> = cluster.nodes().iter().map(|n| forwarded_calls(n)).collect();
        for (i, node) in cluster.nodes().iter().enumerate() {
            let ids = insert_rows(&mut node.client(), 300, i as i32);
            assert!(ids.iter().all(|id| decode(*id).1 == own_shard(groups[i])), "node {i}: an ID of another shard");
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "node {i}: IDs do not rise");
            all.extend(ids);
        }
        let after: Vec<usize> = cluster.nodes().iter().map(|n| forwarded_calls(n)).collect();
        assert_eq!(before, after, "inserts keyed by next_node_id() called another node");

        // The worker 30 s behind: its IDs carry the earlier time, and its own shard.
        let coordinators = insert_rows(&mut c, 1, 0)[0];
        let behind = insert_rows(&mut cluster.workers[1].client(), 1, 2)[0];
        assert!(decode(behind).0 < decode(coordinators).0 - 20_000, "the second worker's clock is not behind");
        all.extend([coordinators, behind]);

        // A worker added: a new group, a shard of its own.
        cluster.add_worker();
        let third = cluster.workers[2].client().query_one("SELECT groupid FROM pg_dist_local_group", &[]).unwrap().get::<_, i32>(0);
        assert!(!groups.contains(&third));
        let ids = insert_rows(&mut cluster.workers[2].client(), 300, 3);
        assert!(ids.iter().all(|id| decode(*id).1 == own_shard(third)));
        all.extend(ids);
        // Removed (it holds no placement: nothing was rebalanced onto it) and added again: a new group, another shard.
        let name = node_name(&cluster.workers[2]);
        c.execute("SELECT citus_remove_node($1, $2)", &[&name, &(PORT as i32)]).unwrap();
        let gone = cluster.workers[1].client().query_one("SELECT next_shard_id($1::int)", &[&(own_shard(third) as i32)]).unwrap_err();
        let db = gone.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "55000", "{}", db.message());
        assert!(db.message().contains(&format!("own shard of Citus node group {third}, which lists no node")), "{}", db.message());
        c.execute("SELECT citus_add_node($1, $2)", &[&name, &(PORT as i32)]).unwrap();
        let again: i32 = cluster.workers[2].client().query_one("SELECT groupid FROM pg_dist_local_group", &[]).unwrap().get(0);
        assert_ne!(again, third, "re-added as the same group");
        let ids = insert_rows(&mut cluster.workers[2].client(), 300, 4);
        assert!(ids.iter().all(|id| decode(*id).1 == own_shard(again)));
        all.extend(ids);

        // The coordinator stopped: every worker goes on.
        cluster.coordinator.stop("fast");
        for (i, w) in cluster.workers.iter().enumerate() {
            let ids = insert_rows(&mut w.client(), 100, 10 + i as i32);
            assert!(ids.iter().all(|id| decode(*id).1 != own_shard(0)), "worker {i} minted the coordinator's shard");
            all.extend(ids);
        }
        cluster.coordinator.start_process();
        let n = all.len();
        let distinct: HashSet<i64> = all.iter().copied().collect();
        assert_eq!(distinct.len(), n, "duplicate IDs across nodes");
        let stored: i64 = cluster.coordinator.client().query_one("SELECT count(DISTINCT id) FROM events", &[]).unwrap().get(0);
        assert_eq!(stored as usize, n - nodes_controlled, "every acknowledged row stored once (the probe's controls minted bare IDs)");
    }

    /// On a single server, and in a database without Citus, next_node_id()
    /// has no node group to mint for: 55000.
    #[test]
    fn next_node_id_outside_a_citus_cluster_refuses() {
        let cluster = Cluster::start("citus_nodeid_db", 0, &[]);
        let mut c = cluster.coordinator.client();
        c.batch_execute("CREATE DATABASE plain").unwrap();
        let mut p = cluster.coordinator.client_db("plain");
        p.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        let e = p.query_one("SELECT next_node_id()", &[]).unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "55000");
        assert_eq!(db.message(), "next_node_id must run on a node of a Citus cluster");
        // On the coordinator of a cluster without workers: its own shard, 8191.
        let id: i64 = c.query_one("SELECT next_node_id()", &[]).unwrap().get(0);
        assert_eq!(decode(id).1, 8191);
    }

    /// On a Citus cluster no schema is registered at a node group's shard.
    #[test]
    fn a_schema_is_never_registered_at_a_node_groups_shard() {
        let cluster = Cluster::start("citus_nodeid_reg", 0, &[]);
        let mut c = cluster.coordinator.client();
        for shard in [7168, 8000, 8191] {
            let e = c.batch_execute(&format!("SELECT shard_schema_create('s{shard}', {shard})")).unwrap_err();
            let db = e.as_db_error().expect("a server error");
            assert_eq!(db.code().code(), "22023", "{}", db.message());
            assert_eq!(db.message(), format!("shard {shard} is the own shard of Citus node group {}", 8191 - shard));
        }
        c.batch_execute("SELECT shard_schema_create('s7167', 7167)").unwrap();
        let n: i64 = c.query_one("SELECT count(*) FROM pg_namespace WHERE nspname LIKE 's8%' OR nspname = 's7168'", &[]).unwrap().get(0);
        assert_eq!(n, 0, "a refused registration left its schema");
    }

    /// Creates distributed schema `tenant1`, registered as shard 101, with a
    /// table keyed by next_schema_id; returns the node holding it.
    fn make_tenant(cluster: &Cluster) -> String {
        let mut c = cluster.coordinator.client();
        c.batch_execute(
            "SET citus.enable_schema_based_sharding = on;
             SELECT shard_schema_create('tenant1', 101);
             CREATE TABLE tenant1.photos (id bigint PRIMARY KEY DEFAULT next_schema_id('tenant1'), body text);
             RESET citus.enable_schema_based_sharding;",
        )
        .unwrap();
        c.query_one("SELECT nodename FROM citus_shards WHERE table_name = 'tenant1.photos'::regclass", &[]).unwrap().get(0)
    }

    /// The coordinator stopped: through the worker that does not hold a
    /// schema, next_schema_id of it and next_shard_id of its shard go
    /// straight to the holder; the coordinator's own shards refuse with
    /// 08001 naming it.
    #[test]
    fn a_schemas_shard_through_the_other_worker_needs_no_coordinator() {
        let mut cluster = Cluster::start("citus_onehop", 2, &["pg_idgen.max_clock_lead_ms = '1h'"]);
        let holder = make_tenant(&cluster);
        let (h, other) = if node_name(&cluster.workers[0]) == holder { (0, 1) } else { (1, 0) };
        // The holder takes the shard over once, while the coordinator is up.
        let first: i64 = cluster.workers[h].client().query_one("INSERT INTO tenant1.photos (body) VALUES ('h') RETURNING id", &[]).unwrap().get(0);
        cluster.coordinator.stop("fast");
        let mut o = cluster.workers[other].client();
        let mut ids = vec![first];
        for i in 0..50 {
            let id: i64 = o
                .query_one("SELECT next_schema_id('tenant1')", &[])
                .unwrap_or_else(|e| panic!("call {i} through the other worker: {}", failure(&e)))
                .get(0);
            ids.push(id);
        }
        // next_shard_id of the schema's shard too: the worker's copy of the registry names the schema.
        for i in 0..50 {
            let id: i64 = o
                .query_one("SELECT next_shard_id(101)", &[])
                .unwrap_or_else(|e| panic!("next_shard_id(101) {i} through the other worker: {}", failure(&e)))
                .get(0);
            ids.push(id);
        }
        assert!(ids.windows(2).all(|w| w[0] < w[1]) && ids.iter().all(|id| decode(*id).1 == 101), "{ids:?}");
        let e = o.query_one("SELECT next_shard_id(7)", &[]).unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "08001", "{}", db.message());
        assert!(db.message().starts_with("next_shard_id cannot reach the Citus coordinator at "), "{}", db.message());
        cluster.coordinator.start_process();
    }

    /// A worker added after a registration has no copy of the registry
    /// until citus_registry_sync() sends it (before, its next_shard_id of
    /// the schema's shard goes through the coordinator); a copy older than
    /// the coordinator's registry never hands out an ID of another shard.
    #[test]
    fn a_workers_copy_of_the_registry_is_synced_and_checked() {
        let mut cluster = Cluster::start("citus_regcopy", 1, &["pg_idgen.max_clock_lead_ms = '1h'"]);
        assert_eq!(make_tenant(&cluster), node_name(&cluster.workers[0]), "the only worker holds tenant1");
        let mut c = cluster.coordinator.client();
        cluster.add_worker();
        let mut w2 = cluster.workers[1].client();
        let before: i64 = w2.query_one("SELECT count(*) FROM shard_schemas", &[]).unwrap().get(0);
        assert_eq!(before, 0, "a worker added later has no copy yet");
        let id: i64 = w2.query_one("SELECT next_shard_id(101)", &[]).unwrap().get(0);
        assert_eq!(decode(id).1, 101, "through the coordinator");
        let synced: i64 = c.query_one("SELECT citus_registry_sync()", &[]).unwrap().get(0);
        assert_eq!(synced, 2);
        let copy: String = w2.query_one("SELECT string_agg(schema_name || '=' || shard, ',') FROM shard_schemas", &[]).unwrap().get(0);
        assert_eq!(copy, "tenant1=101");
        // An ordinary role may neither sync nor write a copy.
        c.batch_execute("CREATE ROLE plain LOGIN").unwrap();
        let mut p = cluster.coordinator.client_as("postgres", "plain");
        assert_eq!(pg_idgen_e2e::sqlstate(p.query_one("SELECT citus_registry_sync()", &[])), "42501");
        let mut pw = cluster.workers[1].client_as("postgres", "plain");
        assert_eq!(pg_idgen_e2e::sqlstate(pw.batch_execute("SELECT citus_registry_note('{tenant1}', '{102}')")), "42501");

        // A stale copy (as a registration rolled back after its copy was
        // sent leaves): shard 102 names tenant1, which the coordinator
        // registered as 101. next_shard_id(102) through that worker gets
        // an ID of shard 102 all the same, from the coordinator.
        w2.batch_execute("SELECT citus_registry_note('{tenant1}', '{102}')").unwrap();
        for _ in 0..3 {
            let id: i64 = w2.query_one("SELECT next_shard_id(102)", &[]).unwrap().get(0);
            assert_eq!(decode(id).1, 102, "an ID of another shard handed out");
        }
        let id: i64 = w2.query_one("SELECT next_schema_id('tenant1')", &[]).unwrap().get(0);
        assert_eq!(decode(id).1, 101);
    }

    /// No schema is ever minted at a node group's shard: a role allowed to
    /// register (INSERT on the registry) cannot write one by hand, and a row
    /// there nonetheless (restored, or registered before 0.11.0) is refused
    /// through the coordinator and on the node holding the schema, while
    /// the group's own node goes on minting its shard.
    #[test]
    fn a_schema_at_a_node_groups_shard_is_refused_by_every_path() {
        let cluster = Cluster::start("citus_nodeshard_row", 2, &["pg_idgen.max_clock_lead_ms = '1h'"]);
        let mut c = cluster.coordinator.client();
        c.batch_execute(
            "CREATE ROLE registrar LOGIN;
             GRANT INSERT ON shard_schema_registry TO registrar;
             SET citus.enable_schema_based_sharding = on;
             CREATE SCHEMA sx;
             CREATE TABLE sx.t (id bigint PRIMARY KEY DEFAULT next_schema_id('sx'), body text);
             RESET citus.enable_schema_based_sharding;",
        )
        .unwrap();
        let mut r = cluster.coordinator.client_as("postgres", "registrar");
        let e = r.batch_execute("INSERT INTO shard_schema_registry (schema_name, shard) VALUES ('sx', 8190)").unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert_eq!((db.code().code(), db.message()), ("22023", "shard 8190 is the own shard of Citus node group 1"));
        // The row nonetheless, as a restore with triggers disabled leaves it.
        c.batch_execute(
            "SET session_replication_role = replica;
             INSERT INTO shard_schema_registry (schema_name, shard) VALUES ('sx', 8190);
             RESET session_replication_role;",
        )
        .unwrap();
        let holder: String = c.query_one("SELECT nodename FROM citus_shards WHERE table_name = 'sx.t'::regclass", &[]).unwrap().get(0);
        let h = cluster.workers.iter().position(|w| node_name(w) == holder).expect("a worker holds sx");
        for (what, server) in [("the coordinator", &cluster.coordinator), ("the holder", &cluster.workers[h])] {
            let e = server.client().query_one("INSERT INTO sx.t (body) VALUES ('x') RETURNING id", &[]).unwrap_err();
            let db = e.as_db_error().unwrap_or_else(|| panic!("through {what}: {e}"));
            assert_eq!(db.code().code(), "22023", "through {what}: {}", db.message());
            assert_eq!(db.message(), "shard 8190 is the own shard of Citus node group 1", "through {what}");
        }
        let group_1 = cluster.workers.iter().find(|w| group_of(w) == 1).expect("a worker of group 1");
        let id: i64 = group_1.client().query_one("SELECT next_node_id()", &[]).unwrap().get(0);
        assert_eq!(decode(id).1, 8190);
    }

    /// A worker whose Citus metadata was cleared says node group 0, the
    /// coordinator's: next_node_id() there refuses rather than mint the
    /// coordinator's shard.
    #[test]
    fn a_worker_without_metadata_does_not_mint_the_coordinators_shard() {
        let cluster = Cluster::start("citus_nodeid_nometa", 1, &[]);
        let w = &cluster.workers[0];
        cluster
            .coordinator
            .client()
            .execute("SELECT stop_metadata_sync_to_node($1, $2, clear_metadata => true)", &[&node_name(w), &(PORT as i32)])
            .unwrap();
        let group: i32 = w.client().query_one("SELECT groupid FROM pg_dist_local_group", &[]).unwrap().get(0);
        assert_eq!(group, 0, "the cleared worker no longer says group 0: this test tests less");
        let e = w.client().query_one("SELECT next_node_id()", &[]).unwrap_err();
        let db = e.as_db_error().expect("a server error");
        assert_eq!((db.code().code(), db.message()), ("55000", "next_node_id must run on a node of a Citus cluster"));
        let id: i64 = cluster.coordinator.client().query_one("SELECT next_node_id()", &[]).unwrap().get(0);
        assert_eq!(decode(id).1, 8191);
    }
}
