//! How many connections a server's sessions keep to each other node, all
//! sessions together, as Citus counts its own (`shared_connection_stats`).
//!
//! Each session that calls another node asks for a turn at that node. It
//! gets one when fewer than the limit of the node's entries are live
//! (`Using`, or `Idle` and not yet expired) and no session asked earlier
//! for the same node; otherwise it waits (the caller bounds the wait). A
//! session keeps its connection between calls as `Idle` until `until`: the
//! other node ends a session idle that long (`idle_session_timeout`), so an
//! expired entry holds no connection there and counts no more. A session
//! whose call ends while another waits for the node gives its turn up and
//! closes its connection, so no session holds a turn that others wait for
//! longer than one call. The table lives in shared memory under one lock;
//! these functions are what runs under it.

/// The entries of the table: connections held and sessions waiting, all
/// nodes together.
pub const ENTRIES: usize = 512;

/// The most entries one node takes (its limit is at most 64): sessions
/// waiting for a node that does not answer leave room for the others.
pub const PER_NODE: usize = 96;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum State {
    Free,
    /// Waiting for a turn, in the order of `ticket`.
    Waiting,
    /// Connecting or calling.
    Using,
    /// Connected, between calls, until `until`.
    Idle,
}

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub state: State,
    /// The node (a hash of its address).
    pub node: u64,
    /// The session's process.
    pub pid: i32,
    pub ticket: u64,
    /// Monotonic milliseconds: when an `Idle` entry expires.
    pub until: i64,
    /// Monotonic milliseconds: when the turn was granted.
    pub since: i64,
}

const FREE: Entry = Entry { state: State::Free, node: 0, pid: 0, ticket: 0, until: 0, since: 0 };

/// How long a session keeps its turn at a node while others wait, calling
/// as often as it likes, before its next call's end hands it on: a new
/// connection for each call would cost more than the call.
pub const TENURE_MS: i64 = 250;

/// The most nodes that refused a connection lately, kept at once.
const REFUSALS: usize = 16;

pub struct Pool {
    pub entries: [Entry; ENTRIES],
    pub tickets: u64,
    /// Nodes that refused a connection for want of slots: (node, how many
    /// connections they took, until when that is their limit).
    refusals: [(u64, usize, i64); REFUSALS],
}

impl Default for Pool {
    fn default() -> Self {
        Pool { entries: [FREE; ENTRIES], tickets: 0, refusals: [(0, 0, 0); REFUSALS] }
    }
}

/// What asking for a turn gives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Turn {
    /// The session's own live connection to the node, still counted: use it.
    Kept,
    /// A new turn: connect (closing any connection of the session's own to
    /// the node first: it expired, the node ended it).
    Granted,
    /// Ask again later.
    Wait,
}

impl Pool {
    fn live(&self, i: usize, now: i64) -> bool {
        let e = &self.entries[i];
        e.state == State::Using || e.state == State::Idle && e.until > now
    }

    fn find(&self, pid: i32, node: u64, states: &[State]) -> Option<usize> {
        self.entries.iter().position(|e| e.pid == pid && e.node == node && states.contains(&e.state))
    }

    /// Frees what expired: the other node ended those sessions.
    fn expire(&mut self, now: i64) {
        for e in self.entries.iter_mut() {
            if e.state == State::Idle && e.until <= now {
                *e = FREE;
            }
        }
    }

