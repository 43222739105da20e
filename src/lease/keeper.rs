//! The lease keeper: one background worker, started once recovery is over
//! (at server start, after a crash restart, at a promotion), that holds
//! this server's lease in the store and publishes what minting reads.
//!
//! Each round (three per TTL, every 0.5 s while the store fails):
//! 1. renew the lease (or be granted one; after a crash restart of this
//!    same postmaster, take back the lease its keys are attached to);
//! 2. ask for the shards it lacks (`core::lease::to_ask`), each with a
//!    create-if-absent transaction that also reads the shard's mark, and
//!    raise the shard's generator above that mark. With a leader key
//!    (`pg_idgen.lease_leader_key`, Patroni's): while it names this server,
//!    shards an earlier primary of the same data holds are taken, above
//!    its mark, once it has missed a renewal and if the election is newer
//!    than its claim (`core::lease::may_take_over`, `missed_renewal`);
//!    while the key names another server, its shards are given back;
//! 3. file each held shard's new mark, in transactions that succeed only
//!    while its key is still attached to this lease;
//! 4. publish, per shard, the mark, then the validity of step 1.
//!
//! A failure anywhere publishes nothing new: what was published runs out by
//! itself. On SIGTERM it stops minting of its shards (retiring their
//! generators, so no mint under way can finish), files their exact marks
//! and gives the lease back, so that a restart, or another server, takes
//! them at once.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;

use super::etcd::{Kv, Store};
use crate::clock;
use crate::core::generator::{self, RETIRED};
use crate::core::layout::{ID_TICKS, MAX_SHARD};
use crate::core::lease::{self as rules, Leader, Seen};
use crate::errors::{LeaseWhy, OrRaise};
use crate::{datafiles, settings, shared};

/// The shards held before a restart, asked for first after it.
const PREFERRED_FILE: &str = "leased_shards";
/// The etcd cluster this data directory leases from, once known: an answer
/// from another (a wrong address listed, a rebuilt etcd) is refused.
const CLUSTER_FILE: &str = "lease_cluster";
/// How soon a failed round is tried again.
const RETRY: Duration = Duration::from_millis(500);
/// Shards whose marks one transaction files (a compare and a put each;
/// etcd allows 128 operations per transaction by default).
const BATCH: usize = 60;

