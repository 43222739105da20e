//! uuid_v7() across real concurrent backends, and the B-tree it builds.

use std::collections::{HashMap, HashSet};

use pg_idgen_e2e::Server;

/// A UUID's generator tick (48-bit ms and 12-bit rand_a) and its 62 random bits.
fn split(u: &uuid::Uuid) -> (u64, u64) {
    let b = u.as_bytes();
    let hi = u64::from_be_bytes(b[..8].try_into().unwrap());
    let lo = u64::from_be_bytes(b[8..].try_into().unwrap());
    ((hi >> 16) << 12 | (hi & 0xfff), lo & ((1 << 62) - 1))
}

#[test]
fn backends_share_one_order_and_never_share_random_bits() {
    let server = Server::start("uuid_concurrent", &[]);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let mut c = server.client();
            std::thread::spawn(move || {
                let mut seen: Vec<uuid::Uuid> = Vec::new();
                // (sent, answered, first, last) of each batch.
                let mut spans = Vec::new();
                for _ in 0..5 {
                    let sent = std::time::Instant::now();
                    let row = c
                        .query_one(
                            "SELECT array_agg(u ORDER BY n) FROM (SELECT n, uuid_v7() AS u FROM generate_series(1, 20000) n) s",
                            &[],
                        )
                        .unwrap();
                    let batch = row.get::<_, Vec<uuid::Uuid>>(0);
                    spans.push((sent, std::time::Instant::now(), batch[0], batch[batch.len() - 1]));
                    seen.extend(batch);
                }
                (seen, spans)
            })
        })
        .collect();
    let (per_backend, spans): (Vec<Vec<uuid::Uuid>>, Vec<_>) = handles.into_iter().map(|h| h.join().unwrap()).unzip();
    // One order across backends, in real time: a batch answered before
    // another was sent (by any backend) has only smaller UUIDs.
    let spans: Vec<_> = spans.into_iter().flatten().collect();
    for a in &spans {
        for b in spans.iter().filter(|b| a.1 < b.0) {
            assert!(a.3 < b.2, "a batch answered before another was sent has a larger UUID: {} then {}", a.3, b.2);
        }
    }
    let mut ticks = HashSet::new();
    let mut random_owner: HashMap<u64, usize> = HashMap::new();
    for (backend, seen) in per_backend.iter().enumerate() {
        assert_eq!(seen.len(), 100_000);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "not increasing within backend {backend}");
        for u in seen {
            assert_eq!(u.get_version_num(), 7);
            assert_eq!(u.get_variant(), uuid::Variant::RFC4122);
            let (tick, random) = split(u);
            // One shared generator: no two values of the server share a (ms, rand_a) tick.
            assert!(ticks.insert(tick), "tick {tick:#x} handed out twice");
            if let Some(other) = random_owner.insert(random, backend) {
                panic!("backends {other} and {backend} produced the same 62 random bits");
            }
        }
    }
    assert_eq!(ticks.len(), 400_000);
}

/// Fills `table(id)` through its DEFAULT from 4 concurrent backends, then
/// returns the primary key's avg_leaf_density.
fn fill_and_measure(server: &Server, table: &str, key: &str) -> f64 {
    server
        .client()
        .batch_execute(&format!("CREATE TABLE {table} (id {key} PRIMARY KEY, n int)"))
        .unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let mut c = server.client();
            let insert = format!("INSERT INTO {table} (n) SELECT generate_series(1, 2500)");
            std::thread::spawn(move || (0..20).for_each(|_| c.batch_execute(&insert).unwrap()))
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let mut c = server.client();
    let rows: i64 = c.query_one(&format!("SELECT count(DISTINCT id) FROM {table}"), &[]).unwrap().get(0);
    assert_eq!(rows, 200_000);
    c.query_one(&format!("SELECT avg_leaf_density FROM pgstatindex('{table}_pkey')"), &[]).unwrap().get(0)
}

#[test]
fn a_uuid_v7_primary_key_is_as_dense_as_a_sequential_one() {
    let server = Server::start("uuid_density", &[]);
    server.client().batch_execute("CREATE EXTENSION pgstattuple").unwrap();
    let sequential = fill_and_measure(&server, "t_identity", "bigint GENERATED ALWAYS AS IDENTITY");
    let v7 = fill_and_measure(&server, "t_uuid_v7", "uuid DEFAULT uuid_v7()");
    let random = fill_and_measure(&server, "t_uuid_v4", "uuid DEFAULT gen_random_uuid()");
    println!("avg_leaf_density: identity {sequential:.2}, uuid_v7() {v7:.2}, gen_random_uuid() {random:.2}");
    assert!(v7 >= sequential - 5.0, "uuid_v7 {v7} vs identity {sequential}");
    assert!(random < v7 - 10.0, "gen_random_uuid {random} vs uuid_v7 {v7}");
}