    /// Session `pid` asks for a turn at `node`, allowed `limit` live
    /// entries there. Every call but the first of a wait finds the
    /// `Waiting` entry the first made; a full table, or a node with
    /// [`PER_NODE`] entries, is a `Wait` too (with no entry: not in order).
    pub fn ask(&mut self, pid: i32, node: u64, limit: usize, now: i64) -> Turn {
        self.expire(now);
        if let Some(i) = self.find(pid, node, &[State::Idle, State::Using]) {
            self.entries[i].state = State::Using;
            return Turn::Kept;
        }
        let me = match self.find(pid, node, &[State::Waiting]) {
            Some(i) => i,
            None if self.entries.iter().filter(|e| e.node == node && e.state != State::Free).count() >= PER_NODE => return Turn::Wait,
            None => match self.entries.iter().position(|e| e.state == State::Free) {
                Some(i) => {
                    self.tickets += 1;
                    self.entries[i] = Entry { state: State::Waiting, node, pid, ticket: self.tickets, until: 0, since: 0 };
                    i
                }
                None => return Turn::Wait,
            },
        };
        let ticket = self.entries[me].ticket;
        let first = !self.entries.iter().any(|e| e.state == State::Waiting && e.node == node && e.ticket < ticket);
        let live = self.live_for(node, now);
        let limit = match self.refusals.iter().find(|r| r.0 == node && r.2 > now) {
            Some(r) => limit.min(r.1),
            None => limit,
        };
        if first && live < limit.max(1) {
            self.entries[me].state = State::Using;
            self.entries[me].since = now;
            Turn::Granted
        } else {
            Turn::Wait
        }
    }

    /// Session `pid`'s call to `node` ended well: true to keep the
    /// connection until `now + idle_ms`, false to close it (another session
    /// waits for the node, and this one had its turn [`TENURE_MS`]) and then
    /// [`leave`](Pool::leave): the turn is counted until the connection is
    /// closed.
    pub fn done(&mut self, pid: i32, node: u64, now: i64, idle_ms: i64) -> bool {
        let Some(i) = self.find(pid, node, &[State::Using]) else { return false };
        if now - self.entries[i].since >= TENURE_MS && self.entries.iter().any(|e| e.state == State::Waiting && e.node == node) {
            false
        } else {
            self.entries[i].state = State::Idle;
            self.entries[i].until = now + idle_ms;
            true
        }
    }

    /// Session `pid` was refused a connection by `node` for want of slots
    /// there: it gives its turn up. If this server's other sessions have
    /// connections there, until `until` the node's limit is how many they
    /// have, so that the sessions take turns on those instead of each
    /// failing, and true: wait for a turn. False if they have none: nothing
    /// to wait for (and attempts one after another would each take a slot
    /// there for a moment, the administrators' too).
    pub fn refused(&mut self, pid: i32, node: u64, now: i64, until: i64) -> bool {
        self.leave(pid, node);
        let took = self.live_for(node, now);
        if took == 0 {
            return false;
        }
        let slot = match self.refusals.iter().position(|r| r.0 == node) {
            Some(i) => i,
            None => (0..REFUSALS).min_by_key(|&i| self.refusals[i].2).unwrap_or(0),
        };
        self.refusals[slot] = (node, took, until);
        true
    }

    /// Session `pid` closed its connection to `node`, but the other node's
    /// session may still be running a statement (it did not end when asked):
    /// the entry goes on counting, owned by no session, until `until` (when
    /// that statement's timeout there has surely ended it).
    pub fn linger(&mut self, pid: i32, node: u64, until: i64) {
        if let Some(i) = self.find(pid, node, &[State::Using, State::Idle]) {
            self.entries[i] = Entry { state: State::Idle, node, pid: 0, ticket: 0, until, since: 0 };
        }
        self.leave(pid, node);
    }

    /// Session `pid` stops waiting for or closed its connection to `node`.
    pub fn leave(&mut self, pid: i32, node: u64) {
        for e in self.entries.iter_mut() {
            if e.pid == pid && e.node == node && e.state != State::Free {
                *e = FREE;
            }
        }
    }

    /// Session `pid` exits.
    pub fn exit(&mut self, pid: i32) {
        for e in self.entries.iter_mut() {
            if e.pid == pid && e.state != State::Free {
                *e = FREE;
            }
        }
    }

