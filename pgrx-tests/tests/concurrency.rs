//! Several real backends minting at once: no duplicate, strictly increasing
//! per shard (within a backend, and across backends in real time), honest times.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use pg_idgen_e2e::{decode, Server};

const LEAD_MS: i64 = 10_000;

/// One batch from one backend: the server clock (Unix ms, rounded down as IDs
/// round it) before and after, and the IDs in the order the backend minted them.
fn batch(c: &mut postgres::Client, sql_id: &str, n: i32) -> (i64, Vec<i64>, i64) {
    let row = c
        .query_one(
            &format!(
                "WITH t0 AS MATERIALIZED (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms),
                      ids AS MATERIALIZED (SELECT n, {sql_id} AS id FROM generate_series(1, $1) n, t0)
                 SELECT (SELECT ms FROM t0), array_agg(id ORDER BY n),
                        floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint FROM ids"
            ),
            &[&n],
        )
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

fn epoch_unix_ms(c: &mut postgres::Client) -> i64 {
    c.query_one("SELECT (extract(epoch FROM id_epoch()) * 1000)::bigint", &[]).unwrap().get(0)
}

#[test]
fn backends_minting_one_shard_never_collide_and_always_increase() {
    let server = Server::start("one_shard", &[]);
    let epoch = epoch_unix_ms(&mut server.client());
    let (backends, batches, per_batch) = (4, 10, 10_000);
    let deadline = Instant::now() + Duration::from_secs(120);
    let handles: Vec<_> = (0..backends)
        .map(|_| {
            let mut c = server.client();
            std::thread::spawn(move || {
                let mut seen: Vec<i64> = Vec::new();
                // (sent, answered, smallest ID, largest ID) of each batch.
                let mut spans: Vec<(Instant, Instant, i64, i64)> = Vec::new();
                for _ in 0..batches {
                    assert!(Instant::now() < deadline, "took too long");
                    let sent = Instant::now();
                    let (before, ids, after) = batch(&mut c, "next_shard_id(42)", per_batch);
                    spans.push((sent, Instant::now(), ids[0], *ids.last().unwrap()));
                    for &id in &ids {
                        let (ms, shard, _) = decode(id);
                        assert_eq!(shard, 42);
                        let unix_ms = ms + epoch;
                        assert!(unix_ms >= before, "ID time {unix_ms} before the clock {before}");
                        assert!(unix_ms <= after + LEAD_MS, "ID time {unix_ms} beyond the lead bound");
                    }
                    seen.extend(ids);
                }
                (seen, spans)
            })
        })
        .collect();
    let mut all = HashSet::new();
    let mut total = 0;
    let mut spans = Vec::new();
    for h in handles {
        let (seen, s) = h.join().unwrap();
        spans.extend(s);
        if let Some(w) = seen.windows(2).find(|w| w[0] >= w[1]) {
            panic!("not strictly increasing within one backend: {} then {}", w[0], w[1]);
        }
        total += seen.len();
        all.extend(seen);
    }
    assert_eq!(total, backends * batches * per_batch as usize);
    assert_eq!(all.len(), total, "{} duplicates", total - all.len());
    // Across backends, in real time: a batch answered before another was
    // sent (by any backend) has only smaller IDs.
    for a in &spans {
        for b in spans.iter().filter(|b| a.1 < b.0) {
            assert!(a.3 < b.2, "a batch answered before another was sent has a larger ID: {} then {}", a.3, b.2);
        }
    }
}

#[test]
fn backends_minting_many_shards_never_collide() {
    let server = Server::start("many_shards", &[]);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let mut c = server.client();
            std::thread::spawn(move || {
                (0..5).flat_map(|_| batch(&mut c, "next_shard_id((random() * 15)::int)", 20_000).1).collect::<Vec<_>>()
            })
        })
        .collect();
    let ids: Vec<i64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let distinct: HashSet<_> = ids.iter().copied().collect();
    assert_eq!(ids.len(), 400_000);
    assert_eq!(distinct.len(), ids.len(), "{} duplicates", ids.len() - distinct.len());
    let shards: HashSet<_> = ids.iter().map(|&id| decode(id).1).collect();
    assert_eq!(shards, (0..=15).collect());
}
