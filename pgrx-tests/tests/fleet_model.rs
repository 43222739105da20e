//! A randomized, model-based test of fleet ownership: three servers (each
//! with its fleet database and a second database), a seeded random sequence
//! of claims, releases, adoptions, mints in either database, restarts,
//! crashes, prepared releases and clock steps under libfaketime. After every
//! step: all IDs minted so far are distinct, each was minted by the server
//! the model says owned its shard at the time, and each is above every ID
//! minted before for its shard, whichever server minted it.

use std::collections::{HashMap, HashSet};

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::{decode, sqlstate, Server};

const SHARDS: i32 = 8;
const STEPS: usize = 300;
const SEEDS: [u64; 2] = [0x5eed_0001, 0x5eed_0002];

/// xorshift64*: small, seeded, reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Fleet {
    servers: Vec<Server>,
    /// The server that owns each shard, or None while it is released.
    owner: HashMap<i32, Option<usize>>,
    /// Released shards: the ID returned by `shard_release`.
    released: HashMap<i32, i64>,
    /// The largest ID minted so far for each shard, on any server.
    last: HashMap<i32, i64>,
    seen: HashSet<i64>,
    minted: usize,
}

impl Fleet {
    fn client(&self, server: usize, db: &str) -> Client {
        self.servers[server].client_db(db)
    }

    fn mint(&mut self, seed: u64, step: usize, server: usize, db: &str, shard: i32) {
        let mut c = self.client(server, db);
        let r = c.query_one("SELECT array_agg(next_shard_id($1) ORDER BY g) FROM generate_series(1, 200) g", &[&shard]);
        let owns = self.owner[&shard] == Some(server);
        match r {
            Ok(row) => {
                assert!(owns, "seed {seed:#x} step {step}: server {server} ({db}) minted shard {shard}, owned by {:?}", self.owner[&shard]);
                let ids: Vec<i64> = row.get(0);
                for id in ids {
                    assert_eq!(decode(id).1 as i32, shard);
                    let last = self.last.get(&shard).copied().unwrap_or(-1);
                    assert!(id > last, "seed {seed:#x} step {step}: shard {shard} minted {id}, not above {last}");
                    assert!(self.seen.insert(id), "seed {seed:#x} step {step}: duplicate {id}");
                    self.last.insert(shard, id);
                    self.minted += 1;
                }
            }
            Err(e) => {
                assert!(!owns, "seed {seed:#x} step {step}: server {server} ({db}) owns shard {shard} but: {e:?}");
                assert_eq!(sqlstate(Err::<(), _>(e)), "55000");
            }
        }
    }
}

/// What one run did, by kind of step: [releases, adoptions, refused prepared
/// releases, clock steps, restarts, crashes].
type Done = [usize; 6];

fn run(seed: u64) -> (usize, usize, Done) {
    let mut done: Done = [0; 6];
    let servers: Vec<Server> = (0..3)
        .map(|i| Server::start_with_clock(&format!("model{i}-{seed:x}"), &["max_prepared_transactions = 4"]))
        .collect();
    let mut fleet = Fleet { servers, owner: HashMap::new(), released: HashMap::new(), last: HashMap::new(), seen: HashSet::new(), minted: 0 };
    for (i, s) in fleet.servers.iter().enumerate() {
        s.client().batch_execute("CREATE DATABASE other").unwrap();
        s.client_db("other").batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        // Servers 0, 1 and 2 start with shards 0-2, 3-5 and 6-7.
        let (first, last) = [(0, 2), (3, 5), (6, 7)][i];
        s.client().execute("SELECT shard_claim($1, $2)", &[&first, &last]).unwrap();
        for shard in first..=last {
            fleet.owner.insert(shard, Some(i));
        }
    }
    let mut rng = Rng(seed);
    for step in 0..STEPS {
        let server = rng.below(3) as usize;
        let shard = rng.below(SHARDS as u64) as i32;
        match rng.below(100) {
            0..=54 => {
                let db = if rng.below(2) == 0 { "postgres" } else { "other" };
                fleet.mint(seed, step, server, db, shard);
            }
            55..=66 => {
                let r = fleet.client(server, "postgres").query_one("SELECT shard_release($1)", &[&shard]);
                if fleet.owner[&shard] == Some(server) {
                    let high: i64 = r.unwrap_or_else(|e| panic!("seed {seed:#x} step {step}: release: {e:?}")).get(0);
                    assert!(high > fleet.last.get(&shard).copied().unwrap_or(-1));
                    fleet.owner.insert(shard, None);
                    fleet.released.insert(shard, high);
                    done[0] += 1;
                } else {
                    assert_eq!(sqlstate(r), "55000", "seed {seed:#x} step {step}: release of a shard not owned");
                }
            }
            67..=78 => {
                if let Some(&high) = fleet.released.get(&shard) {
                    fleet
                        .client(server, "postgres")
                        .execute("SELECT shard_adopt($1, $2)", &[&shard, &high])
                        .unwrap_or_else(|e| panic!("seed {seed:#x} step {step}: adopt: {e:?}"));
                    fleet.released.remove(&shard);
                    fleet.owner.insert(shard, Some(server));
                    done[1] += 1;
                }
            }
            79..=84 => {
                // A release in a prepared transaction is refused and leaves nothing.
                let mut c = fleet.client(server, "postgres");
                c.batch_execute("BEGIN").unwrap();
                let _ = c.query_one("SELECT shard_release($1)", &[&shard]);
                let r = c.batch_execute("PREPARE TRANSACTION 'model'");
                let _ = c.batch_execute("ROLLBACK");
                if fleet.owner[&shard] == Some(server) {
                    assert_eq!(sqlstate(r), "0A000", "seed {seed:#x} step {step}: prepared release");
                    done[2] += 1;
                }
            }
            85..=89 => {
                let offset = format!("-{}s", rng.below(4));
                fleet.servers[server].set_clock(&offset);
                done[3] += 1;
            }
            90..=94 => {
                fleet.servers[server].restart();
                done[4] += 1;
            }
            _ => {
                fleet.servers[server].stop("immediate");
                fleet.servers[server].start_process();
                done[5] += 1;
            }
        }
    }
    (STEPS, fleet.minted, done)
}

#[test]
fn random_sequences_over_three_servers_never_mint_twice() {
    let mut total = (0, 0);
    let mut done: Done = [0; 6];
    for seed in SEEDS {
        let (steps, ids, d) = run(seed);
        println!("seed {seed:#x}: {steps} steps, {ids} IDs, all distinct and owned; {d:?}");
        total = (total.0 + steps, total.1 + ids);
        for (t, n) in done.iter_mut().zip(d) {
            *t += n;
        }
    }
    println!("fleet model: {} steps, {} IDs over {} seeds", total.0, total.1, SEEDS.len());
    // The model exercised what it is for: IDs, and every kind of event.
    assert!(total.1 > 0, "no ID was minted");
    let kinds = ["releases", "adoptions", "refused prepared releases", "clock steps", "restarts", "crashes"];
    for (kind, n) in kinds.iter().zip(done) {
        assert!(n > 0, "the runs made no {kind}: {done:?}");
    }
}