    /// Live entries for `node` at `now`.
    pub fn live_for(&self, node: u64, now: i64) -> usize {
        (0..ENTRIES).filter(|&i| self.entries[i].node == node && self.live(i, now)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_keeps_its_turn_until_it_expires() {
        let mut p = Pool::default();
        assert_eq!(p.ask(1, 7, 1, 0), Turn::Granted);
        assert!(p.done(1, 7, 10, 2000));
        assert_eq!(p.ask(2, 7, 1, 1000), Turn::Wait);
        // Session 2 waits: session 1's next call is its last before it yields.
        assert_eq!(p.ask(1, 7, 1, 1500), Turn::Kept);
        assert!(!p.done(1, 7, 1600, 2000));
        assert_eq!(p.ask(2, 7, 1, 1600), Turn::Wait, "counted until closed");
        p.leave(1, 7);
        assert_eq!(p.ask(2, 7, 1, 1600), Turn::Granted);
        // An idle connection no one waits for expires with the node's timeout.
        assert!(p.done(2, 7, 1700, 2000));
        assert_eq!(p.ask(3, 7, 1, 3699), Turn::Wait);
        assert_eq!(p.ask(3, 7, 1, 3700), Turn::Granted);
        assert_eq!(p.ask(2, 7, 1, 3700), Turn::Wait);
    }

    #[test]
    fn nodes_are_counted_apart_and_waits_are_served_in_order() {
        let mut p = Pool::default();
        assert_eq!(p.ask(1, 7, 1, 0), Turn::Granted);
        assert_eq!(p.ask(1, 8, 1, 0), Turn::Granted);
        assert_eq!(p.ask(2, 7, 1, 0), Turn::Wait);
        assert_eq!(p.ask(3, 7, 1, 0), Turn::Wait);
        p.leave(1, 7);
        assert_eq!(p.ask(3, 7, 1, 0), Turn::Wait, "3 asked after 2");
        assert_eq!(p.ask(2, 7, 1, 0), Turn::Granted);
        p.exit(2);
        assert_eq!(p.ask(3, 7, 1, 0), Turn::Granted);
        assert_eq!(p.live_for(8, 0), 1);
    }

    #[test]
    fn a_full_table_makes_every_asker_wait() {
        let mut p = Pool::default();
        for pid in 0..ENTRIES as i32 {
            assert_eq!(p.ask(pid, pid as u64, 1, 0), Turn::Granted);
        }
        assert_eq!(p.ask(-1, 1_000, 1, 0), Turn::Wait);
        p.exit(5);
        assert_eq!(p.ask(-1, 1_000, 1, 0), Turn::Granted);
    }

    #[test]
    fn a_connection_closed_with_its_statement_running_counts_until_the_statement_surely_ended() {
        let mut p = Pool::default();
        assert_eq!(p.ask(1, 7, 1, 0), Turn::Granted);
        p.linger(1, 7, 30_000);
        assert_eq!(p.ask(1, 7, 1, 10), Turn::Wait, "not the session's own any more");
        assert_eq!(p.ask(2, 7, 1, 10), Turn::Wait);
        assert_eq!(p.ask(2, 7, 1, 20_000), Turn::Wait);
        assert_eq!(p.ask(2, 7, 1, 30_000), Turn::Wait, "1 asked before 2");
        assert_eq!(p.ask(1, 7, 1, 30_000), Turn::Granted);
    }

    #[test]
    fn sessions_waiting_for_one_node_leave_room_for_the_others() {
        let mut p = Pool::default();
        for pid in 0..1_000 {
            let turn = p.ask(pid, 7, 16, 0);
            assert_eq!(turn, if pid < 16 { Turn::Granted } else { Turn::Wait });
        }
        assert_eq!(p.entries.iter().filter(|e| e.state != State::Free).count(), PER_NODE);
        assert_eq!(p.ask(5_000, 8, 16, 0), Turn::Granted);
    }

    #[test]
    fn a_node_out_of_slots_is_shared_by_turns() {
        let mut p = Pool::default();
        assert_eq!(p.ask(1, 7, 16, 0), Turn::Granted);
        assert_eq!(p.ask(2, 7, 16, 0), Turn::Granted);
        assert_eq!(p.ask(3, 7, 16, 0), Turn::Granted);
        // The node had room for two: session 3's attempt is refused.
        assert!(p.refused(3, 7, 0, 5_000));
        assert_eq!(p.ask(3, 7, 16, 10), Turn::Wait);
        assert!(p.done(1, 7, 20, 2_000), "a turn is kept for its tenure");
        assert_eq!(p.ask(1, 7, 16, 100), Turn::Kept);
        assert!(!p.done(1, 7, TENURE_MS, 2_000), "a session that waits gets the connection's slot");
        p.leave(1, 7);
        assert_eq!(p.ask(3, 7, 16, 300), Turn::Granted);
        assert_eq!(p.live_for(7, 300), 2);
        assert_eq!(p.ask(4, 7, 16, 300), Turn::Wait);
        // Past the refusal's time, the limit is the setting's again.
        assert_eq!(p.ask(4, 7, 16, 5_000), Turn::Granted);
        // Refused with none connected: nothing to wait for, no limit kept.
        let mut p = Pool::default();
        assert_eq!(p.ask(1, 7, 16, 0), Turn::Granted);
        assert!(!p.refused(1, 7, 0, 5_000));
        assert_eq!(p.ask(1, 7, 16, 0), Turn::Granted);
        assert_eq!(p.ask(2, 7, 16, 0), Turn::Granted);
    }

    /// xorshift64*: small, seeded, reproducible.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    /// A model of the pool's concurrency: sessions, each a state machine
    /// (out, asking, calling, idle), take random steps in a random order
    /// under the one lock, with time moving on; the other node, as the real
    /// one does, ends a session's connection once it was idle `IDLE` ms
    /// (the table keeps it `IDLE + MARGIN`), and may refuse a connection for
    /// want of slots, and a cancelled session's statement there may run on
    /// after its connection closed. After every step: no node has
    /// more open connections than the limit, by the model's own count (not
    /// the table's), and only a waiting session has a waiting entry. Then
    /// no session asks anew while those connected call without pause: every
    /// waiter gets its turn within a bounded number of rounds. Once all
    /// exit, the table is empty.
    #[test]
    fn a_model_of_many_sessions_never_passes_the_limit_and_serves_every_waiter() {
        const IDLE: i64 = 2_000;
        const MARGIN: i64 = 250;
        #[derive(Clone, Copy, PartialEq, Debug)]
        enum S {
            Out,
            Asking,
            Calling,
            /// Connected and idle since.
            Idle(i64),
            /// The node ended the connection; the session does not know yet.
            Ended,
            /// Closing its connection after giving its turn up (the other
            /// node's session is still there): leaves once closed.
            Closing,
        }
        for seed in 1..=60u64 {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let mut p = Pool::default();
            let sessions = 2 + rng.below(40) as usize;
            let limit = 1 + rng.below(4) as usize;
            let nodes = 1 + rng.below(3);
            let node_of: Vec<u64> = (0..sessions).map(|_| rng.below(nodes)).collect();
            let mut s = vec![S::Out; sessions];
            let mut now = 0i64;
            // Sessions there that did not end when closed: (node, until when they may run).
            let mut orphans: Vec<(u64, i64)> = vec![];
            let check = |s: &[S], p: &Pool, orphans: &[(u64, i64)], now: i64, what: &str| {
                for n in 0..nodes {
                    let open = (0..sessions).filter(|&j| node_of[j] == n && matches!(s[j], S::Calling | S::Idle(_) | S::Closing)).count()
                        + orphans.iter().filter(|o| o.0 == n && o.1 > now).count();
                    assert!(open <= limit, "seed {seed} {what} at {now}: {open} connections to node {n}, limit {limit}");
                }
                for e in p.entries.iter().filter(|e| e.state == State::Waiting) {
                    assert_eq!(s[(e.pid - 100) as usize], S::Asking, "seed {seed} {what}: a waiting entry of a session not waiting");
                }
            };
            let ask = |p: &mut Pool, s: &mut [S], k: usize, now: i64| {
                let dead = s[k] == S::Ended;
                match p.ask(k as i32 + 100, node_of[k], limit, now) {
                    // A kept connection the node ended: the session finds it
                    // broken and connects again, within its turn.
                    Turn::Kept => {
                        assert!(matches!(s[k], S::Idle(_) | S::Ended), "seed {seed}: kept a turn from {:?}", s[k]);
                        let _ = dead;
                        s[k] = S::Calling
                    }
                    Turn::Granted => s[k] = S::Calling,
                    Turn::Wait => s[k] = S::Asking,
                }
            };
            let end_idle = |s: &mut [S], now: i64| {
                for state in s.iter_mut() {
                    if matches!(*state, S::Idle(since) if now - since >= IDLE) {
                        *state = S::Ended;
                    }
                }
            };
            for step in 0..10_000 {
                now += rng.below(400) as i64;
                end_idle(&mut s, now);
                let k = rng.below(sessions as u64) as usize;
                let pid = k as i32 + 100;
                match s[k] {
                    S::Closing => {
                        s[k] = S::Out;
                        p.leave(pid, node_of[k]);
                    }
                    S::Out | S::Idle(_) | S::Ended | S::Asking => match rng.below(40) {
                        0 => {
                            p.exit(pid);
                            s[k] = S::Out;
                        }
                        1 if s[k] == S::Asking => {
                            p.leave(pid, node_of[k]);
                            s[k] = S::Out;
                        }
                        _ => ask(&mut p, &mut s, k, now),
                    },
                    S::Calling => match rng.below(20) {
                        // An error or a cancel: the connection is closed.
                        0 => {
                            p.leave(pid, node_of[k]);
                            s[k] = S::Out;
                        }
                        // A cancel while the statement there runs on.
                        2 => {
                            let until = now + rng.below(3_000) as i64;
                            orphans.push((node_of[k], until));
                            p.linger(pid, node_of[k], until);
                            s[k] = S::Out;
                        }
                        // The node refused the connection for want of slots.
                        1 => {
                            s[k] = S::Out;
                            if p.refused(pid, node_of[k], now, now + 5_000) {
                                ask(&mut p, &mut s, k, now);
                            }
                        }
                        _ => s[k] = if p.done(pid, node_of[k], now, IDLE + MARGIN) { S::Idle(now) } else { S::Closing },
                    },
                }
                check(&s, &p, &orphans, now, &format!("step {step}"));
            }
            // No session asks anew; those holding a connection keep calling
            // as fast as they can (each round a tenth of a turn's tenure):
            // the waiters are served all the same, in a bounded number of
            // rounds.
            // Sessions there that did not end when closed have ended by now.
            now = orphans.iter().map(|o| o.1).fold(now, i64::max);
            for round in 0..=12 * sessions {
                now += TENURE_MS / 10;
                end_idle(&mut s, now);
                for k in 0..sessions {
                    match s[k] {
                        S::Calling => s[k] = if p.done(k as i32 + 100, node_of[k], now, IDLE + MARGIN) { S::Idle(now) } else { S::Closing },
                        S::Asking | S::Idle(_) => ask(&mut p, &mut s, k, now),
                        S::Closing => {
                            s[k] = S::Out;
                            p.leave(k as i32 + 100, node_of[k]);
                        }
                        _ => {}
                    }
                    check(&s, &p, &orphans, now, &format!("round {round}"));
                }
                if !s.contains(&S::Asking) && !s.contains(&S::Closing) {
                    break;
                }
                assert!(round < 12 * sessions, "seed {seed}: still waiting after {round} rounds: {s:?}");
            }
            for k in 0..sessions {
                p.exit(k as i32 + 100);
            }
            assert!(p.entries.iter().all(|e| e.state == State::Free), "seed {seed}: entries left");
        }
    }
}