/// Registers the keeper (while preloading), when a lease store is set.
/// Not during `pg_upgrade`.
pub fn register() {
    // SAFETY: a plain global flag of the server.
    if unsafe { pg_sys::IsBinaryUpgrade } || settings::lease_store().is_none() {
        return;
    }
    BackgroundWorkerBuilder::new("pg_idgen lease keeper")
        .set_type("pg_idgen lease keeper")
        .set_library("pg_idgen")
        .set_function("pg_idgen_lease_keeper")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_idgen_lease_keeper(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    // Connected to no database: it shows in pg_stat_activity, and stands in
    // no database's way.
    BackgroundWorker::connect_worker_to_spi(None, None);
    let mut keeper = Keeper::new();
    log!(
        "pg_idgen lease keeper: server identity {}, asking the lease store at {} for shards [{}] and {} free ones (TTL {} s)",
        super::identity(),
        keeper.store_text,
        listed(keeper.named.iter()),
        keeper.auto,
        keeper.ttl_s
    );
    loop {
        let wait = keeper.round();
        if !BackgroundWorker::wait_latch(Some(wait)) {
            break;
        }
        if BackgroundWorker::sighup_received() {
            // SAFETY: reloads the configuration in this process, as PostgreSQL's own workers do.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
    }
    keeper.release_all();
    // SAFETY: ends this worker the way PostgreSQL's own do; code 1 has it
    // started again (after a SIGTERM of its own, not at shutdown).
    unsafe { pg_sys::proc_exit(1) };
}

struct Keeper {
    store: Store,
    store_text: String,
    prefix: String,
    named: Vec<u16>,
    auto: usize,
    ttl_s: i64,
    owner: String,
    system_id: u64,
    started_ns: u64,
    /// The resolution of the clock deadlines are read on.
    clock_res_ns: u64,
    /// The lease and the monotonic time until which it lets this server mint.
    lease: Option<i64>,
    valid_until_ns: u64,
    /// Held shards, each with the mark filed for it (Unix ms; 0 before the first).
    held: BTreeMap<u16, i64>,
    preferred: Vec<u16>,
    /// When the lease was last renewed (coarse monotonic ns).
    renewed_ns: u64,
    /// The store's addresses were checked to belong to one etcd cluster.
    one_cluster: bool,
    /// The store failed in the last round (logged once per outage).
    failing: bool,
    /// Shards refused for their mark (logged once each).
    refused: HashSet<u16>,
    /// Shards whose holder was logged.
    named_holder: HashSet<u16>,
    /// The leader key and this server's name in it, and what it said last.
    leader_key: Option<(String, String)>,
    leader: Leader,
}

impl Keeper {
    fn new() -> Keeper {
        let store_text = settings::lease_store().unwrap_or_default();
        // The postmaster refused an address that cannot be read already.
        let store = Store::parse(&store_text)
            .map_err(|why| crate::errors::IdError::InvalidSetting { name: "pg_idgen.lease_store", why })
            .or_raise();
        // SAFETY: reads globals set before any worker starts.
        let (system_id, port, pid, data) = unsafe {
            (
                pg_sys::GetSystemIdentifier(),
                pg_sys::PostPortNumber,
                pg_sys::PostmasterPid,
                std::ffi::CStr::from_ptr(pg_sys::DataDir).to_string_lossy().into_owned(),
            )
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string();
        let description = format!("{host}:{port} postmaster {pid} data {data}");
        let preferred: Vec<u16> = datafiles::read(PREFERRED_FILE)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .filter(|s| i32::from(*s) <= MAX_SHARD)
            .collect();
        // The postmaster refused a setting that cannot be read already.
        let leader_key = settings::lease_leader().unwrap_or_default();
        let keeper = Keeper {
            store,
            store_text,
            prefix: settings::lease_prefix(),
            named: settings::lease_shards().unwrap_or_default(),
            auto: settings::lease_auto_shards(),
            ttl_s: settings::lease_ttl_s(),
            owner: rules::owner_value(super::identity(), system_id, leader_key.as_ref().map(|(k, _)| k.as_str()), &description),
            system_id,
            started_ns: clock::coarse_ns(),
            clock_res_ns: clock::coarse_res_ns(),
            lease: None,
            valid_until_ns: 0,
            held: BTreeMap::new(),
            preferred,
            renewed_ns: 0,
            one_cluster: false,
            failing: false,
            refused: HashSet::new(),
            named_holder: HashSet::new(),
            leader_key,
            leader: Leader::Unused,
        };
        for s in &keeper.named {
            keeper.set_why(*s, LeaseWhy::Asking);
        }
        keeper
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl_s as u64 * 1000
    }

    fn set_why(&self, shard: u16, why: LeaseWhy) {
        if let Ok(state) = shared::state() {
            state.leases.why[shard as usize].store(why as u32, Ordering::Release);
        }
    }

    /// One round; how long to wait for the next.
    fn round(&mut self) -> Duration {
        match self.try_round() {
            Ok(()) => {
                if self.failing {
                    self.failing = false;
                    log!("pg_idgen lease keeper: the lease store at {} answers again", self.store_text);
                }
                let every = Duration::from_millis(rules::renew_every_ms(self.ttl_ms()));
                // Sooner while asking for shards not yet held (every 1 s).
                let wanted = self.named.len() + self.auto;
                if self.held.len() < wanted { every.min(Duration::from_secs(1)) } else { every }
            }
            Err(e) => {
                if !self.failing {
                    self.failing = true;
                    warning!("pg_idgen lease keeper: the lease store at {} cannot be used: {e}", self.store_text);
                }
                for s in self.wanted_not_held() {
                    self.set_why(s, LeaseWhy::Unreachable);
                }
                RETRY
            }
        }
    }

    fn wanted_not_held(&self) -> Vec<u16> {
        self.named.iter().copied().filter(|s| !self.held.contains_key(s)).collect()
    }

    fn try_round(&mut self) -> Result<(), String> {
        if !self.one_cluster {
            let pinned = datafiles::read(CLUSTER_FILE).map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
            let cluster = self.store.check_one_cluster(pinned.as_deref())?;
            if pinned.is_none() {
                datafiles::try_write(CLUSTER_FILE, &cluster)?;
            }
            self.one_cluster = true;
        }
        let sent = clock::coarse_ns();
        // Never longer than asked for, whatever an answer says.
        let ttl = match self.lease {
            Some(id) => self.store.keepalive(id)?.min(self.ttl_s),
            None => 0,
        };
        if ttl <= 0 {
            if self.lease.is_some() {
                warning!(
                    "pg_idgen lease keeper: the lease store let this server's lease run out (paused or cut off past the TTL); shards {} stop minting and are asked for again",
                    listed(self.held.keys())
                );
                self.lose_all(LeaseWhy::Lost);
            }
            self.new_lease()?;
        } else {
            self.renewed_ns = sent;
            self.valid_until_ns = rules::deadline_ns(sent, ttl as u64 * 1000, self.clock_res_ns, self.leader_key.is_some());
        }
        let lease = self.lease.ok_or("no lease")?;
        self.read_leader()?;
        if let Leader::Other(_) = self.leader {
            // Deposed: the shards go back with their exact marks, so that
            // the elected primary takes them at once; the lease lives on.
            self.give_back(lease, LeaseWhy::NotLeader, true)?;
            for s in self.named.clone() {
                self.set_why(s, LeaseWhy::NotLeader);
            }
            return Ok(());
        }
        self.ask(lease)?;
        self.file_marks(lease)?;
        self.publish();
        Ok(())
    }

    /// A lease: the one this postmaster's keys are attached to (a keeper
    /// restarted after a crash), or a new one.
    fn new_lease(&mut self) -> Result<(), String> {
        let sent = clock::coarse_ns();
        let mine: Vec<Kv> = self
            .shard_keys()?
            .into_iter()
            .filter(|kv| rules::owner_of(&kv.value).0 == super::identity() && kv.lease != 0)
            .collect();
        if let Some(kv) = mine.first() {
            let ttl = self.store.keepalive(kv.lease)?.min(self.ttl_s);
            if ttl > 0 {
                self.lease = Some(kv.lease);
                self.renewed_ns = sent;
                self.valid_until_ns = rules::deadline_ns(sent, ttl as u64 * 1000, self.clock_res_ns, self.leader_key.is_some());
                // The generators start above their marks as filed: after a
                // crash restart they start above what this server's own
                // files say, which need not cover the mark of the holder
                // before it (a retired one, after a keeper stopped before
                // it gave the lease back, is brought back the same way).
                for kv in mine.iter().filter(|k| k.lease == kv.lease) {
                    let Some(s) = rules::shard_of_key(&self.prefix, &kv.key) else { continue };
                    self.take_filed(s, kv.lease)?;
                }
                return Ok(());
            }
        }
        let sent = clock::coarse_ns();
        let (id, ttl) = self.store.grant(self.ttl_s)?;
        self.lease = Some(id);
        self.renewed_ns = sent;
        self.valid_until_ns = rules::deadline_ns(sent, ttl.clamp(0, self.ttl_s) as u64 * 1000, self.clock_res_ns, self.leader_key.is_some());
        Ok(())
    }

    /// Reads the leader key, if one is set; warns when it starts to name another server.
    fn read_leader(&mut self) -> Result<(), String> {
        let Some((key, name)) = &self.leader_key else { return Ok(()) };
        let leader = Leader::of(self.store.get(key)?.as_deref(), name);
        if leader == Leader::Absent && self.leader != Leader::Absent {
            log!("pg_idgen lease keeper: the leader key {key} is not in the lease store: shards are leased as without it");
        }
        if let Leader::Other(other) = &leader {
            if !matches!(self.leader, Leader::Other(_)) {
                warning!(
                    "pg_idgen lease keeper: the leader key {key} names \"{other}\", not this server (\"{name}\"); shards {} stop minting here",
                    listed(self.held.keys())
                );
            }
        }
        self.leader = leader;
        Ok(())
    }

    /// Whether the holder of `lease` missed a renewal (see `core::lease::missed_renewal`).
    fn silent(&self, lease: i64) -> Result<bool, String> {
        let (remaining, granted) = self.store.time_to_live(lease)?;
        Ok(rules::missed_renewal(remaining, granted))
    }

    fn shard_keys(&self) -> Result<Vec<Kv>, String> {
        self.store.range_prefix(&format!("{}shard/", self.prefix))
    }

    /// A shard's filed mark: the store's answer, then whether it can be used.
    fn read_mark(&self, shard: u16) -> Result<Result<Option<i64>, String>, String> {
        let key = rules::mark_key(&self.prefix, shard);
        let kvs = self.store.range_prefix(&key)?;
        Ok(rules::read_mark(kvs.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str()), settings::configured_epoch_ms()))
    }

    /// Starts holding a shard whose key is already this lease's, above its filed mark.
    fn take_filed(&mut self, shard: u16, lease: i64) -> Result<(), String> {
        match self.read_mark(shard)? {
            Ok(mark) => {
                self.take(shard, mark.unwrap_or(0));
                Ok(())
            }
            Err(why) => self.refuse(shard, lease, &why),
        }
    }

    /// Gives up a shard just taken whose mark cannot be used: its key is
    /// deleted, and it is not minted here.
    fn refuse(&mut self, shard: u16, lease: i64, why: &str) -> Result<(), String> {
        self.store.delete_if_held(&rules::shard_key(&self.prefix, shard), lease)?;
        self.drop_shard(shard, LeaseWhy::Refused);
        if self.refused.insert(shard) {
            warning!(
                "pg_idgen lease keeper: shard {shard} is not minted here: {why} (key {})",
                rules::mark_key(&self.prefix, shard)
            );
        }
        Ok(())
    }

    /// Starts holding `shard`, whose last holder filed `mark`: its generator
    /// starts above it, whatever this server's clock says.
    fn take(&mut self, shard: u16, mark: i64) {
        if let Ok(state) = shared::state() {
            let ms = mark + 1 - settings::configured_epoch_ms();
            generator::revive_above(&state.shards[shard as usize].last, ID_TICKS, ms);
        }
        self.held.insert(shard, mark);
        self.set_why(shard, LeaseWhy::Held);
    }

    /// Asks for the shards this server lacks.
    fn ask(&mut self, lease: i64) -> Result<(), String> {
        if self.named.iter().all(|s| self.held.contains_key(s)) && self.held.len() >= self.named.len() + self.auto {
            return Ok(());
        }
        let keys = self.shard_keys()?;
        let taken: BTreeMap<u16, &Kv> = keys.iter().filter_map(|kv| Some((rules::shard_of_key(&self.prefix, &kv.key)?, kv))).collect();
        // A key of this lease not held: a create whose answer was lost.
        let lost_answers: Vec<u16> =
            taken.iter().filter(|(s, kv)| kv.lease == lease && !self.held.contains_key(s)).map(|(s, _)| *s).collect();
        for s in lost_answers {
            self.take_filed(s, lease)?;
        }
        let seen = |s: u16| match taken.get(&s) {
            _ if self.held.contains_key(&s) => Seen::Mine,
            Some(kv) if kv.lease == lease => Seen::Mine,
            Some(_) => Seen::Other,
            None => Seen::Free,
        };
        let patient = clock::coarse_ns().saturating_sub(self.started_ns) < self.ttl_ms() * 1_500_000;
        let ask = rules::to_ask(&self.named, self.auto, &self.preferred, patient, seen);
        // Half the validity for asking; the rest of the round files marks.
        let enough = self.renewed_ns + self.valid_until_ns.saturating_sub(self.renewed_ns) / 2;
        for s in ask {
            if clock::coarse_ns() > enough {
                break;
            }
            let (key, mark_key) = (rules::shard_key(&self.prefix, s), rules::mark_key(&self.prefix, s));
            let holder = taken.get(&s).copied();
            let over = match holder.filter(|kv| rules::may_take_over(&self.leader, &kv.value, &self.owner)) {
                Some(kv) if self.silent(kv.lease)? => Some(kv),
                _ => None,
            };
            let answer = match (holder, over, &self.leader_key) {
                (Some(_), Some(kv), Some((leader_key, name))) => {
                    self.store.take_over(kv, (leader_key, name), &self.owner, lease, &mark_key)?
                }
                (Some(kv), _, _) => {
                    self.note_holder(s, kv, patient);
                    continue;
                }
                (None, _, _) => self.store.create(&key, &self.owner, lease, &mark_key)?,
            };
            match answer.map(|mark| rules::read_mark(mark.as_ref().map(|kv| kv.value.as_str()), settings::configured_epoch_ms())) {
                Some(Ok(mark)) => {
                    let mark = mark.unwrap_or(0);
                    if let Some(kv) = over {
                        log!(
                            "pg_idgen lease keeper: took shard {s} from an earlier primary of this data that stopped renewing its lease ({}), without waiting for the lease to run out: the leader key names this server; its IDs start above the mark {mark} that primary filed",
                            kv.value
                        );
                    } else {
                        log!("pg_idgen lease keeper: leased shard {s}; its IDs start above the mark {mark} filed by its last holder");
                    }
                    self.take(s, mark);
                }
                Some(Err(why)) => self.refuse(s, lease, &why)?,
                None => self.set_why(s, LeaseWhy::HeldElsewhere),
            }
        }
        self.write_preferred();
        Ok(())
    }

    /// Logs once who holds a shard this server asks for; warns when it is
    /// a running copy of this server (same system identifier, another start).
    fn note_holder(&mut self, shard: u16, kv: &Kv, patient: bool) {
        self.set_why(shard, LeaseWhy::HeldElsewhere);
        if patient || !self.named_holder.insert(shard) {
            return;
        }
        let (identity, system_id) = rules::owner_of(&kv.value);
        if system_id == Some(self.system_id) && identity != super::identity() {
            warning!(
                "pg_idgen lease keeper: shard {shard} is leased to another running server with this server's system identifier: {} (a copy of this server: a clone, or the old primary of a promoted standby); this server does not mint it",
                kv.value
            );
        } else {
            log!("pg_idgen lease keeper: shard {shard} is leased to another server: {}", kv.value);
        }
    }

    /// Files each held shard's mark for the validity just renewed; drops
    /// the shards whose keys are no longer attached to the lease.
    fn file_marks(&mut self, lease: i64) -> Result<(), String> {
        let now_ns = clock::coarse_ns();
        let valid_for_ms = self.valid_until_ns.saturating_sub(now_ns) / 1_000_000;
        let mark = rules::mark_ms(clock::unix_us().div_euclid(1000), valid_for_ms, settings::max_clock_lead_ms());
        let marks: Vec<(u16, i64)> = self.held.iter().map(|(s, filed)| (*s, mark.max(*filed))).collect();
        for batch in marks.chunks(BATCH) {
            if self.put_marks(batch, lease)? {
                self.held.extend(batch.iter().copied());
                continue;
            }
            // Some key is no longer this lease's: find which, drop them.
            let now: BTreeMap<u16, i64> = self
                .shard_keys()?
                .iter()
                .filter_map(|kv| Some((rules::shard_of_key(&self.prefix, &kv.key)?, kv.lease)))
                .collect();
            for (s, _) in batch.iter().filter(|(s, _)| now.get(s) != Some(&lease)) {
                warning!("pg_idgen lease keeper: shard {s} is no longer leased to this server; it stops minting");
                self.drop_shard(*s, LeaseWhy::Lost);
            }
            return Err("a shard's lease was lost while filing marks (tried again)".into());
        }
        Ok(())
    }

    /// Files `marks` (shard, Unix ms) if every one of their keys is still
    /// attached to `lease`: whether it did.
    fn put_marks(&self, marks: &[(u16, i64)], lease: i64) -> Result<bool, String> {
        let epoch = settings::configured_epoch_ms();
        let keys: Vec<String> = marks.iter().map(|(s, _)| rules::shard_key(&self.prefix, *s)).collect();
        let puts: Vec<(String, String)> =
            marks.iter().map(|(s, m)| (rules::mark_key(&self.prefix, *s), rules::mark_value(*m, epoch))).collect();
        self.store.put_if_held(&keys, lease, &puts)
    }

    /// Publishes the marks, then the validity.
    fn publish(&self) {
        let Ok(state) = shared::state() else { return };
        for (s, mark) in &self.held {
            state.leases.cap_ms[*s as usize].store(*mark, Ordering::Release);
        }
        for s in self.held.keys() {
            state.leases.valid_until_ns[*s as usize].store(self.valid_until_ns, Ordering::Release);
            state.leases.why[*s as usize].store(LeaseWhy::Held as u32, Ordering::Release);
        }
    }

    fn drop_shard(&mut self, shard: u16, why: LeaseWhy) {
        if let Ok(state) = shared::state() {
            state.leases.valid_until_ns[shard as usize].store(0, Ordering::Release);
        }
        self.held.remove(&shard);
        self.set_why(shard, why);
    }

    fn lose_all(&mut self, why: LeaseWhy) {
        for s in self.held.keys().copied().collect::<Vec<_>>() {
            self.drop_shard(s, why);
        }
        self.lease = None;
    }

    /// A hint for the next start: a failure to write it is ignored.
    fn write_preferred(&self) {
        let text: Vec<String> = self.held.keys().map(u16::to_string).collect();
        let _ = datafiles::try_write(PREFERRED_FILE, &text.join(" "));
    }

    /// Stops minting the held shards, files their exact marks and gives
    /// the lease back (at SIGTERM). If the store does not answer, the marks
    /// filed before stand (higher) and the lease runs out by itself.
    fn release_all(&mut self) {
        let Some(lease) = self.lease else { return };
        let shards = listed(self.held.keys());
        if let Err(e) = self.give_back(lease, LeaseWhy::Released, false) {
            log!("pg_idgen lease keeper: could not file the exact marks at release ({e}); the marks filed before stand");
            return;
        }
        match self.store.revoke(lease) {
            Ok(()) => log!("pg_idgen lease keeper: gave back the lease on shards {shards}"),
            Err(e) => log!("pg_idgen lease keeper: could not give the lease back ({e}); it runs out by itself"),
        }
        self.lease = None;
    }

    /// Stops minting the held shards (retiring their generators, so that
    /// no mint under way finishes after its last value is read), files
    /// their exact marks and, with `delete`, deletes their keys (without,
    /// the caller revokes the lease, which deletes them all). If the store
    /// fails, the shards stay stopped and the marks filed before stand (higher).
    fn give_back(&mut self, lease: i64, why: LeaseWhy, delete: bool) -> Result<(), String> {
        if self.held.is_empty() {
            return if delete { self.delete_keys(lease) } else { Ok(()) };
        }
        let state = shared::state().map_err(|e| format!("{e:?}"))?;
        let epoch = settings::configured_epoch_ms();
        let mut exact = Vec::new();
        // No longer held from here, whatever the store answers: the keys
        // still attached to the lease are taken back above their marks
        // (`ask`), or deleted by the next round that gives shards back.
        for (s, filed) in std::mem::take(&mut self.held) {
            state.leases.valid_until_ns[s as usize].store(0, Ordering::Release);
            state.leases.why[s as usize].store(why as u32, Ordering::Release);
            let last = state.shards[s as usize].last.swap(RETIRED, Ordering::AcqRel);
            let mark = if last == RETIRED || last == 0 { filed } else { ((last >> ID_TICKS.bits) as i64 + epoch).min(filed) };
            exact.push((s, mark));
        }
        // If filing fails, the marks filed before (higher) stand.
        let mut filed = true;
        for batch in exact.chunks(BATCH) {
            filed &= self.put_marks(batch, lease)?;
        }
        if delete {
            self.delete_keys(lease)?;
        }
        log!(
            "pg_idgen lease keeper: gave back shards {} {}",
            listed(exact.iter().map(|(s, _)| s)),
            if filed { "with their exact marks" } else { "(the marks filed before stand)" }
        );
        Ok(())
    }

    /// Deletes every shard key still attached to `lease` (a deposed
    /// server's, whose shards are no longer held).
    fn delete_keys(&self, lease: i64) -> Result<(), String> {
        for kv in self.shard_keys()?.iter().filter(|kv| kv.lease == lease) {
            self.store.delete_if_held(&kv.key, lease)?;
        }
        Ok(())
    }
}

/// Shards for the log: the first 20, and how many more.
fn listed<'a>(shards: impl Iterator<Item = &'a u16>) -> String {
    let all: Vec<String> = shards.map(u16::to_string).collect();
    match all.len() {
        0..=20 => all.join(","),
        n => format!("{} and {} more", all[..20].join(","), n - 20),
    }
}

